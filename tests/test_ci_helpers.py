"""The helpers of .ci/run: a step run in the background fails CI however it fails.

`.ci/background.sh` (sourced by .ci/run) runs steps beside the README's
suite. Here it runs synthetic steps in bash, under `.ci/run`'s own shell
options, and the test reads which failures `collect` counted.
"""

import os
import shutil
import subprocess

import pytest

_CI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), '.ci')

pytestmark = pytest.mark.skipif(shutil.which('bash') is None,
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


def test_a_step_that_passes_counts_no_failure(tmp_path):
  assert _collected(tmp_path, 'passes') == (0, [])
  assert (tmp_path / 'passes.out').read_text() == 'all well\n'


def test_a_step_that_records_failures_counts_each(tmp_path):
  assert _collected(tmp_path, 'records_two') == (1, ['first', 'second'])


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


def test_a_step_that_exits_early_fails(tmp_path):
  status, counted = _collected(tmp_path, 'exits_early')
  assert status == 1
  assert counted == ['first', f'exits_early: stopped before its end (exit 3; '
                     f'its output is above and in {tmp_path}/exits_early.out)']


@pytest.mark.parametrize('step,signal_status', [('is_killed', 137),
                                                ('is_terminated', 143)])
def test_a_step_killed_fails(tmp_path, step, signal_status):
  status, counted = _collected(tmp_path, step)
  assert status == 1
  assert counted[-1].startswith(
      f'{step}: stopped before its end (exit {signal_status};'), counted


def test_ci_run_parses_and_sources_its_helpers():
  run = os.path.join(_CI, 'run')
  assert subprocess.run(['bash', '-n', run], check=False).returncode == 0
  with open(run) as f:
    assert '\nsource .ci/background.sh\n' in f.read()
