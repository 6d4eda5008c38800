"""Every kind of Keras 3 file, written and read with and without install().

A Keras 3 program uses no legacy name: `compat.install()` must leave what it
writes and what it reads as they are. Four fresh processes
(tests/file_matrix_runs.py) settle it for every kind of file a Keras 3
program saves its training to (`tf.train.Checkpoint`, `CheckpointManager`,
`BackupAndRestore`, `model.save` to `.keras` and `.h5`, `save_weights` to
`.weights.h5`, `ModelCheckpoint`): one writer without install() and one with
it train a two-layer model per case (Adam; SGD with momentum; AdamW with a
`LearningRateSchedule`; Lion; each under `mixed_float16`, where compile wraps
the optimizer, and float32) through steps that overflow, then finite ones,
so that the loss scale and its counter moved from a fresh optimizer's, and
write every kind; one reader without install() and one with it read every
file of both writers into a fresh model and train one more step. Every
value read (the weights; the optimizer's iterations, learning rate, slots,
loss scale and its counter; the class of its step count) and every value
after the next step must equal those of the run that never installed
(which are the writer's, but for Keras's own .h5 bug, pinned): values are
compared exactly, not restore statuses. The optimizer is Keras's class
wherever install() did not run, and the class install() names
(`tf_loss_scale.keras.mixed_precision.shared_name`) wherever it did, for
every kind.

One exception, by design: under install(), an .h5 file's loss scale
optimizer loads into that class, which keeps the optimizer's state that
Keras's class loses from .h5 files, as TF 2.4-2.15's did; those reads are
compared with the writer's values.
"""

import concurrent.futures
import os
from typing import Any, Dict, List, Optional

import pytest

import class_names
import file_matrix_runs
import fresh_process
import versions

_RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     'file_matrix_runs.py')
# Each child trains or reads 8 cases (and 56 or 112 files) on the CPU.
_TIMEOUT = 1800
_SIDES = {False: 'without', True: 'with'}
# The optimizer's class: Keras's, and the one install() puts under its name
# (which says it is Keras's: class_names.defining_name).
_KERAS_CLASS = 'keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer'
_INSTALLED_CLASS = ('tf_loss_scale.keras.mixed_precision.shared_name.'
                    'LossScaleOptimizer')
_INNER_CLASSES = {'adam': 'keras.src.optimizers.adam.Adam',
                  'sgd_momentum': 'keras.src.optimizers.sgd.SGD',
                  'adamw_schedule': 'keras.src.optimizers.adamw.AdamW',
                  'lion': 'keras.src.optimizers.lion.Lion'}
# A fresh optimizer's scale and counter (Keras's defaults).
_FRESH_SCALE, _FRESH_COUNTER = 2.0**15, 0
# What the comparison covers: every value but the optimizer's class, which
# differs by design (_assert_class).
_VALUES = ('inner_optimizer', 'iterations_type', 'weights', 'iterations',
           'inner_iterations', 'learning_rate', 'slots', 'loss_scale',
           'counter')
# Keras's bug, its own .h5 round trip (no install() anywhere): the loaded
# optimizer has no slots, and refuses the next step with this error.
_KERAS_H5_ERROR = 'ValueError: Unknown variable'

pytestmark = [pytest.mark.slow, (versions.KERAS_3 & versions.Condition(
    not versions.LEGACY_KERAS_REQUESTED,
    'the file matrix runs Keras 3 programs, whose processes never set '
    'TF_USE_LEGACY_KERAS: the run without the variable runs it')).mark]


@pytest.fixture(scope='module')
def matrix(tmp_path_factory) -> Dict[str, Any]:
  """The two writers' and the two readers' reports, and where they wrote."""
  root = tmp_path_factory.mktemp('file_matrix')
  directories = {w: str(root / f'written_{_SIDES[w]}') for w in _SIDES}

  def child(*args: str) -> Any:
    return fresh_process.run_json([_RUNS, *args], timeout=_TIMEOUT)

  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    written = dict(zip(_SIDES, pool.map(
        lambda w: child('write', str(int(w)), directories[w]), _SIDES)))
    read = dict(zip(_SIDES, pool.map(
        lambda r: child('read', str(int(r)), directories[False],
                        directories[True]), _SIDES)))
  return {'written': written, 'read': read, 'directories': directories}


