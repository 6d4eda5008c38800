"""Specification of tf_loss_scale/distribute.py on two real replicas.

The `mirrored_strategy` fixture (tests/conftest.py) runs two replicas on two
logical CPUs. Gradients are made non-finite on one replica only, chosen by
`replica_id_in_sync_group`, to prove that every replica sees the overflow.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import distribute
from tf_loss_scale import gradients

import versions

INF, NAN = np.inf, np.nan


def _per_replica(strategy, values_by_replica):
  """Per-replica gradients [dense (2,), sparse (1, 2)] from one value each."""

  def value_fn(context):
    value = values_by_replica[context.replica_id_in_sync_group]
    dense = tf.constant([1.0, value])
    sparse = tf.IndexedSlices(tf.constant([[2.0, 3.0]]), tf.constant([1]),
                              tf.constant([4, 2]))
    return [dense, None, sparse]

  return strategy.experimental_distribute_values_from_function(value_fn)


def _verdict(grads, divided_by=None):
  """The verdict of `distribute.read`."""
  return distribute.read(grads, divided_by=divided_by).finite


def _local(strategy, value):
  """Each replica's copy of a variable or per-replica value, as numpy."""
  return [np.asarray(v) for v in strategy.experimental_local_results(value)]


# --- read: the verdict ---------------------------------------------------------


def test_read_without_a_strategy():
  assert bool(_verdict([tf.constant(1.0), None]))
  assert not bool(_verdict(tf.constant(NAN)))


@pytest.mark.parametrize('values,expected', [
    ((1.0, 2.0), True),
    ((1.0, INF), False),
    ((NAN, 1.0), False),
    ((-INF, NAN), False),
    ((1.0, -NAN), False),
    # Each finite, but their float32 sum (6e38) overflows: the sum that an
    # optimizer applies is what counts.
    ((3e38, 3e38), False),
    ((-3e38, -3e38), False),
    ((1.5e38, 1.5e38), True),
    ((3.4e38, 1.0), True),
])
@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'function'])
def test_read_sees_each_replica(mirrored_strategy,
                                                       values, expected,
                                                       in_function):
  grads = _per_replica(mirrored_strategy, values)
  verdict_of = _verdict
  if in_function:
    verdict_of = tf.function(verdict_of)
  with mirrored_strategy.scope():
    verdict = verdict_of(grads)
  assert verdict.dtype == tf.bool
  assert bool(verdict) is expected, (
      f'replica values {values}, {"in a tf.function" if in_function else "eagerly"}')


@pytest.mark.parametrize('values,expected', [
    ((1e308, 1e308), False),
    ((8e307, 8e307), True),
    ((1.0, NAN), False),
])
@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'function'])
def test_read_sees_a_float64_sum_overflow(
    mirrored_strategy, values, expected, in_function):
  grads = mirrored_strategy.experimental_distribute_values_from_function(
      lambda context: [tf.constant(
          [values[context.replica_id_in_sync_group], 1.0], tf.float64)])
  verdict_of = _verdict
  if in_function:
    verdict_of = tf.function(verdict_of)
  with mirrored_strategy.scope():
    assert bool(verdict_of(grads)) is expected, f'replica values {values}'


def test_read_in_a_function(mirrored_strategy):

  @tf.function
  def verdict(grads):
    return _verdict(grads)

  with mirrored_strategy.scope():
    assert bool(verdict(_per_replica(mirrored_strategy, (1.0, 2.0))))
    assert not bool(verdict(_per_replica(mirrored_strategy, (1.0, INF))))


def test_read_sees_a_float16_sum_overflow(
    mirrored_strategy):
  # 40000 fits in float16 (largest 65504); 40000 + 40000 does not.
  def value_fn(context):
    value = [40000.0, 20000.0][context.replica_id_in_sync_group]
    return [tf.constant([value, 1.0], tf.float16)]

  big = mirrored_strategy.experimental_distribute_values_from_function(
      lambda context: [tf.constant([40000.0, 1.0], tf.float16)])
  fits = mirrored_strategy.experimental_distribute_values_from_function(
      value_fn)
  with mirrored_strategy.scope():
    assert not bool(_verdict(big))
    assert bool(_verdict(fits))


def _trap_magnitudes(monkeypatch):
  """Makes reading the largest magnitudes fail, but only if the read runs."""
  largest = gradients._largest  # pylint: disable=protected-access

  def trapped(values):
    trap = tf.strings.to_number(tf.strings.format(
        'magnitudes read {}', tf.size(values[0])))
    return largest(values) + tf.cast(trap, tf.float64)

  monkeypatch.setattr(gradients, '_largest', trapped)


