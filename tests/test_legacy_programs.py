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
    # Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable
    # Resumes: yes                       run twice in one directory, the
                                         first time under Keras 2's class
    # Compared: TensorFlow's wrapper     (TF1 programs) run first with
                                         TensorFlow's own classes in the
                                         same process: every entry of its
                                         JSON line but `record` (the
                                         library's skip record, None there,
                                         set with ours) must be equal
The selected programs start together when the first test asks, two at a
time.

The runner reports the class of every loss scale optimizer a program made,
and each program's run is checked for it: TF1 programs (`tf1_*`, after
`install(override=True)`) the library's v1 class, never TensorFlow's;
TF 2.0-2.3 programs (`tf23_*`, helper_configure_optimizer_tf23) the
library's experimental class; TF 2.4-2.15 programs (tf24_*,
helper_maybe_wrap) the library's class on Keras 3 (TensorFlow 2.16+ without
`TF_USE_LEGACY_KERAS`), and elsewhere TensorFlow's or tf_keras's own, which
`install()` leaves in place.

A few programs also run through `python -m tf_loss_scale run`, under the
Keras 2 it chooses and under `--keras 3`.

The fast tier runs one program of each generation (`_FAST`); `--full` runs
them all, and the runs through `run`.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import tempfile
import time
from typing import (Any, Callable, Dict, List, NamedTuple, Optional,
                    Tuple)

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
    # A TF 2.4-2.15 program that uses no TF 2.4-2.15 method reads
    # `iterations` as a Keras 3 program does: Keras's class's count, a
    # Keras variable.
    'Keras 2, or Keras 3.12 or later for int() of a Keras variable':
        versions.Condition(
            bool(not versions.KERAS_3 or versions.keras_at_least(3, 12)),
            "Keras 3.3's variables refuse int() (Keras 3.12's take it), and "
            "before Keras 3.9 Keras's class counts no step in `iterations`; "
            'until a program calls a TF 2.4-2.15 method, `iterations` is '
            "Keras's class's, as for Keras 3 programs: "
            f'{versions.keras_at_least(3, 12).reason}'),
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

# The programs of each generation's class, besides those named tf1_, tf23_,
# tf24_.
_TF23_HELPERS = ('helper_configure_optimizer_tf23.py',)
_TF24_HELPERS = ('helper_maybe_wrap.py',)
_OURS = 'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'
_OURS_V1 = 'tf_loss_scale.optimizer_v1.MixedPrecisionLossScaleOptimizer'
_OURS_EXPERIMENTAL = 'tf_loss_scale.keras.experimental'
_KERAS_3_OWN = 'keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer'
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


# Made by the library's own steps, and dropped: Keras 3's `compile` makes
# Keras's class under `mixed_float16`, which `install()` replaces with the
# library's; TensorFlow's graph rewrite switch, which the library's turns
# on, wraps a throwaway optimizer in TensorFlow's class.
_DROPPED = (
    _KERAS_3_OWN + ' in compile',
    'tensorflow.python.training.experimental.loss_scale_optimizer.'
    'MixedPrecisionLossScaleOptimizer in enable_mixed_precision_graph_rewrite')


def _kept(made: List[str]) -> List[str]:
  """The classes made, but those of `_DROPPED`, without where made."""
  kept = []
  for name in made:
    name = name.split(' in ')[0] if name not in _DROPPED else None
    if name and name not in kept:
      kept.append(name)
  return kept


def _expected_classes(name: str, legacy_keras: bool) -> Tuple[
    str, Callable[[List[str]], bool]]:
  """What `_kept` of the classes a program made must be, and a test."""
  if name.startswith('tf1_'):
    return (f'only {_OURS_V1}', lambda kept: kept == [_OURS_V1])
  if name.startswith('tf23_') or name in _TF23_HELPERS:
    return (f'only classes of {_OURS_EXPERIMENTAL}*', lambda kept: bool(
        kept) and all(c.startswith(_OURS_EXPERIMENTAL) for c in kept))
  if name == 'keras3_both_names.py':
    # Keras's class, then the library's by its own name (under tf_keras,
    # `keras.mixed_precision` keeps Keras's, and the program still trains
    # the library's class beside it).
    both = [_KERAS_3_OWN, _OURS]
    return ' then '.join(both), lambda kept: kept == both
  if name.startswith('tf24_') or name in _TF24_HELPERS:
    expected = _OURS if _ours_runs(legacy_keras) else "Keras 2's own class"
    return (f'only {expected}', lambda kept: bool(kept) and all(
        _expected_class_is(c, legacy_keras) for c in kept))
  raise ValueError(f'{name}: no rule for the classes it makes')


