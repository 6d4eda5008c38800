"""Tests of the skip report: `tf_loss_scale.monitoring.last_skip`.

Every front end, eagerly, in a `tf.function`, on two replicas and in a TF1
session; a `DynamicLossScale` used directly; the collapse messages; the
Keras callback and the v1 hook. Expected names are the framework's: a Keras
variable outside any layer is named by its path, its own name; a
`tf.Variable` by `name:0`.
"""

import collections
import glob
import logging
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import distribute
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import monitoring
import front_ends
import versions

INF = float('inf')
NAN = float('nan')


def _named_variable(front_end, name, value, dtype=np.float32):
  """A variable of the front end's family, and the name a report gives it."""
  value = np.asarray(value, dtype)
  if front_end in (front_ends.KERAS3, front_ends.KERAS_MIXED_PRECISION,
                   front_ends.EXPERIMENTAL_KERAS3):
    return keras.Variable(value, name=name), name
  return tf.Variable(value, name=name), f'{name}:0'


def _report(step, loss_scale, nan, inf):
  return monitoring.SkipReport(step=step, loss_scale=loss_scale,
                               nan=tuple(nan), inf=tuple(inf),
                               cause='nan' if nan else 'overflow')


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit'])
@pytest.mark.parametrize('front_end', front_ends.ALL)
def test_report_names_each_kind_of_non_finite_gradient(front_end, mode):
  opt = front_end.wrap(front_end.inner(0.1), 8.0, 1000)
  (a, name_a), (b, name_b), (c, name_c) = [
      _named_variable(front_end, n, v)
      for n, v in (('a', [1.0, 2.0]), ('b', [3.0, 4.0]), ('c', [5.0]))]
  variables = [a, b, c]
  front_end.build(opt, variables)

  def train_step(ga, gb, gc):
    front_end.apply(opt, [ga, gb, gc], variables)

  if mode != 'eager':
    # Under XLA the flags come from the verdict's own pass (step.py).
    train_step = tf.function(train_step, jit_compile=(mode == 'jit'))
  finite = ([0.5, 0.5], [0.5, 0.5], [0.5])
  steps = [
      # (gradients, the report expected after the step)
      (finite, None),
      # An inf in a; a NaN and an inf in b: b is in both lists.
      (([1.0, INF], [NAN, -INF], [1.0]), _report(1, 8.0, [name_b],
                                                 [name_a, name_b])),
      # A finite step keeps the last report.
      (finite, _report(1, 8.0, [name_b], [name_a, name_b])),
      # Only infinities: an overflow, at the scale halved by the first skip.
      (([1.0, 1.0], [-INF, 1.0], [INF]), _report(3, 4.0, [],
                                                 [name_b, name_c])),
  ]
  assert monitoring.last_skip(opt) is None
  for step, (grads, expected) in enumerate(steps):
    train_step(*[tf.constant(g, tf.float32) for g in grads])
    got = monitoring.last_skip(opt)
    assert got == expected, f'{front_end.name}, step {step}: {got}'


def test_report_of_a_dynamic_loss_scale_names_gradients_by_position():
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0)
  # Nested gradients are named in `tf.nest.flatten` order; None counts.
  loss_scale.update({'x': tf.constant([1.0]), 'y': [None, tf.constant(NAN)]})
  assert monitoring.last_skip(loss_scale) == _report(0, 2.0, ['gradient 2'],
                                                     [])
  update = tf.function(lambda g: loss_scale.update([tf.constant(1.0), g]))
  update(tf.constant(1.0))
  update(tf.constant([INF, NAN]))
  assert monitoring.last_skip(loss_scale) == _report(
      2, 1.0, ['gradient 1'], ['gradient 1'])


def test_report_is_written_only_on_a_skipped_step():
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0)
  for _ in range(3):
    loss_scale.update([tf.constant(1.0)])
  assert monitoring.last_skip(loss_scale) is None
  loss_scale.update([tf.constant(INF)])
  assert monitoring.last_skip(loss_scale) == _report(3, 2.0, [],
                                                     ['gradient 0'])


def test_report_has_a_one_line_text_for_each_cause():
  overflow = _report(7, 1024.0, [], ['dense/kernel'])
  assert str(overflow) == (
      'step 7 skipped at loss scale 1024 (overflow): inf in dense/kernel')
  nan = _report(9, 1.0, ['dense/bias'], ['dense/kernel', 'dense/bias'])
  assert str(nan) == ('step 9 skipped at loss scale 1 (nan): NaN in '
                      'dense/bias; inf in dense/kernel, dense/bias')