def _mixed(case: str) -> bool:
  return case.endswith('mixed_float16')


def _assert_class(result: Dict[str, Any], case: str, installed: bool,
                  what: str) -> None:
  """The optimizer is Keras's class without install(), the class install()
  names with it (under mixed_float16; else the inner optimizer itself), in
  the state read or written and after the next step."""
  inner = _INNER_CLASSES[case.split('-')[0]]
  expected = ((_INSTALLED_CLASS if installed else _KERAS_CLASS)
              if _mixed(case) else inner)
  for stage in ('state', 'next'):
    if stage in result:
      got = (result[stage]['optimizer'], result[stage]['inner_optimizer'])
      assert got == (expected, inner), (
          f'{what} ({stage}): {got[0]} around {got[1]}, where {expected} '
          f'around {inner}')


def _state_differences(stage: str, got: Dict[str, Any],
                       expected: Dict[str, Any]) -> List[str]:
  differences = []
  for name in _VALUES:
    a, b = got[name], expected[name]
    if a != b:
      if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        a, b, name = a[i], b[i], f'{name}[{i}]'
      differences.append(f'{stage}{name}: {str(a)[:200]}, where the run '
                         f'compared with has {str(b)[:200]}')
  return differences


def _differences(got: Dict[str, Any], expected: Dict[str, Any],
                 next_error: Optional[str] = None) -> List[str]:
  """Each value that differs, named, with both values (or their first
  differing entry), in the state read and after the next step.

  Reading that raised is a difference, on either side; so is a next step
  that raised, but when `next_error` says how both must raise (Keras's .h5
  bug): then each must, and only the states read are compared.
  """
  raised = [f'reading raised {r["error"]} ({side})\n'
            f'{r.get("traceback", "")}'
            for side, r in (('here', got), ('compared with', expected))
            if 'error' in r]
  if raised:
    return raised
  differences = _state_differences('', got['state'], expected['state'])
  for side, r in (('here', got), ('in the run compared with', expected)):
    if next_error is None and 'next_error' in r:
      differences.append(f'the next step raised {r["next_error"]} {side}\n'
                         f'{r.get("traceback", "")}')
    elif next_error is not None and not r.get('next_error', '').startswith(
        next_error):
      differences.append(f'the next step {side} gave '
                         f'{r.get("next_error", "values")}, where it must '
                         f'raise {next_error}')
  if next_error is None and 'next' in got and 'next' in expected:
    differences += _state_differences('after the next step, ', got['next'],
                                      expected['next'])
  return differences


@pytest.mark.parametrize('case', file_matrix_runs.CASES)
def test_writer_with_install_trains_as_without(matrix, case):
  written = matrix['written']
  for installed in _SIDES:
    _assert_class(written[installed][case], case, installed,
                  f'{case} trained {_SIDES[installed]} install()')
  if _mixed(case):
    # Overflows moved the scale, and the finite steps after the last one
    # are counted: neither is a fresh optimizer's, so that reading a file
    # shows whether they were read.
    state = written[False][case]['state']
    assert state['loss_scale'] < _FRESH_SCALE, state
    assert state['counter'] > _FRESH_COUNTER, state
  differences = _differences(written[True][case], written[False][case])
  assert not differences, (f'{case} trained under install():\n  ' +
                           '\n  '.join(differences))


def test_the_classes_checked_have_names_of_their_own():
  # What _assert_class tells apart: Keras's class, the library's TF
  # 2.4-2.15 class and its subclass install() puts under Keras's name.
  import keras  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras import mixed_precision  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras.mixed_precision import shared_name  # pylint: disable=g-import-not-at-top
  assert [class_names.defining_name(cls) for cls in (
      keras.optimizers.LossScaleOptimizer, shared_name.LossScaleOptimizer,
      mixed_precision.LossScaleOptimizer)] == [
          _KERAS_CLASS, _INSTALLED_CLASS,
          'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer']
  assert class_names.defining_name(keras.optimizers.Adam) == (
      _INNER_CLASSES['adam'])


def _read(matrix: Dict[str, Any], kind: str, case: str, written: bool,
          read: bool) -> Dict[str, Any]:
  directory = matrix['directories'][written]
  return matrix['read'][read][f'{directory}|{case}|{kind}']