class Program(NamedTuple):
  name: str
  override: bool
  uses_keras: bool
  resumes: bool
  condition: versions.Condition
  keras3_only: bool = False
  compared: bool = False
  # The condition where the program's tf.keras is tf_keras (Keras 2): its
  # needs but those of Keras 3 ("Keras 2, or Keras 3.12 or later ...").
  keras2_condition: versions.Condition = versions.Condition(True, '')


def _header(text: str, key: str) -> Optional[str]:
  match = re.search(rf'^# {key}: (.+)$', text, re.MULTILINE)
  return match.group(1).strip() if match else None


def _program(name: str) -> Program:
  with open(os.path.join(_LEGACY, name), encoding='utf-8') as f:
    text = f.read()
  install = _header(text, 'Runs after')
  if install not in ('compat.install()', 'compat.install(override=True)'):
    raise ValueError(f'{name}: no "# Runs after: compat.install(...)" line')
  condition = keras2_condition = versions.Condition(True, '')
  for needs in re.findall(r'^# Needs: (.+)$', text, re.MULTILINE):
    condition = condition & _NEEDS[needs.strip()]
    if not needs.startswith('Keras 2, or '):
      keras2_condition = keras2_condition & _NEEDS[needs.strip()]
  resumes = _header(text, 'Resumes') == 'yes'
  if resumes:
    condition = condition & _RESUMES
    keras2_condition = keras2_condition & _RESUMES
  keras = _header(text, 'Keras')
  return Program(name, 'override=True' in install, keras in ('yes', '3 only'),
                 resumes, condition, keras3_only=keras == '3 only',
                 keras2_condition=keras2_condition,
                 compared=_header(text, 'Compared') == "TensorFlow's wrapper")


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
  return program.keras2_condition if legacy_keras else program.condition


# (program, whether its process runs under TF_USE_LEGACY_KERAS=1)
_MODES = ([True] if versions.LEGACY_KERAS_REQUESTED else
          [False, True] if versions.TF >= (2, 16) and
          versions.TF_KERAS_CHILDREN_WANTED else [False])
RUNS = [(program, legacy_keras)
        for program in (_program(name) for name in sorted(os.listdir(_LEGACY))
                        if name.endswith('.py') and name not in (
                            'run_program.py', 'run_after_install.py',
                            'tf23_compile_fit.py',
                            'tf23_custom_training_loop.py'))
        for legacy_keras in _MODES
        if program.uses_keras or not legacy_keras or
        versions.LEGACY_KERAS_REQUESTED]


# The runs of the fast tier, one program of each generation; the others are
# marked slow (docs/testing.md).
_FAST = {('tf1_session_dynamic.py', False),
         ('tf23_custom_loop_dynamic.py', False),
         ('tf24_train_step_isinstance.py', False),
         ('keras3_both_names.py', False)}


def _param(program: Program, legacy_keras: bool) -> Any:
  fast = (program.name, legacy_keras) in _FAST
  return pytest.param(
      program, legacy_keras, marks=() if fast else pytest.mark.slow,
      id=f'{program.name[:-3]}-{"tf_keras" if legacy_keras else "tf.keras"}')


# Programs also run through `python -m tf_loss_scale run`, with its --keras.
_RUN_COMMAND = (('tf1_monitored_session.py', '2'),
                ('tf23_custom_loop_dynamic.py', '3'),
                ('tf24_fit_then_loop.py', '2'),
                ('tf24_fit_then_loop.py', '3'))


def _run_command_condition(keras: str) -> versions.Condition:
  if versions.LEGACY_KERAS_REQUESTED:
    return versions.Condition(False, (
        '`run` chooses the Keras itself: the run without TF_USE_LEGACY_KERAS '
        'runs it'))
  if keras == '3':
    return versions.KERAS_3
  return versions.TF_KERAS_INSTALLED if versions.KERAS_3 else versions.KERAS_2


class Run(NamedTuple):
  returncode: Optional[int]  # None: killed at the timeout
  stdout: str
  stderr: str
  seconds: float


def _timed(args: List[str], legacy_keras: bool, workdir: str) -> Run:
  start = time.monotonic()
  try:
    done = fresh_process.run(args, legacy_keras, _TIMEOUT, cwd=workdir)
  except subprocess.TimeoutExpired:  # subprocess.run killed the child
    return Run(None, '', 'killed at the timeout', _TIMEOUT)
  return Run(done.returncode, done.stdout, done.stderr[-6000:],
             time.monotonic() - start)


