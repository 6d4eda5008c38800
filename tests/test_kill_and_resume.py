"""A run killed with SIGKILL and restarted ends where an unbroken run ends.

`tests/workers/kill_and_resume.py` trains three front ends for 6 steps
(step 4 overflows and is skipped), checkpointing after every step: a TF1
`MonitoredTrainingSession` with a `Saver` and the v1 optimizer, a custom loop
with a `tf.train.CheckpointManager` and the experimental Keras wrapper, and
`model.fit` with `BackupAndRestore` and the Keras 3 form. The process kills
itself at chosen steps, right after that step's checkpoint is written (so
the kills are deterministic), and is started again until it finishes. Every
variable must then equal, bit for bit, that of a run never killed.
"""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys

import pytest

_WORKER = os.path.join(os.path.dirname(__file__), 'workers',
                       'kill_and_resume.py')
_FRONT_ENDS = ('tf1', 'experimental', 'keras_fit')
# Kills after step 4 (the skipped one) everywhere, and after step 2 (scale
# 16 with one good step, both unlike a fresh start) in the TF1 loop.
_KILLS = {'tf1': [2, 4], 'experimental': [4], 'keras_fit': [4]}
_TIMEOUT = 240
# After 6 steps of which step 4 was skipped: scale 8 -> 16 -> 32, halved by
# the overflow to 16, then one good step. TF1's global_step and Keras 3's
# iterations count applied steps; TF 2.3's iterations count every step.
_EXPECTED = {
    'tf1': {'current_loss_scale': 16.0, 'good_steps': 1, 'global_step': 5,
            'data_step': 6},
    'experimental': {'loss_scale': 16.0, 'good_steps': 1, 'iterations': 6,
                     'data_step': 6},
    'keras_fit': {'loss_scale': 16.0, 'good_steps': 1, 'iterations': 5},
}


def _run(directory, kills):
  result = subprocess.run(
      [sys.executable, _WORKER, str(directory), json.dumps(kills)],
      capture_output=True, text=True, timeout=_TIMEOUT,
      env=dict(os.environ, CUDA_VISIBLE_DEVICES=''))
  finals, ran = {}, {front_end: [] for front_end in _FRONT_ENDS}
  for line in result.stdout.splitlines():
    if not line.startswith('{'):
      continue
    record = json.loads(line)
    if 'ran' in record:
      ran[record['front_end']].append(record['ran'])
    else:
      # One copy of each variable (no strategy): {name: {'hex', 'value'}}.
      finals[record['front_end']] = {
          name: copies[0] for name, copies in record['final'].items()}
  return result.returncode, result.stderr, finals, ran


def _run_until_done(directory):
  """Restarts the killed run until it finishes.

  Returns:
    The exit codes, the last run's final states, and for each process the
    steps it ran, front end by front end.
  """
  codes, ran = [], []
  for _ in range(sum(len(k) for k in _KILLS.values()) + 1):
    code, stderr, finals, ran_here = _run(directory, _KILLS)
    codes.append(code)
    ran.append(ran_here)
    if code != -signal.SIGKILL:
      assert code == 0, f'run {len(codes)} failed:\n{stderr[-3000:]}'
      return codes, finals, ran
  raise AssertionError(f'still killed after {len(codes)} runs: {codes}')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The final states of an unbroken run and of a killed-and-resumed one."""
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    unbroken = pool.submit(_run, tmp_path_factory.mktemp('unbroken'), {})
    killed = pool.submit(_run_until_done, tmp_path_factory.mktemp('killed'))
    code, stderr, unbroken_finals, _ = unbroken.result()
    assert code == 0, f'the unbroken run failed:\n{stderr[-3000:]}'
    codes, resumed_finals, ran = killed.result()
  return {'codes': codes, 'ran': ran, 'unbroken': unbroken_finals,
          'resumed': resumed_finals}


@pytest.mark.slow
def test_every_planned_kill_happened_and_the_last_run_finished(runs):
  kills = sum(len(k) for k in _KILLS.values())
  assert runs['codes'] == [-signal.SIGKILL] * kills + [0]


@pytest.mark.slow
def test_each_restart_resumes_after_the_last_checkpoint(runs):
  # Every step ran exactly once over all the processes: a restart neither
  # trained from the beginning again nor left a step out.
  expected = [
      {'tf1': [0, 1, 2], 'experimental': [], 'keras_fit': []},
      {'tf1': [3, 4], 'experimental': [], 'keras_fit': []},
      {'tf1': [5], 'experimental': [0, 1, 2, 3, 4], 'keras_fit': []},
      {'tf1': [], 'experimental': [5], 'keras_fit': [0, 1, 2, 3, 4]},
      {'tf1': [], 'experimental': [], 'keras_fit': [5]},
  ]
  for process, (ran, planned) in enumerate(zip(runs['ran'], expected)):
    assert ran == planned, f'process {process + 1} ran {ran}'
  assert len(runs['ran']) == len(expected), runs['ran']


@pytest.mark.slow
@pytest.mark.parametrize('front_end', _FRONT_ENDS)
def test_resumed_run_ends_bit_for_bit_like_an_unbroken_one(runs, front_end):
  unbroken = runs['unbroken'][front_end]
  resumed = runs['resumed'][front_end]
  for name, value in _EXPECTED[front_end].items():
    assert unbroken[name]['value'] == value, (
        f'{front_end}, unbroken run: {name} is {unbroken[name]["value"]}, '
        f'expected {value}')
  assert sorted(resumed) == sorted(unbroken), f'{front_end}: other variables'
  for name, expected in unbroken.items():
    assert resumed[name]['hex'] == expected['hex'], (
        f'{front_end}, killed after steps {_KILLS[front_end]} and resumed: '
        f'{name} is {resumed[name]["value"]}, the unbroken run has '
        f'{expected["value"]} (bit for bit)')
