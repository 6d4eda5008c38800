"""`LossScaleOptimizer`: TF 2.4-2.15's Keras API on Keras 3.

For custom loops written for `tf.keras.mixed_precision` of TF 2.4-2.15, on
TensorFlow 2.16 and later; a subclass of the Keras 3 form, so `compile`
keeps it (docs/differences.md).

Whose behaviour (`_follows_tf_keras`): this class is tf_keras's (`iterations`
a `tf.Variable`, a dynamic scale floored at 1, `apply_gradients` taking the
gradients as given but in a `fit` step (`shared/protocols.py`), settings
forwarded, an optimizer another wrapper holds refused). The subclass
`compat.install()` puts under Keras's name (`shared_name.py`) is Keras's
class until the program calls `get_scaled_loss`, `get_unscaled_gradients`,
`compute_gradients` or `minimize`, or passes `dynamic`.

The forwarding rule, once tf_keras's behaviour holds: the inner optimizer's
settings that are not flags (`learning_rate`, `momentum`, `clipnorm`, ...;
`lr` is `learning_rate`) and `use_ema` are read and written on it, as
tf_keras's class did. A flag (`nesterov`, `amsgrad`, ...) set on the wrapper
stays there, with a warning; `loss_scale_factor` stays None; `iterations`
cannot be replaced. Keras's `build` on the wrapper sees the wrapper's own
settings, so it makes no second EMA or accumulator copy of the model.
"""

import contextlib
import numbers
from typing import Any, Dict, Iterable, List, Optional, Tuple

from absl import logging
import keras
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import guards
from tf_loss_scale import step
from tf_loss_scale.keras import keras3
from tf_loss_scale.keras.mixed_precision import tf_keras_checkpoints
from tf_loss_scale.keras.shared import keras3_support
from tf_loss_scale.keras.shared import protocols
from tf_loss_scale.keras.shared import tf2_members