def test_last_skip_refuses_what_keeps_no_report():
  assert monitoring.last_skip(tf_loss_scale.FixedLossScale(8.0)) is None
  with pytest.raises(TypeError, match='DynamicLossScale.*got 3 of type int'):
    monitoring.last_skip(3)
  if versions.KERAS_3:
    keras_own = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(TypeError, match='LossScaleOptimizer'):
      monitoring.last_skip(keras_own)
  with pytest.raises(TypeError, match='session must be the'):
    monitoring.last_skip(tf_loss_scale.DynamicLossScale(), session='sess')


# ---- under a strategy -------------------------------------------------------


@pytest.mark.parametrize('front_end', front_ends.ON_REPLICAS)
def test_report_is_the_union_over_replicas(front_end, mirrored_strategy):
  strategy = mirrored_strategy
  with strategy.scope():
    opt = front_end.wrap(front_end.inner(0.1), 4.0, 1000)
    (a, name_a), (b, name_b), (c, name_c) = [
        _named_variable(front_end, n, v)
        for n, v in (('a', [1.0, 2.0]), ('b', [3.0]), ('c', [4.0]))]
    variables = [a, b, c]
    front_end.build(opt, variables)

  @tf.function
  def train_step(per_replica):
    def replica_step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      ga, gb, gc = [tf.gather(tf.constant(g, tf.float32), replica)
                    for g in per_replica]
      front_end.apply(opt, [ga, gb, gc], variables)
    strategy.run(replica_step)

  ok = [[0.5, 0.5], [0.5, 0.5]]
  steps = [
      # Each replica's unscaled c is finite, their sum is not.
      ((ok, [[1.0], [1.0]], [[2e38], [2e38]]), _report(0, 4.0, [],
                                                       [name_c])),
      # Only replica 1 overflows, in a.
      (([[0.5, 0.5], [0.5, INF]], [[1.0], [1.0]], [[1.0], [1.0]]),
       _report(1, 2.0, [], [name_a])),
      # Only replica 0 has a NaN, in b.
      ((ok, [[NAN], [1.0]], [[1.0], [1.0]]), _report(2, 1.0, [name_b], [])),
  ]
  for step, (grads, expected) in enumerate(steps):
    train_step(grads)
    got = monitoring.last_skip(opt)
    assert got == expected, f'{front_end.name}, step {step}: {got}'


# ---- in a TF1 graph -----------------------------------------------------------


def _v1_graph_step(on_collapse='skip', initial_loss_scale=4.0):
  """A v1 step on w (2 values) and v (1 value), gradients fed."""
  w = tf.compat.v1.get_variable('w', initializer=[1.0, 2.0], use_resource=True)
  v = tf.compat.v1.get_variable('v', initializer=[3.0], use_resource=True)
  grads = [tf.compat.v1.placeholder(tf.float32, [2]),
           tf.compat.v1.placeholder(tf.float32, [1])]
  loss_scale = tf_loss_scale.DynamicLossScale(
      initial_loss_scale=initial_loss_scale, on_collapse=on_collapse)
  opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1), loss_scale)
  train_op = opt.apply_gradients(zip(grads, [w, v]))
  feed = lambda gw, gv: {grads[0]: gw, grads[1]: gv}
  return opt, train_op, feed


def test_report_is_read_through_the_session_in_a_tf1_graph():
  with tf.Graph().as_default():
    opt, train_op, feed = _v1_graph_step()
    with tf.compat.v1.Session() as session:
      # Local variables not initialised: no report yet, then one.
      session.run(tf.compat.v1.global_variables_initializer())
      assert monitoring.last_skip(opt, session) is None
      session.run(train_op, feed([1.0, 1.0], [1.0]))
      session.run(train_op, feed([NAN, 1.0], [INF]))
      assert monitoring.last_skip(opt, session) == _report(
          1, 4.0, ['w:0'], ['v:0'])
      session.run(train_op, feed([1.0, 1.0], [1.0]))
      assert monitoring.last_skip(opt, session) == _report(
          1, 4.0, ['w:0'], ['v:0'])
      with pytest.raises(ValueError, match='pass the Session'):
        monitoring.last_skip(opt)
  with tf.Graph().as_default(), tf.compat.v1.Session() as other:
    with pytest.raises(ValueError, match='another graph'):
      monitoring.last_skip(opt, other)


def test_a_first_step_skipped_before_the_counts_are_initialised_is_step_0():
  # No initialiser sets the record's counters (they are in no collection):
  # still uninitialised when the session's first step skips.
  with tf.Graph().as_default():
    opt, train_op, feed = _v1_graph_step()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op, feed([1.0, INF], [1.0]))
      assert monitoring.last_skip(opt, session) == _report(
          0, 4.0, [], ['w:0'])
      assert session.run(opt.loss_scale()) == 2.0
      session.run(train_op, feed([NAN, 1.0], [1.0]))
      assert monitoring.last_skip(opt, session) == _report(
          1, 2.0, ['w:0'], [])


