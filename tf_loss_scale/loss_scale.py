"""The loss scale: its state, its one update rule, and its (de)serialization.

A `LossScale` is called to read the current scale and updated once per step
with that step's gradients. `DynamicLossScale` is a small state machine:

```
on each step, given whether every gradient on every replica is finite:
  if finite:
    if good_steps + 1 >= increment_period:
      scale = scale * multiplier, unless that overflows to inf
      good_steps = 0
    else:
      good_steps = good_steps + 1
  else:                      # the step is skipped
    scale = max(scale / multiplier, 1)
    good_steps = 0
```

`next_dynamic_state` is that block as a pure tensor function. The stateful
`DynamicLossScale.update` assigns its result; stateless front ends (Keras 3's
`stateless_apply`) return it. Nothing else changes the scale.
"""

import abc
import math
import numbers
from typing import Any, Dict, Optional, Tuple, Union

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution

_FLOAT32_MAX = float(tf.float32.max)

UpdateResult = Tuple[Optional[tf.Operation], Union[bool, tf.Tensor]]


def next_dynamic_state(scale: tf.Tensor, good_steps: tf.Tensor,
                       grads_finite: tf.Tensor, increment_period: int,
                       multiplier: float) -> Tuple[tf.Tensor, tf.Tensor]:
  """Computes the dynamic loss scale's state after one step.

  Args:
    scale: The current loss scale, a float32 scalar.
    good_steps: Finite steps since the last change of scale, an int64 scalar.
    grads_finite: Whether this step's gradients were all finite, a bool scalar.
    increment_period: Finite steps in a row after which the scale grows.
    multiplier: The factor the scale grows and shrinks by.

  Returns:
    `(new_scale, new_good_steps)`, tensors of the same dtypes as the inputs.
  """
  good_steps = tf.cast(good_steps, tf.int64)
  period_reached = good_steps + 1 >= increment_period
  grown = scale * multiplier
  finite_scale = tf.where(
      tf.logical_and(period_reached, tf.math.is_finite(grown)), grown, scale)
  finite_steps = tf.where(period_reached, tf.constant(0, tf.int64),
                          good_steps + 1)
  shrunk = tf.maximum(scale / multiplier, 1.0)
  return (tf.where(grads_finite, finite_scale, shrunk),
          tf.where(grads_finite, finite_steps, tf.constant(0, tf.int64)))


class LossScale(tf.Module, metaclass=abc.ABCMeta):
  """The loss scale used by a mixed precision optimizer (abstract).

  Calling a loss scale returns its current value as a scalar float32 tensor.
  `update(grads)` is given each step's unscaled gradients and tells the caller
  whether to apply them. Use `FixedLossScale`, `DynamicLossScale`, or `get()`
  to make one. Loss scales are trackable: the state of a dynamic one is saved
  and restored by `tf.train.Checkpoint` and `tf.compat.v1.train.Saver`.
  """

  @abc.abstractmethod
  def __call__(self) -> tf.Tensor:
    """Returns the current loss scale as a scalar float32 tensor."""

  @abc.abstractmethod
  def update(self, grads: Any) -> UpdateResult:
    """Advances the loss scale by one step.

    Under a `tf.distribute` strategy, call this in the cross-replica context
    (for example from `merge_call`); the gradients of every replica are then
    taken into account.

    Args:
      grads: The step's gradients, already divided by the loss scale: one
        tensor or any nested structure. `None` entries are ignored and
        `tf.IndexedSlices` are read through their values.

    Returns:
      `(update_op, should_apply_gradients)`. In graph mode (a
      `tf.compat.v1.Session` graph or a `tf.function`), `update_op` is an op
      that performs the update when run; eagerly the update has already
      happened and `update_op` is None. `should_apply_gradients` is a bool
      scalar tensor, or the Python `True` for scales that never skip a step;
      when it is False the caller must not apply this step's gradients.
    """

  @abc.abstractmethod
  def get_config(self) -> Dict[str, Any]:
    """Returns the constructor arguments that recreate this loss scale."""

  @classmethod
  def from_config(cls, config: Dict[str, Any]) -> 'LossScale':
    """Creates a loss scale from the output of `get_config`.

    Args:
      config: A dict of constructor arguments.

    Returns:
      A new loss scale of this class.
    """
    return cls(**config)


