"""The options of `DynamicLossScale` beyond TensorFlow's.

`min_loss_scale`, `max_loss_scale`, `hysteresis`, `on_collapse` with
`collapse_patience`, and `last_step_skipped`. Every trajectory below is
worked out by hand from the rule in the module docstring of
`tf_loss_scale/loss_scale.py`, and must hold in a TF1 graph, eagerly, in a
`tf.function` and under MirroredStrategy (every replica agreeing on every
counter), and through the front ends that take a `DynamicLossScale`.
"""

import contextlib
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import loss_scale_runs
import tf_loss_scale
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale.keras import experimental

MODES = loss_scale_runs.MODES
T, F = True, False


@pytest.fixture(params=['none', 'mirrored'])
def strategy(request):
  if request.param == 'none':
    return None
  return request.getfixturevalue('mirrored_strategy')


# name: (constructor arguments, verdicts, expected values after each step).
PINNED = {
    # A floor below 1: the scale halves down to it and stays.
    'floor-below-one': (
        dict(initial_loss_scale=1, min_loss_scale=2**-4),
        [F] * 6,
        {'loss_scale': [0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0625]}),
    'hysteresis-two': (
        dict(initial_loss_scale=64, hysteresis=2),
        [F, T, F, F, F],
        {'loss_scale': [64, 64, 64, 32, 16],
         'non_finite_streak': [1, 0, 1, 2, 3],
         'good_steps': [0, 1, 0, 0, 0]}),
    'cap': (
        dict(initial_loss_scale=2, increment_period=1, max_loss_scale=8),
        [T, T, T, F, T],
        {'loss_scale': [4, 8, 8, 4, 8], 'good_steps': [0] * 5}),
    # Hysteresis 2 over a floor of 2: the scale reaches the floor on step 2,
    # steps 3, 4 and 6, 7, 8 are skipped at it; a collapse (2 in a row) is
    # reached on steps 4 and 7.
    'collapse-counts': (
        dict(initial_loss_scale=4, min_loss_scale=2, hysteresis=2,
             on_collapse='warn', collapse_patience=2),
        [F, F, F, F, T, F, F, F],
        {'loss_scale': [4, 2, 2, 2, 2, 2, 2, 2],
         'non_finite_streak': [1, 2, 3, 4, 0, 1, 2, 3],
         'skips_at_floor': [0, 0, 1, 2, 0, 1, 2, 3],
         'good_steps': [0, 0, 0, 0, 1, 0, 0, 0],
         'skipped_steps': [1, 2, 3, 4, 4, 5, 6, 7],
         'last_step_skipped': [T, T, T, T, F, T, T, T]}),
}
# The steps (0-based) on which 'collapse-counts' collapses.
COLLAPSE_STEPS = [3, 6]


def _check(records, verdicts, expected, what):
  for step, (record, verdict) in enumerate(zip(records, verdicts)):
    assert record['should_apply'] == verdict, f'{what}: step {step} verdict'
  for name, values in expected.items():
    got = loss_scale_runs.trajectory(records, name)
    assert got == values, f'{what}: {name} was {got}, expected {values}'


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('name', list(PINNED))
def test_pinned_trajectory(name, mode, strategy):
  arguments, verdicts, expected = PINNED[name]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', RuntimeWarning)
    records = loss_scale_runs.run(
        lambda: tf_loss_scale.DynamicLossScale(**arguments), verdicts, mode,
        strategy)
  _check(records, verdicts, expected, f'{name}, {mode}')


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_assign_next_state_from_inside_strategy_run(mode, mirrored_strategy):
  # A front end that all-reduced its verdict in the replica context passes it
  # straight in; the loss scale merges into the cross-replica context.
  arguments, verdicts, expected = PINNED['collapse-counts']
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', RuntimeWarning)
    records = loss_scale_runs.run(
        lambda: tf_loss_scale.DynamicLossScale(**arguments), verdicts, mode,
        mirrored_strategy, via='assign_next_state')
  _check(records, verdicts, expected, f'assign_next_state, {mode}')