# TF 2.4-2.15's defaults for a dynamic scale.
_INITIAL_SCALE = 2.0**15
_GROWTH_STEPS = 2000
# Settings of Keras 2 optimizers that Keras 3's do not take, found in the
# configs of tf_keras's class: their values do nothing in Keras 3.
_KERAS2_ONLY_SETTINGS = ('jit_compile', 'is_legacy_optimizer')
# Settings of a Keras 3 optimizer that are not forwarded.
_NOT_FORWARDED = frozenset({'loss_scale_factor'})
# What a config holds of this class's arguments (Keras's or tf_keras's).
_OWN_CONFIG = ('dynamic', 'initial_scale', 'dynamic_growth_steps', 'name')
# TF 2.4-2.10's other names for forwarded settings.
_ALIASES = {'lr': 'learning_rate'}
# `dynamic` not given: Keras's behaviour (module docstring).
_UNSET = object()


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.mixed_precision', name='LossScaleOptimizer')
class LossScaleOptimizer(protocols.TwoProtocols,
                         tf_keras_checkpoints.ReadsTfKerasLayout,
                         tf2_members.Keras3Members,
                         keras3.LossScaleOptimizer):
  """Loss scaling with TF 2.4-2.15's Keras API, around a Keras 3 optimizer.

  Custom loop, as written for TF 2.4-2.15:

  ```python
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_fn())
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))
  ```

  Which gradients each apply takes: `shared/protocols.py`. A fixed scale
  (`dynamic=False`) applies every step, even a non-finite one, as TF
  2.4-2.15's did. Config and checkpoint layout are Keras's (tf_keras's are
  read too).
  """

  # As tf_keras's class: on a step of unscaled gradients the inner optimizer
  # clips and applies their sums; on others, a finite sum is applied, as by
  # Keras's class, whose name this class takes after `install()`.
  _INNER_GETS_SUMS = True
  _DECIDES_ON_SUMS = True
  _FORM = guards.MIXED_PRECISION_FORM
  # Whether the class is Keras's until a TF 2.4-2.15 call (module docstring).
  _KERAS_CLASS_UNTIL_TF24_CALL = False

  def __init__(self, inner_optimizer: keras.optimizers.Optimizer,
               *args: Any, dynamic: Any = _UNSET,
               initial_scale: Optional[float] = None,
               dynamic_growth_steps: Optional[int] = None,
               name: Optional[str] = None, **kwargs: Any):
    """Wraps `inner_optimizer`.

    TF 2.4-2.15's form, `(inner, dynamic=True, initial_scale=None,
    dynamic_growth_steps=None)`, and Keras 3's, `(inner, initial_scale,
    dynamic_growth_steps)` (where `compat.install()` puts this class): a
    positional number after `inner_optimizer` is `initial_scale`, a
    positional bool `dynamic`.

    Args:
      inner_optimizer: The Keras 3 optimizer that applies the gradients.
      *args: The arguments below, in either form's order.
      dynamic: Whether the scale adapts or stays `initial_scale`; given,
        TF 2.4-2.15's behaviour follows (module docstring).
      initial_scale: The first scale, a finite positive number: 2**15 by
        default when `dynamic`, required otherwise.
      dynamic_growth_steps: Finite steps in a row after which a dynamic
        scale doubles: 2000 by default; None when not `dynamic`.
      name: The optimizer's name.
      **kwargs: The base optimizer arguments, only at their defaults.

    Raises:
      TypeError: If `dynamic` is not a bool, an argument is given twice or
        there are too many, or as the Keras 3 form.
      ValueError: For `dynamic=False` without `initial_scale` or with
        `dynamic_growth_steps`, or as the Keras 3 form.
    """
    named = {'dynamic': dynamic, 'initial_scale': initial_scale,
             'dynamic_growth_steps': dynamic_growth_steps}
    order = ('initial_scale', 'dynamic_growth_steps')  # Keras 3's.
    if args and not _is_number(args[0]):
      order = ('dynamic',) + order  # TF 2.4-2.15's (a bool, or refused).
    if len(args) > len(order):
      raise TypeError(
          f'LossScaleOptimizer() takes at most {len(order)} positional '
          f'arguments after inner_optimizer here, but got {len(args)}: '
          f'{args!r}. Pass them by name (dynamic=, initial_scale=, '
          'dynamic_growth_steps=).')
    for key, value in zip(order, args):
      if named[key] not in (None, _UNSET):
        raise TypeError(
            f'LossScaleOptimizer() got multiple values for argument {key!r}: '
            f'{value!r} by position and {named[key]!r} by name.')
      named[key] = value
    dynamic, initial_scale, dynamic_growth_steps = (
        named['dynamic'], named['initial_scale'],
        named['dynamic_growth_steps'])
    # Set past Keras's attribute tracking, before anything reads the mode.
    object.__setattr__(self, '_tf_keras_call', (
        not self._KERAS_CLASS_UNTIL_TF24_CALL or dynamic is not _UNSET))
    if dynamic is _UNSET:
      dynamic = True
    if not isinstance(dynamic, bool):
      raise TypeError(
          '"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, '
          f'but got: {dynamic!r}. (Keras 3\'s form takes the initial scale '
          'as the second positional argument, or as initial_scale=; the TF '
          '2.0-2.3 form took a loss scale there: use tf_loss_scale.keras.'
          'experimental.LossScaleOptimizer for that.)')
    if not dynamic and initial_scale is None:
      raise ValueError(
          '"initial_scale" must be specified if "dynamic" is False: it is the '
          'fixed loss scale (TF 2.4-2.15\'s form). Keras 3\'s '
          'LossScaleOptimizer no longer supports `dynamic=False`: there, '
          'set `loss_scale_factor` directly on the `inner_optimizer` instead.')
    if not dynamic and dynamic_growth_steps is not None:
      raise ValueError(
          '"dynamic_growth_steps" must be None if "dynamic" is False, but '
          f'got: {dynamic_growth_steps!r} (a fixed scale never grows).')
    if tf.is_tensor(initial_scale) or _is_number(initial_scale):
      initial_scale = float(initial_scale)  # As tf_keras's class keeps it.
    # Forwarded once constructed and following tf_keras (Keras's `__init__`
    # sets its own defaults).
    forwarded, flags = _forwarding(inner_optimizer)
    object.__setattr__(self, '_forwarded', forwarded)
    object.__setattr__(self, '_flags', flags)
    # Set past Keras's attribute tracking, before Keras's `__init__` sets
    # `dynamic_growth_steps`.
    object.__setattr__(self, '_dynamic', dynamic)
    super().__init__(
        inner_optimizer,
        _INITIAL_SCALE if initial_scale is None else initial_scale,
        (_GROWTH_STEPS if dynamic_growth_steps is None else
         dynamic_growth_steps), name=name, **kwargs)
    self._start_reading_tf_keras()
    if self._follows_tf_keras():
      self._make_scale_variables()
    object.__setattr__(self, '_constructed', True)

  # ---- the forwarding rule (module docstring) ------------------------------

  def __getattribute__(self, name: str) -> Any:
    own = object.__getattribute__(self, '__dict__')
    if (name in own.get('_forwarded', ()) and own.get('_constructed') and
        own['_tf_keras_call'] and not own.get('_own_settings')):
      return getattr(own['inner_optimizer'], _ALIASES.get(name, name))
    return object.__getattribute__(self, name)

  def __setattr__(self, name: str, value: Any) -> None:
    own = self.__dict__
    if not own.get('_constructed') or not own['_tf_keras_call']:
      super().__setattr__(name, value)
      return
    if name in own['_forwarded']:
      setattr(own['inner_optimizer'], _ALIASES.get(name, name), value)
      return
    if name in own['_flags']:
      logging.warning(
          '%s.%s = %r is set on the wrapper, where nothing reads it (as on '
          'tf_keras\'s class): the inner optimizer keeps %s=%r. Set '
          'inner_optimizer.%s to change its steps.', type(self).__name__,
          name, value, name, getattr(own['inner_optimizer'], name, None),
          name)
    if name == 'loss_scale_factor' and value is not None:
      raise ValueError(
          f'{type(self).__name__}.loss_scale_factor cannot be set to '
          f'{value!r}: the wrapper scales the loss itself (with the dynamic '
          'scale, or initial_scale when dynamic=False), and a factor would '
          'scale it twice. Construct the wrapper with dynamic=False and '
          f'initial_scale={value!r} for a fixed scale.')
    super().__setattr__(name, value)

  @contextlib.contextmanager
  def _wrapper_settings(self):
    """Within: forwarded names read the wrapper's own (default) values.

    So that Keras's `build` on the wrapper copies no model for an EMA.
    """
    object.__setattr__(self, '_own_settings', True)
    try:
      yield
    finally:
      object.__setattr__(self, '_own_settings', False)

  def _make_scale_variables(self) -> None:
    """Makes Keras's two variables of the scale now, as the Keras 3 form.

    tf_keras's class has them from its construction, so that a checkpoint
    restores them before the first step; they also stand for tf_keras's
    `loss_scale` node.
    """
    super()._make_scale_variables()
    self._read_tf_keras_scale_into()

  def build(self, var_list: Any) -> None:
    """Creates the variables, as `tf_loss_scale.keras.LossScaleOptimizer`."""
    with self._wrapper_settings():
      super().build(var_list)
    self._read_tf_keras_scale_into()
    self._restore_left_for_inner()

  def set_weights(self, weights: Iterable[Any]) -> None:
    """Sets the variables from their values, as `tf2_members.Keras3Members`.

    Unbuilt, it makes the scale's two variables first, so that values of a
    built wrapper's `variables` (an HDF5 file's) go each to its variable.
    """
    weights = list(weights)
    if (not self.built and self._dynamic and
        len(weights) > len(self.variables)):
      self._make_scale_variables()
    super().set_weights(weights)

  # ---- whose behaviour (module docstring) ------------------------------

  def _follows_tf_keras(self) -> bool:
    return self.__dict__.get('_tf_keras_call', False)

  _follows_tensorflow = _follows_tf_keras

  def _called(self, method: str) -> None:
    super()._called(method)
    if method != 'scale_loss':
      # `get_scaled_loss` or `get_unscaled_gradients` (`compute_gradients`
      # and `minimize` call the first): tf_keras's behaviour from now on.
      self._follow_tf_keras()

  def _follow_tf_keras(self) -> None:
    """TF 2.4-2.15's behaviour from now on (module docstring)."""
    object.__setattr__(self, '_tf_keras_call', True)
    # As tf_keras's class, whose scale is a variable from construction: a
    # restore under way finds them, a trace under way reads them.
    self._make_scale_variables()

  def _wraps_exclusively(self) -> bool:
    # Keras's class lets two wrappers hold one optimizer; tf_keras's did not.
    return self._follows_tf_keras()

  def _scale_floor(self) -> Optional[float]:
    # tf_keras's dynamic scale stops at 1; Keras's, and a fixed scale (which
    # may be below 1, as TF 2.4-2.15's), have no floor.
    if self._dynamic and self._follows_tf_keras():
      return super()._scale_floor()
    return None

  dynamic = property(lambda self: self._dynamic,
                     doc='Whether the loss scale is dynamic.')

  @property
  def dynamic_growth_steps(self) -> Optional[int]:
    """Finite steps after which a dynamic scale doubles; None when fixed."""
    return self._growth_steps if self._dynamic else None

  @dynamic_growth_steps.setter
  def dynamic_growth_steps(self, value: int) -> None:
    self._growth_steps = value

  @property
  def iterations(self) -> Any:
    """The inner optimizer's step count: Keras's variable, or tf_keras's.

    Its `tf.Variable` once TF 2.4-2.15's behaviour is asked for; before,
    Keras's class's answer (on Keras before 3.9, a counter of its own that
    stays at 0: Keras's bug, kept so that `install()` changes nothing).
    """
    if self._follows_tf_keras():
      return keras3_support.tf_variable(self.inner_optimizer.iterations)
    if not keras3_support.CLASS_COUNTS_INNER_STEPS:
      # Keras's constructor set it (before Keras 3.5), or keeps it as
      # `_iterations` behind a property (3.5 to 3.8).
      own = self.__dict__.get('_own_step_count')
      return self._iterations if own is None else own
    return self.inner_optimizer.iterations

  @iterations.setter
  def iterations(self, variable: Any) -> None:
    if not getattr(self, '_constructed', False):
      # Keras's constructor makes a counter of its own, tracked in
      # `variables` (and, before 3.9, saved as `iterations`).
      object.__setattr__(self, '_own_step_count', variable)
      return
    raise AttributeError(
        f'{type(self).__name__}.iterations cannot be replaced by '
        f'{variable!r}: the Keras 3 optimizer it wraps owns its step count '
        '(tf_keras let the global step stand in for it). Assign a value '
        'instead (optimizer.iterations.assign(step)), and where summaries '
        'need the step, use optimizer.iterations '
        '(tf.summary.experimental.set_step(optimizer.iterations)).')

  @property
  def dynamic_counter(self) -> Optional[tf.Variable]:
    """Finite steps since the scale last changed; None if fixed."""
    if not self._dynamic:
      return None
    self._make_scale_variables()  # tf_keras's has it from construction.
    return keras3_support.tf_variable(self.step_counter)

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      skip_gradients_aggregation: bool = False,
                      **kwargs: Any) -> Any:
    """Applies the gradients if they are all finite; moves the scale.

    Call it in a replica context. Which gradients it takes:
    `shared/protocols.py`; sums across replicas are applied exactly.

    Args:
      grads_and_vars: `(gradient, variable)` pairs.
      name: A name for the step's ops.
      skip_gradients_aggregation: Whether the gradients are already summed
        across replicas (TF 2.11-2.15).
      **kwargs: `experimental_aggregate_gradients`: False when they are
        (TF 2.4-2.10).

    Returns:
      The inner optimizer's `iterations`.

    Raises:
      TypeError: For another keyword argument.
      ValueError: As `apply`.
    """
    aggregate = kwargs.pop('experimental_aggregate_gradients', True)
    if kwargs:
      raise TypeError(
          f'apply_gradients() got unexpected keyword arguments '
          f'{sorted(kwargs)}: it takes name, skip_gradients_aggregation and '
          'experimental_aggregate_gradients.')
    pairs = list(grads_and_vars)
    with contextlib.nullcontext() if name is None else tf.name_scope(name):
      self._apply([g for g, _ in pairs], [v for _, v in pairs],
                  summed=skip_gradients_aggregation or not aggregate,
                  method=None)
    return self.iterations

  def compute_gradients(self, loss: Any, var_list: Any,
                        tape: Optional[tf.GradientTape] = None
                       ) -> List[Tuple[Any, Any]]:
    """Gradients of `loss`, computed on the scaled loss and then unscaled.

    Args:
      loss: A zero-argument callable returning the loss, or a loss tensor
        computed under `tape`.
      var_list: The variables, or a zero-argument callable returning them
        (called after `loss`, which may create them).
      tape: The `tf.GradientTape` that recorded a tensor `loss` (not
        recording when this is called); a new one for a callable `loss`.

    Returns:
      `(unscaled gradient, variable)` pairs, one per variable (None where
      the loss does not depend on it).

    Raises:
      ValueError: If `loss` is a tensor and `tape` is None.
    """
    if tape is None:
      if not callable(loss):
        raise ValueError(
            f'compute_gradients() got a loss tensor ({loss!r}) and tape=None: '
            'pass the tf.GradientTape that computed the loss as tape=, or '
            'pass the loss as a zero-argument callable.')
      tape = tf.GradientTape()
    with tape:
      if callable(loss) and not callable(var_list):
        # As tf_keras: variables that are not trainable get gradients too.
        # (A Keras variable holds its tf.Variable; on Keras 3.3 a model's
        # are not instances of `keras.Variable`.)
        tape.watch([keras3_support.tf_variable(v) for v in var_list])
      scaled_loss = self.get_scaled_loss(loss)
      if callable(scaled_loss):
        scaled_loss = scaled_loss()
      if callable(var_list):
        var_list = var_list()
    var_list = list(var_list)
    grads = tape.gradient(scaled_loss, var_list)
    return list(zip(self.get_unscaled_gradients(grads), var_list))

  def minimize(self, loss: Any, var_list: Any,
               grad_loss: Optional[tf.Tensor] = None,
               name: Optional[str] = None,
               tape: Optional[tf.GradientTape] = None) -> Any:
    """One step on `loss`: `compute_gradients`, then `apply_gradients`.

    Args:
      loss, var_list, tape: As `compute_gradients`.
      grad_loss: The gradient of the objective with respect to `loss`; a
        `tf.GradientTape` here is TF 2.11-2.15's `tape`.
      name: As `apply_gradients`.

    Returns:
      What `apply_gradients` returns.

    Raises:
      As `compute_gradients` and `apply_gradients`.
    """
    if isinstance(grad_loss, tf.GradientTape):
      grad_loss, tape = None, grad_loss
    if grad_loss is not None:
      loss = _weighted_by(loss, grad_loss, tape)
    return self.apply_gradients(self.compute_gradients(loss, var_list, tape),
                                name=name)

  def aggregate_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]]
                         ) -> List[Tuple[Any, Any]]:
    """TF 2.11-2.15's: the pairs with gradients summed across replicas.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, in a replica context.

    Returns:
      The pairs, each gradient summed across replicas.
    """
    pairs = list(grads_and_vars)
    sums = distribute.all_reduce_in_replica([g for g, _ in pairs])
    return list(zip(sums, [v for _, v in pairs]))

  def add_variable_from_reference(
      self, reference_variable: Any = None, name: Optional[str] = None,
      initializer: Any = 'zeros', *, model_variable: Any = None,
      variable_name: Optional[str] = None, shape: Any = None,
      initial_value: Any = None) -> Any:
    """Keras's, also under TF 2.11-2.15's parameter names.

    Args:
      reference_variable, model_variable: The model variable the new one is
        shaped after (Keras's name, TF 2.11-2.15's).
      name, variable_name: The new variable's name (likewise).
      initializer: A Keras initializer or its name.
      shape: A shape other than the reference variable's (TF 2.11-2.15).
      initial_value: The first value, instead of `initializer`.

    Returns:
      The new variable, the wrapper's, named after the reference variable.

    Raises:
      TypeError: If a value is given under both of its names.
    """
    for keras_name, keras_value, tf_name, tf_value in (
        ('reference_variable', reference_variable, 'model_variable',
         model_variable),
        ('name', name, 'variable_name', variable_name)):
      if keras_value is not None and tf_value is not None:
        raise TypeError(
            f'add_variable_from_reference() got both {keras_name}= and '
            f'{tf_name}=, two names for one argument: pass one.')
    reference = (reference_variable if model_variable is None else
                 model_variable)
    name = name if variable_name is None else variable_name
    if initial_value is not None:
      value = initial_value
      initializer = lambda shape, dtype: tf.cast(value, dtype)
    if shape is None:
      return super().add_variable_from_reference(reference, name,
                                                 initializer)
    return self.add_variable(
        shape=shape, initializer=initializer, dtype=reference.dtype,
        name=f'{reference.path.replace("/", "_")}_{name or "var"}')

  @property
  def decay(self) -> Any:
    """TF 2.4-2.10's learning rate decay: 0 (Keras 3 has none).

    The inner optimizer's `decay` if it has one; otherwise a float32 zero,
    as a Keras 2 optimizer built without `decay` held.
    """
    inner = self.inner_optimizer
    return inner.decay if hasattr(inner, 'decay') else tf.constant(0.0)

  @decay.setter
  def decay(self, value: Any) -> None:
    inner = self.inner_optimizer
    if hasattr(inner, 'decay'):
      inner.decay = value
      return
    if float(value) != 0.0:
      raise ValueError(
          f'{type(self).__name__}.decay = {value!r}: Keras 3 optimizers have '
          'no decay. Give the inner optimizer a schedule instead: '
          'learning_rate=keras.optimizers.schedules.InverseTimeDecay('
          'initial_learning_rate, decay_steps=1, decay_rate=decay) decays as '
          'Keras 2\'s decay did.')

  def _on_skipped_step(self, given_unscaled: bool) -> Any:
    # TF 2.4-2.15's custom loops: `iterations` counts skipped steps too.
    # Keras 3's protocol (`fit`) counts them as Keras's class: not at all.
    if given_unscaled:
      return keras3_support.count_skipped_step(self.inner_optimizer)
    return None

  loss_scale = property(
      lambda self: self._current_scale(),
      doc='The current loss scale, a float32 scalar tensor.')

  def _scale_state(self, scale: Optional[tf.Tensor] = None,
                   counter: Optional[tf.Tensor] = None) -> step.ScaleState:
    if self._dynamic:
      return super()._scale_state(scale, counter)
    return _FixedScale(self._current_scale() if scale is None else scale,
                       None if scale is None else (scale, counter))

  def get_config(self) -> Dict[str, Any]:
    """Keras's config (with `name`), so that Keras loads it without us.

    A fixed scale adds `dynamic: False`, which Keras's class refuses, as it
    refuses a fixed scale.
    """
    # The wrapper's own settings (the defaults), not the forwarded ones: the
    # inner optimizer's are in its own config.
    with self._wrapper_settings():
      config = super().get_config()
    if not self._dynamic:
      config['dynamic'] = False
    return config

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer (without its state) from a config.

    Args:
      config: `get_config()` of this class, Keras's or tf_keras's.
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new, unbuilt `LossScaleOptimizer`.

    Raises:
      ValueError: For a base optimizer setting not at its default.
    """
    config = dict(config)
    inner = config.pop('inner_optimizer')
    if isinstance(inner, dict):
      inner = keras.optimizers.deserialize(_as_keras3_config(inner),
                                           custom_objects=custom_objects)
    own = {name: config.pop(name) for name in _OWN_CONFIG if name in config}
    # Keras's config holds the base optimizer's settings at their defaults.
    keras3._without_base_optimizer_defaults(  # pylint: disable=protected-access
        cls.__name__, config)
    return cls(inner, **own)


def _as_keras3_config(inner: Dict[str, Any]) -> Dict[str, Any]:
  """A serialized optimizer of tf_keras's, as Keras 3 deserializes it.

  Less the settings Keras 3 does not take; a schedule's `name` of None
  (tf_keras's default) is left to Keras 3's default, a string.
  """
  config = {k: v for k, v in inner.get('config', {}).items()
            if k not in _KERAS2_ONLY_SETTINGS}
  schedule = config.get('learning_rate')
  if isinstance(schedule, dict) and isinstance(schedule.get('config'), dict):
    config['learning_rate'] = dict(schedule, config={
        k: v for k, v in schedule['config'].items()
        if not (k == 'name' and v is None)})
  return dict(inner, config=config)


def _forwarding(inner: keras.optimizers.Optimizer
               ) -> Tuple[frozenset, frozenset]:
  """The names the rule forwards (module docstring), and the flags it keeps."""
  settings, flags = tf2_members.settings_of(inner)
  flags -= {'use_ema'}
  return (settings - flags - _NOT_FORWARDED | frozenset(_ALIASES), flags)


def _weighted_by(loss: Any, grad_loss: Any,
                 tape: Optional[tf.GradientTape]) -> Any:
  """A loss whose gradients are those of `loss` weighted by `grad_loss`.

  The gradients of `sum(loss * grad_loss)` (with `grad_loss` held constant)
  are `tape.gradient(loss, variables, output_gradients=grad_loss)`.
  """
  def weighted(value: Any) -> Any:
    weight = tf.stop_gradient(tf.cast(grad_loss, value.dtype))
    return tf.reduce_sum(value * weight)
  if callable(loss):
    return lambda: weighted(loss())
  if tape is None:
    return loss  # `compute_gradients` refuses it, in its words.
  with tape:
    return weighted(loss)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


class _FixedScale(step.ScaleState):
  """A fixed scale for the step: every step is applied, nothing moves."""

  def __init__(self, scale: tf.Tensor, values: Optional[Any]):
    self._scale, self._values = scale, values

  def scale(self) -> tf.Tensor:
    return self._scale

  def decide(self, grads: Any, all_finite: Any) -> step.Decision:
    return step.Decision(True)

  def advance(self, verdict: Any, after: Any) -> Any:
    return self._values  # Stateless: the values given, unchanged.