def _scale_as(strategy, kind, value):
  """A loss scale as one tensor, or as each replica's read of it."""
  if kind == 'one':
    return tf.constant(value)
  return strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant(value))


@pytest.mark.parametrize('values,expected', [
    ((1.0, 2.0), True),
    ((1.0, INF), False),
    ((NAN, 1.0), False),
    ((-INF, 1.0), False),
])
@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'function'])
@pytest.mark.parametrize('scale_kind', ['one', 'per_replica'])
def test_a_scale_of_twice_the_replicas_settles_the_sums_without_magnitudes(
    mirrored_strategy, monkeypatch, values, expected, in_function,
    scale_kind):
  _trap_magnitudes(monkeypatch)
  grads = _per_replica(mirrored_strategy, values)
  verdict_of = _verdict
  if in_function:
    verdict_of = tf.function(verdict_of)
  with mirrored_strategy.scope():
    # Two replicas: from a scale of 4 on, quotients cannot sum past the max.
    verdict = verdict_of(grads,
                         _scale_as(mirrored_strategy, scale_kind, 4.0))
    assert bool(verdict) is expected, f'replica values {values}'
    with pytest.raises(tf.errors.InvalidArgumentError, match='magnitudes read'):
      verdict_of(grads, _scale_as(mirrored_strategy, scale_kind, 3.99))


@pytest.mark.parametrize('low_replica', [0, 1])
def test_each_replica_decides_from_its_own_read_of_the_scale(
    mirrored_strategy, monkeypatch, low_replica):
  # The replicas' reads are the same in a step; here they differ, to show
  # that a replica whose read is below twice the replicas reads magnitudes
  # (which the trap turns into an error) whatever the other replica read.
  _trap_magnitudes(monkeypatch)
  grads = _per_replica(mirrored_strategy, (1.0, 2.0))
  scales = mirrored_strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant(
          3.99 if context.replica_id_in_sync_group == low_replica else 4.0))
  with mirrored_strategy.scope():
    with pytest.raises(tf.errors.InvalidArgumentError, match='magnitudes read'):
      tf.function(_verdict)(grads, scales)


@pytest.mark.parametrize('scale', [1.0, 3.99])
@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'function'])
@pytest.mark.parametrize('scale_kind', ['one', 'per_replica'])
def test_below_twice_the_replicas_the_magnitudes_bound_the_sums(
    mirrored_strategy, scale, in_function, scale_kind):
  # 40000 on each replica is finite in float16; the sum is not.
  big = mirrored_strategy.experimental_distribute_values_from_function(
      lambda context: [tf.constant([40000.0, 1.0], tf.float16)])
  verdict_of = _verdict
  if in_function:
    verdict_of = tf.function(verdict_of)
  with mirrored_strategy.scope():
    assert not bool(verdict_of(
        big, _scale_as(mirrored_strategy, scale_kind, scale))), (
            f'scale {scale}')


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_keras3_form_reads_magnitudes_only_once_its_scale_is_below_twice_the_replicas(
    mirrored_strategy, monkeypatch):
  import keras  # pylint: disable=g-import-not-at-top
  from tf_loss_scale import keras as ours  # pylint: disable=g-import-not-at-top
  _trap_magnitudes(monkeypatch)
  with mirrored_strategy.scope():
    opt = ours.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    var = keras.Variable([0.0, 0.0])
    opt.build([var])
  second = tf.Variable(3.0)

  @tf.function
  def train_step():
    def replica_step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      grad = tf.where(tf.equal(replica, 0), tf.constant([1.0, 2.0]),
                      tf.stack([second, 5.0]))
      opt.apply([grad], [var])
    mirrored_strategy.run(replica_step)

  train_step()  # Scale 4: ([1, 2] + [3, 5]) / 4 is applied.
  for replica, value in enumerate(_local(mirrored_strategy, var.value)):
    assert value.tolist() == [-1.0, -1.75], f'replica {replica}: {value}'
  second.assign(INF)
  train_step()  # Skipped on replica 1's inf; the scale halves to 2.
  assert _local(mirrored_strategy, opt.dynamic_scale.value) == [2.0, 2.0]
  second.assign(3.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match='magnitudes read'):
    train_step()


def test_all_reduce_in_replica_sums_once_and_keeps_none(mirrored_strategy):

  def replica_fn():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    grad = tf.cast(replica + 1, tf.float32) * tf.constant([1.0, 10.0])
    return distribute.all_reduce_in_replica([grad, None])

  reduced, none = mirrored_strategy.run(replica_fn)
  assert none is None
  for replica, value in enumerate(_local(mirrored_strategy, reduced)):
    np.testing.assert_array_equal(value, [3.0, 30.0],
                                  err_msg=f'replica {replica}')


