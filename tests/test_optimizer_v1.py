"""Specification of tf_loss_scale/optimizer_v1.py, the tf.compat.v1 wrapper.

TensorFlow's own `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`
is the oracle: the same seeded sequences of finite, inf, NaN and scale-dependent
overflowing gradients go through both, in a TF1 session, eagerly and in a
tf.function, and every step's loss scale, verdict, variables, slots and global
step must be identical.
"""

import contextlib
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
import v1_training
import versions

INF, NAN = np.inf, np.nan
TF_V1 = tf.compat.v1.mixed_precision
MODES = v1_training.MODES
OPTIMIZERS = v1_training.OPTIMIZERS
OURS, THEIRS = v1_training.OURS, v1_training.THEIRS
Model = v1_training.Model


# --- Differential: ours against TensorFlow's, step by step --------------------


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('optimizer_name,seed', [
    ('sgd', 1), ('momentum', 5), ('adam', 7)])
def test_dynamic_matches_tensorflow_step_by_step(optimizer_name, seed, mode):
  steps = v1_training.random_steps(seed)
  make_loss_scale = lambda classes: classes[1](2.0**15, increment_period=2)
  make_inner = OPTIMIZERS[optimizer_name]
  ours = v1_training.train(OURS, make_inner, make_loss_scale, steps, mode)
  theirs = v1_training.train(THEIRS, make_inner, make_loss_scale, steps, mode)
  v1_training.assert_same_trajectory(ours, theirs)
  # The sequence must exercise every branch: applied steps, skipped steps,
  # and skips caused by the scale itself (finite inputs that overflow). In a
  # tf.function Grappler folds `x * scale * (1 / scale)` to `x`, for
  # TensorFlow's class as for ours, so the float32 overflow never happens.
  applied = v1_training.applied_steps(ours)
  assert any(applied) and not all(applied), applied
  finite_inputs = [np.all(np.isfinite(x)) and np.all(np.isfinite(y))
                   for x, y in steps]
  overflowed = [f and not a for f, a in zip(finite_inputs, applied)]
  assert any(overflowed) == (mode != 'function'), overflowed


@pytest.mark.parametrize('mode', MODES)
def test_fixed_matches_tensorflow_and_never_skips(mode):
  steps = [(x, y) for x, y in v1_training.random_steps(3, count=8)
           if np.all(np.isfinite(x)) and np.all(np.isfinite(y))]
  make_loss_scale = lambda classes: classes[2](128)
  make_inner = OPTIMIZERS['momentum']
  ours = v1_training.train(OURS, make_inner, make_loss_scale, steps, mode)
  theirs = v1_training.train(THEIRS, make_inner, make_loss_scale, steps, mode)
  v1_training.assert_same_trajectory(ours, theirs)
  assert all(v1_training.applied_steps(ours))


# --- The wrapper --------------------------------------------------------------


def test_wraps_only_v1_optimizers_naming_the_type():
  with pytest.raises(ValueError, match='SGD'):
    tf_loss_scale.MixedPrecisionLossScaleOptimizer(keras.optimizers.SGD(),
                                                   'dynamic')
  with pytest.raises(ValueError, match='str'):
    tf_loss_scale.MixedPrecisionLossScaleOptimizer('sgd', 'dynamic')


@pytest.mark.parametrize('loss_scale', [
    None, 'bogus', [2], 0.5, TF_V1.DynamicLossScale()])
def test_refuses_a_missing_or_unrecognised_loss_scale(loss_scale):
  with pytest.raises(ValueError, match='loss.scale'):
    tf_loss_scale.MixedPrecisionLossScaleOptimizer(OPTIMIZERS['sgd'](),
                                                   loss_scale)


def test_loss_scale_identifiers():
  dynamic = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), 'dynamic').loss_scale
  assert isinstance(dynamic, tf_loss_scale.DynamicLossScale)
  assert dynamic.get_config() == TF_V1.DynamicLossScale().get_config()
  fixed = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), 64).loss_scale
  assert isinstance(fixed, tf_loss_scale.FixedLossScale)
  assert float(fixed()) == 64.0
  given = tf_loss_scale.DynamicLossScale(8)
  assert tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), given).loss_scale is given


