"""`LossScaleOptimizer`: the Keras 3 form, a drop-in for Keras's own.

Storage, arguments, config and messages are Keras's: the class subclasses
`keras.optimizers.LossScaleOptimizer` and lets its `__init__` and `build`
create the state, so the variables are the `keras.Variable`s Keras's files,
state trees and checkpoints expect. The computation is this library's: the
step (`tf_loss_scale.step`), the update rule (`next_dynamic_state`) and the
finite check (`tf_loss_scale.gradients`).

Keras 3.3.3 (the Keras of TensorFlow 2.16) and later are supported. Where
Keras's own class changed between those releases (`keras3_support`), this
class follows the Keras it runs on (its variables, `get_config`,
`iterations`, messages), except in two places where the older class lost a
user's setting silently: base optimizer arguments are refused and the inner
optimizer's `loss_scale_factor` is cleared on every release, as Keras does
from 3.12 and 3.10 on.
"""

import math
import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import gradients
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import precision
from tf_loss_scale import step
# First: refuses an unsupported Keras before anything subclasses Keras 3's.
from tf_loss_scale.keras import keras3_support
from tf_loss_scale.keras import ownership
from tf_loss_scale.keras import wrapping

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

  Args:
    class_name: The optimizer's class name, for messages.
    kwargs: The keyword arguments the constructor got beyond its own.

  Returns:
    What remains for Keras's constructor (`dynamic`, if given).

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
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
  """Dynamic loss scaling around a Keras 3 optimizer, as in Keras 3.

  A drop-in for `keras.optimizers.LossScaleOptimizer`: same arguments,
  config, variables (`iteration`, `learning_rate`, `step_counter`,
  `dynamic_scale`, then the inner optimizer's) and messages, so models,
  `.keras` files, weights, state trees and checkpoints move between the two
  classes in both directions.

  Each `apply` unscales the gradients of the scaled loss, decides whether
  the gradients that will be applied (under a strategy, their sums across
  replicas) are all finite, advances the scale and lets the inner optimizer
  apply them, or skips the step on every replica. A skipped step changes no
  model or inner optimizer variable (`iterations` does not count it) and
  halves the scale; `dynamic_growth_steps` finite steps in a row double it.
  Where it differs from Keras's class, deliberately: the scale never falls
  below 1 nor grows to inf, and under a strategy a step is skipped when the
  gradients of any replica, or their sum, are not finite (Keras's class
  trusts the first replica's gradients before the sum).

  Custom loop:

  ```python
  opt = tf_loss_scale.keras.LossScaleOptimizer(keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(loss_fn())
  opt.apply(tape.gradient(loss, model.trainable_variables),
            model.trainable_variables)
  ```

  `stateless_apply` works on the TensorFlow backend too (without a
  strategy), by running a copy of the inner optimizer on its own scratch
  variables: nothing of this optimizer or the model is assigned.
  """

  def __init__(self,
               inner_optimizer: keras.optimizers.Optimizer,
               initial_scale: float = 2.0**15,
               dynamic_growth_steps: int = 2000,
               name: Optional[str] = None,
               **kwargs: Any):
    """Wraps `inner_optimizer`.

    Args:
      inner_optimizer: The Keras 3 optimizer that applies the gradients. Its
        `loss_scale_factor` is set to None, as Keras's class does.
      initial_scale: The first loss scale, a finite positive number. High is
        cheap: a too-high scale costs a few skipped steps.
      dynamic_growth_steps: Finite steps in a row after which the scale
        doubles, an integer of at least 1.
      name: The optimizer's name.
      **kwargs: As Keras's class: `dynamic=True`, and the base optimizer
        arguments only at their defaults (as found in old configs).

    Raises:
      TypeError: If `inner_optimizer` is not a Keras 3 optimizer, or a
        number is of the wrong type.
      ValueError: With Keras's messages for `dynamic=False`, a base optimizer
        argument (set it on the inner optimizer) or an unknown argument; for
        an out of range number, an inner optimizer that is a loss scale
        optimizer or is already wrapped; or under an unsupported strategy.
    """
    wrapping.check_inner_optimizer(inner_optimizer)
    _check_scale_arguments(initial_scale, dynamic_growth_steps)
    distribute.check_strategy_supported(f'{type(self).__name__}()')
    # Base optimizer arguments: refused on every Keras release.
    kwargs = _without_base_optimizer_defaults(type(self).__name__, kwargs)
    super().__init__(inner_optimizer, initial_scale, dynamic_growth_steps,
                     name=name, **kwargs)
    # The wrapper scales the loss; a factor left on the inner optimizer would
    # divide the gradients again.
    inner_optimizer.loss_scale_factor = None
    ownership.remember_wrapper(inner_optimizer, self)
    precision.warn_if_scaling_is_not_needed(
        keras.mixed_precision.global_policy().compute_dtype,
        type(self).__name__)
    # Plain holders, so that neither Keras's variable tracking nor
    # checkpoints see what they hold.
    self._monitor = _SkipMonitor()
    self._scratch = _Scratch()

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the variables, exactly as Keras's class does, for `var_list`.

    Args:
      var_list: The trainable variables this optimizer will update.
    """
    super().build(var_list)
    if not keras3_support.CLASS_RUNS_BASE_BUILD:
      # What Keras's class does from 3.12 on: the base optimizer records the
      # variables (for `apply(grads)` and `stateless_apply`). With the base
      # arguments at their defaults it creates no variable.
      keras.optimizers.Optimizer.build(self, var_list)
    self._monitor.create()

  @property
  def skipped_steps(self) -> tf.Tensor:
    """Steps skipped so far in this process (int64 tensor; 0 before build).

    For monitoring: not one of the optimizer's variables, so it is neither
    saved nor restored and it starts at 0 in each process.
    """
    return self._monitor.skipped_steps()

  @property
  def last_step_skipped(self) -> tf.Tensor:
    """Whether the last `apply` skipped its step (bool tensor)."""
    return self._monitor.last_step_skipped()

  def check_finite(self, grads: Sequence[Any]) -> tf.Tensor:
    """Tells whether every gradient is finite (None entries are ignored).

    Args:
      grads: A list of gradients.

    Returns:
      A scalar bool tensor. In a replica context of a strategy, the same on
      every replica, and False also when the sum across replicas overflows.
    """
    return distribute.all_finite_in_any_context(list(grads))

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the current scale (`initial_scale` before build).

    Args:
      loss: A loss tensor (the scale is cast to its dtype), or a
        zero-argument callable returning one.

    Returns:
      The scaled loss, or for a callable a callable returning it.
    """
    scale = self.dynamic_scale if self.built else self.initial_scale
    return gradients.scale_loss(loss, scale)

  def apply(self, grads: Sequence[Any],
            trainable_variables: Optional[Sequence[Any]] = None) -> None:
    """Applies the gradients of the scaled loss if they are finite.

    Call it in a replica context (inside `strategy.run`, or with no
    strategy), as Keras's class requires.

    Args:
      grads: One gradient per variable (None allowed), of the scaled loss.
      trainable_variables: The variables; optional once built.

    Raises:
      ValueError: In a cross-replica context, under an unsupported strategy,
        or when the optimizer's variables were not created in the current
        strategy's scope.
    """
    distribute.check_strategy_supported(f'{type(self).__name__}.apply()')
    # Keras's wording: "apply() must be called in a replica context".
    distribute.require_replica_context('apply()')
    if not self.built:
      with keras.name_scope(self.name, caller=self):
        self.build(trainable_variables)
    self._check_variables_belong_to_strategy()
    variables = list(trainable_variables or self._trainable_variables)
    grads = list(grads)
    step.apply_step(
        grads, _KerasVariablesState(self),
        lambda unscaled: self.inner_optimizer.apply(
            unscaled, trainable_variables=trainable_variables),
        scaled=_scaled_flags(grads, variables))

  def stateless_apply(
      self, optimizer_variables: Sequence[Any], grads: Sequence[Any],
      trainable_variables: Sequence[Any]) -> Tuple[List[Any], List[Any]]:
    """Computes one step from values; assigns nothing of this optimizer.

    Keras's stateless pattern, on the TensorFlow backend too:
    `opt.stateless_apply([v.value for v in opt.variables], grads,
    [v.value for v in model.trainable_variables])`. The inner optimizer's
    update runs on a copy of it (made once, from its config) whose scratch
    variables are overwritten with the given values on each call.

    Args:
      optimizer_variables: Values for `self.variables`, in that order.
      grads: Gradients of the scaled loss, one per trainable variable.
      trainable_variables: Values for the variables the optimizer was built
        with, in that order.

    Returns:
      `(new_trainable_values, new_optimizer_values)`.

    Raises:
      ValueError: If the optimizer is not built, the lists have the wrong
        lengths, or a strategy is in use.
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
    model_variables = list(self._trainable_variables)
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
    model_values = [tf.convert_to_tensor(v) for v in trainable_variables]
    num_own = len(variables) - len(self.inner_optimizer.variables)
    scale_index = _index_of(variables, self.dynamic_scale)
    counter_index = _index_of(variables, self.step_counter)
    grads = list(grads)
    _, (new_scale, new_counter), (new_model, new_inner) = step.stateless_step(
        grads, values[scale_index], values[counter_index],
        int(self.dynamic_growth_steps), _MULTIPLIER,
        _scaled_flags(grads, model_variables),
        lambda unscaled: self._scratch.apply(
            self.inner_optimizer, model_variables, unscaled, model_values,
            values[num_own:]),
        lambda: (model_values, values[num_own:]))
    values[scale_index] = tf.cast(new_scale, values[scale_index].dtype)
    values[counter_index] = tf.cast(new_counter, values[counter_index].dtype)
    return list(new_model), values[:num_own] + list(new_inner)

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer (without its state) from `get_config()`.

    Args:
      config: The output of `get_config` of this class or of Keras's (the
        dict is not modified).
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new, unbuilt `LossScaleOptimizer`.
    """
    return super().from_config(dict(config), custom_objects=custom_objects)

  def _check_variables_belong_to_strategy(self) -> None:
    # Variables created outside strategy.scope() are plain variables that
    # the replicas would each update on their own: refuse before anything
    # runs, so that no step is half-applied.
    if not tf.distribute.has_strategy():
      return
    strategy = tf.distribute.get_strategy()
    for variable in (self.dynamic_scale, self.step_counter,
                     self.inner_optimizer.iterations):
      if not strategy.extended.variable_created_in_scope(variable.value):
        raise ValueError(
            f'{type(self).__name__}.apply() runs under '
            f'{type(strategy).__name__}, but the optimizer variable '
            f'{variable.path!r} was not created in its scope, so the '
            'replicas would not share it. Create the optimizer (and the '
            'model) inside `with strategy.scope():`, or apply it without '
            'the strategy.')


