"""Legacy mixed precision programs run unmodified after `compat.install()`.

tests/legacy/ holds short programs written the way each generation's guides
and API pages wrote mixed precision code: TF1 sessions, TF 2.0-2.3's
experimental Keras API, TF 2.4-2.15's Keras API, training-library helpers.
Each asserts what it trained (weights or losses, the steps it skipped, the
loss scale after) and prints a JSON line last. Each runs in a fresh process
through tests/legacy/run_program.py, with a timeout, in the Keras
configuration of this run; on TensorFlow 2.16+ a run without
`TF_USE_LEGACY_KERAS` also runs the Keras programs under tf_keras
(`TF_USE_LEGACY_KERAS=1`), and a run with it runs only the Keras programs
(the others would repeat the run without it).

A program declares in its header comments how it runs:
    # Runs after: compat.install()       or compat.install(override=True)
    # Keras: yes                         or no; or "3 only": it calls
                                         TF 2.4-2.10's optimizer methods
                                         (get_slot, get_weights), which
                                         only this library's class on
                                         Keras 3 has where TensorFlow is
                                         2.11+ (not under tf_keras)
    # Needs: tf.estimator                a name some TensorFlows lack
    # Needs: Keras 3                     `import keras` is Keras 3
    # Needs: a .keras loader that restores a LossScaleOptimizer
                                         not Keras 2.12's
    # Needs: Keras 2, or Keras 3.12 or later   (tf_keras's checkpoints)
    # Resumes: yes                       run twice in one directory, the
                                         first time under Keras 2's class
The programs start together when the first test asks, two at a time.

The TF 2.4-2.15 programs (tf24_*, helper_maybe_wrap) also report which class
`LossScaleOptimizer(...)` made (`optimizer_class`, module and qualname):
this library's on Keras 3 (TensorFlow 2.16+ without `TF_USE_LEGACY_KERAS`),
and elsewhere TensorFlow's or tf_keras's own, which `install()` leaves in
place. A run this library is known to fail is an expected failure (strict),
and only with the failure it is known for: another one fails the test.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import tempfile
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pytest

import fresh_process
import versions

_LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'legacy')
_RUNNER = os.path.join(_LEGACY, 'run_program.py')
_TIMEOUT = 240
_WORKERS = 2

# What a `# Needs:` line may name, and where it holds.
_NEEDS = {
    'tf.estimator': versions.Condition(
        versions.TF < (2, 16),
        'tf.estimator was removed in TensorFlow 2.16 '
        f'(here {".".join(map(str, versions.TF))})'),
    'Keras 3': versions.KERAS_3,
    'Keras 2, or Keras 3.12 or later': versions.Condition(
        bool(not versions.KERAS_3 or versions.KERAS_TF_KERAS_CHECKPOINTS),
        versions.KERAS_TF_KERAS_CHECKPOINTS.reason),
    # Seen on 2.12.1; 2.15 restores it.
    'a .keras loader that restores a LossScaleOptimizer': versions.Condition(
        versions.TF >= (2, 13),
        "Keras 2.12's .keras loader starts a LossScaleOptimizer afresh "
        "('Error in loading the saved optimizer state')"),
}
# A program that resumes first runs where the TF 2.4 API is Keras 2's own
# class: TensorFlow's on 2.15 and earlier, tf_keras's (TF_USE_LEGACY_KERAS=1)
# on 2.16 and later.
_WRITER_LEGACY_KERAS = versions.TF >= (2, 16)
_RESUMES = versions.KERAS_2

# The programs of TF 2.4-2.15's `tf.keras.mixed_precision.LossScaleOptimizer`.
_TF24_HELPERS = ('helper_maybe_wrap.py',)
_OURS = 'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'
# Keras 2's class: `LossScaleOptimizerV3` around the optimizers of Keras 2.11+.
_KERAS2_QUALNAMES = ('LossScaleOptimizer', 'LossScaleOptimizerV3')


def _ours_runs(legacy_keras: bool) -> bool:
  """Whether TF 2.4-2.15's name is this library's class in that process."""
  return versions.TF >= (2, 16) and not legacy_keras


def _expected_class_is(name: str, legacy_keras: bool) -> bool:
  if _ours_runs(legacy_keras):
    return name == _OURS
  module, _, qualname = name.rpartition('.')
  # tf_keras where TensorFlow honours TF_USE_LEGACY_KERAS (2.15 and later),
  # else the keras 2.x that TensorFlow 2.12-2.15 ship.
  package = ('tf_keras' if legacy_keras and versions.TF >= (2, 15) and
             versions.TF_KERAS_INSTALLED else 'keras')
  return module.startswith(package + '.') and qualname in _KERAS2_QUALNAMES


class Program(NamedTuple):
  name: str
  override: bool
  uses_keras: bool
  resumes: bool
  condition: versions.Condition
  keras3_only: bool = False

  @property
  def reports_class(self) -> bool:
    return self.name.startswith('tf24_') or self.name in _TF24_HELPERS


def _header(text: str, key: str) -> Optional[str]:
  match = re.search(rf'^# {key}: (.+)$', text, re.MULTILINE)
  return match.group(1).strip() if match else None


def _program(name: str) -> Program:
  with open(os.path.join(_LEGACY, name), encoding='utf-8') as f:
    text = f.read()
  install = _header(text, 'Runs after')
  if install not in ('compat.install()', 'compat.install(override=True)'):
    raise ValueError(f'{name}: no "# Runs after: compat.install(...)" line')
  condition = versions.Condition(True, '')
  needs = _header(text, 'Needs')
  if needs:
    condition = _NEEDS[needs]
  resumes = _header(text, 'Resumes') == 'yes'
  if resumes:
    condition = condition & _RESUMES
  keras = _header(text, 'Keras')
  return Program(name, 'override=True' in install, keras in ('yes', '3 only'),
                 resumes, condition, keras == '3 only')


def _condition(program: Program, legacy_keras: bool) -> versions.Condition:
  if (legacy_keras and not program.uses_keras and
      versions.LEGACY_KERAS_REQUESTED):
    return versions.Condition(False, (
        f'{program.name} uses no Keras: TF_USE_LEGACY_KERAS=1 changes '
        'nothing for it, and the run without the variable runs it'))
  if legacy_keras and not versions.TF_KERAS_INSTALLED:
    return versions.TF_KERAS_INSTALLED
  if program.keras3_only and (legacy_keras or versions.TF < (2, 16)):
    return versions.Condition(False, (
        f'{program.name} calls TF 2.4-2.10\'s optimizer methods (get_slot, '
        'get_weights), which Keras 2\'s optimizers of TF 2.11+ lack; it runs '
        'where tf.keras is Keras 3'))
  return program.condition


# (program, whether its process runs under TF_USE_LEGACY_KERAS=1)
_MODES = ([True] if versions.LEGACY_KERAS_REQUESTED else
          [False, True] if versions.TF >= (2, 16) else [False])
RUNS = [(program, legacy_keras)
        for program in (_program(name) for name in sorted(os.listdir(_LEGACY))
                        if name.endswith('.py') and name not in (
                            'run_program.py', 'run_after_install.py',
                            'tf23_compile_fit.py',
                            'tf23_custom_training_loop.py'))
        for legacy_keras in _MODES
        if program.uses_keras or not legacy_keras or
        versions.LEGACY_KERAS_REQUESTED]


def _param(program: Program, legacy_keras: bool) -> Any:
  return pytest.param(
      program, legacy_keras,
      id=f'{program.name[:-3]}-{"tf_keras" if legacy_keras else "tf.keras"}')


class Run(NamedTuple):
  returncode: Optional[int]  # None: killed at the timeout
  stdout: str
  stderr: str
  seconds: float


def _run(program: Program, legacy_keras: bool, workdir: str) -> List[Run]:
  """Runs the program (twice if it resumes) in `workdir`."""
  args = [_RUNNER] + (['--override'] if program.override else []) + [
      os.path.join(_LEGACY, program.name)]
  runs = []
  for legacy in [_WRITER_LEGACY_KERAS] * program.resumes + [legacy_keras]:
    start = time.monotonic()
    try:
      done = fresh_process.run(args, legacy, _TIMEOUT, cwd=workdir)
    except subprocess.TimeoutExpired:  # subprocess.run killed the child
      runs.append(Run(None, '', 'killed at the timeout', _TIMEOUT))
      break
    runs.append(Run(done.returncode, done.stdout, done.stderr[-6000:],
                    time.monotonic() - start))
    if done.returncode:
      break
  return runs


@pytest.fixture(scope='session')
def program_runs(tmp_path_factory) -> Dict[Tuple[str, bool],
                                           concurrent.futures.Future]:
  """Every run that applies here, started two at a time."""
  root = tmp_path_factory.mktemp('legacy_programs')
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS)
  yield {(program.name, legacy_keras): pool.submit(
      _run, program, legacy_keras, tempfile.mkdtemp(dir=root))
         for program, legacy_keras in RUNS
         if _condition(program, legacy_keras)}
  pool.shutdown(wait=True)


@pytest.mark.parametrize('program,legacy_keras',
                         [_param(p, legacy) for p, legacy in RUNS])
def test_legacy_program_runs_unmodified(program, legacy_keras, program_runs):
  condition = _condition(program, legacy_keras)
  if not condition:
    pytest.skip(condition.reason)
  runs = program_runs[program.name, legacy_keras].result()
  keras = 'tf_keras' if legacy_keras else 'the default tf.keras'
  legacy_of_run = [_WRITER_LEGACY_KERAS] * program.resumes + [legacy_keras]
  for i, run in enumerate(runs):
    writes = program.resumes and i == 0
    phase = ' (the run that writes the checkpoint)' if writes else ''
    assert run.returncode == 0, (
        f'{program.name}{phase} under {keras} failed (exit '
        f'{run.returncode}, {run.seconds:.0f} s):\n{run.stderr}')
  results = [json.loads(run.stdout.strip().splitlines()[-1]) for run in runs]
  if program.resumes:
    assert [r['resumed'] for r in results] == [False, True], results
  if program.reports_class:
    for result, legacy in zip(results, legacy_of_run):
      ran = result.get('optimizer_class')
      expected = _OURS if _ours_runs(legacy) else "Keras 2's own class"
      where = 'tf_keras' if legacy else 'the default tf.keras'
      assert ran and _expected_class_is(ran, legacy), (
          f'{program.name} under {where} ran {ran}, expected {expected}')