def test_name_gates_and_inner_optimizer():
  inner = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, name='MyMomentum')
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(inner, 'dynamic')
  assert optimizer.get_name() == 'MyMomentum'
  assert optimizer.inner_optimizer is inner
  assert isinstance(optimizer, tf.compat.v1.train.Optimizer)
  klass = tf_loss_scale.MixedPrecisionLossScaleOptimizer
  assert (klass.GATE_NONE, klass.GATE_OP, klass.GATE_GRAPH) == (0, 1, 2)
  assert (optimizer.GATE_NONE, optimizer.GATE_OP,
          optimizer.GATE_GRAPH) == (0, 1, 2)


def test_variables_slots_and_slot_names_go_beyond_tensorflow():
  names = {}
  for classes in (OURS, THEIRS):
    with tf.Graph().as_default():
      model = Model()
      inner = OPTIMIZERS['momentum']()
      optimizer = classes[0](inner, classes[1](8))
      optimizer.minimize(model.loss(tf.ones([3]), tf.ones([2, 2])),
                         var_list=model.weights)
      names[classes] = [v.name for v in optimizer.variables()]
      if classes is THEIRS:
        assert optimizer.get_slot_names() == []  # TensorFlow hides the slots
        assert optimizer.get_slot(model.w, 'momentum') is None
        continue
      if versions.TF >= (2, 15):
        assert optimizer.get_slot_names() == inner.get_slot_names()
        assert optimizer.get_slot_names() == ['momentum']
      else:
        # TensorFlow 2.14 and earlier would save forwarded slots twice.
        assert optimizer.get_slot_names() == []
      for variable in (model.w, model.embedding):
        slot = optimizer.get_slot(variable, 'momentum')
        assert slot is not None and slot is inner.get_slot(variable,
                                                          'momentum')
      assert optimizer.get_slot(model.unused, 'momentum') is None
      assert optimizer.get_slot(model.w, 'nonexistent') is None
      loss_scale = optimizer.loss_scale
      assert optimizer.variables() == inner.variables() + [
          loss_scale.current_loss_scale, loss_scale.good_steps]
  assert names[OURS] == names[THEIRS]
  assert sorted(names[OURS]) == [
      'current_loss_scale:0', 'embedding/Momentum:0', 'good_steps:0',
      'w/Momentum:0']


def test_variables_with_a_fixed_loss_scale_are_the_inner_ones():
  with tf.Graph().as_default():
    model = Model()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['adam'](), 16)
    optimizer.minimize(model.loss(tf.ones([3]), tf.ones([2, 2])),
                       var_list=model.weights)
    assert optimizer.variables() == optimizer.inner_optimizer.variables()
    assert len(optimizer.variables()) == 6  # two beta powers, m and v twice


# --- compute_gradients --------------------------------------------------------


class RecordingOptimizer(tf.compat.v1.train.GradientDescentOptimizer):
  """Gradient descent that records what compute_gradients was given."""

  def __init__(self):
    super().__init__(0.1)
    self.calls = []

  def compute_gradients(self, loss, **kwargs):
    self.calls.append(dict(kwargs, loss=loss))
    return super().compute_gradients(loss, **kwargs)


