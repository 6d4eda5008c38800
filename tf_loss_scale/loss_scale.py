"""The loss scale: its state, its one update rule, and its (de)serialization.

A `LossScale` is called to read the current scale and updated once per step
with that step's gradients. `DynamicLossScale` is a small state machine:

```
on each step, given whether every gradient on every replica is finite:
  if finite:
    non_finite_streak = 0
    if good_steps + 1 >= increment_period:
      scale = min(scale * multiplier, max_loss_scale), unless that is inf
      good_steps = 0
    else:
      good_steps = good_steps + 1
  else:                      # the step is skipped
    non_finite_streak = non_finite_streak + 1
    if non_finite_streak >= hysteresis:
      scale = max(scale / multiplier, min_loss_scale)
    good_steps = 0
  skips_at_floor = skips_at_floor + 1 if the step was skipped with the scale
                   already at min_loss_scale, else 0
```

With its defaults (`min_loss_scale=1`, no `max_loss_scale`, `hysteresis=1`)
this is TensorFlow's rule. Two options of the pure function give TF
1.13-1.15's `ExponentialUpdateLossScaleManager` its own rule: with
`backoff_factor` a shrink is `scale * backoff_factor`, not a division; with
`non_finite_count='accumulated'` a finite step keeps `non_finite_streak`
(then a count of skipped steps, not a streak), which only a completed
increment period or a shrink clears. `advance_dynamic_state` is that block as a pure
tensor function and `next_dynamic_state` its two-variable form. The stateful
`DynamicLossScale.assign_next_state` assigns its result; stateless front ends
(Keras 3's `stateless_apply`) return it. Nothing else changes the scale.
"""

