"""The training step with a loss scale, written once for every front end.

Each step every front end does the same thing:

```
grads = grads / scale          # those that are gradients of the scaled loss
verdict = are the gradients that will be applied all finite?
state = rule(state, verdict)   # loss_scale.next_dynamic_state, the one rule
apply the gradients on every replica if verdict, else skip everywhere
```

This module is that block, in two views of one computation:

- `apply_step(grads, state, apply_fn, ...)`, the stateful view, for `apply`
  and `apply_gradients`. It runs in a replica context (inside
  `strategy.run`) or with no strategy, eagerly, in a `tf.function` or in a
  TF1 graph. The state is a `ScaleState`: `LossScaleState` adapts any
  `tf_loss_scale.LossScale` (a `DynamicLossScale` takes the step's verdict
  through `assign_next_state`; a `FixedLossScale` or a user's `LossScale`
  decides through its own `update(grads)`), and a front end with state of
  its own (the Keras 3 form's Keras variables) subclasses `ScaleState`.
- `stateless_step(grads, scale, good_steps, ...)`, the stateless view, for
  Keras 3's `stateless_apply`: values in, values out, nothing assigned.

Both views unscale with `unscale_where`, decide with `gradients.all_finite`
(or its cross-replica form) and advance with `next_dynamic_state`.

Under a strategy, the verdict is about the gradients that are applied, the
all-reduced ones, and every replica reaches it without exchanging it:

- `reduces=False`: `apply_fn` applies gradients as it is given them (a
  tf_keras optimizer's `apply_gradients(..., experimental_aggregate_gradients=
  False)`). The step all-reduces the gradients once, in the replica context,
  decides on the sums (the same on every replica, so no further
  communication) and hands the sums to `apply_fn`. Nothing is reduced
  beyond what the bare optimizer reduces.
- `reduces=True`: `apply_fn` all-reduces the gradients itself (a Keras 3
  optimizer's `apply`, a `tf.compat.v1` optimizer's `apply_gradients`), and
  cannot be handed sums without summing them again: Keras 3's TensorFlow
  optimizers reduce whenever `apply` runs in a replica context, and under
  MirroredStrategy `apply` fails in the cross-replica context (its update
  goes through a merge_call that needs a replica context). The step then
  takes a verdict that holds for the sums before they exist, from one
  all-reduced scalar per step (`distribute.all_finite_on_every_replica`):
  no step whose summed gradients would overflow is applied.
"""

import abc
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import gradients
from tf_loss_scale import loss_scale as loss_scale_lib

Verdict = Union[bool, tf.Tensor]
UpdateResult = Tuple[Optional[tf.Operation], Verdict]


class ScaleState(abc.ABC):
  """A loss scale's state, as the step reads and advances it."""

  @abc.abstractmethod
  def scale(self) -> tf.Tensor:
    """Returns the current loss scale, a float32 scalar tensor."""

  @abc.abstractmethod
  def advance(self, grads: List[Any],
              decide: Callable[[], tf.Tensor]) -> UpdateResult:
    """Moves the state one step; runs in the cross-replica context.

    Args:
      grads: The step's unscaled gradients as `apply_fn` will get them
        (per-replica values under a strategy).
      decide: Returns the step's verdict, a bool scalar tensor that is the
        same on every replica. Call it at most once; a state that never skips
        a step need not call it, and then no verdict is computed at all.

    Returns:
      `(update_op, should_apply)`: the update op in graph mode (None eagerly,
      where the update has happened), and a bool tensor or the Python `True`.
    """


class LossScaleState(ScaleState):
  """The state of a `tf_loss_scale.LossScale`, for the step."""

  def __init__(self, loss_scale: loss_scale_lib.LossScale):
    """Adapts `loss_scale`.

    Args:
      loss_scale: Any `LossScale`. A `DynamicLossScale` advances on the
        step's verdict; any other decides through its own `update(grads)`.
    """
    self._loss_scale = loss_scale

  def scale(self) -> tf.Tensor:
    return self._loss_scale()

  def advance(self, grads: List[Any],
              decide: Callable[[], tf.Tensor]) -> UpdateResult:
    if isinstance(self._loss_scale, loss_scale_lib.DynamicLossScale):
      grads_finite = decide()
      return self._loss_scale.assign_next_state(grads_finite), grads_finite
    return self._loss_scale.update(grads)


