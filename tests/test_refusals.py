"""What TensorFlow 2.3 trained, ours trains: no refusal the original lacked.

The TF 2.3 programs of tests/legacy/launcher/ that keep a loss scale outside
the strategy's scope (OpenNMT-tf's trainer; a policy set before the
strategy, whose loss scale `compile` wraps in its scope) run unmodified in
a fresh process, through `tf-loss-scale run` and after `compat.install()`,
and print what TensorFlow 2.3.4 printed (`test_launcher_programs._RECORDED`,
compared again with the original itself where `.ci/run originals` ran it).
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
    pytest.param(False, id='keras3', marks=versions.KERAS_3.mark),
    pytest.param(True, id='tf_keras', marks=[versions.TF_KERAS_INSTALLED.mark,
                                             pytest.mark.slow]),
])
def test_tf23_policy_set_before_the_strategy_trains_after_install(
    legacy_keras):
  name = 'tf23_set_policy_then_mirrored_compile.py'
  _assert_as_tf23(name, _printed([_RUNNER, os.path.join(_LAUNCHER, name)],
                                 legacy_keras=legacy_keras))
