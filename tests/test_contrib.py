"""`tf_loss_scale.contrib.mixed_precision`: TF 1.13-1.15's contrib API.

The managers' rule (the one rule's `backoff_factor` and
`non_finite_count='accumulated'` options), their arguments' checks, the
optimizer's step in a TF1 graph, eagerly, in a `tf.function` and with two
replicas, a user's own manager, the skip report, and NVIDIA BERT's loop run
unmodified through `tf-loss-scale run`. tests/test_traces.py compares the
graphs with TF 1.15.0 itself, step by step; tests/test_launcher_programs.py
the BERT loop's output with what TF 1.15.0 printed, recorded in CI.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import fresh_process
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import monitoring
from tf_loss_scale.contrib import mixed_precision as mp

INF, NAN = float('inf'), float('nan')
v1 = tf.compat.v1
_PROGRAM = os.path.join(os.path.dirname(__file__), 'legacy', 'launcher',
                        'tf1_contrib_bert_loop.py')
# What TensorFlow 1.15.0 printed for tf1_contrib_bert_loop.py (also
# tests/test_launcher_programs.py's record): 2**32 halves every 2 skipped
# steps until the float16 kernel gradient fits, at 2**12; the loop's global
# step moves on finite steps only.
BERT_SCALES = [2.0 ** (32 - (step + 1) // 2) for step in range(40)] + [
    4096.0] * 10
BERT_STEPS = [0] * 40 + list(range(1, 11))
BERT_WEIGHTS = [0.5533382296562195, 0.40935155749320984, 0.5272089838981628]


def _rule(verdicts, **options):
  """(scale, good_steps, count) after each verdict, by the pure rule."""
  state = loss_scale_lib.DynamicState(tf.constant(16.0), tf.constant(0, tf.int32),
                                      tf.constant(0, tf.int64))
  found = []
  for finite in verdicts:
    state = loss_scale_lib.advance_dynamic_state(state, finite, **options)
    found.append((float(state.scale), int(state.good_steps),
                  int(state.non_finite_streak)))
  return found


_CONTRIB_OPTIONS = dict(increment_period=3, multiplier=2.0, hysteresis=2,
                        backoff_factor=0.75, non_finite_count='accumulated')


def test_accumulated_count_survives_finite_steps_and_shrinks_by_the_factor():
  assert _rule([False, True, False, True, True, True], **_CONTRIB_OPTIONS) == [
      (16.0, 0, 1), (16.0, 1, 1), (12.0, 0, 0), (12.0, 1, 0), (12.0, 2, 0),
      (24.0, 0, 0)]


def test_completed_period_clears_the_accumulated_count():
  assert _rule([False, True, True, True, False], **_CONTRIB_OPTIONS) == [
      (16.0, 0, 1), (16.0, 1, 1), (16.0, 2, 1), (32.0, 0, 0), (32.0, 0, 1)]


def test_consecutive_count_is_still_the_default():
  # The same verdicts with the library's own hysteresis: a finite step ends
  # the streak, so the second overflow does not shrink.
  assert _rule([False, True, False], increment_period=3, multiplier=2.0,
               hysteresis=2) == [(16.0, 0, 1), (16.0, 1, 0), (16.0, 0, 1)]


def test_unknown_non_finite_count_is_refused():
  with pytest.raises(ValueError, match="'consecutive' or 'accumulated'"):
    _rule([True], increment_period=1, multiplier=2.0, non_finite_count='all')


def test_fixed_manager_refuses_a_scale_below_one_with_tf_1_15s_message():
  with pytest.raises(ValueError, match=r'^loss scale must be at least 1\.$'):
    mp.FixedLossScaleManager(0.5)


def test_optimizer_refuses_what_has_no_optimizer_methods():
  manager = mp.FixedLossScaleManager(8.0)
  with pytest.raises(TypeError, match=r'opt must have .* compute_gradients'):
    mp.LossScaleOptimizer(object(), manager)
  with pytest.raises(TypeError, match=r'loss_scale_manager must have .*'
                     r'no get_loss_scale, update_loss_scale'):
    mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), 8.0)


def test_manager_is_abstract():
  with pytest.raises(TypeError, match='abstract'):
    mp.LossScaleManager()  # pylint: disable=abstract-class-instantiated


def _graph_steps(make_manager, gradients, make_opt=None, minimize=True):
  """Trains `w` in a TF1 graph; (scale, good, bad, global step, w) a step."""
  with tf.Graph().as_default():
    w = v1.Variable([1.0, 2.0], name='w')
    feed = v1.placeholder(tf.float32, [2])
    global_step = v1.train.get_or_create_global_step()
    manager = make_manager()
    opt = mp.LossScaleOptimizer(
        (make_opt or (lambda: v1.train.GradientDescentOptimizer(0.5)))(),
        manager)
    loss = tf.reduce_sum(w * feed)
    if minimize:
      train = opt.minimize(loss, global_step=global_step)
    else:
      train = opt.apply_gradients(opt.compute_gradients(loss),
                                  global_step=global_step)
    counters = [getattr(manager, name, tf.constant(-1)) for name in
                ('_num_good_steps', '_num_bad_steps')]
    found = []
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      for gradient in gradients:
        session.run(train, {feed: gradient})
        scale, good, bad, step, value = session.run(
            [manager.get_loss_scale()] + counters + [global_step, w])
        found.append((float(scale), int(good), int(bad), int(step),
                      value.tolist()))
  return found, opt


def test_exponential_manager_in_a_graph_skips_and_accumulates_bad_steps():
  found, _ = _graph_steps(
      lambda: mp.ExponentialUpdateLossScaleManager(8.0, 2, decr_ratio=0.5),
      [[1.0, 1.0], [INF, 1.0], [1.0, 1.0], [NAN, 1.0], [1.0, 1.0]],
      minimize=False)
  assert found == [
      (8.0, 1, 0, 1, [0.5, 1.5]),
      (8.0, 0, 1, 1, [0.5, 1.5]),    # skipped: w and global_step stay
      (8.0, 1, 1, 2, [0.0, 1.0]),    # bad_steps kept
      (4.0, 0, 0, 2, [0.0, 1.0]),    # the second bad step halves
      (4.0, 1, 0, 3, [-0.5, 0.5])]


def test_growth_that_would_overflow_float32_is_not_taken():
  found, _ = _graph_steps(
      lambda: mp.ExponentialUpdateLossScaleManager(2.0 ** 127, 1),
      [[1.0, 1.0]] * 2)
  assert [entry[:3] for entry in found] == [(2.0 ** 127, 0, 0)] * 2


def test_shrinking_stops_at_one():
  found, _ = _graph_steps(
      lambda: mp.ExponentialUpdateLossScaleManager(
          2.0, 100, decr_every_n_nan_or_inf=1), [[INF, 1.0]] * 5)
  ratio, scale, expected = np.float32(0.8), np.float32(2.0), []
  for _ in range(3):
    scale = np.float32(scale * ratio)  # 1.6, 1.28, 1.024 in float32
    expected.append(float(scale))
  assert [entry[0] for entry in found] == expected + [1.0, 1.0]


def test_fixed_manager_still_skips_a_non_finite_step():
  found, _ = _graph_steps(lambda: mp.FixedLossScaleManager(4.0),
                          [[INF, 1.0], [1.0, 1.0]])
  assert [(entry[0], entry[3], entry[4]) for entry in found] == [
      (4.0, 0, [1.0, 2.0]), (4.0, 1, [0.5, 1.5])]


class _Quartering(mp.LossScaleManager):
  """A user's own manager: records each verdict it is given."""

  def __init__(self):
    self._scale = v1.Variable(64.0, trainable=False, name='own_scale')
    self.verdicts = v1.Variable(0, trainable=False, name='verdicts')

  def get_loss_scale(self):
    return self._scale

  def update_loss_scale(self, finite_grads):
    return tf.group(
        self._scale.assign(tf.where(finite_grads, self._scale,
                                    self._scale / 4)),
        self.verdicts.assign(self.verdicts * 10 +
                             tf.cast(finite_grads, tf.int32) + 1))