class FixedLossScale(LossScale):
  """A loss scale that never changes and never skips a step.

  Example:

  >>> scale = FixedLossScale(128)
  >>> float(scale())
  128.0
  """

  def __init__(self, loss_scale_value: float):
    """Creates a fixed loss scale.

    Args:
      loss_scale_value: The scale, a finite Python or NumPy number of at
        least 1. Too small a value lets float16 gradients underflow; too large
        a value makes them overflow, which a fixed scale cannot recover from.

    Raises:
      TypeError: If `loss_scale_value` is not a real number.
      ValueError: If `loss_scale_value` is below 1, NaN or infinite.
    """
    super().__init__(name='fixed_loss_scale')
    value = _real_number('loss_scale_value', loss_scale_value)
    if not math.isfinite(value) or not 1 <= value <= _FLOAT32_MAX:
      raise ValueError(
          'loss_scale_value must be a finite number of at least 1 that fits in '
          f'float32, but got {loss_scale_value!r}.')
    self._loss_scale_value = value

  @property
  def loss_scale_value(self) -> float:
    """The fixed scale, a Python float."""
    return self._loss_scale_value

  def __call__(self) -> tf.Tensor:
    return tf.constant(self._loss_scale_value, tf.float32)

  def update(self, grads: Any) -> UpdateResult:
    """Does nothing: a fixed scale applies every step.

    Args:
      grads: Ignored.

    Returns:
      `(no_op, True)` in graph mode, `(None, True)` eagerly.
    """
    del grads
    return execution.op_in_graph_mode(tf.no_op), True

  def __repr__(self) -> str:
    return f'FixedLossScale({self._loss_scale_value})'

  def get_config(self) -> Dict[str, Any]:
    return {'loss_scale_value': self._loss_scale_value}