@pytest.mark.parametrize('in_function', [False, True])
@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_shares_all_reduce_to_exactly_the_sums(mirrored_strategy, dtype,
                                              in_function):
  # Every kind of value, signed zeros included, comes back bit for bit.
  sums = np.array([-0.0, 0.0, 1.0 / 3.0, -2.5e-8, 6e4, INF, -INF, NAN],
                  dtype)
  rows = np.array([[1.5, -0.0], [NAN, 3.0]], dtype)

  def replica_fn():
    dense, sparse = distribute.shares_summing_to([
        tf.constant(sums),
        tf.IndexedSlices(tf.constant(rows), tf.constant([2, 0]),
                         tf.constant([3, 2]))])
    dense, sparse = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, [dense, sparse])
    return dense, sparse.values, sparse.indices

  run = lambda: mirrored_strategy.run(replica_fn)
  dense, values, indices = (tf.function(run) if in_function else run)()
  for replica in range(2):
    got = _local(mirrored_strategy, dense)[replica]
    assert got.tobytes() == sums.tobytes(), f'replica {replica}: {got}'
    # The first replica's rows, and none from the other.
    got = _local(mirrored_strategy, values)[replica]
    assert got.tobytes() == rows.tobytes(), f'replica {replica}: {got}'
    assert _local(mirrored_strategy, indices)[replica].tolist() == [2, 0]


def test_shares_are_the_sums_themselves_without_a_strategy():
  grads = [tf.constant([1.0, -0.0]), None]
  shares = distribute.shares_summing_to(grads)
  assert shares[0] is grads[0] and shares[1] is None


@pytest.mark.parametrize('bad,in_function', [
    (3e38, False), (3e38, True), (NAN, True), (-INF, True)])
def test_read_in_a_replica_context_sees_a_sum_overflow_in_a_replica_context(
    mirrored_strategy, bad, in_function):

  def replica_verdict():
    grad = tf.constant([bad, 1.0])
    return _verdict([grad, None])

  run = lambda: mirrored_strategy.run(replica_verdict)
  if in_function:
    run = tf.function(run)
  assert _local(mirrored_strategy, run()) == [False, False], bad


def test_read_in_a_replica_context_agrees_across_replicas(mirrored_strategy):

  def replica_verdict():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    bad = tf.where(tf.equal(replica, 1), INF, 1.0)
    return _verdict([tf.constant(1.0), bad])

  assert _local(mirrored_strategy,
                mirrored_strategy.run(replica_verdict)) == [False, False]
  finite = mirrored_strategy.run(
      lambda: _verdict([tf.constant(1.0)]))
  assert _local(mirrored_strategy, finite) == [True, True]


# --- DynamicLossScale under MirroredStrategy ----------------------------------


def _replica_steps(strategy, loss_scale, bad_replica_per_step, in_function):
  """Runs one update per step from strategy.run; returns per-step records.

  Args:
    strategy: A two-replica strategy.
    loss_scale: A loss scale created in `strategy.scope()`.
    bad_replica_per_step: For each step, the replica whose gradient is inf
      (or None for a finite step).
    in_function: Whether to run the steps in a tf.function.

  Returns:
    A list of `(should_apply per replica, scale per replica, good_steps per
    replica)` after each step.
  """

  def replica_fn(bad_replica):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    grad = tf.where(tf.equal(replica, bad_replica), INF, 0.5)

    def merge_fn(unused_strategy, grads):
      update_op, should_apply = loss_scale.update(grads)
      with tf.control_dependencies([update_op] if update_op is not None
                                   else []):
        return tf.identity(should_apply)

    should_apply = tf.distribute.get_replica_context().merge_call(
        merge_fn, args=([grad, None],))
    # Each replica returns its own copy of the verdict it was given.
    return tf.identity(should_apply)

  step = lambda bad: strategy.run(replica_fn, args=(bad,))
  if in_function:
    step = tf.function(step)
  records = []
  for bad_replica in bad_replica_per_step:
    should_apply = step(tf.constant(-1 if bad_replica is None else bad_replica))
    records.append((_local(strategy, should_apply),
                    _local(strategy, loss_scale.current_loss_scale),
                    _local(strategy, loss_scale.good_steps)))
  return records