def test_users_own_manager_is_told_each_verdict():
  made = []

  def make():
    made.append(_Quartering())
    return made[-1]

  with tf.Graph().as_default():
    found, _ = _graph_steps(make, [[1.0, 1.0], [INF, 1.0], [NAN, 1.0]])
  assert [(entry[0], entry[3]) for entry in found] == [
      (64.0, 1), (16.0, 1), (4.0, 1)]


def test_momentum_slots_and_names_are_tf_1_15s():
  with tf.Graph().as_default() as graph:
    w = v1.Variable([1.0], name='w')
    manager = mp.ExponentialUpdateLossScaleManager(8.0, 2)
    inner = v1.train.AdamOptimizer(0.1)
    opt = mp.LossScaleOptimizer(inner, manager)
    opt.minimize(tf.reduce_sum(w * w),
                 global_step=v1.train.get_or_create_global_step())
    assert [v.op.name for v in v1.global_variables()] == [
        'w', 'loss_scale', 'good_steps', 'bad_steps', 'global_step',
        'cond/beta1_power', 'cond/beta2_power', 'w/Adam', 'w/Adam_1']
    assert [v.op.name for v in v1.trainable_variables()] == ['w']
    assert [v.dtype.base_dtype for v in v1.global_variables()[1:4]] == [
        tf.float32, tf.int32, tf.int32]
    assert opt.get_slot(w, 'm') is inner.get_slot(w, 'm')
    assert opt.get_slot_names() == ['m', 'v']
    assert opt.get_name() == 'Adam'
    assert opt.variables() == inner.variables()
    assert not graph.get_collection('tf_loss_scale_record')