class _KerasVariablesState(step.ScaleState):
  """The step's view of the scale kept in Keras's two variables."""

  def __init__(self, optimizer: LossScaleOptimizer):
    self._optimizer = optimizer

  def scale(self) -> tf.Tensor:
    return tf.convert_to_tensor(self._optimizer.dynamic_scale)

  def advance(self, grads: List[Any], decide: Any) -> step.UpdateResult:
    del grads  # The verdict is all the rule needs.
    opt = self._optimizer
    grads_finite = decide()
    new_scale, new_counter = loss_scale_lib.next_dynamic_state(
        tf.convert_to_tensor(opt.dynamic_scale),
        tf.convert_to_tensor(opt.step_counter), grads_finite,
        int(opt.dynamic_growth_steps), _MULTIPLIER)

    def assign() -> Any:
      # A Keras variable's assign returns no op (None in Keras 3.3, its
      # input in later releases): the assignments run eagerly, or in
      # program order inside a tf.function.
      opt.dynamic_scale.assign(new_scale)
      opt.step_counter.assign(tf.cast(new_counter, opt.step_counter.dtype))
      return opt._monitor.record(grads_finite)  # pylint: disable=protected-access

    return execution.op_in_graph_mode(assign), grads_finite


class _SkipMonitor:
  """Counts skipped steps in variables that no checkpoint or file sees."""

  def __init__(self):
    self._skipped = None
    self._last_skipped = None

  def create(self) -> None:
    # Created with the optimizer's other variables (in the strategy's scope
    # when there is one), outside any tf.function being traced.
    with tf.init_scope():
      self._skipped = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name='skipped_steps')
      self._last_skipped = tf.Variable(False, trainable=False,
                                       name='last_step_skipped')

  def record(self, grads_finite: tf.Tensor) -> Any:
    skipped = tf.logical_not(grads_finite)
    return tf.group(self._skipped.assign_add(tf.cast(skipped, tf.int64)),
                    self._last_skipped.assign(skipped))

  def skipped_steps(self) -> tf.Tensor:
    if self._skipped is None:
      return tf.constant(0, tf.int64)
    return tf.identity(self._skipped)

  def last_step_skipped(self) -> tf.Tensor:
    if self._last_skipped is None:
      return tf.constant(False)
    return tf.identity(self._last_skipped)


