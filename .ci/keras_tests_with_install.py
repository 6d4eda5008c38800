"""Runs test files with `compat.install()` active, and plainly where it matters.

`python keras_tests_with_install.py LOGS_DIR [GROUP...]` (the Python of
the environment under test) runs each group below (or those named) with
pytest and .ci/install_compat_plugin.py loaded (`install(override=True)` at
configure time), then plainly the tests of it that did not pass with
install() and those known to fail plainly (.ci/select_tests_plugin.py): a
test that passes with install() can fail or skip only with it in no way,
so running it plainly again would decide nothing. It compares the outcomes
test by test, prints, per group, both runs' counts, pytest's exit status
and every test whose outcome differs, and exits 1 if, in either run of a
group:
  - a test file fails to import or collect (pytest reports a collection
    error; the other run failing alike does not excuse it);
  - no test ran with install() (every test skipped, or none collected);
  - pytest exits other than 0 (a test failed or errored, or pytest stopped),
    unless every failing test is one of _KNOWN_FAILURES for that run;
  - a test fails (or errors) only with install(), or skips only with it
    (a check install() made vanish), or a test of _KNOWN_FAILURES runs and
    no longer fails (its entry must go);
  - with install(), a name a group requires rebound was not, or a test the
    group requires to run under install() did not.

  keras     Keras's own test files, run in place from the installed Keras
            wheel (site-packages/keras/src/...), with KERAS_BACKEND=
            tensorflow: saving, compile, models, dtype policies, optimizers,
            Keras's LossScaleOptimizer (compiled in by the EMA callback's
            tests), the model checkpoint and backup callbacks. The
            checkout's pytest.ini and tests/conftest.py do not apply (a
            blank ini, confcutdir at the Keras package); the wheel ships no
            conftest of its own.
  keras-class
            Keras's tests of its LossScaleOptimizer (the whole file) and of
            the one `compile` makes under mixed_float16 (the trainer's loss
            scaling tests), from the installed wheel as `keras`, with
            .ci/keras_class_name_plugin.py: with install(), the class they
            test is the one install() puts under
            `keras.mixed_precision.LossScaleOptimizer` (the run fails unless
            the plugin rebound the test module's own `LossScaleOptimizer`,
            `keras.src.optimizers`' and the trainer's), and the stateless
            cases, which Keras skips on TensorFlow (its class has no
            `stateless_apply` there), run against it and must not skip.
            Each file must run a test.
  tf_keras  This library's tests of compile, fit and saving under tf_keras
            (TF_USE_LEGACY_KERAS=1), with the checkout's pytest setup
            and --full (the slow ones too).

The JUnit XML reports and pytest's output go to LOGS_DIR.
"""

import dataclasses
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional, Set, Tuple

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CI = os.path.join(_CHECKOUT, '.ci')

# Relative to the installed Keras package; globs allowed.
_KERAS_FILES = (
    'src/saving/saving_lib_test.py',
    'src/saving/saving_api_test.py',
    'src/trainers/compile_utils_test.py',
    'src/models/model_test.py',
    'src/models/sequential_test.py',
    'src/models/functional_test.py',
    'src/dtype_policies/*_test.py',
    'src/optimizers/optimizer_test.py',
    'src/callbacks/model_checkpoint_test.py',
    'src/callbacks/backup_and_restore_test.py',
    'src/callbacks/swap_ema_weights_test.py',
    'src/optimizers/loss_scale_optimizer_test.py',
    'src/optimizers/adam_test.py',
    'src/optimizers/lion_test.py',
    # Not trainers/trainer_test.py, whose tests compile under mixed_float16:
    # it imports jax, which the environment lacks. tests/test_file_matrix.py
    # (the README's suite) compiles and fits under it with and without
    # install().
)
# Relative to the installed Keras package, each with the tests selected.
_KERAS_CLASS_TESTS = (
    ('src/optimizers/loss_scale_optimizer_test.py', ''),
    ('src/trainers/trainer_test.py',
     '::TestTrainer::test_adds_loss_scaling_optimizer'),
    ('src/trainers/trainer_test.py',
     '::TestTrainer::test_loss_scaling_prevents_underflow'),
)
_TF_KERAS_FILES = (
    'tests/test_keras_experimental.py',
    'tests/test_keras_experimental_tf_keras.py',
    'tests/test_keras_experimental_families.py',
)
_TF_KERAS_SELECTION = 'compile or fit or save or load or checkpoint'


@dataclasses.dataclass
class Group:
  name: str
  args: List[str]
  env: Dict[str, str]
  cwd: str
  # Module prefixes of test ids, each of which must run a test in each run.
  each_runs: Tuple[str, ...] = ()
  # Namespaces whose `LossScaleOptimizer` .ci/keras_class_name_plugin.py
  # must rebind under install() (the test module's own among them).
  rebinds: Tuple[str, ...] = ()
  # Test ids (regular expressions, matched whole) that must run, not skip,
  # with install(): each pattern must match at least one test.
  run_with_install: Tuple[str, ...] = ()