def test_defaults_keep_tensorflows_two_variables():
  loss_scale = tf_loss_scale.DynamicLossScale()
  assert loss_scale.non_finite_streak is None
  assert loss_scale.skips_at_floor is None
  assert [v.name for v in loss_scale.variables] == ['current_loss_scale:0',
                                                    'good_steps:0']


# --- The rule as a pure function -----------------------------------------------


@pytest.mark.parametrize('state,finite,options,expected', [
    # (scale, good_steps, streak, skips) -> the same after the step.
    ((1.0, 0, 0, 0), F, dict(min_loss_scale=0.25), (0.5, 0, 1, 0)),
    ((0.25, 0, 1, 0), F, dict(min_loss_scale=0.25), (0.25, 0, 2, 1)),
    ((0.25, 3, 2, 5), T, dict(min_loss_scale=0.25), (0.25, 4, 0, 0)),
    ((8.0, 9, 0, 0), T, dict(max_loss_scale=12.0), (12.0, 0, 0, 0)),
    ((12.0, 9, 0, 0), T, dict(max_loss_scale=12.0), (12.0, 0, 0, 0)),
    ((8.0, 4, 0, 0), F, dict(hysteresis=3), (8.0, 0, 1, 0)),
    ((8.0, 0, 2, 0), F, dict(hysteresis=3), (4.0, 0, 3, 0)),
    ((4.0, 0, 3, 0), F, dict(hysteresis=3), (2.0, 0, 4, 0)),
    ((1.0, 0, 1, 7), F, dict(hysteresis=3), (1.0, 0, 2, 8)),
])
def test_advance_dynamic_state(state, finite, options, expected):
  new = loss_scale_lib.advance_dynamic_state(
      loss_scale_lib.DynamicState(tf.constant(state[0]),
                                  tf.constant(state[1], tf.int64),
                                  tf.constant(state[2], tf.int64),
                                  tf.constant(state[3], tf.int64)),
      tf.constant(finite), increment_period=10, multiplier=2.0, **options)
  assert (float(new.scale), int(new.good_steps), int(new.non_finite_streak),
          int(new.skips_at_floor)) == expected


def test_next_dynamic_state_takes_floor_and_cap_by_keyword_only():
  scale, good_steps = loss_scale_lib.next_dynamic_state(
      tf.constant(1.0), tf.constant(0, tf.int64), tf.constant(False), 2, 2.0,
      min_loss_scale=0.25)
  assert (float(scale), int(good_steps)) == (0.5, 0)
  scale, _ = loss_scale_lib.next_dynamic_state(
      tf.constant(6.0), tf.constant(1, tf.int64), tf.constant(True), 2, 2.0,
      max_loss_scale=10.0)
  assert float(scale) == 10.0
  with pytest.raises(TypeError):
    loss_scale_lib.next_dynamic_state(  # pylint: disable=too-many-function-args
        tf.constant(1.0), tf.constant(0, tf.int64), tf.constant(False), 2,
        2.0, 0.25)


# --- Collapse -------------------------------------------------------------------


def _collapse_scale(on_collapse):
  arguments = dict(PINNED['collapse-counts'][0], on_collapse=on_collapse)
  return tf_loss_scale.DynamicLossScale(**arguments)


def test_warn_eagerly_once_per_collapse():
  loss_scale = _collapse_scale('warn')
  verdicts = PINNED['collapse-counts'][1]
  warned = []
  for step, finite in enumerate(verdicts):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('default')
      loss_scale.update([tf.constant(1.0 if finite else np.inf)])
    if caught:
      assert len(caught) == 1 and caught[0].category is RuntimeWarning
      assert 'collapsed' in str(caught[0].message)
      assert 'min_loss_scale=2' in str(caught[0].message)
      warned.append(step)
  assert warned == COLLAPSE_STEPS