class _Scratch:
  """A copy of an inner optimizer on scratch variables, for stateless steps.

  Keras's TensorFlow optimizers can only update real variables, so a
  stateless step loads the given values into variables of its own, lets a
  copy of the inner optimizer (same class and config) update them, and
  reads them back. The copy is made once per optimizer, on first use.
  """

  def __init__(self):
    self._inner = None
    self._model_variables = None

  def apply(self, inner: keras.optimizers.Optimizer,
            model_variables: List[Any], grads: List[Any],
            model_values: List[tf.Tensor],
            inner_values: List[tf.Tensor]) -> Tuple[List[Any], List[Any]]:
    if self._inner is None:
      self._create(inner, model_variables)
    copy_variables = self._inner.variables
    if len(copy_variables) != len(inner_values):
      raise ValueError(
          f'The copy of {type(inner).__name__} made for stateless_apply has '
          f'{len(copy_variables)} variables but the optimizer has '
          f'{len(inner_values)}: its config does not recreate it.')
    for variable, value in zip(self._model_variables + copy_variables,
                               model_values + inner_values):
      variable.assign(value)
    self._inner.apply(grads, self._model_variables)
    return ([tf.convert_to_tensor(v) for v in self._model_variables],
            [tf.convert_to_tensor(v) for v in copy_variables])

  def _create(self, inner: keras.optimizers.Optimizer,
              model_variables: List[Any]) -> None:
    with tf.init_scope():
      try:
        copy = type(inner).from_config(inner.get_config())
      except Exception as error:  # pylint: disable=broad-except
        raise ValueError(
            'stateless_apply() on the TensorFlow backend runs a copy of the '
            f'inner optimizer, but {type(inner).__name__} could not be '
            f'recreated from its config: {error}') from error
      scratch = []
      for variable in model_variables:
        twin = keras.Variable(
            np.zeros(variable.shape, variable.dtype), dtype=variable.dtype,
            trainable=True, name=variable.name)
        # Set, not passed: Keras 3.3's Variable takes no constraint argument.
        twin.constraint = variable.constraint
        if getattr(variable, 'overwrite_with_gradient', False):
          twin.overwrite_with_gradient = True
        scratch.append(twin)
      copy.build(scratch)
    self._inner, self._model_variables = copy, scratch