class _CountingHook(tf.compat.v1.train.SessionRunHook):
  """Counts the runs a MonitoredSession makes with hooks."""

  def __init__(self):
    self.runs = 0

  def after_run(self, run_context, run_values):
    del run_context, run_values
    self.runs += 1


def test_reading_the_report_through_a_monitored_session_runs_no_hook():
  with tf.Graph().as_default():
    opt, train_op, feed = _v1_graph_step()
    counter = _CountingHook()
    with tf.compat.v1.train.MonitoredSession(hooks=[counter]) as session:
      assert monitoring.last_skip(opt, session) is None
      session.run(train_op, feed([1.0, 1.0], [INF]))
      for _ in range(3):
        assert monitoring.last_skip(opt, session) == _report(
            0, 4.0, [], ['v:0'])
      assert counter.runs == 1


def test_hook_logs_each_skipped_step_and_writes_it_as_text(tmp_path, caplog):
  with tf.Graph().as_default():
    opt, train_op, feed = _v1_graph_step()
    hook = monitoring.LossScaleHook(opt, output_dir=str(tmp_path),
                                    every_n_steps=100)
    with caplog.at_level(logging.WARNING, logger='absl'):
      with tf.compat.v1.train.MonitoredTrainingSession(
          hooks=[hook], save_summaries_steps=None,
          save_checkpoint_secs=None) as session:
        for gw, gv in (([1.0, 1.0], [1.0]), ([1.0, 1.0], [INF]),
                       ([1.0, 1.0], [1.0]), ([NAN, 1.0], [1.0])):
          session.run(train_op, feed(gw, gv))
        # Read through a MonitoredSession too (its graph is finalized).
        assert monitoring.last_skip(opt, session) == _report(
            3, 2.0, ['w:0'], [])
  lines = [r.getMessage() for r in caplog.records
           if 'skipped at loss scale' in r.getMessage()]
  assert lines == [
      'Loss scale: step 1 skipped at loss scale 4 (overflow): inf in v:0 '
      '[1 skipped so far]',
      'Loss scale: step 3 skipped at loss scale 2 (nan): NaN in w:0 '
      '[2 skipped so far]']
  assert _texts(str(tmp_path)) == {1: lines[0], 3: lines[1]}


def _texts(log_dir):
  """The skip reports written to TensorBoard as text: {step: text}."""
  found, plugins = {}, set()
  for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == monitoring.SKIP_REPORT_TAG:
          # A v1 FileWriter keeps a tag's metadata on its first value only.
          plugins.add(value.metadata.plugin_data.plugin_name)
          found[event.step] = tf.make_ndarray(value.tensor).item().decode()
  assert plugins - {''} == {'text'}, plugins
  return found


# ---- collapse messages ------------------------------------------------------


def _collapsing(on_collapse):
  return tf_loss_scale.DynamicLossScale(
      initial_loss_scale=1.0, on_collapse=on_collapse, collapse_patience=2)


def test_collapse_error_names_the_variable_and_says_nan_eagerly():
  loss_scale = _collapsing('raise')
  grads = [tf.constant([1.0]), tf.constant([NAN])]
  loss_scale.update(grads)
  with pytest.raises(tf_loss_scale.LossScaleCollapseError) as raised:
    loss_scale.update(grads)
  message = str(raised.value)
  assert ('The last skipped step: step 1 skipped at loss scale 1 (nan): NaN '
          'in gradient 1.') in message
  assert 'no loss scale will cure it' in message


def test_collapse_error_names_the_variable_and_says_nan_in_a_function():
  loss_scale = _collapsing('raise')
  update = tf.function(lambda: loss_scale.update(
      [tf.constant([INF]), tf.constant([NAN, 1.0])]))
  update()
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    update()
  message = str(raised.value)
  assert ('The last skipped step: step 1 skipped at loss scale 1 (nan): NaN '
          'in gradient 1; inf in gradient 0.') in message
  assert 'no loss scale will cure it' in message


def test_collapse_error_in_a_tf1_session_names_the_variable():
  with tf.Graph().as_default():
    # A first skip at min_loss_scale (1) is a collapse with patience 1.
    _, train_op, feed = _v1_graph_step(on_collapse='raise',
                                       initial_loss_scale=1.0)
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        session.run(train_op, feed([1.0, NAN], [1.0]))
  message = str(raised.value)
  assert 'step 0 skipped at loss scale 1 (nan): NaN in w:0.' in message
  assert 'no loss scale will cure it' in message