def test_warn_in_a_graph_and_a_function_logs_once_per_collapse():
  # TensorFlow's C++ log is silenced by the test suite's TF_CPP_MIN_LOG_LEVEL,
  # so the graphs run in a child process that keeps warnings.
  code = f"""
import numpy as np, tensorflow as tf, tf_loss_scale
arguments = {PINNED['collapse-counts'][0]!r}
verdicts = {PINNED['collapse-counts'][1]!r}
with tf.Graph().as_default():
  loss_scale = tf_loss_scale.DynamicLossScale(**arguments)
  grad = tf.compat.v1.placeholder(tf.float32, [])
  update_op, _ = loss_scale.update([grad])
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    for finite in verdicts:
      session.run(update_op, {{grad: 1.0 if finite else np.inf}})
print('--- function ---', flush=True)
import sys; sys.stderr.write('--- function ---\\n'); sys.stderr.flush()
loss_scale = tf_loss_scale.DynamicLossScale(**arguments)
step = tf.function(lambda g: loss_scale.update([g])[1])
for finite in verdicts:
  step(tf.constant(1.0 if finite else np.inf))
"""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0',
             PYTHONPATH=os.pathsep.join(sys.path))
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  graph_log, function_log = result.stderr.split('--- function ---\n')
  for what, log in (('graph', graph_log), ('function', function_log)):
    lines = [line for line in log.splitlines() if 'has collapsed' in line]
    assert len(lines) == len(COLLAPSE_STEPS), f'{what}: {lines}'
    assert all('min_loss_scale=2' in line for line in lines), lines


def test_raise_eagerly_after_updating_the_state():
  loss_scale = _collapse_scale('raise')
  for finite in PINNED['collapse-counts'][1][:COLLAPSE_STEPS[0]]:
    loss_scale.update([tf.constant(1.0 if finite else np.inf)])
  with pytest.raises(tf_loss_scale.LossScaleCollapseError,
                     match=r'collapsed.*2 steps in a row.*min_loss_scale=2'):
    loss_scale.update([tf.constant(np.nan)])
  assert int(loss_scale.skips_at_floor.numpy()) == 2
  assert bool(loss_scale.last_step_skipped)
  # Every further step at the floor raises too; a finite step resets.
  with pytest.raises(tf_loss_scale.LossScaleCollapseError):
    loss_scale.update([tf.constant(np.nan)])
  _, should_apply = loss_scale.update([tf.constant(1.0)])
  assert bool(should_apply) and int(loss_scale.skips_at_floor.numpy()) == 0


@pytest.mark.parametrize('mode', ['graph', 'function'])
def test_raise_in_a_graph_fails_the_step(mode, strategy):
  verdicts = PINNED['collapse-counts'][1]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'collapsed.*min_loss_scale=2.*learning rate'):
    loss_scale_runs.run(lambda: _collapse_scale('raise'), verdicts, mode,
                        strategy)


def test_raise_fails_the_v1_train_op_in_a_graph():
  with tf.Graph().as_default():
    var = tf.Variable(1.0)
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.5),
        _collapse_scale('raise'))
    grad = tf.compat.v1.placeholder(tf.float32, [])
    train_op = optimizer.minimize(var * grad)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step, finite in enumerate(PINNED['collapse-counts'][1]):
        feed = {grad: 1.0 if finite else np.inf}
        if step == COLLAPSE_STEPS[0]:
          with pytest.raises(tf.errors.InvalidArgumentError,
                             match='collapsed'):
            session.run(train_op, feed)
          break
        session.run(train_op, feed)
      assert session.run(var) == 1.0, 'no step was applied'


# --- Through the front ends that take a DynamicLossScale -------------------------


@pytest.mark.parametrize('mode', MODES)
def test_v1_optimizer_follows_the_pinned_trajectory(mode):
  arguments, verdicts, expected = PINNED['collapse-counts']
  records = []
  with warnings.catch_warnings(), _graph_if(mode):
    warnings.simplefilter('ignore', RuntimeWarning)
    var = tf.Variable(1.0)
    global_step = tf.Variable(0, dtype=tf.int64)
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.5),
        tf_loss_scale.DynamicLossScale(**arguments))

    def train(grad):
      optimizer.minimize(lambda: var * grad, var_list=[var],
                         global_step=global_step)

    state = lambda: (optimizer.loss_scale(), global_step.read_value(),
                     var.read_value())
    if mode == 'graph':
      grad = tf.compat.v1.placeholder(tf.float32, [])
      train_op = optimizer.minimize(var * grad, global_step=global_step)
      session = tf.compat.v1.Session()
      session.run(tf.compat.v1.global_variables_initializer())
      step = lambda value: session.run(train_op, {grad: value})
      read = lambda fetches=state(): session.run(fetches)
    else:
      step = tf.function(train) if mode == 'function' else train
      read = state
    for finite in verdicts:
      step(np.float32(1.0 if finite else np.inf))
      records.append(tuple(np.asarray(x).item() for x in read()))
  assert [r[0] for r in records] == expected['loss_scale']
  assert [r[1] for r in records] == [0, 0, 0, 0, 1, 1, 1, 1]
  # One applied step, of learning rate 0.5 times gradient 1.
  assert [r[2] for r in records] == [1.0] * 4 + [0.5] * 4