def _built_unstepped(case: str) -> int:
  # The inner optimizer's variables before its first step, when built for
  # no model variable: its count, and its rate unless a schedule gives it.
  return 1 if 'schedule' in case else 2


@pytest.mark.parametrize('kind', file_matrix_runs.KINDS)
@pytest.mark.parametrize('case', file_matrix_runs.CASES)
def test_keras_reads_back_what_it_wrote_without_install(matrix, kind, case):
  # The oracle of the test below: without install() anywhere, each kind of
  # file gives back every value the writer had, and the same next step.
  got = _read(matrix, kind, case, False, False)
  expected = matrix['written'][False][case]
  _assert_class(got, case, False, f'{kind} of {case} read')
  if kind != 'h5':
    differences = _differences(got, expected)
    assert not differences, f'{kind} of {case}:\n  ' + '\n  '.join(
        differences)
    return
  # Pins Keras's bug (_KERAS_H5_ERROR). Keras's loader builds the optimizer
  # for no variables and sets the variables it then has, in order, from the
  # file: a wrapper's own (its scale and counter: the writer's), a bare
  # optimizer's count and rate. Not the slots, nor a wrapper's inner count,
  # and the next step raises.
  state, wrote = got['state'], expected['state']
  pinned = {'weights': wrote['weights'],
            'loss_scale': wrote['loss_scale'], 'counter': wrote['counter'],
            'inner_iterations': (0 if _mixed(case) else
                                 wrote['inner_iterations']),
            'slots': ([state['slots'][0]] +
                      wrote['slots'][1:_built_unstepped(case)]),
            'iterations_type': wrote['iterations_type']}
  for name, value in pinned.items():
    assert state[name] == value, (
        f'h5 of {case} read: {name} {str(state[name])[:200]}, where '
        f'Keras\'s loader gives {str(value)[:200]}')
  assert got.get('next_error', '').startswith(_KERAS_H5_ERROR), got


def _reads_into_installed_class(kind: str, case: str, read: bool) -> bool:
  # Under install(), the LossScaleOptimizer of an .h5 file (named as Keras
  # names its own) loads into the class install() names, whoever wrote it,
  # which keeps the optimizer's state as TF 2.4-2.15's class did: TF
  # 2.4-2.15 programs' .h5 files kept it, which Keras's class loses
  # (_KERAS_H5_ERROR).
  return read and kind == 'h5' and _mixed(case)


def _params() -> List[Any]:
  params = []
  for kind in file_matrix_runs.KINDS:
    for case in file_matrix_runs.CASES:
      for written in _SIDES:
        for read in _SIDES:
          if not (written or read):
            continue  # The oracle, tested above.
          params.append(pytest.param(
              kind, case, written, read,
              id=f'{kind}-{case}-written_{_SIDES[written]}-read_'
              f'{_SIDES[read]}'))
  return params


@pytest.mark.parametrize('kind,case,written,read', _params())
def test_file_read_keeps_every_value(matrix, kind, case, written, read):
  # Every value read, and the next step, as where install() never ran.
  got = _read(matrix, kind, case, written, read)
  what = (f'{kind} of {case}, written {_SIDES[written]} install(), read '
          f'{_SIDES[read]} it')
  _assert_class(got, case, read, what)
  if _reads_into_installed_class(kind, case, read):
    # Every value the writer had, and its next step. Keras's loader builds
    # the optimizer for no variables, so the inner optimizer holds its count
    # and rate; its slots are made, with the file's values, by the next
    # step, which must land on every value of the writer's next step.
    wrote = matrix['written'][written][case]
    counted = wrote['state']['slots'][:_built_unstepped(case)]
    differences = _differences(got, dict(wrote, state=dict(
        wrote['state'], slots=counted)))
  else:
    # As the oracle, which the test above checks against the writer; from
    # .h5 into Keras's class (or a bare optimizer), with Keras's bug.
    differences = _differences(
        got, _read(matrix, kind, case, False, False),
        next_error=_KERAS_H5_ERROR if kind == 'h5' else None)
  assert not differences, f'{what}:\n  ' + '\n  '.join(differences)
