"""TF1 control flow: our v1 wrapper's graph and Saver files are TensorFlow's.

A TF 1.15 program (`disable_v2_behavior()`: TF1's `cond`, reference
variables) gets from TensorFlow's wrapper, with a dynamic scale, a graph whose
inner apply is built inside a `cond`: the inner optimizer's variables made
there (Adam's `cond_1/beta1_power`), the `train_op` collection and the
`cond_context` entries carry its names, and a `tf.train.Saver` file keys
them so. tests/originals/tf1_saver_checkpoints.py builds such programs
(Momentum, Adam, RMSProp, Adagrad; fixed and dynamic scales), each in a
fresh process, with TF 2.21's own wrapper, with ours, and on TensorFlow
1.15.0 itself (the original's virtualenv, `original-tf115` under
TF_LOSS_SCALE_CI_VENVS or .ci/venvs): the names must be equal, each side's
checkpoint must restore into the other with every value (weights, slots,
beta powers, loss scale, good steps, global step), and training must go
on alike. Without the original the TF 1.15 tests skip, saying so, unless
TF_LOSS_SCALE_REQUIRE_ORIGINALS=1 (as in CI's originals step), where they
fail.
"""

import concurrent.futures
import json
import os
import subprocess

import numpy as np
import pytest

import fresh_process

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCRIPT = os.path.join(_HERE, 'originals', 'tf1_saver_checkpoints.py')
_CASES = [f'{o}-{s}' for o in ('adagrad', 'adam', 'momentum', 'rmsprop')
          for s in ('fixed', 'dynamic')]
# TF 1.15's kernels round some updates differently in the last bits.
_TOLERANCE = 1e-6


def _ours_or_tf221(which, command, directory):
  return fresh_process.run_json([_SCRIPT, command, which, directory])


def _both(calls):
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    return [f.result() for f in [pool.submit(*call) for call in calls]]


@pytest.fixture(scope='module')
def tf221(tmp_path_factory):
  """What each side wrote, and where."""
  ours, theirs = (str(tmp_path_factory.mktemp(n)) for n in ('ours', 'theirs'))
  written = _both([(_ours_or_tf221, 'ours', 'write', ours),
                   (_ours_or_tf221, 'theirs', 'write', theirs)])
  return {'ours': written[0], 'theirs': written[1], 'ours_dir': ours,
          'theirs_dir': theirs}


@pytest.fixture(scope='module')
def tf221_read(tf221):
  """What each side restored from the other's files."""
  read = _both([(_ours_or_tf221, 'ours', 'read', tf221['theirs_dir']),
                (_ours_or_tf221, 'theirs', 'read', tf221['ours_dir'])])
  return dict(tf221, **{'ours read theirs': read[0],
                        'theirs read ours': read[1]})


def _assert_values(found, expected, what, tolerance=0.0):
  assert sorted(found) == sorted(expected), what
  for name in expected:
    np.testing.assert_allclose(found[name], expected[name], rtol=tolerance,
                               atol=tolerance, err_msg=f'{what}: {name}')


def test_adam_with_a_dynamic_scale_keeps_tensorflows_names(tf221):
  names = tf221['ours']['adam-dynamic']['names']
  assert names['variables'] == [
      'global_step:0', 'w:0', 'embedding:0', 'current_loss_scale:0',
      'good_steps:0', 'cond_1/beta1_power:0', 'cond_1/beta2_power:0',
      'w/Adam:0', 'w/Adam_1:0', 'embedding/Adam:0', 'embedding/Adam_1:0']
  assert names['collections']['train_op'] == ['cond_1/Adam-wrapped']
  # The update's cond, the apply's, then the program's own.
  assert names['collections']['cond_context'] == [
      'cond/cond_text', 'cond/cond_text_1', 'cond_1/cond_text',
      'cond_1/cond_text_1', 'cond_2/cond_text', 'cond_2/cond_text_1']
  assert (names['train_op'], names['later_cond']) == ('Adam', 'cond_2/Merge:0')


@pytest.mark.parametrize('case', _CASES)
def test_a_tf1_graph_holds_the_names_and_values_of_tensorflows(case, tf221):
  ours, theirs = tf221['ours'][case], tf221['theirs'][case]
  assert ours['names'] == theirs['names']
  _assert_values(ours['written'], theirs['written'], f'{case}: trained')


# The full tier: two more processes (the names above are the fast tier's).
@pytest.mark.slow
@pytest.mark.parametrize('case', _CASES)
def test_saver_files_interchange_with_tensorflow_2_21s_wrapper(case,
                                                               tf221_read):
  tf221 = tf221_read
  _assert_values(tf221['ours read theirs'][case]['restored'],
                 tf221['theirs'][case]['written'], f'{case}: ours restored')
  _assert_values(tf221['theirs read ours'][case]['restored'],
                 tf221['ours'][case]['written'], f'{case}: theirs restored')
  # From the same state, each goes on as the other.
  _assert_values(tf221['ours read theirs'][case]['resumed'],
                 tf221['theirs read ours'][case]['resumed'],
                 f'{case}: resumed')