@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'function'])
def test_dynamic_loss_scale_skips_on_every_replica_when_one_overflows(
    mirrored_strategy, in_function):
  with mirrored_strategy.scope():
    loss_scale = tf_loss_scale.DynamicLossScale(16, increment_period=2)
  assert len(mirrored_strategy.experimental_local_results(
      loss_scale.current_loss_scale)) == 2, 'the loss scale must be mirrored'
  # Finite, inf on replica 1, finite, finite, inf on replica 0.
  records = _replica_steps(mirrored_strategy, loss_scale,
                           [None, 1, None, None, 0], in_function)
  expected = [(True, 16, 1), (False, 8, 0), (True, 8, 1), (True, 16, 0),
              (False, 8, 0)]
  for step, (record, want) in enumerate(zip(records, expected)):
    for replica in range(2):
      got = (bool(record[0][replica]), float(record[1][replica]),
             int(record[2][replica]))
      assert got == want, (
          f'step {step}, replica {replica}: (should_apply, scale, good_steps) '
          f'= {got}, expected {want}')


def test_dynamic_loss_scale_update_in_a_replica_context_is_a_clear_error(
    mirrored_strategy):
  with mirrored_strategy.scope():
    loss_scale = tf_loss_scale.DynamicLossScale(16)
  with pytest.raises(RuntimeError) as raised:
    mirrored_strategy.run(lambda: loss_scale.update([tf.constant(1.0)]))
  message = str(raised.value)
  assert 'cross-replica context' in message
  assert 'strategy.run' in message and 'merge_call' in message
  assert _local(mirrored_strategy, loss_scale.current_loss_scale) == [16, 16]


def test_dynamic_loss_scale_update_in_the_cross_replica_context(
    mirrored_strategy):
  with mirrored_strategy.scope():
    loss_scale = tf_loss_scale.DynamicLossScale(16, increment_period=1)
    _, should_apply = loss_scale.update(_per_replica(mirrored_strategy,
                                                     (1.0, 2.0)))
    assert bool(should_apply)
    _, should_apply = loss_scale.update(_per_replica(mirrored_strategy,
                                                     (1.0, NAN)))
    assert not bool(should_apply)
  assert _local(mirrored_strategy, loss_scale.current_loss_scale) == [16, 16]


def test_dynamic_loss_scale_update_takes_python_numbers_as_replica_gradients(
    mirrored_strategy):
  # `tf.cond(pred, lambda: 1., ...)` eagerly returns the Python float: a
  # replica's gradient may be a number rather than a tensor.
  def replica_gradient(bad_value):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.constant(bad_value) if int(replica) == 0 else 1.0

  verdicts = []
  with mirrored_strategy.scope():
    loss_scale = tf_loss_scale.DynamicLossScale(16, increment_period=1)
    for bad_value in (1.0, NAN, 2.0):
      grads = mirrored_strategy.extended.call_for_each_replica(
          replica_gradient, args=(bad_value,))
      _, should_apply = loss_scale.update([grads])
      verdicts.append(bool(should_apply))
  assert verdicts == [True, False, True]
  # 16, doubled, halved, doubled (increment_period=1).
  assert _local(mirrored_strategy, loss_scale.current_loss_scale) == [32, 32]


def test_fixed_loss_scale_works_in_a_replica_context(mirrored_strategy):
  loss_scale = tf_loss_scale.FixedLossScale(4)
  results = mirrored_strategy.run(
      lambda: loss_scale() * tf.cast(loss_scale.update([INF])[1], tf.float32))
  assert _local(mirrored_strategy, results) == [4.0, 4.0]


# --- Context helpers ----------------------------------------------------------


def test_require_cross_replica_context(mirrored_strategy):
  distribute.require_cross_replica_context('Anything')  # no strategy: fine
  with mirrored_strategy.scope():
    distribute.require_cross_replica_context('Anything')
  with pytest.raises(RuntimeError, match='^Updating the scale must happen in '
                     'a cross-replica context'):
    mirrored_strategy.run(
        lambda: distribute.require_cross_replica_context('Updating the scale'))


def test_require_replica_context(mirrored_strategy):
  distribute.require_replica_context('apply_gradients()')  # no strategy: fine
  mirrored_strategy.run(
      lambda: distribute.require_replica_context('apply_gradients()'))
  with mirrored_strategy.scope():
    with pytest.raises(ValueError, match=r'^apply_gradients\(\) must be called '
                       'in a replica context.*strategy.run'):
      distribute.require_replica_context('apply_gradients()')


def test_merge_to_cross_replica_without_a_strategy():
  received = []

  def fn(strategy, a, b):
    received.append(strategy)
    return a + b

  assert distribute.merge_to_cross_replica(fn, 2, 3) == 5
  assert received == [tf.distribute.get_strategy()]


