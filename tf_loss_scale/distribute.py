"""Where `tf.distribute` meets loss scaling: a step's gradients across replicas.

The only module that knows about strategies, replica contexts and merge_call
(`call_for_each_replica`, `experimental_local_results`, reductions). It
owns what a step does to its gradients as a whole, in one direction: it
divides them by the scale and sums them across replicas (`merge_step`),
reads each replica's with the kernels of `tf_loss_scale.gradients` and
adds the readings up (`read`), and applies or skips the step on every
replica. Its promise: every replica, and every worker, reaches the same
verdict, so all of them skip or apply together and their loss scales never
drift apart.
"""

import functools
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Union

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import gradients


class Reading(NamedTuple):
  """What one reading of a step's gradients found, the same on every replica.

  Attributes:
    nan: A bool vector with one entry per gradient: it holds a NaN (under a
      strategy, on some replica).
    inf: A bool vector like `nan`: it holds an inf of either sign, or its
      sum across replicas could overflow.
  """
  nan: tf.Tensor
  inf: tf.Tensor

  @property
  def finite(self) -> tf.Tensor:
    """The verdict: a bool scalar, True when no gradient is flagged."""
    return tf.logical_not(tf.reduce_any(tf.logical_or(self.nan, self.inf)))


Reader = Callable[[], Reading]


def merge_step(body: Callable[[tf.distribute.Strategy, List[Any], Reader],
                              Any],
               grads: Sequence[Any], scale: Optional[tf.Tensor] = None,
               scaled: Optional[Sequence[bool]] = None, sums: bool = False,
               summed: bool = False, exact: bool = False,
               held_as: Optional[Sequence[Any]] = None) -> Any:
  """Readies a step's gradients, then runs `body` once, cross-replica.

  In the replica context (or with no strategy): the gradients marked in
  `scaled` are divided by `scale` as Keras 3 divides them
  (`gradients.unscale(divide=True)`); with `sums` they are summed across
  replicas in one all-reduce (unless `summed`: the caller made the sums);
  and what the verdict reads is chosen: those gradients, or with `exact`
  their sums, made for the reading only (instead of a bound of the sums
  the step's apply makes), or under XLA, when every gradient was divided
  and none summed, their dividends, as Keras's class reads them (XLA fuses
  the division into each op reading its result, so reading the quotients
  would divide every value twice). Then `body(strategy, grads, reading)`
  runs, from a merge_call under a strategy, with `grads` as the step
  applies them (per-replica values) and `reading()` the step's one
  reading of them (`read`, with `held_as`), made when first called; what
  `body` returns is returned.

  Raises:
    ValueError: If `scaled` and `grads` differ in length.
  """
  grads, divided_by, handed = list(grads), None, None
  if scaled is not None:
    scaled = list(scaled)
    if len(scaled) != len(grads):
      raise ValueError(
          f'Got {len(grads)} gradients but {len(scaled)} scaled flags: pass '
          'one flag per gradient.')
    quotients = gradients.unscale(
        [g if s else None for g, s in zip(grads, scaled)], scale, divide=True)
    handed, grads = grads, [q if s else g
                            for g, q, s in zip(grads, quotients, scaled)]
    divided_by = scale if all(scaled) else None
  sums = sums or summed
  if sums and not summed:
    grads = all_reduce_in_replica(grads)
  read_from, dividends = grads, False
  if divided_by is not None and not sums and execution.in_xla_computation():
    read_from, dividends = handed, True
  if exact and not sums and tf.distribute.has_strategy():
    read_from, dividends, sums = all_reduce_in_replica(grads), False, True

  def in_cross_replica(strategy: tf.distribute.Strategy, grads: List[Any],
                       read_from: List[Any],
                       divided_by: Optional[tf.Tensor]) -> Any:
    return body(strategy, grads, functools.lru_cache(maxsize=None)(
        lambda: read(read_from, summed=sums, divided_by=divided_by,
                     dividends=dividends, held_as=held_as)))

  return merge_to_cross_replica(in_cross_replica, grads, read_from,
                                divided_by)