# (group, run) -> tests known to fail in that run, each with why. A test
# listed here that passes fails the step: the entry must go.
_MISSING_FIXTURE = {
    'keras.src.saving.saving_lib_test.SavingBattleTest::'
    'test_legacy_load_skips_missing_nested_containers':
        'the wheel lacks its data file (Keras 3.15: keras/src/saving/'
        'test_data/pre_pr22362_nested_container.keras)',
}
_KNOWN_FAILURES: Dict[Tuple[str, str], Dict[str, str]] = {
    ('keras', 'plain'): _MISSING_FIXTURE,
    ('keras', 'install'): _MISSING_FIXTURE,
}


# What the keras-class group needs rebound: the name the test module
# imported, the one the trainer's tests read (`optimizers.`) and the one
# `compile` makes under mixed_float16.
_KERAS_CLASS_REBINDS = (
    'keras.src.optimizers.loss_scale_optimizer_test',
    'keras.src.optimizers',
    'keras.src.trainers.trainer',
)
# Keras's stateless cases (`test_*_stateless`), which it skips on
# TensorFlow; the plugin runs them on install()'s class.
_KERAS_CLASS_STATELESS = (
    r'keras\.src\.optimizers\.loss_scale_optimizer_test\.'
    r'LossScaleOptimizerTest::test_\w+_stateless',
)


def _keras_directory() -> str:
  # Found without importing Keras (which would import TensorFlow here).
  spec = importlib.util.find_spec('keras')
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit('keras is not installed in this Python')
  return list(spec.submodule_search_locations)[0]


def _groups(scratch: str) -> List[Group]:
  keras_dir = _keras_directory()
  files = sorted(path for pattern in _KERAS_FILES
                 for path in glob.glob(os.path.join(keras_dir, pattern)))
  missing = [p for p in _KERAS_FILES
             if not glob.glob(os.path.join(keras_dir, p))]
  if missing:
    raise SystemExit(f'the Keras wheel in {keras_dir} lacks {missing}')
  # A blank ini in a scratch directory: the checkout's pytest.ini (an
  # ancestor of a .venv inside it) must not apply to Keras's files.
  ini = os.path.join(scratch, 'pytest.ini')
  with open(ini, 'w') as f:
    f.write('[pytest]\n')
  base_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
                  PYTHONPATH=os.pathsep.join(
                      [_CI, _CHECKOUT] +
                      [p for p in os.environ.get('PYTHONPATH', '').split(
                          os.pathsep) if p]))
  base_env.pop('TF_USE_LEGACY_KERAS', None)
  keras = Group(
      'keras',
      # rootdir: the directory holding the keras package, so that test
      # ids name their modules (keras/src/...).
      ['-c', ini, '--rootdir', os.path.dirname(keras_dir),
       '--confcutdir', keras_dir,
       '-p', 'no:cacheprovider', '-q', '-o', 'addopts=', *files],
      dict(base_env, KERAS_BACKEND='tensorflow'), scratch)
  class_files = [os.path.join(keras_dir, path) for path, _ in _KERAS_CLASS_TESTS]
  missing = sorted({p for p in class_files if not os.path.exists(p)})
  if missing:
    raise SystemExit(f'the Keras wheel in {keras_dir} lacks {missing}')
  keras_class = Group(
      'keras-class',
      [*keras.args[:keras.args.index('addopts=') + 1],
       '-p', 'keras_class_name_plugin',
       *[path + selected for path, (_, selected) in zip(
           class_files, _KERAS_CLASS_TESTS)]],
      keras.env, scratch,
      each_runs=tuple(sorted({
          os.path.relpath(path, os.path.dirname(keras_dir))[:-3].replace(
              os.sep, '.') + '.' for path in class_files})),
      rebinds=_KERAS_CLASS_REBINDS, run_with_install=_KERAS_CLASS_STATELESS)
  tf_keras = Group(
      'tf_keras',
      ['-p', 'no:cacheprovider', '-q', '--full', '-k', _TF_KERAS_SELECTION,
       *_TF_KERAS_FILES],
      dict(base_env, TF_USE_LEGACY_KERAS='1'), _CHECKOUT)
  return [keras, keras_class, tf_keras]


@dataclasses.dataclass
class Outcome:
  """One pytest run: each test's outcome, and what went wrong around them."""
  label: str
  tests: Dict[str, str]  # id -> passed, failed, error or skipped
  collection_errors: List[str]
  returncode: int