def test_compute_gradients_scales_the_loss_and_passes_arguments_through():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    model = Model()
    inner = RecordingOptimizer()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        inner, tf_loss_scale.DynamicLossScale(32))
    x = tf.constant([1.0, 2.0, 3.0])
    y = tf.constant([[1.0, -1.0], [0.5, 0.25]])
    loss = model.loss(x, y)
    grad_loss = tf.constant(2.0)
    grads_and_vars = optimizer.compute_gradients(
        loss, var_list=[model.w, model.embedding, model.unused],
        gate_gradients=optimizer.GATE_GRAPH,
        aggregation_method=tf.AggregationMethod.EXPERIMENTAL_TREE,
        colocate_gradients_with_ops=True, grad_loss=grad_loss)
    session.run(tf.compat.v1.global_variables_initializer())
    call, = inner.calls
    assert call['var_list'] == [model.w, model.embedding, model.unused]
    assert call['gate_gradients'] == 2
    assert call['aggregation_method'] == (
        tf.AggregationMethod.EXPERIMENTAL_TREE)
    assert call['colocate_gradients_with_ops'] is True
    assert call['grad_loss'] is grad_loss
    loss_value, scaled_value = session.run([loss, call['loss']])
    assert scaled_value == loss_value * 32
    (w_grad, w), (e_grad, e), (u_grad, u) = grads_and_vars
    assert (w, e, u) == (model.w, model.embedding, model.unused)
    assert u_grad is None
    assert isinstance(e_grad, tf.IndexedSlices)
    np.testing.assert_array_equal(session.run(w_grad), [2.0, 4.0, 6.0])
    values, indices = session.run([e_grad.values, e_grad.indices])
    np.testing.assert_array_equal(values, [[2.0, -2.0], [1.0, 0.5]])
    np.testing.assert_array_equal(indices, v1_training.EMBEDDING_IDS)


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_compute_gradients_of_a_callable_loss(mode):
  model = Model()
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), tf_loss_scale.DynamicLossScale(2.0**20))
  x = tf.constant([1e-3, 2.0, -3.0])
  y = tf.constant([[1.0, -1.0], [0.5, 0.25]])

  def gradients():
    grads_and_vars = optimizer.compute_gradients(lambda: model.loss(x, y),
                                                 var_list=model.weights)
    assert [v for _, v in grads_and_vars] == model.weights
    assert grads_and_vars[2][0] is None
    assert isinstance(grads_and_vars[1][0], tf.IndexedSlices)
    sparse = grads_and_vars[1][0]
    return grads_and_vars[0][0], sparse.values, sparse.indices

  if mode == 'function':
    gradients = tf.function(gradients)
  w_grad, values, indices = gradients()
  np.testing.assert_array_equal(w_grad.numpy(), x.numpy())
  np.testing.assert_array_equal(values.numpy(), y.numpy())
  np.testing.assert_array_equal(indices.numpy(), v1_training.EMBEDDING_IDS)


def test_compute_gradients_eagerly_needs_a_callable():
  model = Model()
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), 'dynamic')
  with pytest.raises(RuntimeError, match='function'):
    optimizer.compute_gradients(model.loss(tf.ones([3]), tf.ones([2, 2])),
                                var_list=model.weights)


def test_float16_gradients_are_unscaled_in_float16():
  model = Model(tf.float16)
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), tf_loss_scale.DynamicLossScale(2.0**12))
  x = tf.constant([1e-3, 0.5, -2.0], tf.float16)
  y = tf.constant([[3e-4, -1.0], [0.5, 8.0]], tf.float16)
  grads_and_vars = optimizer.compute_gradients(lambda: model.loss(x, y),
                                               var_list=model.weights)
  w_grad, sparse = grads_and_vars[0][0], grads_and_vars[1][0]
  assert w_grad.dtype == tf.float16
  assert isinstance(sparse, tf.IndexedSlices)
  assert sparse.values.dtype == tf.float16
  np.testing.assert_array_equal(w_grad.numpy(), x.numpy())
  np.testing.assert_array_equal(sparse.values.numpy(), y.numpy())
  # The step applies in float16 too.
  optimizer.apply_gradients(grads_and_vars)
  np.testing.assert_array_equal(
      model.w.numpy(),
      (np.array([0.5, -1.0, 2.0], np.float16) - np.float16(0.1) * x.numpy()))


def test_float16_gradient_overflow_skips_the_step():
  model = Model(tf.float16)
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), tf_loss_scale.DynamicLossScale(2.0**15))
  x = tf.constant([4.0, 0.5, -2.0], tf.float16)  # 4 * 2**15 overflows float16
  optimizer.minimize(lambda: model.loss(x, tf.ones([2, 2], tf.float16)),
                     var_list=model.weights)
  np.testing.assert_array_equal(model.w.numpy(), [0.5, -1.0, 2.0])
  assert float(optimizer.loss_scale()) == 2.0**14