class DynamicLossScale(LossScale):
  """A loss scale that shrinks on overflow and grows while gradients are finite.

  The scale starts at `initial_loss_scale`. A step with any non-finite
  gradient is skipped and divides the scale by `multiplier` (never below 1).
  After `increment_period` finite steps in a row the scale is multiplied by
  `multiplier`, unless that would overflow float32.

  The state lives in two non-trainable variables, `current_loss_scale`
  (float32) and `good_steps` (int64), named as in TensorFlow's own class so
  that checkpoints interchange with it.

  Example:

  >>> scale = DynamicLossScale(initial_loss_scale=1, increment_period=2)
  >>> for _ in range(3):
  ...   _ = scale.update([tf.constant(1.0)])
  >>> float(scale())
  2.0
  """

  def __init__(self,
               initial_loss_scale: float = 2**15,
               increment_period: int = 2000,
               multiplier: float = 2.0):
    """Creates a dynamic loss scale and its two variables.

    Create it inside `strategy.scope()` when training under a
    `tf.distribute` strategy, so that its variables are mirrored.

    Args:
      initial_loss_scale: The first scale, a finite positive number. Starting
        high costs a few skipped steps; starting low costs many steps of lost
        precision, so the default is 2**15.
      increment_period: How many finite steps in a row make the scale grow, an
        integer of at least 1.
      multiplier: The factor by which the scale grows and shrinks, a finite
        number above 1.

    Raises:
      TypeError: If an argument is not a number (or not an integer, for
        `increment_period`).
      ValueError: If an argument is out of its range.
    """
    super().__init__(name='dynamic_loss_scale')
    initial = _real_number('initial_loss_scale', initial_loss_scale)
    if not math.isfinite(initial) or not 0 < initial <= _FLOAT32_MAX:
      raise ValueError(
          'initial_loss_scale must be a finite positive number that fits in '
          f'float32, but got {initial_loss_scale!r}.')
    period = _whole_number('increment_period', increment_period)
    # The good-step count it is compared with is an int64 variable.
    if not 1 <= period <= tf.int64.max:
      raise ValueError(
          'increment_period must be an integer from 1 to 2**63 - 1, but got '
          f'{increment_period!r}.')
    factor = _real_number('multiplier', multiplier)
    if not math.isfinite(factor) or factor <= 1:
      raise ValueError(
          f'multiplier must be a finite number above 1, but got {multiplier!r}.')
    self._initial_loss_scale = initial
    self._increment_period = period
    self._multiplier = factor
    self.current_loss_scale = _state_variable('current_loss_scale', initial,
                                              tf.float32)
    self.good_steps = _state_variable('good_steps', 0, tf.int64)
    # Held by a plain object so that it is neither a checkpoint dependency nor
    # in `variables`: checkpoints keep TensorFlow's layout and interchange.
    self._skip_counter = _SkipCounter()

  @property
  def initial_loss_scale(self) -> float:
    """The scale the loss scale started at, a Python float."""
    return self._initial_loss_scale

  @property
  def increment_period(self) -> int:
    """Finite steps in a row after which the scale grows, a Python int."""
    return self._increment_period

  @property
  def multiplier(self) -> float:
    """The growth and shrink factor, a Python float."""
    return self._multiplier

  @property
  def skipped_steps(self) -> tf.Tensor:
    """Steps skipped so far, counted by the state machine (int64 tensor).

    The count is for monitoring only and is not saved in checkpoints, so it
    starts at 0 in each process (in a TF1 graph, when the session initialises
    local variables; it reads 0 before that).
    """
    return self._skip_counter.read()

  def _trackable_children(self, save_type='checkpoint', **kwargs):
    # A SavedModel must track every variable its functions capture, the skip
    # counter included; checkpoints must not see it, or they would stop
    # interchanging with TensorFlow's own DynamicLossScale.
    children = super()._trackable_children(save_type, **kwargs)
    if getattr(save_type, 'value', save_type) == 'savedmodel':
      children['skipped_steps'] = self._skip_counter.variable
    return children

  def __call__(self) -> tf.Tensor:
    return tf.convert_to_tensor(self.current_loss_scale)

  def update(self, grads: Any) -> UpdateResult:
    """Advances the state machine by one step; see `LossScale.update`.

    Args:
      grads: The step's unscaled gradients (any nested structure).

    Returns:
      `(update_op, should_apply_gradients)` as described in
      `LossScale.update`; `should_apply_gradients` is a bool tensor.

    Raises:
      RuntimeError: If called inside a replica context of a strategy.
    """
    grads_finite = distribute.all_finite_on_every_replica(grads)
    return self.assign_next_state(grads_finite), grads_finite

  def assign_next_state(self, grads_finite: tf.Tensor) -> Optional[tf.Operation]:
    """Moves the state machine one step, given the step's finite verdict.

    Front ends that have already decided finiteness (once, for all replicas)
    call this instead of `update` so that the gradients are not read twice.

    Args:
      grads_finite: A bool scalar tensor, the same on every replica.

    Returns:
      The update op in graph mode, None eagerly (the update has happened).
    """
    new_scale, new_good_steps = next_dynamic_state(
        self.current_loss_scale, self.good_steps, grads_finite,
        self._increment_period, self._multiplier)
    return execution.op_in_graph_mode(lambda: tf.group(
        self.current_loss_scale.assign(new_scale),
        self.good_steps.assign(new_good_steps),
        self._skip_counter.add(tf.logical_not(grads_finite))))

  def __repr__(self) -> str:
    arguments = (f'initial_loss_scale={self._initial_loss_scale}, '
                 f'increment_period={self._increment_period}, '
                 f'multiplier={self._multiplier}')
    if tf.executing_eagerly():
      return (f'DynamicLossScale(current_loss_scale='
              f'{self.current_loss_scale.numpy()}, num_good_steps='
              f'{self.good_steps.numpy()}, {arguments})')
    return f'DynamicLossScale({arguments})'

  def get_config(self) -> Dict[str, Any]:
    return {
        'initial_loss_scale': self._initial_loss_scale,
        'increment_period': self._increment_period,
        'multiplier': self._multiplier,
    }


_CLASSES_BY_NAME = {
    'FixedLossScale': FixedLossScale,
    'DynamicLossScale': DynamicLossScale,
}

Identifier = Union[None, str, float, int, LossScale]