def test_gradients_are_unscaled_by_the_reciprocal_and_made_dense():
  with tf.Graph().as_default():
    emb = v1.Variable(tf.ones([3, 2]))
    opt = mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0),
                                mp.FixedLossScaleManager(3.0))
    (grad, _), = opt.compute_gradients(
        tf.reduce_sum(tf.nn.embedding_lookup(emb, [2])) * 0.1)
    assert isinstance(grad, tf.Tensor)
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      # 0.1 * 3 times float32(1/3), not divided by 3.
      expected = np.float32(np.float32(0.1) * np.float32(3)) * np.float32(
          1 / np.float32(3))
      np.testing.assert_array_equal(session.run(grad), [[0, 0], [0, 0],
                                                        [expected] * 2])


def test_eagerly_and_in_a_function():
  for wrap in (lambda f: f, tf.function):
    w = tf.Variable([1.0, 2.0])
    manager = mp.ExponentialUpdateLossScaleManager(8.0, 1, decr_ratio=0.5,
                                                   decr_every_n_nan_or_inf=1)
    opt = mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(0.5),
                                manager)

    results = []

    def minimize(gradient, opt=opt, w=w, results=results):
      results.append(opt.minimize(lambda: tf.reduce_sum(w * gradient),
                                  var_list=[w]))

    step = wrap(lambda gradient, minimize=minimize: minimize(gradient))

    scales = []
    for gradient in ([1.0, 1.0], [INF, 1.0], [1.0, 1.0]):
      step(tf.constant(gradient))
      scales.append(float(manager.get_loss_scale()))
    if wrap is not tf.function:
      assert results == [None] * 3
    assert scales == [16.0, 8.0, 16.0]
    assert w.numpy().tolist() == [0.0, 1.0]


def test_two_replicas_skip_together_and_apply_the_sums():
  devices = ['/cpu:0', '/cpu:1']
  with tf.Graph().as_default():
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
      w = v1.Variable([1.0, 2.0], name='w')
      manager = mp.ExponentialUpdateLossScaleManager(8.0, 1)
      opt = mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(0.5),
                                  manager)
      feed = v1.placeholder(tf.float32, [2, 2])
      global_step = v1.train.get_or_create_global_step()

      def replica_step():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return opt.minimize(tf.reduce_sum(w * feed[replica]),
                            global_step=global_step)

      train = strategy.group(strategy.run(replica_step))
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      found = []
      for gradients in ([[1.0, 1.0], [INF, 1.0]], [[1.0, 1.0], [2.0, -1.0]]):
        session.run(train, {feed: gradients})
        found.append(session.run([w, manager.get_loss_scale(), global_step]))
  assert [(f[0].tolist(), float(f[1]), int(f[2])) for f in found] == [
      ([1.0, 2.0], 8.0, 0), ([-0.5, 2.0], 16.0, 1)]


def test_skip_report_names_the_gradient():
  with tf.Graph().as_default():
    w = v1.Variable([1.0, 2.0], name='w')
    feed = v1.placeholder(tf.float32, [2])
    opt = mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(0.5),
                                mp.FixedLossScaleManager(4.0))
    train = opt.minimize(tf.reduce_sum(w * feed))
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      session.run(train, {feed: [1.0, 1.0]})
      assert monitoring.last_skip(opt, session) is None
      session.run(train, {feed: [NAN, 1.0]})
      report = monitoring.last_skip(opt, session)
  assert (report.step, report.loss_scale, report.nan, report.cause) == (
      1, 4.0, ('w:0',), 'nan')


def test_bert_loop_runs_unmodified_with_tf_1_15s_numbers(tmp_path):
  # As its users run it: `tf-loss-scale run` reads TF 1.x from its code and
  # serves this library's tf.contrib.mixed_precision.
  printed = fresh_process.run_json(
      ['-m', 'tf_loss_scale', 'run', _PROGRAM, '--', '-5', '--flag'],
      cwd=str(tmp_path))
  assert printed['loss_scale'] == BERT_SCALES
  assert printed['global_step'] == BERT_STEPS
  assert printed['weights'] == pytest.approx(BERT_WEIGHTS, rel=1e-6)


def test_loss_scale_hook_reads_the_scale_and_sees_each_skip():
  with tf.Graph().as_default():
    w = v1.Variable([1.0, 2.0], name='w')
    feed = v1.placeholder(tf.float32, [2])
    manager = mp.ExponentialUpdateLossScaleManager(8.0, 1, decr_ratio=0.5,
                                                   decr_every_n_nan_or_inf=1)
    opt = mp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(0.5),
                                manager)
    train = opt.minimize(tf.reduce_sum(w * feed),
                         global_step=v1.train.get_or_create_global_step())
    hook = monitoring.LossScaleHook(opt, every_n_steps=2)
    with v1.train.MonitoredTrainingSession(hooks=[hook]) as session:
      for gradient in ([INF, 1.0], [1.0, 1.0], [1.0, 1.0]):
        session.run(train, {feed: gradient})
      assert monitoring.last_skip(opt, session).inf == ('w:0',)
  # The third run (number 2) is logged: the scale halved once, grew twice.
  assert hook.latest == {'loss_scale': 16.0, 'skipped_steps': 1, 'step': 2}