# --- apply_gradients ----------------------------------------------------------


def _momentum_slot(optimizer, variable):
  return optimizer.get_slot(variable, 'momentum')


def test_skipped_step_in_a_graph_changes_only_the_loss_scale():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    model = Model()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['momentum'](), tf_loss_scale.DynamicLossScale(8))
    x = tf.compat.v1.placeholder(tf.float32, [3])
    train_op = optimizer.minimize(
        model.loss(x, tf.ones([2, 2])), var_list=model.weights,
        global_step=model.global_step, name='train_step')
    assert isinstance(train_op, tf.Operation)
    assert train_op.name == 'train_step'
    watched = [model.w, model.embedding, model.global_step,
               _momentum_slot(optimizer, model.w),
               _momentum_slot(optimizer, model.embedding)]
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(train_op, {x: [1.0, 1.0, 1.0]})
    before = session.run(watched)
    assert session.run(model.global_step) == 1
    for step, bad in enumerate([INF, NAN, -INF]):
      session.run(train_op, {x: [1.0, bad, 1.0]})
      after = session.run(watched)
      for name, old, new in zip(['w', 'embedding', 'global_step',
                                 'momentum(w)', 'momentum(embedding)'],
                                before, after):
        np.testing.assert_array_equal(new, old,
                                      err_msg=f'skipped step {step}: {name}')
      assert session.run(optimizer.loss_scale()) == 8.0 / 2**(step + 1)
    session.run(train_op, {x: [1.0, 1.0, 1.0]})
    assert session.run(model.global_step) == 2


def test_ops_that_wait_for_a_skipped_step_in_a_graph_still_run():
  # The train op must be live on a skipped step: a fetch that depends on it
  # would otherwise fail to produce a value.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    model = Model()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['sgd'](), tf_loss_scale.DynamicLossScale(8))
    x = tf.compat.v1.placeholder(tf.float32, [3])
    train_op = optimizer.minimize(model.loss(x, tf.ones([2, 2])),
                                  var_list=model.weights,
                                  global_step=model.global_step)
    with tf.control_dependencies([train_op]):
      step_after = tf.identity(model.global_step.read_value())
      scale_after = tf.identity(optimizer.loss_scale())
    session.run(tf.compat.v1.global_variables_initializer())
    for step, (bad, global_step, scale) in enumerate(
        [(1.0, 1, 8.0), (NAN, 1, 4.0), (INF, 1, 2.0), (1.0, 2, 2.0)]):
      assert session.run([step_after, scale_after], {x: [1.0, bad, 1.0]}) == [
          global_step, scale], f'step {step}'


def _tensors_through_branches(variable_count):
  """How many tensors enter a branch op (Switch, If) in one wrapped step."""
  with tf.Graph().as_default() as graph:
    variables = [tf.Variable(tf.ones([4])) for _ in range(variable_count)]
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['momentum'](), 'dynamic')
    optimizer.minimize(tf.add_n([tf.reduce_sum(v * v) for v in variables]),
                       var_list=variables)
    return sum(len(op.inputs) for op in graph.get_operations()
               if op.type in ('Switch', 'If', 'StatelessIf'))


def test_a_graph_step_branches_on_no_gradient_or_variable():
  # A tf.cond around the apply would route every gradient and variable handle
  # into its branch (one Switch each once the session lowers it); the
  # apply-or-skip gate and the finite check route none.
  assert _tensors_through_branches(30) == _tensors_through_branches(2)


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_skipped_step_changes_only_the_loss_scale(mode):
  model = Model()
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['momentum'](), tf_loss_scale.DynamicLossScale(8))
  results = []

  def step(x):
    results.append(optimizer.minimize(
        lambda: model.loss(x, tf.ones([2, 2])), var_list=model.weights,
        global_step=model.global_step))

  if mode == 'function':
    step = tf.function(step)
  step(tf.constant([1.0, 1.0, 1.0]))
  if mode == 'eager':
    assert results[0] is None, 'eagerly the step is done, nothing to run'
  watched = lambda: [v.numpy() for v in (
      model.w, model.embedding, model.global_step,
      _momentum_slot(optimizer, model.w),
      _momentum_slot(optimizer, model.embedding))]
  before = watched()
  step(tf.constant([1.0, NAN, 1.0]))
  for name, old, new in zip(['w', 'embedding', 'global_step', 'momentum(w)',
                             'momentum(embedding)'], before, watched()):
    np.testing.assert_array_equal(new, old, err_msg=name)
  assert float(optimizer.loss_scale()) == 4.0
  assert int(optimizer.loss_scale.good_steps.numpy()) == 0