def read(grads: Any, summed: bool = False,
         divided_by: Optional[tf.Tensor] = None,
         dividends: bool = False,
         held_as: Optional[Sequence[Any]] = None) -> Reading:
  """Reads a step's gradients once, for its verdict and its skip report.

  Each replica's gradients are read by `gradients.read`. Under a strategy
  the replicas' rows are added up, so an inf or a NaN on any replica is
  seen by all, and so is a sum that could overflow: each replica reads its
  gradients' largest magnitudes too, and where the replicas' magnitudes of
  a gradient add up past its dtype's largest value (|a sum| is at most
  that total) the gradient is flagged as inf. The bound is conservative
  only when finite gradients together come that close to the largest
  value (for float16, gradients near 32768 on two replicas). When
  every replica runs in this process the rows are added here, with no
  collective op; across workers one small matrix is all-reduced.

  With `divided_by` of at least twice the number of replicas the
  magnitudes are not read (but on steps with a smaller scale): a finite
  `g` is at most its dtype's largest value `M`, so a sum of `n` values
  `g / s` is at most `n * M / s <= M / 2`: its roundings are far smaller.

  Args:
    grads: A nested structure of gradients: per-replica values in the
      cross-replica context, each replica's own in a replica context
      (inside `strategy.run`), or with no strategy the gradients.
    summed: Whether `grads` are already the sums across replicas, the same
      on every replica: then one replica's are read, exactly, and nothing
      is exchanged.
    divided_by: None, or the loss scale every gradient was divided by (in
      the cross-replica context per replica, as a merge_call hands it).
    dividends: Whether `grads` are the gradients before that division:
      their magnitudes are then divided by the scale (a quotient is NaN or
      inf where its dividend is, for any scale of at least 1).
    held_as: None, or one dtype (or None) per gradient: that of the
      variable it will reach. A gradient in a wider float dtype is flagged
      inf where it, or its sum, is past that dtype's largest value (a
      float32 sum of float16 gradients, inf in a float16 variable).

  Returns:
    The `Reading`, with one entry per entry of `tf.nest.flatten(grads)`.
  """
  grads = tf.nest.flatten(grads)
  held_as = held_as or [None] * len(grads)
  strategy = tf.distribute.get_strategy()
  replicas = strategy.num_replicas_in_sync
  if summed or replicas == 1:
    table = gradients.read([  # As each variable receives it.
        _as_held(g, d) for g, d in zip(first_replica_value(grads), held_as)])
    return Reading(table[:, 0] > 0, table[:, 1] > 0)

  def read_replica(replica_grads: Any, scale: Optional[tf.Tensor]
                  ) -> tf.Tensor:
    if scale is None:
      return gradients.read(replica_grads, magnitudes=True)
    scale = tf.cast(scale, tf.float64)
    table = gradients.read(replica_grads,
                           magnitudes=tf.less(scale, 2.0 * replicas))
    if not dividends:
      return table
    return tf.concat([table[:, :2], table[:, 2:] / scale], axis=1)

  if not tf.distribute.in_cross_replica_context():
    table = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, read_replica(grads, divided_by))
  else:
    tables = strategy.extended.call_for_each_replica(
        read_replica, args=(grads, divided_by))
    local = strategy.experimental_local_results(tables)
    table = (tf.add_n(list(local)) if len(local) == replicas else
             strategy.reduce(tf.distribute.ReduceOp.SUM, tables, axis=None))
    grads = first_replica_value(grads)
  # Slightly less than the largest value: the margin covers the roundings
  # of a reduction of many replicas' gradients in their own precision.
  limits = [float('inf') if g is None else
            _narrower(g, d).max * (1.0 - 2.0**-20)
            for g, d in zip(grads, held_as)]
  return Reading(table[:, 0] > 0, tf.logical_or(
      table[:, 1] > 0, table[:, 2] > tf.constant(limits, tf.float64)))


def _narrower(grad: Any, held: Any) -> tf.DType:
  # The dtype `grad` ends in, given to a variable of dtype `held` (a
  # `tf.IndexedSlices` has its values' dtype; a number, what it converts to).
  dtype = getattr(grad, 'dtype', None)
  dtype = (tf.convert_to_tensor(grad).dtype if dtype is None else
           tf.as_dtype(dtype))
  held = None if held is None else tf.as_dtype(held)
  if held is None or not held.is_floating or held.size >= dtype.size:
    return dtype
  return held


def _as_held(grad: Any, held: Any) -> Any:
  # `grad` as a variable of dtype `held` receives it.
  dtype = None if grad is None else _narrower(grad, held)
  if dtype is None or dtype == _narrower(grad, None):
    return grad
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices,
                            grad.dense_shape)
  return tf.cast(grad, dtype)


def all_reduce_in_replica(grads: Sequence[Any]) -> List[Any]:
  """Sums gradients across replicas, from a replica context, in one batch.

  The reduction an optimizer would make: a step that sums here must apply
  the sums without summing again. `None` entries are kept; with no
  strategy the gradients are returned as they are.
  """
  present = [g for g in grads if g is not None]
  if not tf.distribute.has_strategy() or not present:
    return list(grads)
  sums = iter(tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, present))
  return [g if g is None else next(sums) for g in grads]