def test_merge_to_cross_replica_sees_per_replica_values(mirrored_strategy):
  seen = []

  def fn(strategy, value):
    assert tf.distribute.in_cross_replica_context()
    seen.append(strategy)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

  def replica_fn():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    total = distribute.merge_to_cross_replica(fn, tf.cast(replica + 1,
                                                          tf.float32))
    return tf.identity(total)

  totals = mirrored_strategy.run(replica_fn)
  assert seen == [mirrored_strategy], 'fn must run once, for all replicas'
  assert _local(mirrored_strategy, totals) == [3.0, 3.0]


@pytest.mark.parametrize('should_apply', [True, False])
def test_apply_on_every_replica_if_applies_per_replica_or_skips_once(
    mirrored_strategy, should_apply):
  applied, skipped = [], []

  def apply_fn(value):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    applied.append((int(replica), float(value)))

  def merge_fn(strategy, value):
    return distribute.apply_on_every_replica_if(
        strategy, tf.constant(should_apply), apply_fn, (value,),
        on_skip=lambda: skipped.append('skip'))

  def replica_fn():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    value = tf.cast(replica, tf.float32) * 10.0
    return tf.distribute.get_replica_context().merge_call(merge_fn,
                                                          args=(value,))

  verdicts = _local(mirrored_strategy, mirrored_strategy.run(replica_fn))
  assert verdicts and all(v == should_apply for v in verdicts), verdicts
  if should_apply:
    assert sorted(applied) == [(0, 0.0), (1, 10.0)] and not skipped
  else:
    assert applied == [] and skipped == ['skip']


@pytest.mark.parametrize('should_apply', [True, False])
def test_apply_on_every_replica_if_in_a_tf1_graph_runs_the_chosen_branch(
    should_apply):
  with tf.Graph().as_default():
    applied = tf.Variable(0)
    skipped = tf.Variable(0)
    predicate = tf.compat.v1.placeholder(tf.bool, [])
    verdict = distribute.apply_on_every_replica_if(
        tf.distribute.get_strategy(), predicate,
        lambda: applied.assign_add(1).op, (),
        on_skip=lambda: skipped.assign_add(1).op)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      assert session.run(verdict, {predicate: should_apply}) == should_apply
      assert session.run([applied, skipped]) == (
          [1, 0] if should_apply else [0, 1])


@pytest.mark.parametrize('should_apply', [True, False])
def test_apply_on_every_replica_if_in_a_tf1_graph_gates_ops_built_on_replicas(
    mirrored_strategy, should_apply):
  # A sync-on-read variable is updated inside each replica's own thread,
  # with no merge_call back to the thread that built the gate.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    with mirrored_strategy.scope():
      counter = tf.Variable(
          0.0, synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    predicate = tf.compat.v1.placeholder(tf.bool, [])

    def merge_fn(strategy):
      return distribute.apply_on_every_replica_if(
          strategy, predicate, lambda: counter.assign_add(1.0).op, ())

    verdicts = mirrored_strategy.experimental_local_results(
        mirrored_strategy.run(
            lambda: tf.distribute.get_replica_context().merge_call(merge_fn)))
    session.run(tf.compat.v1.global_variables_initializer())
    verdicts = session.run(list(verdicts), {predicate: should_apply})
    assert verdicts and all(v == should_apply for v in verdicts), verdicts
    per_replica = session.run(
        list(mirrored_strategy.experimental_local_results(counter)))
  assert per_replica == ([1.0, 1.0] if should_apply else [0.0, 0.0])


# --- merge_step: what a step reads ---------------------------------------------


def test_a_step_reads_dividends_under_xla_and_quotients_elsewhere(monkeypatch):
  read = gradients.read
  seen = []
  monkeypatch.setattr(gradients, 'read',
                      lambda grads, **kw: seen.append(grads) or read(grads, **kw))

  def chosen():
    dividend = tf.constant([4.0])
    del seen[:]
    finite = distribute.merge_step(
        lambda strategy, grads, reading: reading().finite, [dividend],
        tf.constant(4.0), scaled=[True])
    return finite, seen[0][0] is dividend

  finite, read_dividend = chosen()
  assert bool(finite) and not read_dividend
  assert not bool(tf.function(chosen)()[1])
  assert bool(tf.function(chosen, jit_compile=True)()[1])


def test_merge_step_needs_one_scaled_flag_per_gradient():
  with pytest.raises(ValueError, match='2 gradients but 1 scaled flags'):
    distribute.merge_step(lambda *_: None, [tf.constant(1.0), None],
                          tf.constant(2.0), scaled=[True])