def test_apply_gradients_keeps_none_gradients():
  model = Model()
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      OPTIMIZERS['sgd'](), 'dynamic')
  optimizer.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), model.w),
                             (None, model.unused)],
                            global_step=model.global_step)
  np.testing.assert_allclose(model.w.numpy(), [0.4, -1.1, 1.9])
  np.testing.assert_array_equal(model.unused.numpy(), [1.0])
  assert int(model.global_step.numpy()) == 1


def test_apply_gradients_in_a_cross_replica_context_raises(mirrored_strategy):
  with mirrored_strategy.scope():
    model = Model()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['sgd'](), 'dynamic')
    with pytest.raises(ValueError, match='replica context'):
      optimizer.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), model.w)])


# --- Under MirroredStrategy ---------------------------------------------------


def test_minimize_on_two_replicas_in_a_tf1_graph_is_one_fetchable_op(
    mirrored_strategy):
  # As TensorFlow's wrapper: every replica returns the same Operation, so
  # what `strategy.run` returns is that op, not a PerReplica of ops.
  with tf.Graph().as_default():
    with mirrored_strategy.scope():
      var = tf.Variable([5.0])
      optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(1.0),
          tf_loss_scale.DynamicLossScale(initial_loss_scale=2,
                                         increment_period=1))
      train_op = mirrored_strategy.run(lambda: optimizer.minimize(
          lambda: var * 0.5, var_list=[var], name='train'))
    assert isinstance(train_op, tf.Operation), type(train_op)
    assert train_op.name == 'train'
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      # 0.5 per replica, summed over two: 5 - 1.
      assert session.run(var).tolist() == [4.0]
      assert session.run(optimizer.loss_scale()) == 4.0


def _mirrored_training(strategy, classes, bad_steps, mode='function'):
  """Trains with `minimize` on two replicas; one replica may overflow.

  Args:
    strategy: A two-replica MirroredStrategy.
    classes: `OURS` or `THEIRS`.
    bad_steps: For each step, None or `(replica, value)`: that replica's
      gradient holds `value` (inf or NaN) in that step.
    mode: 'function' (strategy.run in a tf.function) or 'graph' (in a TF1
      session).

  Returns:
    One dict per step, from variable name to its per-replica values.
  """
  graph = tf.Graph() if mode == 'graph' else None
  with graph.as_default() if graph else contextlib.nullcontext():
    with strategy.scope():
      model = Model()
      optimizer = classes[0](OPTIMIZERS['momentum'](),
                             classes[1](16, increment_period=2))

    def replica_step(bad_replica, bad_value):
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      x = tf.where(tf.equal(replica, bad_replica),
                   tf.stack([1.0, bad_value, 1.0]),
                   tf.constant([1.0, 2.0, 3.0]) * tf.cast(replica + 1,
                                                         tf.float32))
      return optimizer.minimize(lambda: model.loss(x, tf.ones([2, 2])),
                                var_list=model.weights,
                                global_step=model.global_step)

    def run_step(bad_replica, bad_value):
      return strategy.group(strategy.run(replica_step,
                                         args=(bad_replica, bad_value)))

    if graph:
      session = tf.compat.v1.Session(graph=graph)
      inputs = (tf.compat.v1.placeholder(tf.int32, []),
                tf.compat.v1.placeholder(tf.float32, []))
      train_op = run_step(*inputs)
      session.run(tf.compat.v1.global_variables_initializer())
      step = lambda *values: session.run(train_op, dict(zip(inputs, values)))
      read = session.run
    else:

      @tf.function
      def step(*values):
        run_step(*values)

      read = lambda variables: tf.nest.map_structure(np.asarray, variables)
    records = []
    for bad in bad_steps:
      step(*(bad if bad is not None else (-1, 0.0)))
      state = v1_training.state_variables(model, optimizer)
      records.append(read({
          name: list(strategy.experimental_local_results(variable))
          for name, variable in state.items()}))
    if graph:
      session.close()
  return records