def shares_summing_to(sums: Sequence[Any]) -> List[Any]:
  """This replica's share of `sums`, for an optimizer that sums them again.

  Keras 3's TensorFlow optimizers all-reduce the gradients their `apply` is
  given in a replica context, and fail in the cross-replica context: they
  take no sums. Handed these shares instead, they make exactly `sums`: the
  first replica's share is the sums, every other replica's a negative zero
  (dense) or no rows (`tf.IndexedSlices`), and `x + -0.0` is `x` for every
  float `x`, +0, inf and NaN included, in any order of addition. The cost is
  that second all-reduce of the gradients.

  `sums`: a list of gradients, the same on every replica (`None` kept);
  with no strategy, or one replica, returned as they are.
  """
  context = tf.distribute.get_replica_context()
  if (not tf.distribute.has_strategy() or context is None or
      context.num_replicas_in_sync == 1):
    return list(sums)
  replica = context.replica_id_in_sync_group
  known = tf.get_static_value(replica)
  first = bool(known == 0) if known is not None else tf.equal(replica, 0)

  def share(grad: Any) -> Any:
    if grad is None or first is True:
      return grad
    if isinstance(grad, tf.IndexedSlices):
      rows = 0 if first is False else tf.where(
          first, tf.shape(grad.indices)[0], 0)
      return tf.IndexedSlices(grad.values[:rows], grad.indices[:rows],
                              grad.dense_shape)
    zeros = tf.fill(tf.shape(grad), tf.constant(-0.0, grad.dtype))
    return zeros if first is False else tf.where(first, grad, zeros)

  return [share(g) for g in sums]


def first_replica_value(value: Any) -> Any:
  """`value` (nested) with each per-replica value as its first replica's.

  For values every replica computed identically (a verdict on all-reduced
  gradients), everyone's value without communication.
  """
  if not tf.distribute.has_strategy():
    return value
  strategy = tf.distribute.get_strategy()
  return tf.nest.map_structure(
      lambda v: strategy.experimental_local_results(v)[0], value)


def require_cross_replica_context(what: str) -> None:
  """Raises a RuntimeError starting with `what` inside `strategy.run`."""
  if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
    raise RuntimeError(
        f'{what} must happen in a cross-replica context, but it was called '
        'inside a replica context (strategy.run). Call it outside '
        'strategy.run, or from tf.distribute.get_replica_context().merge_call.')


def require_replica_context(what: str) -> None:
  """Raises a ValueError starting with `what` in a cross-replica context."""
  if tf.distribute.in_cross_replica_context():
    raise ValueError(
        f'{what} must be called in a replica context, but it was called in a '
        'cross-replica context. Call it inside strategy.run(...).')


def merge_to_cross_replica(fn: Callable[..., Any], *args: Any) -> Any:
  """Runs `fn(strategy, *args)` once, in the cross-replica context.

  From a replica context a merge_call (per-replica arguments arrive as
  per-replica values); with no strategy, `fn` with the default strategy.
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
    on_skip: Callable[[], Any] = tf.no_op,
    cond: Optional[Callable[..., tf.Tensor]] = None
) -> Union[bool, tf.Tensor]:
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
  With `cond` (a function of `(pred, true_fn, false_fn)` as TF1's
  `tf.compat.v1.cond`), a graph takes its side in that instead: each side
  returns a bool tensor that is ready once the side has run.
  `should_apply` is a bool scalar tensor, the same on every replica, or
  the Python `True`. Returns whether the step was applied: eagerly `True`
  (when `should_apply` is) or a bool tensor; in a graph always a bool
  tensor, ready only once the chosen side has run, so that control
  dependencies on it order later ops after the step.
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
  if cond is not None and not tf.executing_eagerly():
    return cond(should_apply, lambda: _once_done(apply_everywhere(), True),
                lambda: _once_done(on_skip(), False))
  if execution.in_tf1_graph():
    return execution.one_side_runs(should_apply, apply_everywhere, on_skip)

  def apply_side():
    apply_everywhere()
    return tf.constant(True)

  def skip_side():
    on_skip()
    return tf.constant(False)

  return tf.cond(should_apply, apply_side, skip_side)


def _once_done(done: Any, value: bool) -> tf.Tensor:
  # `value`, ready only once `done` (an op or None) has run: in TF1's cond a
  # side's ops run only when what the side returns depends on them.
  with tf.control_dependencies([] if done is None else [done]):
    return tf.constant(value)