def _outcomes(junit: str) -> Tuple[Dict[str, str], List[str]]:
  """Test outcomes and files that failed to collect, from a JUnit report."""
  outcomes, collection_errors = {}, []
  for case in ElementTree.parse(junit).getroot().iter('testcase'):
    test = f'{case.get("classname")}::{case.get("name")}'
    outcome = 'passed'
    for child in case:
      if child.tag in ('failure', 'error', 'skipped'):
        outcome = {'failure': 'failed'}.get(child.tag, child.tag)
        if child.tag == 'error' and 'collection failure' in (
            child.get('message') or ''):
          # pytest's entry for a module that did not import or collect.
          collection_errors.append(case.get('name') or test)
          outcome = 'uncollected'
        break
    # A test that fails in its teardown is reported twice.
    if outcomes.get(test, 'passed') == 'passed':
      outcomes[test] = outcome
  outcomes = {t: o for t, o in outcomes.items() if o != 'uncollected'}
  return outcomes, collection_errors


def _read(path: str) -> str:
  if not os.path.exists(path):
    return ''
  with open(path) as f:
    return f.read()


def _run(group: Group, install: bool, logs: str,
         only: Optional[Set[str]] = None) -> Outcome:
  """Runs the group's tests (those of `only` alone, if given) once."""
  label = f'{group.name}-{"install" if install else "plain"}'
  junit = os.path.join(logs, f'keras-tests-{label}.xml')
  if os.path.exists(junit):
    os.remove(junit)
  args = [sys.executable, '-m', 'pytest', *group.args,
          f'--junitxml={junit}']
  env = dict(group.env)
  if only is not None:
    selection = os.path.join(logs, f'keras-tests-{label}.selected')
    with open(selection, 'w') as f:
      f.write(''.join(f'{test}\n' for test in sorted(only)))
    args[3:3] = ['-p', 'select_tests_plugin']
    env['TF_LOSS_SCALE_CI_SELECT'] = selection
  marker = os.path.join(logs, f'keras-tests-{label}.installed')
  if os.path.exists(marker):
    os.remove(marker)
  rebound = os.path.join(logs, f'keras-tests-{label}.rebound')
  if os.path.exists(rebound):
    os.remove(rebound)
  if install:
    args[3:3] = ['-p', 'install_compat_plugin']
    env['TF_LOSS_SCALE_CI_INSTALLED'] = marker
    env['TF_LOSS_SCALE_CI_REBOUND'] = rebound
  start = time.monotonic()
  with open(os.path.join(logs, f'keras-tests-{label}.log'), 'w') as log:
    done = subprocess.run(args, env=env, cwd=group.cwd, stdout=log,
                          stderr=subprocess.STDOUT, check=False)
  seconds = time.monotonic() - start
  outcome = Outcome(label, {}, [], done.returncode)
  if install and not _read(marker).startswith('True'):
    print(f'{label}: the plugin did not report install() in effect')
    outcome.returncode = outcome.returncode or 1
    return outcome
  if install and group.rebinds:
    lines = _read(rebound).splitlines()
    print(f'{label}: ' + ('; '.join(lines) or 'NOTHING REBOUND'))
    unbound = rebinding_problems(lines, group.rebinds)
    for problem in unbound:
      print(f'FAILED {label}: {problem}')
    if unbound:
      outcome.returncode = outcome.returncode or 1
      return outcome
  if os.path.exists(junit):
    outcome.tests, outcome.collection_errors = _outcomes(junit)
  counts = {}
  for result in outcome.tests.values():
    counts[result] = counts.get(result, 0) + 1
  shown = ', '.join(f'{n} {o}' for o, n in sorted(counts.items()))
  chosen = '' if only is None else f' of {len(only)} chosen'
  print(f'{label:<20}{shown or "no tests"}{chosen} (pytest exit '
        f'{done.returncode}, {seconds:.0f} s)', flush=True)
  return outcome


def _problems(group: Group, run: Outcome, whole: bool = True) -> List[str]:
  """What makes one run fail the step, whatever the other run did.

  Args:
    group: the group run.
    run: its outcomes.
    whole: whether the run was of every test of the group (else of some
      chosen: then it need not run a test of each file).
  """
  problems = [f'{run.label}: {name} failed to import or collect'
              for name in run.collection_errors]
  ran = [t for t, o in run.tests.items() if o in ('passed', 'failed', 'error')]
  if whole and not ran:
    problems.append(f'{run.label}: no test ran')
  problems += [f'{run.label}: no test of {prefix[:-1]} ran'
               for prefix in group.each_runs if whole
               if not any(t.startswith(prefix) for t in ran)]
  known = _KNOWN_FAILURES.get((group.name, run.label.rpartition('-')[2]), {})
  failing = {t for t, o in run.tests.items() if o in ('failed', 'error')}
  unknown = sorted(failing - set(known))
  problems += [f'{run.label}: {test} {run.tests[test]}' for test in unknown]
  # (One another Keras lacks is no problem.)
  problems += [f'{run.label}: {test} is listed as known to fail ({why}) but '
               f'{run.tests[test]}' for test, why in sorted(known.items())
               if test in run.tests and test not in failing]
  if run.returncode not in (0, 1) or (run.returncode == 1 and not failing):
    # 1 with every failure accounted for above; anything else (2 stopped,
    # 3 internal error, 4 usage, 5 nothing collected) fails as it is.
    problems.append(f'{run.label}: pytest exited {run.returncode}')
  elif run.returncode == 0 and failing:
    problems.append(f'{run.label}: pytest exited 0 with failing tests')
  return problems