def _keras_variable(value):
  # Keras 2 optimizers train tf.Variables.
  if hasattr(keras, 'Variable'):
    return keras.Variable(value)
  return tf.Variable(value)


def _graph_if(mode):
  return tf.Graph().as_default() if mode == 'graph' else contextlib.nullcontext()


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_experimental_keras_wrapper_follows_the_pinned_trajectory(mode):
  arguments, verdicts, expected = PINNED['hysteresis-two']
  var = _keras_variable(1.0)
  optimizer = experimental.LossScaleOptimizer(
      keras.optimizers.SGD(0.5), tf_loss_scale.DynamicLossScale(**arguments))
  apply = lambda g: optimizer.apply_gradients([(g, var)])
  if mode == 'function':
    apply = tf.function(apply)
  scales = []
  for finite in verdicts:
    apply(tf.constant(1.0 if finite else np.inf))
    scales.append(float(optimizer.loss_scale()))
  assert scales == expected['loss_scale']
  assert float(np.asarray(var)) == 0.5, 'only the finite step is applied'


@pytest.mark.parametrize('mode', ['graph', 'function'])
def test_v1_optimizer_under_mirrored_strategy_agrees_on_every_counter(
    mode, mirrored_strategy):
  # Replica 1 alone overflows on the non-finite steps; both skip, and both
  # hold the same scale and counters after every step.
  arguments, verdicts, expected = PINNED['collapse-counts']
  strategy = mirrored_strategy
  records = []
  with warnings.catch_warnings(), _graph_if(mode):
    warnings.simplefilter('ignore', RuntimeWarning)
    with strategy.scope():
      var = tf.Variable(1.0)
      optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.5),
          tf_loss_scale.DynamicLossScale(**arguments))
    loss_scale = optimizer.loss_scale

    def replica_step(bad):
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      grad = tf.where(tf.equal(replica, 1), bad, 1.0)
      return optimizer.minimize(lambda: var * grad, var_list=[var])

    def read():
      """Per value, its list over the replicas."""
      return [strategy.experimental_local_results(value)
              for value in strategy.run(lambda: (
                  loss_scale(), tf.identity(loss_scale.non_finite_streak),
                  tf.identity(loss_scale.skips_at_floor),
                  loss_scale.skipped_steps, var.read_value()))]

    if mode == 'graph':
      bad = tf.compat.v1.placeholder(tf.float32, [])
      train_op = strategy.group(strategy.run(replica_step, args=(bad,)))
      state = read()
      session = tf.compat.v1.Session()
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      step = lambda value: session.run(train_op, {bad: value})
      fetch = lambda: session.run(state)
    else:

      @tf.function
      def step(value):
        strategy.run(replica_step, args=(value,))

      fetch = read
    for finite in verdicts:
      step(np.float32(1.0 if finite else np.inf))
      records.append([[np.asarray(r).item() for r in per_replica]
                      for per_replica in fetch()])
  names = ('loss_scale', 'non_finite_streak', 'skips_at_floor',
           'skipped_steps', 'var')
  for step, record in enumerate(records):
    for name, per_replica in zip(names, record):
      assert per_replica[0] == per_replica[1], (
          f'step {step}: {name} differs between replicas: {per_replica}')
  for position, name in enumerate(names[:4]):
    assert [r[position][0] for r in records] == expected[name], name
  # One applied step: both replicas' gradients of 1, summed, times 0.5.
  assert [r[4][0] for r in records] == [1.0] * 4 + [0.0] * 4