def _run(program: Program, legacy_keras: bool, workdir: str) -> List[Run]:
  """Runs the program (twice if it resumes) in `workdir`."""
  args = [_RUNNER] + (['--override'] if program.override else []) + (
      ['--compare'] if program.compared else []) + [
          os.path.join(_LEGACY, program.name)]
  runs = []
  for legacy in [_WRITER_LEGACY_KERAS] * program.resumes + [legacy_keras]:
    runs.append(_timed(args, legacy, workdir))
    if runs[-1].returncode != 0:
      break
  return runs


def _run_command(name: str, keras: str, workdir: str) -> Run:
  """Runs the program through `tf-loss-scale run`, with the runner's record."""
  return _timed(['-m', 'tf_loss_scale', 'run', '--keras', keras, _RUNNER,
                 '--installed', os.path.join(_LEGACY, name)], False, workdir)


@pytest.fixture(scope='session')
def program_runs(request, tmp_path_factory) -> Dict[Tuple[Any, ...],
                                                    concurrent.futures.Future]:
  """Every run that applies here and was selected, started two at a time."""
  selected = [item.callspec.params for item in request.session.items
              if str(item.fspath) == os.path.abspath(__file__) and
              hasattr(item, 'callspec')]
  programs = {(p['program'].name, p['legacy_keras']) for p in selected
              if 'program' in p}
  commands = {(p['name'], p['keras']) for p in selected if 'name' in p}
  root = tmp_path_factory.mktemp('legacy_programs')
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS)
  runs = {(program.name, legacy_keras): pool.submit(
      _run, program, legacy_keras, tempfile.mkdtemp(dir=root))
          for program, legacy_keras in RUNS
          if (program.name, legacy_keras) in programs and
          _condition(program, legacy_keras)}
  runs.update({('run', name, keras): pool.submit(
      _run_command, name, keras, tempfile.mkdtemp(dir=root))
               for name, keras in _RUN_COMMAND
               if (name, keras) in commands and _run_command_condition(keras)})
  yield runs
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
  # The program's JSON line, then the runner's.
  lines = [run.stdout.strip().splitlines() for run in runs]
  results = [json.loads(out[-2]) for out in lines]
  if program.resumes:
    assert [r['resumed'] for r in results] == [False, True], results
  for out, legacy in zip(lines, legacy_of_run):
    _assert_made(program.name, json.loads(out[-1])['made'], legacy)
  if program.compared:
    _assert_as_tensorflows(program.name, results[-1], lines[-1])


def _assert_as_tensorflows(name: str, ours: Dict[str, Any],
                           out: List[str]) -> None:
  """Ours' JSON line against that of TensorFlow's wrapper, run first."""
  theirs = [json.loads(line)['theirs'] for line in out
            if line.startswith('{"theirs": ')]
  assert len(theirs) == 1, f'{name}: no line of TensorFlow\'s run'
  theirs = theirs[0]
  if 'record' in theirs:
    assert theirs['record'] is None, theirs
    assert ours['record'] is not None, f'{name}: no skip record of ours'
  assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
  for key in sorted(theirs):
    if key != 'record':
      assert ours[key] == theirs[key], (
          f'{name}: {key} is {ours[key]!r} with ours, {theirs[key]!r} with '
          "TensorFlow's wrapper")


def _assert_made(name: str, made: List[str], legacy_keras: bool) -> None:
  expected, holds = _expected_classes(name, legacy_keras)
  where = 'tf_keras' if legacy_keras else 'the default tf.keras'
  assert holds(_kept(made)), (
      f'{name} under {where} made {made}, expected {expected}')


@pytest.mark.slow
@pytest.mark.parametrize('name,keras', _RUN_COMMAND,
                         ids=[f'{n[:-3]}-keras{k}' for n, k in _RUN_COMMAND])
def test_legacy_program_through_run_command(name, keras, program_runs):
  condition = _run_command_condition(keras)
  if not condition:
    pytest.skip(condition.reason)
  run = program_runs['run', name, keras].result()
  assert run.returncode == 0, (
      f'tf-loss-scale run --keras {keras} {name} failed (exit '
      f'{run.returncode}, {run.seconds:.0f} s):\n{run.stderr}')
  # Keras 2 is tf_keras where `keras` is Keras 3.
  legacy = keras == '2' and bool(versions.KERAS_3)
  _assert_made(name, json.loads(run.stdout.strip().splitlines()[-1])['made'],
               legacy)