def test_collapse_on_an_overflow_at_the_floor_does_not_say_nan():
  loss_scale = _collapsing('warn')
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    for _ in range(2):
      loss_scale.update([tf.constant([INF])])
  (warning,) = [w for w in caught if 'collapsed' in str(w.message)]
  message = str(warning.message)
  assert ('The last skipped step: step 1 skipped at loss scale 1 '
          '(overflow): inf in gradient 0.') in message
  assert 'no loss scale will cure it' not in message


# ---- the Keras callback -------------------------------------------------------


@versions.KERAS_3.mark
def test_callback_logs_the_report_and_the_cause(tmp_path, caplog):
  from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  opt = tls_keras.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                     initial_scale=64.0)
  model.compile(optimizer=opt, loss='mse')
  x = np.ones((8, 2), np.float32)
  x[5, 0] = np.nan  # batch 2 of 4
  causes = []
  record = keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, logs: causes.append(
          logs[monitoring.SKIP_CAUSE]))
  with caplog.at_level(logging.WARNING, logger='absl'):
    model.fit(x, np.ones((8, 1), np.float32), batch_size=2, shuffle=False,
              verbose=0, callbacks=[
                  monitoring.LossScaleCallback(log_dir=str(tmp_path),
                                               update_freq=1), record])
  assert causes == [0, 0, 2, 2]
  kernel, bias = [v.path for v in model.trainable_variables]
  line = (f'Loss scale: step 2 skipped at loss scale 64 (nan): NaN in '
          f'{kernel}, {bias} [1 skipped so far]')
  assert [r.getMessage() for r in caplog.records
          if 'skipped at' in r.getMessage()] == [line]
  assert _texts(str(tmp_path)) == {2: line}


def test_skipped_steps_are_logged_one_by_one_then_at_powers_of_two(caplog):
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0**40)
  log = monitoring._SkipLog(loss_scale)  # pylint: disable=protected-access
  logged = []
  with caplog.at_level(logging.WARNING, logger='absl'):
    for count in range(1, 41):
      loss_scale.update([tf.constant(INF)])
      if log.follow(int(loss_scale.skipped_steps)):
        logged.append(count)
    # Counts read less often than every step: 41 to 70 in one read.
    for _ in range(30):
      loss_scale.update([tf.constant(INF)])
    if log.follow(int(loss_scale.skipped_steps)):
      logged.append(70)
  assert logged == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 70]
  assert 'one line each time the count reaches a power of two' in [
      r.getMessage() for r in caplog.records][9]


def test_report_is_not_in_checkpoints(tmp_path):
  def saved(loss_scale, name):
    path = tf.train.Checkpoint(loss_scale=loss_scale).save(
        str(tmp_path / name))
    return path, sorted(key for key, _ in tf.train.list_variables(path))

  skipped = tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0)
  skipped.update([tf.constant(INF)])
  assert monitoring.last_skip(skipped) is not None
  path, keys = saved(skipped, 'skipped')
  # The same layout as a loss scale that never skipped: TensorFlow's.
  assert keys == saved(tf_loss_scale.DynamicLossScale(), 'fresh')[1]
  restored = tf_loss_scale.DynamicLossScale(initial_loss_scale=8.0)
  tf.train.Checkpoint(loss_scale=restored).restore(path).assert_consumed()
  assert monitoring.last_skip(restored) is None


def _writes(fn, strategy):
  """How many variable writes a `tf.function` of `fn` makes, by device."""
  def traced():
    fn()

  with strategy.scope():
    graph = tf.function(traced).get_concrete_function().graph
  devices = collections.Counter(
      op.device.rsplit(':', 1)[-1] for op in graph.get_operations()
      if op.type in ('AssignVariableOp', 'AssignAddVariableOp'))
  return dict(devices)


@pytest.mark.parametrize('replicas', [1, 2])
def test_a_skip_writes_its_report_in_two_variables(mirrored_strategy,
                                                  replicas):
  # Under a strategy each variable written is written on every device, so
  # the report is kept in as few variables as it can be.
  strategy = (mirrored_strategy if replicas == 2 else
              tf.distribute.get_strategy())
  with strategy.scope():
    loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0)
    # As a step does: the site's flags are made under the strategy too.
    reading = distribute.Reading(tf.constant([False]), tf.constant([True]))
    write_report = loss_scale_lib.step_record_of(loss_scale).skip_reporter(
        ['w'], loss_scale, lambda: reading)
  per_device = ['0', '1'] if replicas == 2 else ['']
  assert _writes(write_report, strategy) == {
      device: 2 for device in per_device}
