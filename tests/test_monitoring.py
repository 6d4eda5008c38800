"""Tests of tf_loss_scale.monitoring and DynamicLossScale.skipped_steps.

`keras` is the Keras of the installed TensorFlow (Keras 2 up to 2.15,
Keras 3 from 2.16); the callback is also run by the `model.fit` of the other
family where one is installed (`tf_keras`, or `tf.keras` under
`TF_USE_LEGACY_KERAS=1`).
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import monitoring
import versions

INF = float('inf')
NAN = float('nan')

# A dynamic scale from 8 that doubles after 2 finite steps, given the gradient
# sequence below: (scale, good_steps, skipped_steps) after each step, worked
# out by hand from the rule.
GRADS = [1.0, 1.0, INF, 1.0, 1.0, NAN, 1.0, 1.0]
EXPECTED = [
    (8.0, 1, 0),
    (16.0, 0, 0),
    (8.0, 0, 1),   # skipped: halved
    (8.0, 1, 1),
    (16.0, 0, 1),
    (8.0, 0, 2),   # skipped: halved
    (8.0, 1, 2),
    (16.0, 0, 2),
]


def _events(log_dir):
  """Reads every scalar in a directory's event files: {tag: {step: value}}."""
  found = {}
  for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == monitoring.SKIP_REPORT_TAG:
          continue  # Text: tests/test_skip_report.py reads it.
        number = (float(tf.make_ndarray(value.tensor))
                  if value.HasField('tensor') else value.simple_value)
        found.setdefault(value.tag, {})[event.step] = number
  return found


def _check_trajectory(observed, what):
  for step, (got, want) in enumerate(zip(observed, EXPECTED)):
    assert tuple(got) == want, (
        f'{what}: step {step}: (scale, good_steps, skipped_steps) was {got}, '
        f'expected {want}')
  assert len(observed) == len(EXPECTED), f'{what}: {len(observed)} steps'


def _keras_3_form(*args, **kwargs):
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  return LossScaleOptimizer(*args, **kwargs)


def _check_events(log_dir, steps, what):
  events = _events(log_dir)
  for key, index in ((monitoring.SCALE, 0), (monitoring.GOOD_STEPS, 1),
                     (monitoring.SKIPPED_STEPS, 2)):
    tag = monitoring.TAGS[key]
    got = [events.get(tag, {}).get(step) for step in steps]
    want = [EXPECTED[step][index] for step in steps]
    assert got == want, f'{what}: TensorBoard {tag} at steps {steps}: {got}, expected {want}'


def test_skipped_steps_counted_eagerly_and_in_tf_function():
  loss_scale = tf_loss_scale.DynamicLossScale(8.0, increment_period=2)
  update = tf.function(lambda g: loss_scale.update([g])[1])
  observed = []
  for step, grad in enumerate(GRADS):
    if step % 2:
      update(tf.constant(grad))
    else:
      loss_scale.update([tf.constant(grad)])
    state = {k: v.numpy() for k, v in monitoring.state_tensors(loss_scale).items()}
    observed.append((state['loss_scale'], state['good_steps'],
                     state['skipped_steps']))
  _check_trajectory(observed, 'eager/tf.function')


def test_skipped_steps_counter_is_not_saved_and_checkpoints_still_interchange(tmp_path):
  ours = tf_loss_scale.DynamicLossScale(8.0, increment_period=2)
  ours.update([tf.constant(INF)])
  assert [v.name for v in ours.variables] == ['current_loss_scale:0',
                                              'good_steps:0']
  path = tf.train.Checkpoint(loss_scale=ours).save(str(tmp_path / 'ours'))
  keys = sorted(name for name, _ in tf.train.list_variables(path))
  assert keys == ['_CHECKPOINTABLE_OBJECT_GRAPH',
                  'loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE',
                  'loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE',
                  'save_counter/.ATTRIBUTES/VARIABLE_VALUE']
  # TensorFlow's class reads it with every value consumed.
  theirs = tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=1.0)
  tf.train.Checkpoint(loss_scale=theirs).restore(path).assert_consumed()
  assert float(theirs()) == 4.0