def test_raise_fails_the_experimental_keras_wrappers_function_step():
  var = _keras_variable(1.0)
  optimizer = experimental.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                              _collapse_scale('raise'))
  apply = tf.function(lambda g: optimizer.apply_gradients([(g, var)]))
  verdicts = PINNED['collapse-counts'][1]
  for finite in verdicts[:COLLAPSE_STEPS[0]]:
    apply(tf.constant(1.0 if finite else np.inf))
  with pytest.raises(tf.errors.InvalidArgumentError, match='collapsed'):
    apply(tf.constant(np.inf))


# --- Checkpoints ----------------------------------------------------------------

RESUMED = dict(initial_loss_scale=8, increment_period=2, min_loss_scale=0.5,
               max_loss_scale=16, hysteresis=3, on_collapse='warn',
               collapse_patience=4)
# Split after step 5, mid-hysteresis (two non-finite steps in a row).
RESUMED_VERDICTS = [T, T, T, F, F, F, F, F, F, F, T, T, T, T]
RESUMED_SPLIT = 5


def _state(loss_scale):
  return (float(loss_scale()), int(loss_scale.good_steps.numpy()),
          int(loss_scale.non_finite_streak.numpy()),
          int(loss_scale.skips_at_floor.numpy()))


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_object_checkpoint_mid_hysteresis_resumes_identically(mode, tmp_path):
  grads = lambda finite: [tf.constant(1.0 if finite else np.inf)]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', RuntimeWarning)
    uninterrupted = tf_loss_scale.DynamicLossScale(**RESUMED)
    expected = []
    for finite in RESUMED_VERDICTS:
      uninterrupted.update(grads(finite))
      expected.append(_state(uninterrupted))
    writer = tf_loss_scale.DynamicLossScale(**RESUMED)
    update = tf.function(writer.update) if mode == 'function' else writer.update
    for finite in RESUMED_VERDICTS[:RESUMED_SPLIT]:
      update(grads(finite))
    assert _state(writer)[2] == 2, 'saved mid-hysteresis'
    path = tf.train.Checkpoint(loss_scale=writer).save(str(tmp_path / 'ckpt'))
    keys = {k for k, _ in tf.train.list_variables(path)
            if k.startswith('loss_scale/')}
    assert keys == {f'loss_scale/{name}/.ATTRIBUTES/VARIABLE_VALUE' for name in
                    ('current_loss_scale', 'good_steps', 'non_finite_streak',
                     'skips_at_floor')}
    reader = tf_loss_scale.DynamicLossScale(**RESUMED)
    tf.train.Checkpoint(loss_scale=reader).restore(path).assert_consumed()
    update = tf.function(reader.update) if mode == 'function' else reader.update
    resumed = [_state(writer)]
    for finite in RESUMED_VERDICTS[RESUMED_SPLIT:]:
      update(grads(finite))
      resumed.append(_state(reader))
  assert resumed == expected[RESUMED_SPLIT - 1:]


def test_saver_checkpoint_mid_hysteresis_resumes_identically(tmp_path):
  def graph_run(verdicts, restore_from=None, save_to=None):
    states = []
    with tf.Graph().as_default():
      loss_scale = tf_loss_scale.DynamicLossScale(**RESUMED)
      grad = tf.compat.v1.placeholder(tf.float32, [])
      update_op, _ = loss_scale.update([grad])
      state = (loss_scale(), loss_scale.good_steps,
               loss_scale.non_finite_streak, loss_scale.skips_at_floor)
      saver = tf.compat.v1.train.Saver()
      names = sorted(v.op.name for v in tf.compat.v1.global_variables())
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        if restore_from:
          saver.restore(session, restore_from)
        for finite in verdicts:
          session.run(update_op, {grad: 1.0 if finite else np.inf})
          states.append(tuple(np.asarray(x).item()
                              for x in session.run(state)))
        path = saver.save(session, save_to) if save_to else None
    return states, names, path

  expected, names, _ = graph_run(RESUMED_VERDICTS)
  assert names == ['current_loss_scale', 'current_loss_scale/non_finite_streak',
                   'current_loss_scale/skips_at_floor', 'good_steps']
  _, _, path = graph_run(RESUMED_VERDICTS[:RESUMED_SPLIT],
                         save_to=str(tmp_path / 'model'))
  resumed, _, _ = graph_run(RESUMED_VERDICTS[RESUMED_SPLIT:],
                            restore_from=path)
  assert resumed == expected[RESUMED_SPLIT:]


