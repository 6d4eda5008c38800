"""TF 1.13-1.15's loss scale managers: what scale to use, and its update.

A manager is read once a step for the scale (`get_loss_scale`) and told once
a step whether the step's gradients were all finite (`update_loss_scale`).
`ExponentialUpdateLossScaleManager`'s rule is this library's one rule
(`tf_loss_scale.loss_scale.advance_dynamic_state`) with the options that
make it TF 1.15's:

```
on each step, given whether every gradient is finite:
  if finite:
    if good_steps + 1 >= incr_every_n_steps:
      scale = scale * incr_ratio, unless that is inf
      good_steps = bad_steps = 0
    else:
      good_steps = good_steps + 1      # bad_steps kept: they accumulate
  else:                                # the step is skipped
    if bad_steps + 1 >= decr_every_n_nan_or_inf:
      scale = max(scale * decr_ratio, 1)
      good_steps = bad_steps = 0
    else:
      bad_steps = bad_steps + 1
      good_steps = 0
```
"""

import abc
from typing import Any, Optional

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import loss_scale as loss_scale_lib


class LossScaleManager(metaclass=abc.ABCMeta):
  """What a `LossScaleOptimizer` asks for its loss scale (abstract).

  Subclass it for a rule of your own: `get_loss_scale` returns the scale the
  step's loss is multiplied by, `update_loss_scale(finite_grads)` moves it.
  The optimizer calls `update_loss_scale` once a step, after the step was
  applied or skipped, with the step's verdict.
  """

  @abc.abstractmethod
  def get_loss_scale(self) -> Any:
    """Returns the current loss scale, a scalar float32 tensor or variable."""

  @abc.abstractmethod
  def update_loss_scale(self, finite_grads: tf.Tensor) -> Any:
    """Moves the loss scale after one step.

    Args:
      finite_grads: A bool scalar tensor: whether every gradient of the step
        was finite (no inf, no NaN), so whether the step was applied.

    Returns:
      In a graph, the op that moves the scale when run; eagerly, None (the
      scale has moved).
    """
    del finite_grads


class FixedLossScaleManager(LossScaleManager):
  """A manager whose scale never changes.

  A step with a non-finite gradient is still skipped by the optimizer.
  """

  def __init__(self, loss_scale: float):
    """Creates a manager of the scale `loss_scale`.

    Args:
      loss_scale: A number of at least 1 (a Python float as a rule).

    Raises:
      ValueError: If `loss_scale` is less than 1.
    """
    if loss_scale < 1:
      raise ValueError('loss scale must be at least 1.')
    self._loss_scale = tf.convert_to_tensor(loss_scale, tf.float32)

  def get_loss_scale(self) -> tf.Tensor:
    return self._loss_scale

  def update_loss_scale(self, finite_grads: tf.Tensor) -> Optional[tf.Operation]:
    """Changes nothing; returns a no-op in a graph, None eagerly."""
    del finite_grads
    return execution.op_in_graph_mode(tf.no_op)


class ExponentialUpdateLossScaleManager(LossScaleManager):
  """A manager that grows the scale by a ratio and shrinks it by another.

  The scale is multiplied by `incr_ratio` after `incr_every_n_steps` finite
  steps in a row, and by `decr_ratio` once `decr_every_n_nan_or_inf`
  non-finite steps have accumulated (in a row or not) since it last changed.
  It never goes below 1 by shrinking, and a growth that would overflow
  float32 is not taken. Both counts restart whenever the scale is updated.

  Its state is three variables, TF 1.15's: `loss_scale` (float32),
  `good_steps` and `bad_steps` (int32), non-trainable and in the global
  variables collection, so a `tf.compat.v1.train.Saver` saves and restores
  them under those names.
  """

  def __init__(self, init_loss_scale: float, incr_every_n_steps: int,
               decr_every_n_nan_or_inf: int = 2, incr_ratio: float = 2,
               decr_ratio: float = 0.8):
    """Creates the manager and its variables.

    Args:
      init_loss_scale: The first scale, a number.
      incr_every_n_steps: Finite steps in a row that make the scale grow.
      decr_every_n_nan_or_inf: Non-finite steps, accumulated, that make it
        shrink.
      incr_ratio: The factor of a growth.
      decr_ratio: The factor of a shrink (below 1 as a rule).
    """
    self._incr_every_n_steps = incr_every_n_steps
    self._decr_every_n_nan_or_inf = decr_every_n_nan_or_inf
    self._incr_ratio = incr_ratio
    self._decr_ratio = decr_ratio
    self._loss_scale = _variable(
        'loss_scale', tf.convert_to_tensor(init_loss_scale, tf.float32),
        tf.float32)
    self._num_good_steps = _variable('good_steps', 0, tf.int32)
    self._num_bad_steps = _variable('bad_steps', 0, tf.int32)

  def get_loss_scale(self) -> tf.Variable:
    """Returns the loss scale variable."""
    return self._loss_scale

  def update_loss_scale(self, finite_grads: tf.Tensor) -> Optional[tf.Operation]:
    """Advances the rule by one step; see `LossScaleManager`."""
    state = loss_scale_lib.advance_dynamic_state(
        loss_scale_lib.DynamicState(self._loss_scale, self._num_good_steps,
                                    self._num_bad_steps),
        finite_grads,
        increment_period=self._incr_every_n_steps,
        multiplier=self._incr_ratio,
        min_loss_scale=1.0,
        hysteresis=self._decr_every_n_nan_or_inf,
        backoff_factor=self._decr_ratio,
        non_finite_count='accumulated')
    return execution.op_in_graph_mode(lambda: tf.group(
        self._loss_scale.assign(state.scale),
        self._num_good_steps.assign(state.good_steps),
        self._num_bad_steps.assign(
            tf.cast(state.non_finite_streak, tf.int32))))


def _variable(name: str, initial_value: Any, dtype: tf.DType) -> tf.Variable:
  # As TF 1.15's: of the program's kind (a reference variable in a graph
  # built with TF1 behaviour), in the global variables collection.
  return tf.compat.v1.Variable(initial_value, name=name, dtype=dtype,
                               trainable=False)
