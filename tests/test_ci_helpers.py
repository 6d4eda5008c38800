"""The helpers of .ci/run, on made-up steps and outputs.

`.ci/background.sh` (sourced by .ci/run) runs steps beside the README's
suite: a step run in the background fails CI however it fails. Here it runs
synthetic steps in bash, under `.ci/run`'s own shell options, and the tests
read which failures `collect` counted. Then the verdicts of the Keras
release matrix (.ci/keras_releases.py) and of the with-install step
(.ci/keras_tests_with_install.py), pure functions of what the runs printed.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

_CI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), '.ci')

_NEEDS_BASH = pytest.mark.skipif(shutil.which('bash') is None,
                                 reason='needs bash, which .ci/run runs in')

_STEPS = r'''
set -uo pipefail
logs="$1"
failed=()
fail() { echo "FAILED: $*" >&2; failed+=("$*"); }
source "$2/background.sh"
passes() { echo 'all well'; }
records_two() { fail 'first'; fail 'second'; }
aborts_under_set_u() { fail 'first'; echo "${never_set}"; fail 'unreached'; }
exits_early() { fail 'first'; exit 3; }
is_killed() { fail 'first'; kill -KILL "${BASHPID}"; }
is_terminated() { kill -TERM "${BASHPID}"; }
for step in "${@:3}"; do start_background "${step}" "${step}"; done
for step in "${@:3}"; do collect "${step}"; done
printf 'counted: %s\n' "${failed[@]}"
[[ ${#failed[@]} -eq 0 ]]
'''


def _collected(tmp_path, *steps):
  """Runs the steps in the background; returns (exit status, counted)."""
  done = subprocess.run(
      ['bash', '-c', _STEPS, 'steps', str(tmp_path), _CI, *steps],
      capture_output=True, text=True, timeout=60, check=False)
  counted = [line[len('counted: '):] for line in done.stdout.splitlines()
             if line.startswith('counted: ') and line != 'counted: ']
  return done.returncode, counted


@_NEEDS_BASH
def test_a_step_that_passes_counts_no_failure(tmp_path):
  assert _collected(tmp_path, 'passes') == (0, [])
  assert (tmp_path / 'passes.out').read_text() == 'all well\n'


@_NEEDS_BASH
def test_a_step_that_records_failures_counts_each(tmp_path):
  assert _collected(tmp_path, 'records_two') == (1, ['first', 'second'])


@_NEEDS_BASH
def test_a_step_that_aborts_under_set_u_fails_with_what_it_recorded(
    tmp_path):
  status, counted = _collected(tmp_path, 'aborts_under_set_u', 'passes')
  assert status == 1
  assert counted[0] == 'first', counted
  assert counted[1].startswith('aborts_under_set_u: stopped before its end '
                               '(exit 1;'), counted
  assert len(counted) == 2, counted
  assert 'never_set: unbound variable' in (
      tmp_path / 'aborts_under_set_u.out').read_text()


@_NEEDS_BASH
def test_a_step_that_exits_early_fails(tmp_path):
  status, counted = _collected(tmp_path, 'exits_early')
  assert status == 1
  assert counted == ['first', f'exits_early: stopped before its end (exit 3; '
                     f'its output is above and in {tmp_path}/exits_early.out)']


@_NEEDS_BASH
@pytest.mark.parametrize('step,signal_status', [('is_killed', 137),
                                                ('is_terminated', 143)])
def test_a_step_killed_fails(tmp_path, step, signal_status):
  status, counted = _collected(tmp_path, step)
  assert status == 1
  assert counted[-1].startswith(
      f'{step}: stopped before its end (exit {signal_status};'), counted


@_NEEDS_BASH
def test_ci_run_parses_and_sources_its_helpers():
  run = os.path.join(_CI, 'run')
  assert subprocess.run(['bash', '-n', run], check=False).returncode == 0
  with open(run) as f:
    assert '\nsource .ci/background.sh\n' in f.read()


def _ci_module(name):
  """A module of .ci/, loaded from its file (.ci is no package)."""
  spec = importlib.util.spec_from_file_location(
      f'ci_{name}', os.path.join(_CI, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


keras_releases = _ci_module('keras_releases')

_SMOKE_PASSED = ('Keras 3.9.2 (/scratch/3.9.2/keras), TensorFlow 2.21.0\n'
                 'PASSED fit\nPASSED replicas\n2 passed, 0 failed\n')


def test_release_matrix_takes_the_newest_patch_of_each_minor_release():
  listed = ['3.15.1', '3.15.0', '3.13.0rc1', '3.4.1', '3.4.0', '3.3.3',
            '3.2.1', '2.15.0', '3.10.0']
  assert keras_releases.newest_patches(listed, (3, 3, 3)) == [
      '3.3.3', '3.4.1', '3.10.0', '3.15.1']


def test_release_matrix_names_minor_releases_the_index_lacks():
  listed = ['3.3.3', '3.4.1', '3.6.0', '3.7.0']
  assert keras_releases.missing_minors(listed, (3, 3, 3), (3, 7, 0)) == [
      '3.5']
  # Up to the newest tested, even where the index stops before it.
  assert keras_releases.missing_minors(listed, (3, 3, 3), (3, 9, 1)) == [
      '3.5', '3.8', '3.9']
  assert keras_releases.missing_minors(
      [f'3.{minor}.0' for minor in range(3, 16)], (3, 3, 3), (3, 15, 1)) == []


def test_release_matrix_passes_a_release_that_ran_the_keras_asked_for():
  assert keras_releases.judge('3.9.2', 0, _SMOKE_PASSED, {}) == (
      'passed', '2 passed, 0 failed')


def test_release_matrix_fails_a_release_that_imported_another_keras():
  outcome, shown = keras_releases.judge(
      '3.9.2', 0, _SMOKE_PASSED.replace('3.9.2', '3.15.1'), {})
  assert outcome == 'failed'
  assert shown == '2 passed, 0 failed; imported Keras 3.15.1, not 3.9.2'


def test_release_matrix_fails_a_run_without_the_scripts_summary():
  assert keras_releases.judge('3.9.2', 0, _SMOKE_PASSED.splitlines()[0],
                              {}) == ('failed', 'exit 0')
  assert keras_releases.judge('3.9.2', 1, _SMOKE_PASSED.replace(
      '2 passed, 0', '1 passed, 1'), {}) == ('failed', '1 passed, 1 failed')


def test_release_matrix_skips_a_release_only_for_a_listed_platform_limit():
  skipped = ('SKIPPED: Keras (/scratch/3.4.1) does not run on TensorFlow '
             '2.21.0 without this library: ImportError: no ml_dtypes.int2\n')
  limits = keras_releases.platform_limits(
      'text\n\nPlatform limits of the matrix:\n'
      '- Keras 3.4: `ImportError: no ml_dtypes.int2` (ml_dtypes too new)\n'
      '- Keras 3.5: `other words` (why)\n\nMore text.\n'
      '- Keras 3.6: `outside the list`\n')
  assert limits == {'3.4': ['ImportError: no ml_dtypes.int2'],
                    '3.5': ['other words']}
  assert keras_releases.judge('3.4.1', 2, skipped, limits) == (
      'skipped', skipped.strip())
  for version, allowed in (('3.5.0', limits), ('3.4.1', {})):
    outcome, shown = keras_releases.judge(version, 2, skipped, allowed)
    assert outcome == 'failed', version
    assert shown.endswith('(no platform limit of docs/testing.md for Keras '
                          f'{version[:3]} names this skip)')


def test_the_platform_limits_of_docs_testing_are_read():
  with open(os.path.join(os.path.dirname(_CI), 'docs', 'testing.md')) as f:
    text = f.read()
  assert '\nPlatform limits of the Keras release matrix:\n' in text
  # Each item of the list, as the step reads them (none today).
  assert keras_releases.platform_limits(text) == {}


@pytest.mark.slow  # A TensorFlow process; the judge's tests above are fast.
def test_release_smoke_script_fails_where_it_imported_another_keras(
    monkeypatch):
  import fresh_process  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('TF_LOSS_SCALE_EXPECTED_KERAS', '3.4.1')
  result = fresh_process.run([os.path.join(
      os.path.dirname(os.path.abspath(__file__)), 'keras_release_smoke.py')])
  assert result.returncode == 1, result.stdout + result.stderr[-2000:]
  assert result.stdout.splitlines()[-1] == (
      f'FAILED version: imported Keras {keras.__version__}, not 3.4.1 '
      '(TF_LOSS_SCALE_EXPECTED_KERAS)')


with_install = _ci_module('keras_tests_with_install')

_LSO_TEST = ('keras.src.optimizers.loss_scale_optimizer_test.'
             'LossScaleOptimizerTest::')


def _rebound(*namespaces):
  return [f'{namespace}.LossScaleOptimizer -> '
          'keras.mixed_precision.LossScaleOptimizer'
          for namespace in namespaces]


def test_with_install_requires_the_test_modules_own_name_rebound():
  required = with_install._KERAS_CLASS_REBINDS  # pylint: disable=protected-access
  assert required[0] == 'keras.src.optimizers.loss_scale_optimizer_test'
  assert with_install.rebinding_problems(_rebound(*required), required) == []
  # Only the trainer's names rebound: the module's own still Keras's.
  assert with_install.rebinding_problems(
      _rebound('keras.src.optimizers', 'keras.src.trainers.trainer'),
      required) == ['keras.src.optimizers.loss_scale_optimizer_test.'
                    "LossScaleOptimizer is not install()'s class"]


def _keras_class_group():
  return with_install.Group(
      'keras-class', [], {}, '',
      run_with_install=with_install._KERAS_CLASS_STATELESS)  # pylint: disable=protected-access


def test_with_install_flags_tests_that_skip_or_fail_only_with_install():
  plain = {f'{_LSO_TEST}test_config': 'passed',
           f'{_LSO_TEST}test_upscaling_stateful': 'passed',
           f'{_LSO_TEST}test_infinite_step_stateful': 'passed',
           f'{_LSO_TEST}test_upscaling_stateless': 'skipped',
           f'{_LSO_TEST}test_serialization': 'failed'}
  installed = dict(plain, **{
      f'{_LSO_TEST}test_upscaling_stateful': 'skipped',
      f'{_LSO_TEST}test_infinite_step_stateful': 'error',
      f'{_LSO_TEST}test_upscaling_stateless': 'passed'})
  assert with_install.install_only_problems(
      _keras_class_group(), plain, installed) == [
          f'{_LSO_TEST}test_infinite_step_stateful error only with install() '
          '(passed plainly)',
          f'{_LSO_TEST}test_upscaling_stateful skipped only with install() '
          '(passed plainly)']


def test_with_install_requires_keras_stateless_cases_to_run_on_its_class():
  plain = {f'{_LSO_TEST}test_finite_step_stateless': 'skipped',
           f'{_LSO_TEST}test_finite_step_stateful': 'passed'}
  group = _keras_class_group()
  assert with_install.install_only_problems(group, plain, plain) == [
      f'{_LSO_TEST}test_finite_step_stateless must run with install(), but '
      'skipped']
  assert with_install.install_only_problems(
      group, plain, {f'{_LSO_TEST}test_finite_step_stateful': 'passed'}) == [
          f'no test matching {group.run_with_install[0]} with install()']
  ran = dict(plain, **{f'{_LSO_TEST}test_finite_step_stateless': 'passed'})
  assert with_install.install_only_problems(group, plain, ran) == []


def test_with_install_reruns_plainly_what_did_not_pass_with_install():
  installed = {f'{_LSO_TEST}test_config': 'passed',
               f'{_LSO_TEST}test_upscaling_stateful': 'skipped',
               f'{_LSO_TEST}test_infinite_step_stateful': 'failed',
               f'{_LSO_TEST}test_serialization': 'passed'}
  known = {f'{_LSO_TEST}test_serialization': 'a data file is missing',
           f'{_LSO_TEST}test_not_collected': 'another release'}
  assert with_install.plain_reruns(installed, known) == {
      f'{_LSO_TEST}test_upscaling_stateful',
      f'{_LSO_TEST}test_infinite_step_stateful',
      f'{_LSO_TEST}test_serialization'}
  assert with_install.plain_reruns(
      {f'{_LSO_TEST}test_config': 'passed'}, {}) == set()


_SELECTED_FILE = '''
import pytest

class TestOne:
  def test_a(self):
    pass

  @pytest.mark.parametrize('n', [1, 2])
  def test_b(self, n):
    pass

def test_c():
  pass
'''


def test_the_selection_plugin_runs_the_tests_named_by_junit_id(tmp_path):
  package = tmp_path / 'pkg'
  package.mkdir()
  (package / 'sample_test.py').write_text(_SELECTED_FILE)
  (tmp_path / 'pytest.ini').write_text('[pytest]\n')

  def run(*args, **env):
    junit = tmp_path / 'report.xml'
    subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
         '-c', str(tmp_path / 'pytest.ini'), '--rootdir', str(tmp_path),
         f'--junitxml={junit}', *args, 'pkg/sample_test.py'],
        cwd=tmp_path, check=False, capture_output=True,
        env=dict(os.environ, PYTHONPATH=_CI, **env))
    return sorted(with_install._outcomes(str(junit))[0])  # pylint: disable=protected-access

  every = run()
  assert every == ['pkg.sample_test.TestOne::test_a',
                   'pkg.sample_test.TestOne::test_b[1]',
                   'pkg.sample_test.TestOne::test_b[2]',
                   'pkg.sample_test::test_c']
  selection = tmp_path / 'selected'
  selection.write_text(f'{every[2]}\n{every[3]}\n')
  assert run('-p', 'select_tests_plugin',
             TF_LOSS_SCALE_CI_SELECT=str(selection)) == every[2:]