def test_skipped_steps_in_tf1_graph_with_and_without_local_init():
  with tf.Graph().as_default():
    loss_scale = tf_loss_scale.DynamicLossScale(8.0, increment_period=2)
    grad = tf.compat.v1.placeholder(tf.float32, [])
    update_op, _ = loss_scale.update([grad])
    state = monitoring.state_tensors(loss_scale)
    last_step_skipped = loss_scale.last_step_skipped
    assert loss_scale.variables == tuple(tf.compat.v1.global_variables())
    # No collection holds the skip count, the last step's verdict or the
    # skip report: no Saver, initialiser or ready_op sees them.
    assert tf.compat.v1.local_variables() == []
    for init in (tf.compat.v1.global_variables_initializer(),
                 tf.group(tf.compat.v1.global_variables_initializer(),
                          tf.compat.v1.local_variables_initializer())):
      with tf.compat.v1.Session() as session:
        session.run(init)
        assert session.run([state['skipped_steps'], last_step_skipped]) == [
            0, False]
        observed = []
        for step, value in enumerate(GRADS):
          session.run(update_op, {grad: value})
          got = session.run(state)
          observed.append((got['loss_scale'], got['good_steps'],
                           got['skipped_steps']))
          assert session.run(last_step_skipped) == (not np.isfinite(value)), (
              f'step {step} with {init.name}: last_step_skipped')
        _check_trajectory(observed, f'graph with {init.name}')


def test_fixed_loss_scale_reports_no_good_or_skipped_steps():
  state = monitoring.state_tensors(tf_loss_scale.FixedLossScale(128))
  assert {k: v.numpy() for k, v in state.items()} == {
      'loss_scale': 128.0, 'good_steps': 0, 'skipped_steps': 0}


def _write_summaries_in_a_loop(loss_scale, grads, log_dir):
  """Trains with the v1 wrapper in a tf.function, writing summaries."""
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1), loss_scale)
  var = tf.Variable(1.0)
  writer = tf.summary.create_file_writer(log_dir)

  @tf.function
  def step(grad, index):
    optimizer.apply_gradients([(grad, var)])
    monitoring.write_summaries(optimizer, step=index)

  with writer.as_default():
    for index, grad in enumerate(grads):
      step(tf.constant(grad), tf.constant(index, tf.int64))
  writer.flush()


def test_write_summaries_in_a_custom_loop(tmp_path):
  _write_summaries_in_a_loop(
      tf_loss_scale.DynamicLossScale(8.0, increment_period=2), GRADS,
      str(tmp_path))
  _check_events(str(tmp_path), list(range(len(GRADS))), 'write_summaries')


class _LogsRecorder(keras.callbacks.Callback):

  def __init__(self):
    super().__init__()
    self.batches = []

  def on_train_batch_end(self, batch, logs=None):
    self.batches.append((logs['loss_scale'], logs['good_steps'],
                         logs['skipped_steps']))


def _overflowing_data():
  """One example per batch; the batches whose GRADS entry is not finite get
  an input so large that the loss, and so the gradients, overflow."""
  x = np.array([[1e30 if not np.isfinite(g) else 1.0] for g in GRADS],
               np.float32)
  return x, np.ones((len(GRADS), 1), np.float32)


@versions.KERAS_3.mark
def test_keras_callback_logs_and_tensorboard(tmp_path):
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  optimizer = _keras_3_form(keras.optimizers.SGD(0.01), initial_scale=8.0,
                                 dynamic_growth_steps=2)
  model.compile(optimizer=optimizer, loss='mse')
  recorder = _LogsRecorder()
  x, y = _overflowing_data()
  history = model.fit(
      x, y, batch_size=1, epochs=1, shuffle=False, verbose=0,
      callbacks=[monitoring.LossScaleCallback(str(tmp_path), update_freq=1),
                 recorder])
  _check_trajectory(recorder.batches, 'Keras logs')
  _check_events(str(tmp_path), list(range(len(GRADS))), 'Keras callback')
  assert history.history['skipped_steps'] == [2]
  assert history.history['loss_scale'] == [16.0]
  # Independent count: the inner optimizer only steps when a step is applied.
  assert int(optimizer.inner_optimizer.iterations.numpy()) == len(GRADS) - 2


@versions.KERAS_3.mark
def test_keras_callback_per_epoch_summaries(tmp_path):
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile(optimizer=_keras_3_form(
      keras.optimizers.SGD(0.01), initial_scale=8.0, dynamic_growth_steps=2),
                loss='mse')
  x, y = _overflowing_data()
  model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0,
            callbacks=[monitoring.LossScaleCallback(str(tmp_path))])
  events = _events(str(tmp_path))
  # The second epoch repeats the sequence from scale 16: it ends at 32.
  assert events[monitoring.TAGS['loss_scale']] == {0: 16.0, 1: 32.0}
  assert events[monitoring.TAGS['skipped_steps']] == {0: 2.0, 1: 4.0}