def _tf115_python():
  venvs = os.environ.get('TF_LOSS_SCALE_CI_VENVS', os.path.join(
      os.path.dirname(_HERE), '.ci', 'venvs'))
  python = os.path.join(venvs, 'original-tf115', 'bin', 'python')
  if not os.path.exists(python):
    message = (f'no TensorFlow 1.15 at {python}: `bash .ci/run originals` '
               'makes it (TF_LOSS_SCALE_CI_VENVS names another directory)')
    if os.environ.get('TF_LOSS_SCALE_REQUIRE_ORIGINALS') == '1':
      pytest.fail(message)
    pytest.skip(message)
  return python


def _tf115(python, command, directory):
  # Importing TensorFlow 2 set TF2_BEHAVIOR=1 here, which would give the
  # original TF 2's behaviour (control flow v2 included).
  env = {k: v for k, v in os.environ.items()
         if k not in ('TF2_BEHAVIOR', 'PYTHONPATH')}
  done = subprocess.run([python, _SCRIPT, command, 'theirs', directory],
                        capture_output=True, text=True, timeout=300,
                        env=env, check=False)
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def tf115(tmp_path_factory, tf221):
  python = _tf115_python()
  directory = str(tmp_path_factory.mktemp('tf115'))
  written = _tf115(python, 'write', directory)
  read = _both([(_ours_or_tf221, 'ours', 'read', directory),
                (_tf115, python, 'read', tf221['ours_dir'])])
  return {'theirs': written, 'ours read theirs': read[0],
          'theirs read ours': read[1]}


@pytest.mark.slow
@pytest.mark.parametrize('case', _CASES)
def test_a_tf1_graph_holds_the_names_and_values_of_tensorflow_1_15s(
    case, tf221, tf115):
  ours, theirs = tf221['ours'][case], tf115['theirs'][case]
  assert ours['names'] == theirs['names']
  _assert_values(ours['written'], theirs['written'], f'{case}: trained',
                 _TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize('case', _CASES)
def test_saver_files_interchange_with_tensorflow_1_15(case, tf221, tf115):
  # A file holds exactly what the session that wrote it held.
  _assert_values(tf115['ours read theirs'][case]['restored'],
                 tf115['theirs'][case]['written'], f'{case}: ours restored')
  _assert_values(tf115['theirs read ours'][case]['restored'],
                 tf221['ours'][case]['written'], f'{case}: 1.15 restored')
  _assert_values(tf115['ours read theirs'][case]['resumed'],
                 tf115['theirs read ours'][case]['resumed'],
                 f'{case}: resumed', _TOLERANCE)


_MIRRORED = '''
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices('CPU')[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_loss_scale

found = {}
for which in ('theirs', 'ours'):
  with tf.Graph().as_default():
    strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
    with strategy.scope():
      w = tf.compat.v1.get_variable('w', initializer=[1.0, 2.0])
      global_step = tf.compat.v1.train.get_or_create_global_step()
      module = (tf_loss_scale if which == 'ours' else
                tf.compat.v1.mixed_precision)
      opt = module.MixedPrecisionLossScaleOptimizer(
          tf.compat.v1.train.AdamOptimizer(0.1),
          module.DynamicLossScale(8.0, 2))
    x = tf.compat.v1.placeholder(tf.float32, [2])

    def step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      loss = tf.reduce_sum(w * x * tf.cast(replica + 1, tf.float32))
      return opt.minimize(loss, global_step=global_step)

    train_op = strategy.experimental_local_results(strategy.run(step))[0]
    variables = [w, global_step] + opt.variables()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for x_value in [[1.0, 1.0], [np.inf, 1.0], [1.0, 2.0], [0.5, 1.0]]:
        session.run(train_op, {x: x_value})
      found[which] = {
          'cond_context': [c.name for c in
                           tf.compat.v1.get_collection('cond_context')],
          'train_op': [o.name for o in tf.compat.v1.get_collection('train_op')],
          'values': {v.op.name: np.asarray(session.run(v)).tolist()
                     for v in variables}}
print(json.dumps(found))
'''


@pytest.mark.slow
def test_two_replicas_build_and_train_as_tensorflows_wrapper():
  # The inner apply runs on every replica inside the apply's cond.
  found = fresh_process.run_json(['-c', _MIRRORED])
  ours, theirs = found['ours'], found['theirs']
  assert ours['cond_context'] == theirs['cond_context'] == [
      'cond/cond_text', 'cond/cond_text_1', 'cond_1/cond_text',
      'cond_1/cond_text_1']
  assert ours['train_op'] == theirs['train_op']
  assert 'cond_1/beta1_power' in theirs['values']
  _assert_values(ours['values'], theirs['values'], 'two replicas')
  assert ours['values']['global_step'] == 3  # The inf step was skipped.