def _scaled_flags(grads: List[Any], variables: List[Any]) -> List[bool]:
  # Variables Keras overwrites with their "gradient" (float8 scaling factors)
  # receive values, not derivatives of the scaled loss.
  if len(grads) != len(variables):
    raise ValueError(
        f'apply() got {len(grads)} gradients for {len(variables)} variables: '
        'pass one gradient per trainable variable.')
  return [not getattr(v, 'overwrite_with_gradient', False) for v in variables]


def _index_of(variables: List[Any], wanted: Any) -> int:
  return next(i for i, v in enumerate(variables) if v is wanted)


def _check_scale_arguments(initial_scale: Any,
                           dynamic_growth_steps: Any) -> None:
  for name, value in (('initial_scale', initial_scale),
                      ('dynamic_growth_steps', dynamic_growth_steps)):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise TypeError(
          f'{name} must be a number, but got {value!r} of type '
          f'{type(value).__name__}.')
  if not (math.isfinite(initial_scale) and
          0 < initial_scale <= float(tf.float32.max)):
    raise ValueError(
        'initial_scale must be a finite positive number that fits in '
        f'float32, but got initial_scale={initial_scale!r}.')
  if not (float(dynamic_growth_steps).is_integer() and
          dynamic_growth_steps >= 1):
    raise ValueError(
        'dynamic_growth_steps must be an integer of at least 1, but got '
        f'dynamic_growth_steps={dynamic_growth_steps!r}.')