def test_keras_callback_needs_a_loss_scale():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile(optimizer='sgd', loss='mse')
  with pytest.raises(TypeError, match='loss_scale property'):
    model.fit(np.ones((2, 1)), np.ones((2, 1)), verbose=0,
              callbacks=[monitoring.LossScaleCallback()])


@pytest.mark.parametrize('update_freq', [0, -1, 'batch', 1.5, True])
def test_keras_callback_rejects_bad_update_freq(update_freq):
  with pytest.raises(ValueError, match='update_freq'):
    monitoring.LossScaleCallback(update_freq=update_freq)


def _v1_training_graph(strategy=None):
  """A TF1 graph training one variable; returns (train_op, feed, optimizer)."""
  strategy = strategy or tf.distribute.get_strategy()
  with strategy.scope():
    var = tf.Variable(1.0)
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.01),
        tf_loss_scale.DynamicLossScale(8.0, increment_period=2))
    global_step = tf.compat.v1.train.get_or_create_global_step()
  per_replica = tf.compat.v1.placeholder(tf.float32, [2])

  def replica_step():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return optimizer.minimize(lambda: var * per_replica[replica],
                              global_step=global_step)

  train_op = strategy.group(strategy.extended.call_for_each_replica(replica_step))
  return train_op, per_replica, optimizer


def test_session_run_hook_in_monitored_training_session(tmp_path):
  with tf.Graph().as_default():
    train_op, per_replica, optimizer = _v1_training_graph()
    hook = monitoring.LossScaleHook(optimizer, output_dir=str(tmp_path),
                                    every_n_steps=1)
    observed = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as session:
      for grad in GRADS:
        session.run(train_op, {per_replica: [grad, grad]})
        observed.append((hook.latest['loss_scale'], hook.latest['good_steps'],
                         hook.latest['skipped_steps']))
  _check_trajectory(observed, 'SessionRunHook')
  _check_events(str(tmp_path), list(range(len(GRADS))), 'SessionRunHook')


def test_session_run_hook_every_n_steps_and_one_replica_overflowing(tmp_path):
  with tf.Graph().as_default():
    strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
    train_op, per_replica, optimizer = _v1_training_graph(strategy)
    hook = monitoring.LossScaleHook(optimizer.loss_scale,
                                    output_dir=str(tmp_path), every_n_steps=3)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as session:
      for grad in GRADS:
        # Only the second replica sees the non-finite gradient.
        session.run(train_op, {per_replica: [1.0, grad]})
  _check_events(str(tmp_path), [0, 3, 6], 'SessionRunHook, mirrored')
  events = _events(str(tmp_path))
  assert sorted(events[monitoring.TAGS['loss_scale']]) == [0, 3, 6]