@pytest.mark.parametrize('mode', ['function', 'graph'])
def test_overflow_on_one_replica_skips_the_step_on_both(mirrored_strategy,
                                                        mode):
  records = _mirrored_training(mirrored_strategy, OURS,
                               [None, (1, INF), (0, NAN), None], mode)
  # Per replica the gradient of w is (1, 2, 3) * (replica + 1); the
  # replicas' gradients are summed, so an applied step uses (3, 6, 9).
  w_after_first = np.array([0.5, -1.0, 2.0]) - 0.1 * np.array([3.0, 6.0, 9.0])
  expected = [  # (w, global_step, loss scale, good_steps)
      (w_after_first, 1, 16.0, 1),
      (w_after_first, 1, 8.0, 0),
      (w_after_first, 1, 4.0, 0),
      (None, 2, 4.0, 1),
  ]
  for step, (record, (w, global_step, scale, good_steps)) in enumerate(
      zip(records, expected)):
    for replica in range(2):
      where = f'step {step}, replica {replica}'
      if w is not None:
        np.testing.assert_allclose(record['w'][replica], w, rtol=1e-6,
                                   err_msg=where)
      assert record['global_step'][replica] == global_step, where
      assert v1_training.named(
          record, 'current_loss_scale')[replica] == scale, where
      assert v1_training.named(
          record, 'good_steps')[replica] == good_steps, where
      for name, values in record.items():
        np.testing.assert_array_equal(
            values[replica], values[0],
            err_msg=f'{where}: {name} differs from replica 0')
  for name in records[0]:
    if name.endswith(('current_loss_scale', 'good_steps')):
      continue
    np.testing.assert_array_equal(
        records[2][name][1], records[0][name][1],
        err_msg=f'skipped steps changed {name} on replica 1')


@pytest.mark.parametrize('mode', ['function', 'graph'])
def test_mirrored_matches_tensorflow_step_by_step(mirrored_strategy, mode):
  bad_steps = [None, (1, INF), None, None, (0, NAN), (1, -INF), None, None,
               None]
  ours = _mirrored_training(mirrored_strategy, OURS, bad_steps, mode)
  theirs = _mirrored_training(mirrored_strategy, THEIRS, bad_steps, mode)
  for step, (mine, reference) in enumerate(zip(ours, theirs)):
    assert sorted(mine) == sorted(reference), f'step {step}: variable names'
    for name in reference:
      for replica in range(2):
        np.testing.assert_array_equal(
            mine[name][replica], reference[name][replica],
            err_msg=f'step {step}, replica {replica}: {name} differs '
            '(ours vs tensorflow)')


_WHILE_LOOP_STEPS_SEED = 11


def _train_in_a_while_loop_with_v1_control_flow(classes_name):
  """`v1_training.train_in_a_while_loop` in a process with TF1 control flow.

  `disable_control_flow_v2` is process-wide, so it runs in a child process.
  """
  code = (
      'import json, tensorflow as tf, v1_training\n'
      'tf.compat.v1.disable_control_flow_v2()\n'
      f'steps = v1_training.random_steps({_WHILE_LOOP_STEPS_SEED})\n'
      'print(json.dumps(v1_training.train_in_a_while_loop('
      f'v1_training.{classes_name}, steps)))\n')
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.abspath(__file__))] + sys.path))
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, env=env, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('control_flow', ['v2', 'v1'])
def test_training_inside_a_while_loop_matches_tensorflow(control_flow):
  # Skipping inside a loop body: the apply-or-skip gate must work within a
  # while_v2 body function and within a TF1 while frame alike.
  if control_flow == 'v1':
    ours, theirs = (_train_in_a_while_loop_with_v1_control_flow(name)
                    for name in ('OURS', 'THEIRS'))
  else:
    steps = v1_training.random_steps(_WHILE_LOOP_STEPS_SEED)
    ours, theirs = (v1_training.train_in_a_while_loop(classes, steps)
                    for classes in (OURS, THEIRS))
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(ours[name], theirs[name],
                                  err_msg=f'{name} after the loop')
  # The sequence skipped some steps and applied others.
  steps_taken = len(v1_training.random_steps(_WHILE_LOOP_STEPS_SEED))
  assert 0 < ours['global_step'] < steps_taken, ours['global_step']