# --- Config ---------------------------------------------------------------------

OPTIONS = [
    dict(min_loss_scale=2**-14),
    dict(max_loss_scale=2**20),
    dict(hysteresis=4),
    dict(on_collapse='warn'),
    dict(on_collapse='raise', collapse_patience=50),
    dict(min_loss_scale=0.5, max_loss_scale=2**16, hysteresis=2,
         on_collapse='warn', collapse_patience=3),
]


@pytest.mark.parametrize('options', OPTIONS)
def test_config_lists_the_options_set_and_round_trips(options):
  loss_scale = tf_loss_scale.DynamicLossScale(**options)
  base = {'initial_loss_scale': 32768.0, 'increment_period': 2000,
          'multiplier': 2.0}
  assert loss_scale.get_config() == dict(base, **options)
  for restored in (
      tf_loss_scale.DynamicLossScale.from_config(loss_scale.get_config()),
      tf_loss_scale.deserialize(tf_loss_scale.serialize(loss_scale))):
    assert restored.get_config() == loss_scale.get_config()
    for name, value in options.items():
      assert getattr(restored, name) == value, name


def test_repr_adds_the_options_set():
  loss_scale = tf_loss_scale.DynamicLossScale(4, 3, 2.5, hysteresis=2)
  assert repr(loss_scale) == (
      'DynamicLossScale(current_loss_scale=4.0, num_good_steps=0, '
      'initial_loss_scale=4.0, increment_period=3, multiplier=2.5, '
      'hysteresis=2)')


@pytest.mark.parametrize('arguments,error,pattern', [
    (dict(min_loss_scale=0), ValueError, r'min_loss_scale.*\b0\b'),
    (dict(min_loss_scale=-1.0), ValueError, r'min_loss_scale.*-1\.0'),
    (dict(min_loss_scale=float('nan')), ValueError, r'min_loss_scale.*nan'),
    (dict(min_loss_scale=float('inf')), ValueError, r'min_loss_scale.*inf'),
    (dict(min_loss_scale=1e-50), ValueError, r'min_loss_scale.*1e-50'),
    (dict(min_loss_scale='1'), TypeError, r"min_loss_scale.*'1'"),
    (dict(max_loss_scale=100), ValueError,
     r'max_loss_scale.*initial_loss_scale.*100'),
    (dict(initial_loss_scale=1, min_loss_scale=4, max_loss_scale=2),
     ValueError, r'max_loss_scale.*min_loss_scale.*\b2\b'),
    (dict(max_loss_scale=float('inf')), ValueError, r'max_loss_scale.*inf'),
    (dict(max_loss_scale=float('nan')), ValueError, r'max_loss_scale.*nan'),
    (dict(max_loss_scale=[8]), TypeError, r'max_loss_scale.*\[8\]'),
    (dict(hysteresis=0), ValueError, r'hysteresis.*\b0\b'),
    (dict(hysteresis=-2), ValueError, r'hysteresis.*-2'),
    (dict(hysteresis=1.5), TypeError, r'hysteresis.*1\.5'),
    (dict(hysteresis=True), TypeError, r'hysteresis.*True'),
    (dict(on_collapse='stop'), ValueError, r"on_collapse.*'stop'"),
    (dict(on_collapse=None), TypeError, r'on_collapse.*None'),
    (dict(on_collapse='raise', collapse_patience=0), ValueError,
     r'collapse_patience.*\b0\b'),
    (dict(on_collapse='warn', collapse_patience=2.5), TypeError,
     r'collapse_patience.*2\.5'),
    (dict(collapse_patience=10), ValueError,
     r"collapse_patience.*10.*on_collapse='skip'"),
])
def test_bad_options_are_refused_naming_them(arguments, error, pattern):
  with pytest.raises(error, match=pattern):
    tf_loss_scale.DynamicLossScale(**arguments)