def test_session_run_hook_rejects_bad_arguments():
  with pytest.raises(ValueError, match='every_n_steps'):
    monitoring.LossScaleHook(tf_loss_scale.FixedLossScale(2), every_n_steps=0)
  with pytest.raises(TypeError, match='LossScale'):
    monitoring.LossScaleHook(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  with pytest.raises(TypeError, match='loss_scale property'):
    monitoring.LossScaleCallback(loss_scale=keras.optimizers.SGD())


# --- Keras batch indices, Keras's own class, and the options' counters ----------


class _BatchRecorder(keras.callbacks.Callback):
  """Records the batch indices Keras reports and the callback's logs."""

  def __init__(self):
    super().__init__()
    self.batches = []
    self.logs = []

  def on_train_batch_end(self, batch, logs=None):
    self.batches.append(batch)
    self.logs.append(dict(logs))


def _fit_sixteen_batches(tmp_path, optimizer, update_freq, epochs=1,
                         steps_per_execution=4):
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile(optimizer=optimizer, loss='mse',
                steps_per_execution=steps_per_execution)
  recorder = _BatchRecorder()
  count = 16 // epochs
  model.fit(np.ones((count, 1), np.float32), np.ones((count, 1), np.float32),
            batch_size=1, epochs=epochs, shuffle=False, verbose=0,
            callbacks=[monitoring.LossScaleCallback(str(tmp_path),
                                                    update_freq=update_freq),
                       recorder])
  return recorder, _events(str(tmp_path)).get(monitoring.TAGS['loss_scale'],
                                              {})


# With 4 steps per execution Keras reports one batch of every 4: the last
# from Keras 3.11 on, the first before.
_REPORTED = 3 if versions.keras_at_least(3, 11) else 0


@versions.KERAS_3.mark
@pytest.mark.parametrize('update_freq,epochs,written_runs', [
    (1, 1, [0, 1, 2, 3]),
    (8, 1, [0, 2]),   # whenever 8 more batches have run
    (1, 2, [0, 1, 2, 3]),  # the second epoch continues the count
])
def test_keras_callback_writes_at_the_batch_index_keras_reports(
    tmp_path, update_freq, epochs, written_runs):
  recorder, events = _fit_sixteen_batches(
      tmp_path, _keras_3_form(keras.optimizers.SGD(0.01)), update_freq,
      epochs)
  runs_per_epoch = 4 // epochs
  assert recorder.batches == [
      4 * run + _REPORTED for run in range(runs_per_epoch)] * epochs
  assert sorted(events) == [4 * run + _REPORTED for run in written_runs]


@versions.KERAS_3.mark
def test_keras_callback_reads_keras_own_loss_scale_optimizer(tmp_path):
  optimizer = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.01), initial_scale=8.0, dynamic_growth_steps=2)
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile(optimizer=optimizer, loss='mse')
  recorder = _BatchRecorder()
  x, y = _overflowing_data()
  model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0,
            callbacks=[monitoring.LossScaleCallback(str(tmp_path),
                                                    update_freq=1),
                       recorder])
  # Keras's class follows the same rule on this sequence; it keeps no count
  # of skipped steps, so none is reported.
  observed = [(logs['loss_scale'], logs['good_steps']) for logs in
              recorder.logs]
  assert observed == [(scale, good) for scale, good, _ in EXPECTED]
  assert all('skipped_steps' not in logs for logs in recorder.logs)
  events = _events(str(tmp_path))
  assert events[monitoring.TAGS['loss_scale']] == {
      step: scale for step, (scale, _, _) in enumerate(EXPECTED)}
  assert monitoring.TAGS['skipped_steps'] not in events


@versions.KERAS_2.mark
def test_keras_callback_with_keras_2_fit_and_keras_2s_own_optimizer(tmp_path):
  k2 = versions.keras_2()
  model = k2.Sequential([k2.layers.Dense(1, input_shape=(1,))])
  model.compile(optimizer=k2.mixed_precision.LossScaleOptimizer(
      k2.optimizers.SGD(0.01), initial_scale=8.0, dynamic_growth_steps=2),
                loss='mse')
  logs = []
  recorder = k2.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, batch_logs: logs.append(
          dict(batch_logs)))
  x, y = _overflowing_data()
  history = model.fit(
      x, y, batch_size=1, epochs=1, shuffle=False, verbose=0,
      callbacks=[monitoring.LossScaleCallback(str(tmp_path), update_freq=1),
                 recorder])
  # Keras 2's class follows the same rule; it counts no skipped steps.
  observed = [(entry['loss_scale'], entry['good_steps']) for entry in logs]
  assert observed == [(scale, good) for scale, good, _ in EXPECTED], (
      f'{k2.__name__} fit: (scale, good_steps) per batch')
  assert all('skipped_steps' not in entry for entry in logs)
  assert history.history['loss_scale'] == [16.0]
  events = _events(str(tmp_path))
  assert events[monitoring.TAGS['loss_scale']] == {
      step: scale for step, (scale, _, _) in enumerate(EXPECTED)}


@versions.KERAS_2.mark
def test_keras_callback_with_keras_2_fit_and_the_tf23_form(tmp_path):
  from tf_loss_scale.keras import experimental  # pylint: disable=g-import-not-at-top
  k2 = versions.keras_2()
  model = k2.Sequential([k2.layers.Dense(1, input_shape=(1,))])
  model.compile(optimizer=experimental.LossScaleOptimizer(
      k2.optimizers.SGD(0.01),
      tf_loss_scale.DynamicLossScale(8.0, increment_period=2)), loss='mse')
  logs = []
  recorder = k2.callbacks.LambdaCallback(
      on_train_batch_end=lambda batch, batch_logs: logs.append(
          dict(batch_logs)))
  x, y = _overflowing_data()
  model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0,
            callbacks=[monitoring.LossScaleCallback(str(tmp_path),
                                                    update_freq=1),
                       recorder])
  _check_trajectory([(entry['loss_scale'], entry['good_steps'],
                      entry['skipped_steps']) for entry in logs],
                    f'{k2.__name__} fit, TF 2.3 form')
  _check_events(str(tmp_path), list(range(len(GRADS))),
                f'{k2.__name__} fit, TF 2.3 form')


