"""What TensorFlow 2.3 trained, ours trains: no refusal the original lacked.

The TF 2.3 programs of tests/legacy/launcher/ that keep a loss scale outside
the strategy's scope (OpenNMT-tf's trainer; a policy set before the
strategy, whose loss scale `compile` wraps in its scope) run unmodified in
a fresh process, through `tf-loss-scale run` and after `compat.install()`,
and print what TensorFlow 2.3.4 printed (`test_launcher_programs._RECORDED`,
compared again with the original itself where `.ci/run originals` ran it).
A graph rewrite refused under a mixed policy, then retried, wraps as
TensorFlow's does (in process, the policy and the rewrite restored).
"""

import json
import os

import pytest

import fresh_process
import test_launcher_programs
import versions

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'legacy', 'launcher')
_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'legacy',
                       'run_program.py')


def _printed(args, legacy_keras=False):
  done = fresh_process.run(args, legacy_keras=legacy_keras, timeout=300)
  assert done.returncode == 0, done.stderr[-4000:]
  lines = [json.loads(line) for line in done.stdout.splitlines()
           if line.startswith('{')]
  return next(line for line in lines if 'made' not in line)


def _assert_as_tf23(name, printed):
  expected = test_launcher_programs._RECORDED[name]  # pylint: disable=protected-access
  assert test_launcher_programs._close(printed, expected), (  # pylint: disable=protected-access
      f'{name}: printed {printed}, TensorFlow 2.3.4 {expected}')


@pytest.mark.parametrize('name', [
    'tf23_mirrored_outside_scope.py',
    # The full tier: the install() runs below cover the fast one.
    pytest.param('tf23_set_policy_then_mirrored_compile.py',
                 marks=pytest.mark.slow)])
def test_tf23_program_with_a_loss_scale_outside_the_scope_runs_as_tf23(name):
  _assert_as_tf23(name, _printed(
      ['-m', 'tf_loss_scale', 'run', os.path.join(_LAUNCHER, name)]))


@pytest.mark.parametrize('legacy_keras', [
    # Keras 3 before 3.5 does not sum gradients across replicas, so the
    # library refuses it under a strategy (test_keras_releases.py).
    pytest.param(False, id='keras3',
                 marks=[versions.KERAS_3.mark,
                        versions.keras_at_least(3, 5).mark]),
    pytest.param(True, id='tf_keras', marks=[versions.TF_KERAS_INSTALLED.mark,
                                             pytest.mark.slow]),
])
def test_tf23_policy_set_before_the_strategy_trains_after_install(
    legacy_keras):
  name = 'tf23_set_policy_then_mirrored_compile.py'
  _assert_as_tf23(name, _printed([_RUNNER, os.path.join(_LAUNCHER, name)],
                                 legacy_keras=legacy_keras))


def _retried(enable, opt):
  """Refused under a mixed policy; the retry under float32 wraps `opt`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    try:
      wrapped, refused = enable(opt), None
    except ValueError as error:
      # Retried here, as programs do, while the error (and its traceback,
      # which holds the refused call's frame) is alive.
      refused = str(error).split(',')[0]
      tf_keras.mixed_precision.set_global_policy('float32')
      wrapped = enable(opt)
  finally:
    # The policy and the rewrite are process-wide: as they were.
    tf_keras.mixed_precision.set_global_policy('float32')
    tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()
  inner = getattr(wrapped, '_optimizer', None) or wrapped.inner_optimizer
  return [refused, inner is opt]


@versions.TF_KERAS_INSTALLED.mark
def test_graph_rewrite_refused_under_a_mixed_policy_wraps_on_the_retry():
  # A refused call changes nothing: the optimizer is not marked as held.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  from tf_loss_scale import graph_rewrite  # pylint: disable=g-import-not-at-top
  v1 = tf.compat.v1.train.GradientDescentOptimizer
  theirs = _retried(
      tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite,
      v1(0.1))
  assert theirs[0].startswith(
      'The mixed precision graph rewrite cannot be enabled'), theirs
  assert theirs[1]
  assert _retried(graph_rewrite.enable_mixed_precision_graph_rewrite,
                  v1(0.1)) == theirs
  assert _retried(graph_rewrite.enable_mixed_precision_graph_rewrite,
                  tf_keras.optimizers.legacy.SGD(0.1)) == theirs