def rebinding_problems(lines: List[str], required: Tuple[str, ...]) -> List[str]:
  """Names of `required` the plugin's record does not show rebound.

  Args:
    lines: .ci/keras_class_name_plugin.py's record, `NAMESPACE.
      LossScaleOptimizer -> keras.mixed_precision.LossScaleOptimizer`.
    required: the namespaces whose name must be install()'s class.
  """
  rebound = {line.split('.LossScaleOptimizer -> ')[0] for line in lines
             if line.endswith(' -> keras.mixed_precision.LossScaleOptimizer')}
  return [f'{namespace}.LossScaleOptimizer is not install()\'s class'
          for namespace in required if namespace not in rebound]


def install_only_problems(group: Group, plain: Dict[str, str],
                          installed: Dict[str, str]) -> List[str]:
  """What install() alone changed for the worse, test by test.

  Args:
    group: the group run (its `run_with_install` patterns).
    plain: outcomes of the plain run, id -> passed, failed, error, skipped.
    installed: outcomes of the run with install().

  Returns:
    One line per problem: a test failing, or skipping, only with install(),
    and a required pattern no test matched, or a test it matched that did
    not run with install().
  """
  bad, ran = ('failed', 'error'), ('passed', 'failed', 'error')
  problems = []
  for test in sorted(set(plain) | set(installed)):
    without, with_install = plain.get(test), installed.get(test)
    if with_install in bad and without not in bad:
      problems.append(f'{test} {with_install} only with install() '
                      f'({without or "absent"} plainly)')
    elif with_install == 'skipped' and without in ran:
      problems.append(f'{test} skipped only with install() ({without} '
                      'plainly)')
  for pattern in group.run_with_install:
    matched = {t: o for t, o in installed.items() if re.fullmatch(pattern, t)}
    if not matched:
      problems.append(f'no test matching {pattern} with install()')
    problems += [f'{test} must run with install(), but {outcome}'
                 for test, outcome in sorted(matched.items())
                 if outcome not in ran]
  return problems


def plain_reruns(installed: Dict[str, str], known: Dict[str, str]
                 ) -> Set[str]:
  """The tests to run plainly after a run with install().

  Args:
    installed: outcomes of the run with install(), id -> passed, failed,
      error, skipped.
    known: the tests known to fail plainly (each must still fail there).

  Returns:
    Those that did not pass with install() (whether install() alone made
    them fail or skip is what the plain run decides) and those of `known`
    the run with install() collected.
  """
  return ({test for test, outcome in installed.items() if outcome != 'passed'}
          | (set(known) & set(installed)))


def main(logs: str, *names: str) -> int:
  os.makedirs(logs, exist_ok=True)
  status = 0
  with tempfile.TemporaryDirectory() as scratch:
    groups = _groups(scratch)
    unknown = set(names) - {group.name for group in groups}
    if unknown:
      raise SystemExit(f'no such group: {sorted(unknown)}')
    for group in groups:
      if names and group.name not in names:
        continue
      installed = _run(group, install=True, logs=logs)
      again = plain_reruns(installed.tests,
                           _KNOWN_FAILURES.get((group.name, 'plain'), {}))
      plain = (_run(group, install=False, logs=logs, only=again) if again
               else Outcome(f'{group.name}-plain', {}, [], 0))
      if not again:
        print(f'{plain.label:<20}nothing to run: every test passed with '
              'install()')
      differing = sorted(
          (test, plain.tests.get(test, 'absent'),
           installed.tests.get(test, 'absent'))
          for test in set(plain.tests)
          if plain.tests.get(test) != installed.tests.get(test))
      for test, without, with_install in differing:
        print(f'  {test}: {without} plainly, {with_install} with install()')
      problems = _problems(group, plain, whole=False) + _problems(
          group, installed)
      problems += [f'{group.name}: {problem}' for problem in
                   install_only_problems(group, plain.tests, installed.tests)]
      for problem in problems:
        print(f'FAILED {problem}')
      status = status or int(bool(problems))
  return status


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:]))