def test_keras_2s_own_fixed_loss_scale_optimizer_reports_its_scale_only():
  # Keras 2's class without a dynamic scale keeps no counter.
  class KerasTwoShaped:
    dynamic_counter = None
    loss_scale = tf.constant(512.0)

  state = {k: v.numpy() for k, v in
           monitoring.state_tensors(KerasTwoShaped()).items()}
  assert state == {'loss_scale': 512.0}


def test_state_tensors_of_a_keras_3_form_by_its_variable_names():
  # Any optimizer shaped like Keras's class is read by its public names.
  class KerasShaped:
    dynamic_scale = tf.Variable(64.0)
    step_counter = tf.Variable(3, dtype=tf.int64)
    skipped_steps = tf.constant(5, tf.int64)

  state = {k: v.numpy() for k, v in
           monitoring.state_tensors(KerasShaped()).items()}
  assert state == {'loss_scale': 64.0, 'good_steps': 3, 'skipped_steps': 5}


# Hysteresis 2 and collapse detection: (scale, good_steps, skipped_steps,
# non_finite_streak, skips_at_floor) after each step from 2 with a floor of
# 1, worked out by hand.
OPTION_GRADS = [INF, INF, INF, INF, 1.0]
OPTION_EXPECTED = [
    (2.0, 0, 1, 1, 0),
    (1.0, 0, 2, 2, 0),
    (1.0, 0, 3, 3, 1),
    (1.0, 0, 4, 4, 2),
    (1.0, 1, 4, 0, 0),
]
OPTION_KEYS = ('loss_scale', 'good_steps', 'skipped_steps',
               'non_finite_streak', 'skips_at_floor')


def _option_loss_scale():
  return tf_loss_scale.DynamicLossScale(2.0, hysteresis=2, on_collapse='warn',
                                        collapse_patience=3)


def test_write_summaries_and_hook_report_hysteresis_and_collapse(tmp_path):
  _write_summaries_in_a_loop(_option_loss_scale(), OPTION_GRADS,
                             str(tmp_path / 'loop'))
  events = _events(str(tmp_path / 'loop'))
  for position, key in enumerate(OPTION_KEYS):
    assert [events[monitoring.TAGS[key]][i] for i in range(5)] == [
        e[position] for e in OPTION_EXPECTED], key

  with tf.Graph().as_default():
    loss_scale = _option_loss_scale()
    grad = tf.compat.v1.placeholder(tf.float32, [])
    update_op, _ = loss_scale.update([grad])
    tf.compat.v1.train.get_or_create_global_step()
    hook = monitoring.LossScaleHook(loss_scale, every_n_steps=1)
    observed = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as session:
      for value in OPTION_GRADS:
        session.run(update_op, {grad: value})
        observed.append(tuple(hook.latest[key] for key in OPTION_KEYS))
  assert observed == OPTION_EXPECTED


def test_keras_callback_logs_hysteresis_and_collapse():
  # Options need a DynamicLossScale, so the TF 2.3 form in its own custom
  # loop (Keras 3's fit is refused for it), with Keras's CallbackList
  # driving the callbacks as fit would.
  from tf_loss_scale.keras import experimental  # pylint: disable=g-import-not-at-top
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  optimizer = experimental.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                              _option_loss_scale())
  model.compile(optimizer=optimizer, loss='mse')
  recorder = _BatchRecorder()
  callbacks = keras.callbacks.CallbackList(
      [monitoring.LossScaleCallback(), recorder], model=model)
  callbacks.on_train_begin()
  for batch, value in enumerate(OPTION_GRADS):
    callbacks.on_train_batch_begin(batch)
    grads = [tf.fill(v.shape, value) for v in model.trainable_variables]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    callbacks.on_train_batch_end(batch, {})
  callbacks.on_train_end()
  observed = [tuple(logs[key] for key in OPTION_KEYS) for logs in recorder.logs]
  assert observed == OPTION_EXPECTED


@versions.KERAS_3.mark
def test_state_tensors_of_an_unbuilt_keras_optimizer_says_to_build_it():
  optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
  with pytest.raises(ValueError, match='build'):
    monitoring.state_tensors(optimizer)
  optimizer.build([keras.Variable(1.0)])
  assert float(monitoring.state_tensors(optimizer)['loss_scale']) == 32768.0