import abc
import math
import numbers
import warnings
from typing import (Any, Dict, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

from absl import logging
import numpy as np
import tensorflow as tf

from tf_loss_scale import private_api
from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import step_record

_FLOAT32_MAX = float(tf.float32.max)
_INT64_MAX = int(tf.int64.max)
ON_COLLAPSE_CHOICES = ('skip', 'warn', 'raise')

UpdateResult = Tuple[Union[None, tf.Operation, tf.Tensor],
                     Union[bool, tf.Tensor]]


class LossScaleCollapseError(RuntimeError):
  """Raised eagerly on a collapse by `DynamicLossScale(on_collapse='raise')`."""


class DynamicState(NamedTuple):
  """The state of a dynamic loss scale, as scalar tensors.

  Attributes:
    scale: The current loss scale (float32).
    good_steps: Finite steps since the scale last changed (int64).
    non_finite_streak: Non-finite steps in a row (int64), for `hysteresis`.
    skips_at_floor: Steps in a row skipped with the scale already at
      `min_loss_scale` (int64), for `on_collapse`.
  """
  scale: Any
  good_steps: Any
  non_finite_streak: Any = 0
  skips_at_floor: Any = 0


def advance_dynamic_state(
    state: DynamicState, grads_finite: Union[bool, tf.Tensor], *,
    increment_period: int, multiplier: float, min_loss_scale: float = 1.0,
    max_loss_scale: Optional[float] = None, hysteresis: int = 1,
    backoff_factor: Optional[float] = None,
    non_finite_count: str = 'consecutive'
) -> DynamicState:
  """Computes a dynamic loss scale's state after one step (the rule).

  A pure function: it assigns nothing. The options up to `hysteresis` are
  `DynamicLossScale`'s; the last two serve the TF 1.13-1.15 managers
  (`tf_loss_scale.contrib.mixed_precision`).

  Args:
    state: The state before the step.
    grads_finite: Whether this step's gradients were all finite, a bool
      scalar, the same on every replica.
    backoff_factor: None to shrink by dividing by `multiplier`; else the
      factor a shrink multiplies the scale by (in the scale's dtype).
    non_finite_count: `'consecutive'`: a finite step clears
      `non_finite_streak`. `'accumulated'`: only a completed increment
      period or a shrink clears it.

  Returns:
    The state after the step: `scale` and `good_steps` in `state`'s dtypes,
    int64 counters.
  """
  scale = tf.convert_to_tensor(state.scale)
  good_steps = tf.convert_to_tensor(state.good_steps)
  counts = tf.cast(good_steps, tf.int64)
  streak = tf.cast(state.non_finite_streak, tf.int64)
  skips_at_floor = tf.cast(state.skips_at_floor, tf.int64)
  finite = _scalar_verdict(grads_finite)
  zero = tf.constant(0, tf.int64)
  floor = tf.constant(min_loss_scale, scale.dtype)

  period_reached = counts + 1 >= increment_period
  grown = scale * multiplier
  if max_loss_scale is not None:
    grown = tf.minimum(grown, tf.constant(max_loss_scale, scale.dtype))
  finite_scale = tf.where(
      tf.logical_and(period_reached, tf.math.is_finite(grown)), grown, scale)
  finite_counts = tf.where(period_reached, zero, counts + 1)

  if non_finite_count == 'consecutive':
    new_streak = tf.where(finite, zero, streak + 1)
    backs_off = new_streak >= hysteresis
  elif non_finite_count == 'accumulated':
    counted = tf.where(finite, tf.where(period_reached, zero, streak),
                       streak + 1)
    backs_off = tf.logical_and(tf.logical_not(finite), counted >= hysteresis)
    new_streak = tf.where(backs_off, zero, counted)
  else:
    raise ValueError(
        "non_finite_count must be 'consecutive' or 'accumulated', but got "
        f'{non_finite_count!r}.')
  reduced = (scale / multiplier if backoff_factor is None else
             scale * tf.convert_to_tensor(backoff_factor, scale.dtype))
  shrunk = tf.where(backs_off, tf.maximum(reduced, floor), scale)
  skipped_at_floor = tf.logical_and(tf.logical_not(finite), scale <= floor)

  return DynamicState(
      scale=tf.where(finite, finite_scale, shrunk),
      good_steps=tf.cast(tf.where(finite, finite_counts, zero),
                         good_steps.dtype),
      non_finite_streak=new_streak,
      skips_at_floor=tf.where(skipped_at_floor, skips_at_floor + 1, zero))


def next_dynamic_state(scale: tf.Tensor, good_steps: tf.Tensor,
                       grads_finite: tf.Tensor, increment_period: int,
                       multiplier: float, *, min_loss_scale: float = 1.0,
                       max_loss_scale: Optional[float] = None
                      ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Computes the scale and good-step count after one step.

  `advance_dynamic_state` for front ends that store only these two values
  (no hysteresis, no collapse detection); with the defaults, TensorFlow's
  rule. The arguments are as there; the results have the inputs' dtypes.

  Returns:
    `(new_scale, new_good_steps)`.
  """
  new_state = advance_dynamic_state(
      DynamicState(scale, good_steps), grads_finite,
      increment_period=increment_period, multiplier=multiplier,
      min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
  return new_state.scale, new_state.good_steps


class LossScale(tf.Module, metaclass=abc.ABCMeta):
  """The loss scale used by a mixed precision optimizer (abstract).

  Calling a loss scale returns its current value as a scalar float32 tensor.
  `update(grads)` is given each step's unscaled gradients and tells the caller
  whether to apply them. Use `FixedLossScale`, `DynamicLossScale`, or `get()`
  to make one. Loss scales are trackable: the state of a dynamic one is saved
  and restored by `tf.train.Checkpoint` and `tf.compat.v1.train.Saver`.
  A subclass may make its state with `_add_weight`, as TensorFlow's did.
  """

  def __init__(self, name: Optional[str] = None):
    super().__init__(name=name)
    # Past tf.Module's tracking: each weight is a dependency of its own name.
    object.__setattr__(self, '_weights', {})

  def _add_weight(self, name: str, initial_value: Any,
                  dtype: Optional[tf.DType] = None) -> tf.Variable:
    """Creates a non-trainable state variable, saved and named `name`.

    It is in `variables`, and in `_weights` under `(name, graph key)`.

    Raises:
      RuntimeError: If this loss scale has a weight `name` in this graph.
    """
    graph = (None if tf.executing_eagerly() else
             id(tf.compat.v1.get_default_graph()))
    if (name, graph) in self._weights:
      raise RuntimeError(
          f'This loss scale has a weight named {name!r} already: give each '
          'weight its own name.')
    variable = _state_variable(name, initial_value, dtype)
    self._weights[(name, graph)] = variable
    private_api.name_dependencies(self, **{name: variable})
    return variable

  @abc.abstractmethod
  def __call__(self) -> tf.Tensor:
    """Returns the current loss scale as a scalar float32 tensor."""

  @abc.abstractmethod
  def update(self, grads: Any) -> UpdateResult:
    """Advances the loss scale by one step.

    Under a `tf.distribute` strategy, call it in the cross-replica context
    (e.g. from `merge_call`), where every replica's gradients count.

    Args:
      grads: The step's unscaled gradients, any nested structure; `None`
        entries are ignored, `tf.IndexedSlices` read through their values.

    Returns:
      `(update_op, should_apply_gradients)`. Eagerly the update has happened
      and `update_op` is None. In graph mode (a `tf.compat.v1` graph or a
      `tf.function`) `update_op` performs the update when run: an op, a
      tensor (which `tf.identity` and `session.run` accept), or None for
      scales with nothing to update. `should_apply_gradients` is a bool
      scalar tensor, or `True` for scales that never skip a step; when it is
      False the caller must not apply this step's gradients.
    """

  @abc.abstractmethod
  def get_config(self) -> Dict[str, Any]:
    """Returns the constructor arguments that recreate this loss scale."""

  @classmethod
  def from_config(cls, config: Dict[str, Any]) -> 'LossScale':
    """Creates a loss scale from the output of `get_config`."""
    return cls(**config)


class FixedLossScale(LossScale):
  """A loss scale that never changes and never skips a step.

  >>> scale = FixedLossScale(128)
  >>> float(scale())
  128.0
  """

  def __init__(self, loss_scale_value: float):
    """Creates a fixed loss scale of `loss_scale_value`.

    Raises:
      TypeError: If `loss_scale_value` is not a Python or NumPy real number.
      ValueError: If `loss_scale_value` is below 1, NaN or infinite.
    """
    super().__init__(name='fixed_loss_scale')
    self._loss_scale_value, _ = check_scale_arguments(
        loss_scale_value, names=('loss_scale_value',), floor=1.0)

  @property
  def loss_scale_value(self) -> float:
    """The fixed scale, a Python float."""
    return self._loss_scale_value

  def __call__(self) -> tf.Tensor:
    return tf.constant(self._loss_scale_value, tf.float32)

  def update(self, grads: Any) -> UpdateResult:
    """Does nothing: returns `(no_op, True)`, eagerly `(None, True)`."""
    del grads
    return execution.op_in_graph_mode(tf.no_op), True

  def __repr__(self) -> str:
    return f'FixedLossScale({self._loss_scale_value})'

  def get_config(self) -> Dict[str, Any]:
    return {'loss_scale_value': self._loss_scale_value}


class DynamicLossScale(private_api.SavedModelOnlyChildren, LossScale):
  """A loss scale that shrinks on overflow and grows while gradients are finite.

  The module docstring holds the rule; docs/loss_scale_options.md the
  options. The state is TensorFlow's (checkpoints interchange):
  `current_loss_scale` and `good_steps`, plus `non_finite_streak` and
  `skips_at_floor` when `hysteresis` and `on_collapse` need them.

  >>> scale = DynamicLossScale(initial_loss_scale=1, increment_period=2)
  >>> for _ in range(3):
  ...   _ = scale.update([tf.constant(1.0)])
  >>> float(scale())
  2.0

  A scale that may fall below 1, tolerates one overflow in a row, and stops
  the run after 100 steps skipped at its floor:

  >>> scale = DynamicLossScale(min_loss_scale=2**-14, hysteresis=2,
  ...                          on_collapse='raise', collapse_patience=100)
  """

  def __init__(self, initial_loss_scale: float = 2**15,
               increment_period: int = 2000, multiplier: float = 2.0, *,
               min_loss_scale: float = 1.0,
               max_loss_scale: Optional[float] = None, hysteresis: int = 1,
               on_collapse: str = 'skip', collapse_patience: int = 1):
    """Creates a dynamic loss scale; under a strategy, inside its scope.

    Args:
      initial_loss_scale: The first scale, a finite positive number.
      increment_period: Finite steps in a row that make the scale grow, an
        integer of at least 1.
      multiplier: The growth and shrink factor, a finite number above 1.
      min_loss_scale: The floor, any finite positive number (TensorFlow's
        is 1).
      max_loss_scale: The cap, or None for only the float32 range; at least
        `initial_loss_scale` and `min_loss_scale`.
      hysteresis: Non-finite steps in a row before the scale shrinks, a
        positive integer.
      on_collapse: `'skip'`, `'warn'` or `'raise'`: what to do once
        `collapse_patience` steps in a row were skipped at `min_loss_scale`.
      collapse_patience: A positive integer; only with `on_collapse` other
        than `'skip'`.

    Raises:
      TypeError: If an argument has the wrong type.
      ValueError: If an argument is out of its range, or `collapse_patience`
        is given with `on_collapse='skip'`.
    """
    super().__init__(name='dynamic_loss_scale')
    initial, period = check_scale_arguments(
        initial_loss_scale, increment_period,
        names=('initial_loss_scale', 'increment_period'))
    factor = _real_number('multiplier', multiplier)
    if not math.isfinite(factor) or factor <= 1:
      raise ValueError(
          f'multiplier must be a finite number above 1, but got {multiplier!r}.')
    floor, _ = check_scale_arguments(min_loss_scale, names=('min_loss_scale',))
    cap = None
    if max_loss_scale is not None:
      cap, _ = check_scale_arguments(max_loss_scale, names=('max_loss_scale',))
      if cap < initial or cap < floor:
        raise ValueError(
            f'max_loss_scale must be at least initial_loss_scale ({initial}) '
            f'and min_loss_scale ({floor}), but got {max_loss_scale!r}.')
    streak_length = _count('hysteresis', hysteresis)
    if on_collapse not in ON_COLLAPSE_CHOICES:
      is_str = isinstance(on_collapse, str)
      raise (ValueError if is_str else TypeError)(
          f'on_collapse must be one of {ON_COLLAPSE_CHOICES}, but got '
          f'{on_collapse!r}' +
          ('.' if is_str else f' of type {type(on_collapse).__name__}.'))
    patience = _count('collapse_patience', collapse_patience)
    if on_collapse == 'skip' and patience != 1:
      raise ValueError(
          f'collapse_patience={collapse_patience!r} has no effect with '
          "on_collapse='skip': pass on_collapse='warn' or 'raise' too.")
    (self._initial_loss_scale, self._increment_period, self._multiplier,
     self._min_loss_scale, self._max_loss_scale, self._hysteresis,
     self._on_collapse, self._collapse_patience) = (
         initial, period, factor, floor, cap, streak_length, on_collapse,
         patience)
    self.current_loss_scale = _state_variable('current_loss_scale', initial,
                                              tf.float32)
    self.good_steps = _state_variable('good_steps', 0, tf.int64)
    # The options' state exists only when an option needs it (the defaults
    # keep TensorFlow's two variables), named under the scale variable as
    # slots are, so a Saver checkpoint says which scale each belongs to.
    with tf.name_scope(self.current_loss_scale.name.split(':')[0] + '/'):
      self.non_finite_streak = (
          _state_variable('non_finite_streak', 0, tf.int64)
          if streak_length > 1 else None)
      self.skips_at_floor = (
          _state_variable('skips_at_floor', 0, tf.int64)
          if on_collapse != 'skip' else None)
    # A plain object: no checkpoint dependency, not in `variables`.
    self._step_record = step_record.StepRecord()
    self._step_record.create()

  @property
  def initial_loss_scale(self) -> float:
    """The first scale, a Python float."""
    return self._initial_loss_scale

  @property
  def increment_period(self) -> int:
    """Finite steps in a row after which it grows, a Python int."""
    return self._increment_period

  @property
  def multiplier(self) -> float:
    """The growth and shrink factor, a Python float."""
    return self._multiplier

  @property
  def min_loss_scale(self) -> float:
    """The floor of the scale, a Python float."""
    return self._min_loss_scale

  @property
  def max_loss_scale(self) -> Optional[float]:
    """The cap on the scale, a Python float or None."""
    return self._max_loss_scale

  @property
  def hysteresis(self) -> int:
    """Non-finite steps in a row before it shrinks, a Python int."""
    return self._hysteresis

  @property
  def on_collapse(self) -> str:
    """'skip', 'warn' or 'raise': what a collapse does."""
    return self._on_collapse

  @property
  def collapse_patience(self) -> int:
    """Steps in a row skipped at the floor that make a collapse."""
    return self._collapse_patience

  @property
  def skipped_steps(self) -> tf.Tensor:
    """Steps skipped so far in this process, in a TF1 graph in the session
    that reads it (int64 tensor, not saved)."""
    return self._step_record.skipped_steps()

  @property
  def last_step_skipped(self) -> tf.Tensor:
    """Whether the latest update skipped its step (bool tensor, not saved)."""
    return self._step_record.last_step_skipped()

  def _saved_model_only_children(self) -> Dict[str, tf.Variable]:
    # A SavedModel tracks what its functions capture; checkpoints keep
    # TensorFlow's layout (see `private_api.SavedModelOnlyChildren`).
    return self._step_record.variables()

  def __call__(self) -> tf.Tensor:
    return tf.convert_to_tensor(self.current_loss_scale)

  def update(self, grads: Any) -> UpdateResult:
    """Advances the state machine by one step; see `LossScale.update`.

    In graph mode `update_op` is a bool tensor, True when the step completed
    an increment period.

    Raises:
      RuntimeError: If called inside a replica context of a strategy.
      LossScaleCollapseError: Eagerly, on a collapse with
        `on_collapse='raise'` (the state has been updated).
    """
    distribute.require_cross_replica_context('DynamicLossScale.update')
    reading = distribute.read(grads)
    grads_finite = _scalar_verdict(reading.finite)
    reported = _run_if_not(grads_finite, self._step_record.skip_reporter(
        step_record.positions(len(tf.nest.flatten(grads))), self,
        lambda: reading))
    with tf.control_dependencies(reported):
      update_op = self.assign_next_state(grads_finite)
    if execution.in_tf1_graph():
      self._step_record.follow(update_op.op)
    return update_op, grads_finite

  def assign_next_state(
      self, grads_finite: tf.Tensor,
      after: Sequence[Union[tf.Tensor, tf.Operation]] = ()
  ) -> Optional[tf.Tensor]:
    """`update` for a verdict already decided, so gradients are read once.

    From a replica context it merges into the cross-replica context; it
    returns `update`'s `update_op`.

    Args:
      grads_finite: A bool scalar tensor, the same on every replica.
      after: In a graph, ops or tensors that the assignments must follow.

    Raises:
      LossScaleCollapseError: Eagerly, on a collapse with
        `on_collapse='raise'` (the state has been updated).
    """
    if (tf.distribute.has_strategy() and
        not tf.distribute.in_cross_replica_context()):
      # The variables are mirrored with no aggregation: only the
      # cross-replica context may assign them, and the verdict is the same
      # on every replica, so the first replica's stands for all.
      return distribute.merge_to_cross_replica(
          lambda _, finite: self._assign_next_state(
              distribute.first_replica_value(finite), after),
          grads_finite)
    return self._assign_next_state(grads_finite, after)

  def _assign_next_state(
      self, grads_finite: Any,
      after: Sequence[Union[tf.Tensor, tf.Operation]]) -> Optional[tf.Tensor]:
    grads_finite = _scalar_verdict(grads_finite)
    state = advance_dynamic_state(
        self._read_state(), grads_finite, **self._rule_options())
    # Made before the control dependencies, so that the record's writes carry
    # them: Grappler folds a `not` of the verdict's `not`, and a control edge
    # on a folded op with it.
    skipped = tf.logical_not(grads_finite)
    with tf.control_dependencies(after):
      assigned = tf.group(
          *[variable.assign(value)
            for variable, value in zip(self._state_variables(), state)
            if variable is not None],
          self._step_record.record(skipped))
    if tf.executing_eagerly():
      self._react_to_collapse_eagerly(state.skips_at_floor)
      return None
    # As TensorFlow's update op: whether the step was finite and completed
    # an increment period.
    completed_period = tf.logical_and(tf.equal(state.non_finite_streak, 0),
                                      tf.equal(state.good_steps, 0))
    with tf.control_dependencies([assigned]):
      reaction = self._collapse_reaction_op(state.skips_at_floor)
    with tf.control_dependencies([assigned] + reaction):
      return tf.identity(completed_period)

  def _state_variables(self) -> DynamicState:
    return DynamicState(self.current_loss_scale, self.good_steps,
                        self.non_finite_streak, self.skips_at_floor)

  def _read_state(self) -> DynamicState:
    return DynamicState(*[
        tf.constant(0, tf.int64) if variable is None else
        tf.convert_to_tensor(variable) for variable in self._state_variables()
    ])

  def _rule_options(self) -> Dict[str, Any]:
    return {key: getattr(self, key) for key in (
        'increment_period', 'multiplier', 'min_loss_scale', 'max_loss_scale',
        'hysteresis')}

  def _collapse_message(self, detail: str = '') -> str:
    return (
        'The dynamic loss scale has collapsed: '
        f'{_steps(self._collapse_patience)} in a row were skipped with the '
        f'scale already at min_loss_scale={self._min_loss_scale:g}, so no '
        f'training step is being applied{detail}. The gradients are not '
        'finite even at the smallest scale allowed: look for an inf or NaN '
        'in the loss or the inputs, lower the learning rate, or compute the '
        'overflowing part of the model in float32. A lower min_loss_scale '
        '(values below 1 are allowed) helps only if scaling itself '
        'overflows.')

  def _react_to_collapse_eagerly(self, skips_at_floor: tf.Tensor) -> None:
    if self._on_collapse == 'skip':
      return
    count = int(skips_at_floor)
    if count < self._collapse_patience:
      return
    # The running count makes each collapse's warning text new, so that
    # Python's warning filters do not hide the second one.
    message = self._collapse_message(
        f' ({_steps(int(self.skipped_steps))} skipped in this process)'
    ) + self._step_record.describe().numpy().decode()
    if self._on_collapse == 'raise':
      raise LossScaleCollapseError(message)
    if count == self._collapse_patience:
      warnings.warn(message, RuntimeWarning)

  def _collapse_reaction_op(self, skips_at_floor: tf.Tensor) -> List[Any]:
    # No Python in the graph: the check is an op, so it works in a TF1
    # session, in a tf.function and under any strategy alike.
    if self._on_collapse == 'skip':
      return []
    # The message, with the report read from the record, is made only in
    # the branch that reports the collapse.
    message = lambda: tf.strings.join(
        [self._collapse_message(), self._step_record.describe()])
    patience = self._collapse_patience
    if self._on_collapse == 'raise':
      below = skips_at_floor < patience
      return _run_if_not(below, lambda: tf.debugging.Assert(
          below, [message()], name='loss_scale_collapse'))
    return _run_if_not(tf.not_equal(skips_at_floor, patience), lambda: tf.print(
        message(), output_stream=logging.warning))

  def __repr__(self) -> str:
    arguments = ', '.join(
        f'{key}={value!r}' for key, value in self.get_config().items())
    if tf.executing_eagerly():
      return (f'DynamicLossScale(current_loss_scale='
              f'{self.current_loss_scale.numpy()}, num_good_steps='
              f'{self.good_steps.numpy()}, {arguments})')
    return f'DynamicLossScale({arguments})'

  def get_config(self) -> Dict[str, Any]:
    """Returns the constructor arguments, options only when not default."""
    # () stands for "always given": no value equals it.
    defaults = dict(initial_loss_scale=(), increment_period=(),
                    multiplier=(), min_loss_scale=1.0, max_loss_scale=None,
                    hysteresis=1, on_collapse='skip', collapse_patience=1)
    return {key: getattr(self, key) for key, default in defaults.items()
            if getattr(self, key) != default}


_CLASSES_BY_NAME = {
    'FixedLossScale': FixedLossScale,
    'DynamicLossScale': DynamicLossScale,
}

Identifier = Union[None, str, float, int, LossScale]


def get(identifier: Identifier) -> Optional[LossScale]:
  """Turns a loss scale identifier into a `LossScale` (or None).

  Args:
    identifier: A number (a `FixedLossScale` of that value), the string
      `'dynamic'` (a `DynamicLossScale` with its defaults), a `LossScale`
      (returned as it is), or None (returned as None).

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
  """Recreates a loss scale from `serialize`'s output (this library's only).

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
  return tf.Variable(initial_value, name=name, dtype=dtype, trainable=False,
                     synchronization=tf.VariableSynchronization.AUTO,
                     aggregation=tf.VariableAggregation.NONE)


def step_record_of(loss_scale: LossScale) -> Optional[step_record.StepRecord]:
  """A `DynamicLossScale`'s monitoring record; None for other loss scales."""
  if isinstance(loss_scale, DynamicLossScale):
    return loss_scale._step_record  # pylint: disable=protected-access
  return None


def _run_if_not(condition: tf.Tensor, fn) -> List[Any]:
  """Runs `fn` only when `condition` is False; its op to depend on, if any."""
  if tf.executing_eagerly():
    if not bool(condition):
      fn()
    return []

  def run() -> tf.Tensor:
    with tf.control_dependencies([fn()]):
      return tf.constant(False)

  return [tf.cond(condition, lambda: tf.constant(True), run)]


def _scalar_verdict(grads_finite: Union[bool, tf.Tensor]) -> tf.Tensor:
  finite = tf.convert_to_tensor(grads_finite, tf.bool)
  if finite.shape.rank is None:
    # A verdict summed from per-gradient flags in a TF1 graph has no static
    # shape; TensorFlow's is a scalar, and so is the state it updates.
    finite = tf.reshape(finite, [])
  return finite


def _steps(count: int) -> str:
  return f'{count} step' if count == 1 else f'{count} steps'


def check_scale_arguments(
    initial_scale: Any, growth_steps: Any = None, *,
    names: Sequence[str] = ('initial_scale', 'dynamic_growth_steps'),
    floor: Optional[float] = None) -> Tuple[float, Optional[int]]:
  """Checks a loss scale's first value and growth period, for every front end.

  `initial_scale` must be finite, positive, within float32's range and at
  least `floor` if given; `growth_steps` an integer from 1 to 2**63 - 1.
  `names` are the arguments' names in the caller's signature, for messages
  (one name only to check `initial_scale` alone).

  Returns:
    `(initial_scale, growth_steps)` as a float and an int (or None).

  Raises:
    TypeError: For an argument of a wrong type; ValueError: out of range.
  """
  initial = _real_number(names[0], initial_scale)
  if not (math.isfinite(initial) and (floor or 0) <= initial <= _FLOAT32_MAX
          and np.float32(initial) > 0):
    at_least = f'number of at least {floor:g}' if floor else 'positive number'
    raise ValueError(
        f'{names[0]} must be a finite {at_least} that fits in float32, but '
        f'got {names[0]}={initial_scale!r}.')
  return initial, (_count(names[1], growth_steps) if len(names) > 1 else None)


def _real_number(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(
        f'{name} must be a Python or NumPy real number, but got {value!r} of '
        f'type {type(value).__name__}.')
  return float(value)


def _count(name: str, value: Any) -> int:
  """A whole number from 1 to the int64 maximum (counters are int64)."""
  number = _real_number(name, value)
  if not number.is_integer():
    raise TypeError(f'{name} must be an integer, but got {name}={value!r}.')
  if not 1 <= number <= _INT64_MAX:
    raise ValueError(
        f'{name} must be an integer from 1 to 2**63 - 1, but got '
        f'{name}={value!r}.')
  return int(number)