# --- A user's own LossScale ------------------------------------------------------


class ConstantUserScale(tf_loss_scale.LossScale):
  """A user's scale that honours the documented contract and never skips.

  `update` returns `(None, True)`, or `(a no-op, True)` with `with_op`.
  """

  def __init__(self, with_op):
    super().__init__()
    self._with_op = with_op

  def __call__(self):
    return tf.constant(4.0)

  # Plain Python: AutoGraph on TensorFlow 2.15 may fail to convert a test
  # class's methods, depending on what other tests traced before.
  @tf.autograph.experimental.do_not_convert
  def update(self, grads):
    del grads
    return (tf.no_op() if self._with_op else None), True

  def get_config(self):
    return {'with_op': self._with_op}


@pytest.mark.parametrize('with_op', [False, True], ids=['none', 'no_op'])
@pytest.mark.parametrize('mode', MODES)
def test_a_user_loss_scale_that_never_skips_applies_every_step(mode, with_op):
  # The verdict decides, not the class: the Python True must not lose the
  # apply op. Gradients are unscaled: w moves by lr * x each step.
  with (tf.Graph().as_default() if mode == 'graph' else
        contextlib.nullcontext()):
    model = Model()
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        OPTIMIZERS['sgd'](), ConstantUserScale(with_op))
    x = tf.constant([1.0, 2.0, 4.0])

    def step():
      optimizer.minimize(lambda: model.loss(x, tf.ones([2, 2])),
                         var_list=model.weights, global_step=model.global_step)

    if mode == 'graph':
      train_op = optimizer.minimize(model.loss(x, tf.ones([2, 2])),
                                    var_list=model.weights,
                                    global_step=model.global_step)
      assert isinstance(train_op, tf.Operation)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
        session.run(train_op)
        w, global_step = session.run([model.w, model.global_step])
    else:
      (tf.function(step) if mode == 'function' else step)()
      (tf.function(step) if mode == 'function' else step)()
      w, global_step = model.w.numpy(), model.global_step.numpy()
  np.testing.assert_allclose(w, [0.5 - 0.2, -1.0 - 0.4, 2.0 - 0.8], rtol=1e-6)
  assert global_step == 2


def test_a_float16_sum_that_overflows_across_replicas_is_skipped(
    mirrored_strategy):
  # Each replica's float16 gradient is finite (40000; float16's largest is
  # 65504), their sum across the two replicas is not: the step is skipped.
  with mirrored_strategy.scope():
    var = tf.Variable(tf.constant([1.0, 2.0], tf.float16))
    opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1e-5),
        tf_loss_scale.DynamicLossScale(initial_loss_scale=8.0))

  @tf.function
  def train_step(value):
    def replica_step():
      opt.apply_gradients([(tf.fill([2], tf.cast(value, tf.float16)), var)])
    mirrored_strategy.run(replica_step)

  train_step(40000.0)
  for replica, value in enumerate(
      mirrored_strategy.experimental_local_results(var)):
    np.testing.assert_array_equal(value.numpy(), [1.0, 2.0],
                                  err_msg=f'replica {replica} applied inf')
  assert float(opt.loss_scale()) == 4.0
  train_step(1000.0)  # 2000 summed: applied.
  np.testing.assert_allclose(var.numpy(), [0.98, 1.98], rtol=1e-3)
  assert float(opt.loss_scale()) == 4.0
