"""`LossScaleOptimizer`: the Keras 3 form, a drop-in for Keras's own.

Storage, arguments, config and messages are Keras's (Keras 3.3.3 and later,
each release's, see `keras3_support`); the step, the rule and the finite
check are this library's. docs/differences.md lists where it differs.
"""

import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import gradients
from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import precision
from tf_loss_scale import private_api
from tf_loss_scale import step
from tf_loss_scale import step_record
# First: refuses an unsupported Keras before anything subclasses Keras 3's.
from tf_loss_scale.keras.shared import keras3_support
from tf_loss_scale.keras.shared import protocols

# Keras's class grows and shrinks its scale by 2; so does this one.
_MULTIPLIER = 2.0


# The base optimizer's arguments and the values at which they do nothing:
# the only values a loss scale optimizer accepts (old configs hold them).
_BASE_OPTIMIZER_DEFAULTS = {
    'weight_decay': None,
    'clipnorm': None,
    'global_clipnorm': None,
    'clipvalue': None,
    'use_ema': False,
    'ema_momentum': 0.99,
    'ema_overwrite_frequency': None,
    'loss_scale_factor': None,
    'gradient_accumulation_steps': None,
}


def _without_base_optimizer_defaults(
    class_name: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
  """`kwargs` less base optimizer arguments at their defaults.

  Raises:
    ValueError: With Keras's wording, for a base optimizer argument with
      another value (it would be ignored) or an unknown argument.
  """
  for name, default in _BASE_OPTIMIZER_DEFAULTS.items():
    if name in kwargs and not (kwargs[name] is default or
                               kwargs[name] == default):
      raise ValueError(
          f'{class_name} does not support `{name}`. Instead, set `{name}` '
          'on the `inner_optimizer`.')
  unknown = [name for name in kwargs
             if name not in _BASE_OPTIMIZER_DEFAULTS and name != 'dynamic']
  if unknown:
    raise ValueError(
        f'{class_name} does not support arguments: `{"`, `".join(unknown)}`.')
  return {name: value for name, value in kwargs.items() if name == 'dynamic'}


@keras.saving.register_keras_serializable(
    package='tf_loss_scale', name='LossScaleOptimizer')
class LossScaleOptimizer(private_api.SavedModelOnlyChildren,
                         keras.optimizers.LossScaleOptimizer):
  """Dynamic loss scaling around a Keras 3 optimizer, as in Keras 3.

  A drop-in for `keras.optimizers.LossScaleOptimizer` (same arguments,
  config, variables, messages and files, both ways). A skipped step changes
  no variable but halves the scale; `dynamic_growth_steps` finite steps in
  a row double it.

  Custom loop:

  ```python
  opt = tf_loss_scale.keras.LossScaleOptimizer(keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(loss_fn())
  opt.apply(tape.gradient(loss, model.trainable_variables),
            model.trainable_variables)
  ```
  """

  def __init__(self,
               inner_optimizer: keras.optimizers.Optimizer,
               initial_scale: float = 2.0**15,
               dynamic_growth_steps: int = 2000,
               name: Optional[str] = None,
               **kwargs: Any):
    """Wraps `inner_optimizer`.

    Args:
      inner_optimizer: The Keras 3 optimizer that applies the gradients (its
        `loss_scale_factor` is set to None, as by Keras's class).
      initial_scale: The first loss scale, a finite number of at least 1.
      dynamic_growth_steps: Finite steps in a row after which the scale
        doubles, an integer of at least 1.
      name: The optimizer's name.
      **kwargs: `dynamic=True`, and base optimizer arguments at defaults.

    Raises:
      TypeError: If `inner_optimizer` is not a Keras 3 optimizer, or a
        number is of the wrong type.
      ValueError: With Keras's messages for `dynamic=False`, a base
        optimizer argument or an unknown one; for an out of range number;
        under an unsupported strategy.
    """
    guards.check_new_wrapper(inner_optimizer, self._FORM, self,
                             exclusive=self._wraps_exclusively())
    keras3_support.check_replicas_are_summed(f'{type(self).__name__}()')
    loss_scale_lib.check_scale_arguments(
        initial_scale, dynamic_growth_steps, floor=self._scale_floor())
    # Base optimizer arguments: refused on every Keras release.
    kwargs = _without_base_optimizer_defaults(type(self).__name__, kwargs)
    super().__init__(inner_optimizer, initial_scale, dynamic_growth_steps,
                     name=name, **kwargs)
    # The wrapper scales the loss; a factor left on the inner optimizer would
    # divide the gradients again.
    inner_optimizer.loss_scale_factor = None
    precision.warn_if_scaling_is_not_needed(
        keras.mixed_precision.global_policy().compute_dtype,
        type(self).__name__)
    # Plain holders, so that neither Keras's variable tracking nor
    # checkpoints see what they hold.
    self._monitor = step_record.StepRecord()
    self._scratch = _Scratch()

  # The front end, as the guards name it.
  _FORM = guards.KERAS_FORM

  def _wraps_exclusively(self) -> bool:
    """Whether an optimizer another wrapper holds is refused (`guards`).

    Not by this class: Keras's lets two wrappers hold one optimizer, and
    each trains it as it would alone.
    """
    return False

  def _scale_floor(self) -> Optional[float]:
    """The lowest scale taken and kept (None: no floor, for a subclass)."""
    return 1.0

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the variables, exactly as Keras's class does, for `var_list`."""
    super().build(var_list)
    if not keras3_support.CLASS_RUNS_BASE_BUILD:
      # What Keras's class does from 3.12 on: the base optimizer records the
      # variables (for `apply(grads)` and `stateless_apply`). With the base
      # arguments at their defaults it creates no variable.
      keras.optimizers.Optimizer.build(self, var_list)
      # Keras's class before 3.12 saves no such list.
      private_api.untrack(self, '_trainable_variables')
    # The skip report's flags, one per variable, made now so that they are
    # not created while Keras traces its train function.
    self._monitor.create(step_record.gradient_names(var_list))
    self._scratch.built_with = list(var_list)

  def _saved_model_only_children(self) -> Dict[str, Any]:
    # A traced `apply` captures the record, which checkpoints leave out.
    return self._monitor.variables()

  @property
  def skipped_steps(self) -> tf.Tensor:
    """Steps skipped so far in this process (int64 tensor, not saved)."""
    return self._monitor.skipped_steps()

  @property
  def last_step_skipped(self) -> tf.Tensor:
    """Whether the last `apply` skipped its step (bool tensor)."""
    return self._monitor.last_step_skipped()

  def check_finite(self, grads: Sequence[Any]) -> tf.Tensor:
    """Whether each gradient's sum across replicas is finite (bool tensor)."""
    return distribute.read(list(grads)).finite

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the current scale (`initial_scale` before build).

    Args:
      loss: A loss tensor, or a zero-argument callable returning one.

    Returns:
      The scaled loss, or a callable returning it; in Keras's dtype (see
      `_keras_scale_loss`).
    """
    return self._keras_scale_loss(loss)

  def _keras_scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """`scale_loss`, in the dtype Keras's class returns.

    Keras multiplies by its float32 scale variable once built, which
    promotes a float16 loss to float32, and by the Python number
    `initial_scale` before, which keeps a float loss's dtype.
    """
    if callable(loss):
      return lambda: self._keras_scale_loss(loss())
    loss = tf.convert_to_tensor(loss)
    dtype = keras.backend.result_type(loss.dtype.name,
                                      'float32' if self.built else float)
    return gradients.scale_loss(tf.cast(loss, dtype), self._current_scale())

  def _current_scale(self) -> tf.Tensor:
    # Keras's class makes its scale variable in `build` and reads
    # `initial_scale` before: a `tf.function` traced then would keep that
    # number for good, whatever the later steps make of the scale.
    self._make_scale_variables()
    return tf.convert_to_tensor(self.dynamic_scale)

  def _make_scale_variables(self) -> None:
    """Makes Keras's two variables of the scale now, if `build` has not.

    `add_variable` hands them to Keras's `build` when it asks for them,
    which keeps Keras's order of `variables`. Made out of any `tf.function`
    (a trace that asks reads them as variables), under the name scope
    `build` gives them.
    """
    if hasattr(self, 'dynamic_scale'):
      return
    # With the aggregation Keras's class asks for on this release.
    aggregation = ({'aggregation': 'none'} if
                   keras3_support.VARIABLES_TAKE_AGGREGATION_NONE else {})
    with tf.init_scope(), keras.name_scope(self.name, caller=self):
      made = {
          'step_counter': super().add_variable(
              shape=(), dtype='int', initializer='zeros',
              name='step_counter', **aggregation),
          'dynamic_scale': super().add_variable(
              shape=(), dtype='float32',
              initializer=keras.initializers.Constant(self.initial_scale),
              name='dynamic_scale', **aggregation),
      }
    object.__setattr__(self, '_made_before_build', dict(made))
    for name, variable in made.items():
      setattr(self, name, variable)  # Tracked: Keras's checkpoint names.

  def add_variable(self, *args: Any, **kwargs: Any) -> Any:
    """As Keras's, but returns a variable made before `build` asked for it."""
    made = self.__dict__.get('_made_before_build', {})
    if kwargs.get('name') in made:
      return made.pop(kwargs['name'])
    return super().add_variable(*args, **kwargs)

  def apply(self, grads: Sequence[Any],
            trainable_variables: Optional[Sequence[Any]] = None) -> None:
    """Applies the gradients of the scaled loss if they are finite.

    Args:
      grads: One gradient per variable (None allowed), of the scaled loss.
      trainable_variables: The variables; optional once built.

    Raises:
      ValueError: In a cross-replica context (as Keras's class), under an
        unsupported strategy, or for variables made outside its scope.
    """
    self._apply(grads, trainable_variables)

  # Whether, on a step of unscaled gradients, the inner optimizer gets their
  # sums across replicas (and clips the sums), or each replica's, as under
  # Keras's class.
  _INNER_GETS_SUMS = False
  # Whether the step decides on the exact sums when the inner optimizer sums
  # (one more all-reduce), or on a bound (docs/differences.md).
  _DECIDES_ON_SUMS = False

  def _apply(self, grads: Sequence[Any],
             trainable_variables: Optional[Sequence[Any]],
             summed: bool = False, method: Optional[str] = 'apply') -> None:
    """`apply`; with `summed`, `grads` are the sums across replicas.

    `method` is as `_scaled_flags` takes it.
    """
    where = f'{type(self).__name__}.apply()'
    guards.check_step(where, [self.inner_optimizer])
    keras3_support.check_replicas_are_summed(where)
    # Keras's wording: "apply() must be called in a replica context".
    distribute.require_replica_context('apply()')
    if not self.built:
      # Out of any tf.function, as tf_keras: one can't initialise mirrored ones.
      with tf.init_scope(), keras.name_scope(self.name, caller=self):
        self.build(trainable_variables)
    variables = list(trainable_variables or self._scratch.built_with)
    grads = list(grads)
    scaled = self._scaled_flags(grads, variables, method)
    inner_apply = lambda unscaled: self.inner_optimizer.apply(
        unscaled, trainable_variables=trainable_variables)
    # Under Keras 3's protocol every form hands over what Keras's class does.
    hands_sums = summed or (self._INNER_GETS_SUMS and scaled is None)
    if hands_sums:
      _refuse_overwritten_on_replicas(variables, where)
      apply_fn = lambda sums: inner_apply(distribute.shares_summing_to(sums))
    step.apply_step(
        grads, self._scale_state(), apply_fn if hands_sums else inner_apply,
        scaled=scaled, reduces=not hands_sums, summed=summed,
        names=step_record.gradient_names(variables),
        on_skip=lambda _: self._on_skipped_step(scaled is None),
        held_as=[v.dtype for v in variables],
        decides_on_sums=self._DECIDES_ON_SUMS)

  def stateless_apply(
      self, optimizer_variables: Sequence[Any], grads: Sequence[Any],
      trainable_variables: Sequence[Any]) -> Tuple[List[Any], List[Any]]:
    """Computes one step from values; assigns nothing of this optimizer.

    On the TensorFlow backend too: the inner optimizer's update runs on a
    copy of it over scratch variables loaded with the given values.

    Args:
      optimizer_variables: Values for `self.variables`, in that order.
      grads: Gradients of the scaled loss, one per trainable variable.
      trainable_variables: Values for the variables it was built with.

    Returns:
      `(new_trainable_values, new_optimizer_values)`.

    Raises:
      ValueError: Unbuilt, for lists of the wrong lengths, or under a
        strategy.
    """
    if not self.built:
      raise ValueError(
          f'To call `stateless_apply`, {type(self).__name__} must be built '
          '(i.e. its variables must have been created). You can build it via '
          '`optimizer.build(trainable_variables)`.')
    if tf.distribute.has_strategy():
      raise ValueError(
          'stateless_apply() is not supported under a tf.distribute strategy '
          '(Keras\'s optimizers cannot run statelessly there); use apply() '
          'inside strategy.run.')
    variables = self.variables
    model_variables = self._scratch.built_with
    if len(optimizer_variables) != len(variables):
      raise ValueError(
          'Argument `optimizer_variables` must be a list of tensors '
          f'corresponding 1:1 to {type(self).__name__}().variables. Received '
          f'list with length {len(optimizer_variables)}, but expected '
          f'{len(variables)} variables.')
    if len(trainable_variables) != len(model_variables):
      raise ValueError(
          'Argument `trainable_variables` must be a list of tensors '
          'corresponding 1:1 to the trainable variables list that the '
          f'optimizer was built with. Received {len(trainable_variables)} '
          f'values whereas the optimizer was built with '
          f'{len(model_variables)} variables.')
    values = [tf.convert_to_tensor(v) for v in optimizer_variables]
    num_own = len(variables) - len(self.inner_optimizer.variables)
    scale_index = _index_of(variables, self.dynamic_scale)
    counter_index = _index_of(variables, self.step_counter)
    scratch = self._scratch.matching(self.inner_optimizer, model_variables)
    scratch.load(trainable_variables, values[num_own:])
    grads = list(grads)
    outcome = step.apply_step(
        grads, self._scale_state(values[scale_index], values[counter_index]),
        scratch.apply,
        scaled=self._scaled_flags(grads, model_variables,
                                  'stateless_apply'))
    values[scale_index], values[counter_index] = outcome.state
    # Read back once the step has run (or was skipped: then the scratch
    # variables still hold the values given).
    with tf.control_dependencies(step.graph_elements(outcome.applied)):
      new_model, new_inner = scratch.read()
    return new_model, values[:num_own] + new_inner

  def _on_skipped_step(self, given_unscaled: bool) -> Any:
    """Runs once, cross-replica, on a skipped step: Keras's counts nothing.

    `given_unscaled`: whether the apply took unscaled gradients.
    """
    del given_unscaled

  def _scaled_flags(self, grads: Sequence[Any],
                    variables: Optional[Sequence[Any]],
                    method: Optional[str] = 'apply') -> Optional[List[bool]]:
    """Every gradient given to an apply is of the scaled loss, as Keras's.

    `method`: as `protocols.TwoProtocols._scaled_flags` takes it.
    """
    return protocols.scaled_flags(grads, variables,
                                  method or 'apply_gradients')

  def _scale_state(self, scale: Optional[tf.Tensor] = None,
                   counter: Optional[tf.Tensor] = None) -> step.ScaleState:
    """The step's view of the scale: the variables, or (stateless) values."""
    return _KerasScale(self, self._scale_floor(), scale, counter)

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer from `get_config()` of this class or Keras's.

    Args and return value as Keras's; `config` is not modified.
    """
    return super().from_config(dict(config), custom_objects=custom_objects)


class _KerasScale(step.ScaleState):
  """The step's view of Keras's two variables, or (stateless) of values."""

  def __init__(self, optimizer: LossScaleOptimizer, floor: Optional[float],
               scale: Optional[tf.Tensor] = None,
               counter: Optional[tf.Tensor] = None):
    self._optimizer, self._floor = optimizer, floor
    self._values = None if scale is None else (scale, counter)

  def scale(self) -> tf.Tensor:
    if self._values is not None:
      return self._values[0]
    return tf.convert_to_tensor(self._optimizer.dynamic_scale)

  def skip_reporter(self, names: Sequence[str], reading: step.Reader
                   ) -> Optional[Callable[[], Any]]:
    if self._values is not None:
      return None  # A stateless step assigns nothing.
    return self._optimizer._monitor.skip_reporter(  # pylint: disable=protected-access
        names, self.scale, reading)

  def advance(self, verdict: tf.Tensor,
              after: Sequence[Union[tf.Tensor, tf.Operation]]) -> Any:
    opt = self._optimizer
    scale, counter = self._values or (
        tf.convert_to_tensor(opt.dynamic_scale),
        tf.convert_to_tensor(opt.step_counter))
    new_scale, new_counter = loss_scale_lib.next_dynamic_state(
        scale, counter, verdict, int(opt.dynamic_growth_steps), _MULTIPLIER,
        min_loss_scale=self._floor or 0.0)
    new_counter = tf.cast(new_counter, counter.dtype)
    if self._values is not None:
      return new_scale, new_counter

    # Made before the control dependencies below, as in
    # `DynamicLossScale._assign_next_state` (which says why).
    skipped = tf.logical_not(verdict)

    def assign() -> Any:
      # A Keras variable's assign returns no op (None in Keras 3.3, its
      # input in later releases): the assignments run eagerly, or in
      # program order inside a tf.function, after the step's side.
      with tf.control_dependencies(after):
        opt.dynamic_scale.assign(new_scale)
        opt.step_counter.assign(new_counter)
        return opt._monitor.record(skipped)  # pylint: disable=protected-access

    return execution.op_in_graph_mode(assign)


class _Scratch:
  """What the optimizer was built with, and copies of it for stateless steps.

  `built_with` holds `build`'s model variables (Keras keeps them privately).
  Keras's TensorFlow optimizers update only real variables, so the copy runs
  on scratch ones. It is made from the config at the first stateless step,
  which decides its variables (SGD has momentum slots only if built with a
  momentum), given the current settings, and remade when these change.
  """

  def __init__(self):
    self._layout = None
    self._copy = None
    self.built_with = []

  def matching(self, inner: keras.optimizers.Optimizer,
               model_variables: List[Any]) -> '_ScratchCopy':
    """A copy of `inner` with its current settings, for `model_variables`."""
    with tf.init_scope():  # A config reads variables' values.
      config = inner.get_config()
      # The layout of the first copy: serializing settings at `build` would
      # refuse or warn about a learning rate before the program saves.
      self._layout = self._layout or config
      settings = _settings(config)
      if self._copy is None or not self._copy.made_from(settings,
                                                        model_variables):
        self._copy = _ScratchCopy(type(inner), self._layout, settings,
                                  model_variables)
    return self._copy


class _ScratchCopy:
  """One copy of an inner optimizer and its scratch model variables."""

  def __init__(self, inner_type: type, layout: Dict[str, Any],
               settings: Dict[str, Any], model_variables: List[Any]):
    try:
      self._inner = inner_type.from_config(layout)
    except Exception as error:  # pylint: disable=broad-except
      raise ValueError(
          'stateless_apply() on the TensorFlow backend runs a copy of the '
          f'inner optimizer, but {inner_type.__name__} could not be '
          f'recreated from its config: {error}') from error
    self._model_variables = []
    for variable in model_variables:
      twin = keras.Variable(
          np.zeros(variable.shape, variable.dtype), dtype=variable.dtype,
          trainable=True, name=variable.name)
      # Set, not passed: Keras 3.3's Variable takes no constraint argument.
      twin.constraint = variable.constraint
      if getattr(variable, 'overwrite_with_gradient', False):
        twin.overwrite_with_gradient = True
      self._model_variables.append(twin)
    self._inner.build(self._model_variables)
    for name, value in settings.items():
      if layout.get(name) != value:
        setattr(self._inner, name, value)
    if _settings(self._inner.get_config()) != settings:
      raise ValueError(
          f'stateless_apply() cannot follow the settings of the inner '
          f'{inner_type.__name__} on a copy of it: {settings}. Recreate the '
          'optimizer with these settings.')
    self._settings = settings
    self._originals = list(model_variables)

  def made_from(self, settings: Dict[str, Any],
                model_variables: List[Any]) -> bool:
    return settings == self._settings and len(model_variables) == len(
        self._originals) and all(
            a is b for a, b in zip(model_variables, self._originals))

  def load(self, model_values: Sequence[Any],
           inner_values: Sequence[Any]) -> None:
    copy_variables = self._inner.variables
    if len(copy_variables) != len(inner_values):
      raise ValueError(
          f'The copy of {type(self._inner).__name__} made for '
          f'stateless_apply has {len(copy_variables)} variables but the '
          f'optimizer has {len(inner_values)}: its config does not recreate '
          'it.')
    for variable, value in zip(self._model_variables + copy_variables,
                               list(model_values) + list(inner_values)):
      variable.assign(value)

  def apply(self, grads: List[Any]) -> None:
    self._inner.apply(grads, self._model_variables)

  def read(self) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    return ([tf.convert_to_tensor(v) for v in self._model_variables],
            [tf.convert_to_tensor(v) for v in self._inner.variables])


def _settings(config: Dict[str, Any]) -> Dict[str, Any]:
  # A config less a learning rate held in a variable: its value travels
  # with the optimizer's variables, not with its settings.
  if isinstance(config.get('learning_rate'), numbers.Real):
    config = {k: v for k, v in config.items() if k != 'learning_rate'}
  return config


def _refuse_overwritten_on_replicas(variables: Sequence[Any],
                                    where: str) -> None:
  """Refuses, under several replicas, sums for `overwrite_with_gradient`.

  Keras assigns each replica's "gradient" (a float8 scaling factor) to such
  a variable: a sum would multiply it.
  """
  if not tf.distribute.has_strategy() or (
      tf.distribute.get_strategy().num_replicas_in_sync == 1):
    return
  overwritten = [v.name for v in variables
                 if getattr(v, 'overwrite_with_gradient', False)]
  if overwritten:
    raise ValueError(
        f'{where} hands the inner optimizer gradients summed across '
        f'replicas, but the variables {overwritten} have '
        'overwrite_with_gradient=True (Keras assigns each replica\'s value '
        'to them, which a sum would multiply). Train them with '
        'tf_loss_scale.keras.LossScaleOptimizer, which hands each '
        'replica\'s gradients as Keras\'s class does.')


def _index_of(variables: List[Any], wanted: Any) -> int:
  return next(i for i, v in enumerate(variables) if v is wanted)