def get(identifier: Identifier) -> Optional[LossScale]:
  """Turns a loss scale identifier into a `LossScale`.

  Args:
    identifier: A number (a `FixedLossScale` of that value), the string
      `'dynamic'` (a `DynamicLossScale` with its defaults), a `LossScale`
      (returned as it is), or None (returned as None).

  Returns:
    A `LossScale`, or None.

  Raises:
    ValueError: For any other identifier.
  """
  if isinstance(identifier, numbers.Real) and not isinstance(identifier, bool):
    return FixedLossScale(identifier)
  if isinstance(identifier, str) and identifier == 'dynamic':
    return DynamicLossScale()
  if identifier is None or isinstance(identifier, LossScale):
    return identifier
  raise ValueError(
      f'Could not interpret loss scale identifier {identifier!r}: use a '
      "number, 'dynamic', a LossScale or None.")


def serialize(loss_scale: LossScale) -> Dict[str, Any]:
  """Describes a loss scale as `{'class_name': ..., 'config': ...}`.

  Args:
    loss_scale: A `FixedLossScale` or `DynamicLossScale`.

  Returns:
    A dict that `deserialize` turns back into an equal loss scale.

  Raises:
    TypeError: If `loss_scale` is not one of this library's loss scales.
  """
  class_name = type(loss_scale).__name__
  if _CLASSES_BY_NAME.get(class_name) is not type(loss_scale):
    raise TypeError(
        'serialize() takes a FixedLossScale or DynamicLossScale, but got '
        f'{loss_scale!r} of type {type(loss_scale).__name__}.')
  return {'class_name': class_name, 'config': loss_scale.get_config()}


def deserialize(config: Dict[str, Any]) -> LossScale:
  """Recreates a loss scale from the output of `serialize`.

  Only this library's own classes are accepted, so a config can never make
  it import or build anything else.

  Args:
    config: A dict with keys `'class_name'` and `'config'`.

  Returns:
    A new loss scale.

  Raises:
    ValueError: If `config` is not such a dict or names another class.
  """
  if not isinstance(config, dict) or set(config) != {'class_name', 'config'}:
    raise ValueError(
        "deserialize() takes a dict with keys 'class_name' and 'config', "
        f'but got {config!r}.')
  loss_scale_class = _CLASSES_BY_NAME.get(config['class_name'])
  if loss_scale_class is None:
    raise ValueError(
        f"Unknown loss scale class_name {config['class_name']!r}: expected one "
        f'of {sorted(_CLASSES_BY_NAME)}.')
  return loss_scale_class.from_config(config['config'])


def _state_variable(name: str, initial_value: Any, dtype: tf.DType) -> tf.Variable:
  return tf.Variable(
      initial_value,
      name=name,
      dtype=dtype,
      trainable=False,
      synchronization=tf.VariableSynchronization.AUTO,
      aggregation=tf.VariableAggregation.NONE)


class _SkipCounter:
  """An int64 count of skipped steps that no checkpoint or Saver sees.

  In a TF1 graph the variable is a local variable: a default `Saver()` saves
  only global ones, and `MonitoredTrainingSession` initialises it. Sessions
  that initialise only global variables still run: an uninitialised counter
  is set rather than incremented, and reads as 0.
  """

  def __init__(self):
    if execution.in_tf1_graph():
      self.variable = tf.compat.v1.Variable(
          0, name='skipped_steps', dtype=tf.int64, trainable=False,
          collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
          use_resource=True, synchronization=tf.VariableSynchronization.AUTO,
          aggregation=tf.VariableAggregation.NONE)
    else:
      self.variable = _state_variable('skipped_steps', 0, tf.int64)

  def add(self, skipped: tf.Tensor) -> Any:
    increment = tf.cast(skipped, tf.int64)
    if execution.in_tf1_graph():
      return tf.cond(self._initialized(),
                     lambda: self.variable.assign_add(increment),
                     lambda: self.variable.assign(increment))
    return self.variable.assign_add(increment)

  def read(self) -> tf.Tensor:
    if execution.in_tf1_graph():
      return tf.cond(self._initialized(), lambda: tf.identity(self.variable),
                     lambda: tf.constant(0, tf.int64))
    return tf.identity(self.variable)

  def _initialized(self) -> tf.Tensor:
    return tf.compat.v1.is_variable_initialized(self.variable)


def _real_number(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(
        f'{name} must be a Python or NumPy real number, but got {value!r} of '
        f'type {type(value).__name__}.')
  return float(value)


def _whole_number(name: str, value: Any) -> int:
  number = _real_number(name, value)
  if not number.is_integer():
    raise TypeError(f'{name} must be an integer, but got {value!r}.')
  return int(number)
