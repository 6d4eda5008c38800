"""Where `tf.distribute` meets loss scaling.

The only module that knows about strategies, replica contexts and merge_call.
Its promise: every replica, and every worker, reaches the same verdict on
whether a step's gradients are finite, so all of them skip or apply together
and their loss scales never drift apart.
"""

from typing import Any, Callable, Sequence, Union

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import gradients



def _unsupported_strategy_types() -> tuple:
  # Strategies whose variables are not mirrored on each replica: the replicas
  # cannot skip a step together there. Looked up by public name, so a
  # TensorFlow without one of them simply has nothing to refuse.
  found = []
  for namespace in (tf.distribute.experimental,
                    tf.compat.v1.distribute.experimental):
    for name in ('CentralStorageStrategy', 'ParameterServerStrategy'):
      strategy_type = getattr(namespace, name, None)
      if strategy_type is not None:
        found.append(strategy_type)
  return tuple(found)


def all_finite_on_every_replica(grads: Any) -> tf.Tensor:
  """Tells whether every gradient on every replica is finite.

  Outside any strategy this is `gradients.all_finite(grads)`. Under a strategy
  it must run in the cross-replica context, where `grads` may hold per-replica
  values: each replica counts its own verdict and the counts are summed across
  replicas (and workers), so one replica's overflow is seen by all.

  Args:
    grads: A nested structure of gradients, possibly per-replica values.

  Returns:
    A scalar bool tensor, the same on every replica.

  Raises:
    RuntimeError: If called in a replica context of a strategy.
  """
  if not tf.distribute.has_strategy():
    return gradients.all_finite(grads)
  require_cross_replica_context('Deciding whether gradients are finite')
  strategy = tf.distribute.get_strategy()
  non_finite = strategy.extended.call_for_each_replica(_non_finite,
                                                      args=(grads,))
  return tf.equal(
      strategy.reduce(tf.distribute.ReduceOp.SUM, non_finite, axis=None), 0.0)


def all_finite_in_any_context(grads: Any) -> tf.Tensor:
  """Tells whether every gradient on every replica is finite, from anywhere.

  In the cross-replica context this is `all_finite_on_every_replica`. In a
  replica context (inside `strategy.run`) each replica tests its own
  gradients and the verdicts are all-reduced, so every replica gets the same
  answer without a merge_call.

  Args:
    grads: A nested structure of gradients (per-replica values only in the
      cross-replica context).

  Returns:
    A scalar bool tensor, the same on every replica.
  """
  if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
    return all_finite_on_every_replica(grads)
  total = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, _non_finite(grads))
  return tf.equal(total, 0.0)


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

  Both branches return the verdict. A branch whose outputs match is one that
  XLA can turn into selects and fuse with the rest of the step; a branch with
  nothing to return stays a real conditional, which forces every gradient
  into memory first.

  Args:
    strategy: The current strategy.
    should_apply: A bool scalar tensor, the same on every replica, or the
      Python `True`.
    apply_fn: Applies the step on one replica.
    args: The arguments of `apply_fn`.
    on_skip: Runs when the step is skipped.

  Returns:
    Whether the step was applied: a bool tensor, or `True`. In a TF1 graph,
    evaluating it runs the chosen branch.
  """
  def apply_step():
    return _then(strategy.group(
        strategy.extended.call_for_each_replica(apply_fn, args=tuple(args))),
                 True)

  if should_apply is True:
    apply_step()
    return True
  return tf.cond(should_apply, apply_step, lambda: _then(on_skip(), False))


def check_strategy_supported(where: str) -> None:
  """Refuses strategies whose variables are not mirrored on each replica.

  Args:
    where: The call being checked (named in the error message).

  Raises:
    ValueError: Under CentralStorageStrategy or ParameterServerStrategy.
  """
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, _unsupported_strategy_types()):
    name = type(strategy).__name__
    raise ValueError(
        f'{where}: loss scaling is not supported under {name}. Use '
        'MirroredStrategy, MultiWorkerMirroredStrategy or no strategy.')


def _non_finite(grads: Any) -> tf.Tensor:
  # One replica's verdict as a number, so that replicas can sum them.
  return tf.cast(tf.logical_not(gradients.all_finite(grads)), tf.float32)


def _then(done: Any, verdict: bool) -> tf.Tensor:
  # Eagerly and in a tf.function, stateful ops run in program order; a TF1
  # graph runs only what the returned tensor depends on.
  if not execution.in_tf1_graph() or done is None:
    return tf.constant(verdict)
  with tf.control_dependencies([done]):
    return tf.constant(verdict)