def apply_step(grads: Sequence[Any],
               state: ScaleState,
               apply_fn: Callable[[List[Any]], Any],
               scaled: Optional[Sequence[bool]] = None,
               reduces: bool = True,
               on_skip: Callable[[], Any] = tf.no_op) -> UpdateResult:
  """Unscales, decides, advances the state, and applies or skips.

  Call it in a replica context (inside `strategy.run`) or with no strategy.

  Args:
    grads: One gradient per variable (`None` allowed, `tf.IndexedSlices`
      kept sparse).
    state: The loss scale's state.
    apply_fn: Applies a list of gradients like `grads`; called in a replica
      context, on every replica, only when the step is applied.
    scaled: None when `grads` are already unscaled; otherwise one bool per
      gradient, True where it is a gradient of the scaled loss (False, for
      example, for Keras variables overwritten with their gradient).
    reduces: Whether `apply_fn` all-reduces the gradients itself (see the
      module docstring).
    on_skip: Runs once, in the cross-replica context, when a step is skipped.

  Returns:
    `(update_op, applied)`: the state's update op (None eagerly), and whether
    the step was applied, a bool tensor or `True` (in a TF1 graph, evaluating
    it runs the chosen side).
  """
  grads = list(grads)
  if scaled is not None:
    grads = unscale_where(grads, scaled, state.scale())
  if not reduces:
    grads = distribute.all_reduce_in_replica(grads)

  def decide_and_apply(strategy: tf.distribute.Strategy,
                       grads: List[Any]) -> UpdateResult:
    def decide() -> tf.Tensor:
      if reduces:
        return distribute.all_finite_on_every_replica(grads)
      # Every replica holds the same sums: any one replica's are the sums.
      return gradients.all_finite(distribute.first_replica_value(grads))

    update_op, should_apply = state.advance(grads, decide)
    applied = distribute.apply_on_every_replica_if(
        strategy, should_apply, apply_fn, (grads,), on_skip=on_skip)
    return update_op, applied

  return distribute.merge_to_cross_replica(decide_and_apply, grads)


def stateless_step(
    grads: Sequence[Any],
    scale: tf.Tensor,
    good_steps: tf.Tensor,
    increment_period: int,
    multiplier: float,
    scaled: Sequence[bool],
    apply_values: Callable[[List[Any]], Any],
    unchanged_values: Callable[[], Any]
) -> Tuple[tf.Tensor, Tuple[tf.Tensor, tf.Tensor], Any]:
  """The step on values, with a dynamic loss scale; assigns nothing.

  For one process without a strategy (Keras's stateless pattern).

  Args:
    grads: One gradient per variable, of the scaled loss where `scaled`.
    scale: The current loss scale, a float32 scalar.
    good_steps: Finite steps since the scale last changed, an int scalar.
    increment_period: Finite steps in a row after which the scale grows.
    multiplier: The factor the scale grows and shrinks by.
    scaled: One bool per gradient, as in `apply_step`.
    apply_values: Given the unscaled gradients, returns the new values of
      whatever the step updates (a nested structure of tensors).
    unchanged_values: Returns the same structure, unchanged (a skipped step).

  Returns:
    `(grads_finite, (new_scale, new_good_steps), values)`.
  """
  grads = unscale_where(list(grads), scaled, scale)
  grads_finite = gradients.all_finite(grads)
  new_state = loss_scale_lib.next_dynamic_state(
      scale, good_steps, grads_finite, increment_period, multiplier)
  values = tf.cond(grads_finite, lambda: apply_values(grads),
                   unchanged_values)
  return grads_finite, new_state, values


def unscale_where(grads: List[Any], scaled: Sequence[bool],
                  scale: tf.Tensor) -> List[Any]:
  """Divides by `scale` the gradients marked as gradients of a scaled loss.

  Args:
    grads: A list of gradients (`None` allowed).
    scaled: One bool per gradient.
    scale: The loss scale, a scalar tensor.

  Returns:
    A new list: marked gradients unscaled, the others as they were.

  Raises:
    ValueError: If `scaled` and `grads` differ in length.
  """
  scaled = list(scaled)
  if len(scaled) != len(grads):
    raise ValueError(
        f'Got {len(grads)} gradients but {len(scaled)} scaled flags: pass one '
        'flag per gradient.')
  unscaled = gradients.unscale(
      [g if s else None for g, s in zip(grads, scaled)], scale)
  return [u if s else g for g, u, s in zip(grads, unscaled, scaled)]
