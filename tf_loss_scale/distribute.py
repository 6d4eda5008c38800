"""Where `tf.distribute` meets loss scaling.

The only module that knows about strategies, replica contexts and merge_call.
Its promise: every replica, and every worker, reaches the same verdict on
whether a step's gradients are finite, so all of them skip or apply together
and their loss scales never drift apart.
"""

from typing import Any, Callable, List, Optional, Sequence, Union

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import gradients


def all_finite_on_every_replica(
    grads: Any, divided_by: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Tells whether the gradients, summed across replicas, are certainly finite.

  Outside any strategy this is `gradients.all_finite(grads)`. Under a strategy
  it must run in the cross-replica context, where `grads` are each replica's
  own gradients (per-replica values) that the optimizer will all-reduce when
  it applies them. Each replica reads its gradients for their largest
  magnitudes (`gradients.largest_magnitudes`), and the replicas' are
  added up, as described in `_sums_fit`: an overflow on any replica, or one
  that only the sum would make, is seen by all. When every replica runs in
  this process they are added here, with no collective op; across workers
  one small vector (one entry per gradient dtype) is all-reduced.

  With `divided_by`, each replica reads its gradients for whether they are
  finite (`gradients.finite_as_magnitudes`: one read, where the largest
  magnitude takes two), and when that scale is at least twice the number of
  replicas this stands for the magnitudes: the sums are bounded without
  them. A finite gradient `g` is at most its dtype's largest value `M`, so
  `g / s` is at most about `M / s`, and a sum of `n` such values at most
  `n * M / s <= M / 2`; the roundings of the division and of the sum
  are far inside that factor of 2. Below that scale (a dynamic scale after
  many overflows, a small fixed one) the magnitudes are read too, on those
  steps only (`execution.computed_unless`). Either way one vector per
  replica is added up. Under XLA, where `largest_magnitudes` reads each
  gradient once and the gating does not exist, the magnitudes are always
  read.

  Args:
    grads: A nested structure of gradients, possibly per-replica values.
    divided_by: None, or the loss scale that every gradient in `grads` is
      the quotient of, computed by `gradients.unscale` from a value of its
      own dtype: a scalar tensor, or one per replica (each replica's read of
      the scale, as a merge_call hands it over), which lets each replica
      decide on its own device, with nothing copied between devices.

  Returns:
    A scalar bool tensor, the same on every replica.

  Raises:
    RuntimeError: If called in a replica context of a strategy.
  """
  if not tf.distribute.has_strategy():
    return gradients.all_finite(grads)
  require_cross_replica_context('Deciding whether gradients are finite')
  strategy = tf.distribute.get_strategy()
  dtypes = gradients.gradient_dtypes(first_replica_value(grads))
  if not dtypes:
    return tf.constant(True)
  if divided_by is None or execution.in_xla_computation():
    magnitudes = strategy.extended.call_for_each_replica(
        gradients.largest_magnitudes, args=(grads,))
  else:
    limit = 2.0 * strategy.num_replicas_in_sync

    def finite_or_magnitudes(replica_grads: Any,
                             replica_scale: tf.Tensor) -> tf.Tensor:
      bounded = tf.greater_equal(tf.cast(replica_scale, tf.float32), limit)
      return execution.computed_unless(
          bounded, lambda: gradients.largest_magnitudes(replica_grads),
          otherwise=gradients.finite_as_magnitudes(replica_grads))

    magnitudes = strategy.extended.call_for_each_replica(
        finite_or_magnitudes, args=(grads, divided_by))
  local = strategy.experimental_local_results(magnitudes)
  if len(local) == strategy.num_replicas_in_sync:
    total = tf.add_n(list(local))
  else:
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, magnitudes, axis=None)
  return _sums_fit(total, dtypes)


def all_finite_in_any_context(grads: Any) -> tf.Tensor:
  """`all_finite_on_every_replica`, callable from a replica context too.

  In a replica context (inside `strategy.run`) each replica reads its own
  gradients and their largest magnitudes are all-reduced, so every replica
  gets the same answer without a merge_call.

  Args:
    grads: A nested structure of gradients (per-replica values only in the
      cross-replica context).

  Returns:
    A scalar bool tensor, the same on every replica.
  """
  if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
    return all_finite_on_every_replica(grads)
  dtypes = gradients.gradient_dtypes(grads)
  if not dtypes:
    return tf.constant(True)
  total = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, gradients.largest_magnitudes(grads))
  return _sums_fit(total, dtypes)


def all_reduce_in_replica(grads: Sequence[Any]) -> List[Any]:
  """Sums gradients across replicas, from a replica context, in one batch.

  This is the reduction an optimizer would make before applying them; a
  step that reduces here must apply the result without reducing again.

  Args:
    grads: A list of gradients; `None` entries are kept as `None`.

  Returns:
    A list like `grads` holding the sums, identical on every replica. With no
    strategy (or one replica) the gradients themselves.
  """
  present = [i for i, g in enumerate(grads) if g is not None]
  if not tf.distribute.has_strategy() or not present:
    return list(grads)
  reduced = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
  result = list(grads)
  for i, value in zip(present, reduced):
    result[i] = value
  return result


def first_replica_value(value: Any) -> Any:
  """The first local replica's component of values met in a merge_call.

  For values that every replica computed identically (a verdict on
  all-reduced gradients), this is everyone's value without communication.

  Args:
    value: A nested structure, possibly of per-replica values.

  Returns:
    The structure with every per-replica value replaced by its first local
    component.
  """
  if not tf.distribute.has_strategy():
    return value
  strategy = tf.distribute.get_strategy()
  return tf.nest.map_structure(
      lambda v: strategy.experimental_local_results(v)[0], value)


def require_cross_replica_context(what: str) -> None:
  """Raises a helpful error unless the caller is in a cross-replica context.

  Args:
    what: The action being attempted, used to start the error message.

  Raises:
    RuntimeError: Inside `strategy.run` (a replica context) of a strategy.
  """
  if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
    raise RuntimeError(
        f'{what} must happen in a cross-replica context, but it was called '
        'inside a replica context (strategy.run). Call it outside '
        'strategy.run, or from tf.distribute.get_replica_context().merge_call.')


def require_replica_context(what: str) -> None:
  """Raises a helpful error if the caller is in a cross-replica context.

  Args:
    what: The action being attempted, used to start the error message.

  Raises:
    ValueError: In the cross-replica context of a strategy.
  """
  if tf.distribute.in_cross_replica_context():
    raise ValueError(
        f'{what} must be called in a replica context, but it was called in a '
        'cross-replica context. Call it inside strategy.run(...).')


def merge_to_cross_replica(fn: Callable[..., Any], *args: Any) -> Any:
  """Runs `fn(strategy, *args)` once, in the cross-replica context.

  From a replica context this is a merge_call, so per-replica arguments arrive
  in `fn` as per-replica values; outside any strategy it simply calls `fn` with
  the default strategy.

  Args:
    fn: A function taking the strategy followed by `args`.
    *args: The arguments to pass on.

  Returns:
    What `fn` returns.
  """
  if not tf.distribute.has_strategy():
    # As the bare optimizer would run (see `apply_on_every_replica_if`).
    return fn(tf.distribute.get_strategy(), *args)
  return tf.distribute.get_replica_context().merge_call(fn, args=args)


def apply_on_every_replica_if(
    strategy: tf.distribute.Strategy,
    should_apply: Union[bool, tf.Tensor],
    apply_fn: Callable[..., Any],
    args: Sequence[Any],
    on_skip: Callable[[], Any] = tf.no_op) -> Union[bool, tf.Tensor]:
  """Applies a step on every replica, or skips it everywhere.

  Runs in the cross-replica context: `apply_fn(*args)` on each replica
  (per-replica arguments are unpacked per replica) when `should_apply`, and
  `on_skip()` once otherwise.

  Eagerly and in a `tf.function` this is a `tf.cond` whose two branches both
  return the verdict: a branch whose outputs match is one that XLA can turn
  into selects and fuse with the rest of the step, while a branch with nothing
  to return stays a real conditional that forces every gradient into memory.
  In a TF1 graph the two sides are gated by `execution.one_side_runs`,
  which costs one Switch where `tf.cond` would add one per gradient and per
  variable handle.

  Args:
    strategy: The current strategy.
    should_apply: A bool scalar tensor, the same on every replica, or the
      Python `True`.
    apply_fn: Applies the step on one replica.
    args: The arguments of `apply_fn`.
    on_skip: Runs when the step is skipped.

  Returns:
    Whether the step was applied: eagerly `True` (when `should_apply` is) or
    a bool tensor; in a graph (TF1 or `tf.function`) always a bool tensor,
    ready only once the chosen side has run, so that control dependencies on
    it order later ops after the step.
  """
  def apply_everywhere(gate: Sequence[tf.Tensor] = ()) -> tf.Operation:
    def apply_on_replica(*replica_args):
      # Replica threads do not inherit the caller's control dependencies.
      with tf.control_dependencies(gate):
        return apply_fn(*replica_args)
    if not tf.distribute.has_strategy():
      # In the caller's replica context: ops made in a new one (Keras's
      # all-reduce gradient) fail where a SavedModel retraces them.
      return strategy.group(apply_on_replica(*args))
    return strategy.group(strategy.extended.call_for_each_replica(
        apply_on_replica, args=tuple(args)))

  if should_apply is True:
    applied = apply_everywhere()
    if tf.executing_eagerly():
      return True
    # `group` gives None when `apply_fn` returned nothing to group.
    with tf.control_dependencies([] if applied is None else [applied]):
      return tf.constant(True)
  if execution.in_tf1_graph():
    return execution.one_side_runs(should_apply, apply_everywhere, on_skip)

  def apply_side():
    apply_everywhere()
    return tf.constant(True)

  def skip_side():
    on_skip()
    return tf.constant(False)

  return tf.cond(should_apply, apply_side, skip_side)


def _sums_fit(total: tf.Tensor, dtypes: Sequence[tf.DType]) -> tf.Tensor:
  """Whether no sum across replicas can overflow, from the summed maxima.

  `total` holds, per dtype, the replicas' largest magnitudes added up
  (float64, exact). Elementwise, |sum over replicas| <= that total, so when
  it stays within the dtype's largest value no sum (nor any partial sum, in
  any order of reduction) overflows. The bound is conservative only when the
  replicas' largest magnitudes together pass that value, which for float32
  gradients never happens in practice and for float16 ones means gradients
  near 32768 on two replicas. The comparison is in float64 against constants
  that are normal numbers: dividing by a dtype's largest value would not be,
  as TensorFlow rewrites a division by a constant into a multiplication by
  its reciprocal, and the reciprocal of float32's largest value is
  subnormal, which TensorFlow's threads flush to zero.
  """
  limits = tf.constant([sum_limit(dtype) for dtype in dtypes], tf.float64)
  return tf.reduce_all(tf.less_equal(total, limits))


def sum_limit(dtype: tf.DType) -> float:
  """The largest total of the replicas' largest magnitudes deemed safe.

  Args:
    dtype: The gradients' dtype.

  Returns:
    Slightly less than `dtype.max`: the margin covers the roundings of a
    reduction of many replicas' gradients in their own precision.
  """
  return dtype.max * (1.0 - 2.0**-20)
