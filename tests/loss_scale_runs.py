"""Drives a loss scale through a sequence of verdicts, in any execution mode.

Shared by the tests of the loss scale's contract (TensorFlow's own test file
as a specification) and of its options. One step per verdict: the gradient
is 1.0 for a finite step and NaN for a non-finite one; under a strategy only
replica 0 sees the NaN, so the verdict must travel to the other replica.
After each step every counter is read on every replica.
"""

import contextlib
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

MODES = ('graph', 'eager', 'function')
# Optional state, read when a loss scale has it.
_COUNTERS = ('good_steps', 'non_finite_streak', 'skips_at_floor')
_MONITORING = ('skipped_steps', 'last_step_skipped')


def _gradient(finite: tf.Tensor, strategy: Optional[tf.distribute.Strategy]):
  value = tf.where(finite, tf.constant(1.0), tf.constant(np.nan))
  if strategy is None:
    return value

  def on_replica():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.where(tf.equal(replica, 0), value, tf.constant(1.0))

  return strategy.run(on_replica)


def _read_state(loss_scale) -> Dict[str, tf.Tensor]:
  """Everything the loss scale exposes about its state, as tensors."""
  state = {'loss_scale': tf.convert_to_tensor(loss_scale())}
  for name in _COUNTERS:
    variable = getattr(loss_scale, name, None)
    if variable is not None:
      state[name] = tf.identity(variable)
  for name in _MONITORING:
    if hasattr(loss_scale, name):
      state[name] = getattr(loss_scale, name)
  return state


def _read_on_every_replica(loss_scale, strategy):
  """{name: [value on replica 0, value on replica 1, ...]} as tensors."""
  if strategy is None:
    return {name: [t] for name, t in _read_state(loss_scale).items()}
  per_replica = strategy.run(lambda: _read_state(loss_scale))
  return {name: list(strategy.experimental_local_results(value))
          for name, value in per_replica.items()}


def _to_python(value: Any) -> Any:
  value = np.asarray(value)
  return value.item()


class Step(dict):
  """One step's record.

  Keys: 'should_apply' (bool), 'update_op' (the graph update op's value, or
  None when there is none: eagerly, or a scale that returns no tensor), and
  one key per state value, each a list with one Python value per replica.
  """

  def value(self, name: str) -> Any:
    """The value of `name`, after checking every replica agrees on it."""
    values = self[name]
    assert all(v == values[0] or (v != v and values[0] != values[0])
               for v in values), (
                   f'{name} differs between replicas: {values}')
    return values[0]


def run(make_loss_scale: Callable[[], Any], verdicts: List[bool], mode: str,
        strategy: Optional[tf.distribute.Strategy] = None,
        via: str = 'update') -> List[Step]:
  """Runs one update per verdict and records each step.

  Args:
    make_loss_scale: Creates the loss scale (inside the strategy's scope).
    verdicts: Whether each step's gradients are finite.
    mode: 'graph' (a TF1 session), 'eager' or 'function'.
    strategy: None, or a MirroredStrategy.
    via: 'update' (the gradients go to `update`, called in the
      cross-replica context) or 'assign_next_state' (each replica passes
      the all-reduced verdict to `assign_next_state` from inside
      `strategy.run`).

  Returns:
    One `Step` per verdict.
  """
  graph = tf.Graph() if mode == 'graph' else None
  with contextlib.ExitStack() as stack:
    if graph is not None:
      stack.enter_context(graph.as_default())
    if strategy is not None:
      stack.enter_context(strategy.scope())
    loss_scale = make_loss_scale()

    def step(finite):
      if via == 'update':
        update_op, should_apply = loss_scale.update([_gradient(finite,
                                                               strategy)])
      else:
        should_apply = finite
        if strategy is None:
          update_op = loss_scale.assign_next_state(finite)
        else:
          update_op = strategy.experimental_local_results(strategy.run(
              loss_scale.assign_next_state, args=(finite,)))[0]
      if isinstance(update_op, tf.Tensor):
        # What TensorFlow's own test does with the update op.
        update_op = tf.identity(update_op)
      elif mode == 'function':
        update_op = None  # An op runs anyway; a tf.function cannot return it.
      return update_op, should_apply

    records = []
    if mode == 'graph':
      finite = tf.compat.v1.placeholder(tf.bool, [])
      update_op, should_apply = step(finite)
      state = _read_on_every_replica(loss_scale, strategy)
      with tf.compat.v1.Session() as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.local_variables_initializer()])
        for verdict in verdicts:
          fetches = {'update_op': update_op, 'should_apply': should_apply}
          if isinstance(should_apply, bool):
            del fetches['should_apply']
          got = session.run(fetches, {finite: verdict})
          got.setdefault('should_apply', should_apply)
          records.append(_record(got, session.run(state)))
      return records

    function = tf.function(step) if mode == 'function' else step
    for verdict in verdicts:
      update_op, should_apply = function(tf.constant(verdict))
      got = {'update_op': update_op, 'should_apply': should_apply}
      records.append(_record(got, tf.nest.map_structure(
          lambda t: t.numpy(), _read_on_every_replica(loss_scale, strategy))))
    return records


def _record(got: Dict[str, Any], state: Dict[str, List[Any]]) -> Step:
  update_op = got['update_op']
  record = Step({
      'should_apply': (got['should_apply'] if got['should_apply'] is True
                       else bool(_to_python(got['should_apply']))),
      'update_op': (None if update_op is None or
                    isinstance(update_op, tf.Operation)
                    else _to_python(update_op)),
  })
  for name, values in state.items():
    record[name] = [_to_python(v) for v in values]
  return record


def trajectory(records: List[Step], name: str) -> List[Any]:
  """The values of `name` step by step (every replica agreeing)."""
  return [record.value(name) for record in records]
