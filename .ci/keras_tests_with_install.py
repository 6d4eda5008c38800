"""Runs test files twice, plainly and with `compat.install()` active.

`python keras_tests_with_install.py LOGS_DIR` (the Python of the
environment under test) runs each group below twice with pytest, the second
time with .ci/install_compat_plugin.py loaded (`install(override=True)` at
configure time), and compares the outcomes test by test. It prints, per
group, both runs' counts and every test whose outcome differs, and exits 1
if any test fails (or errors) only with install(), or if a run collected
nothing.

  keras     Keras's own test files, run in place from the installed Keras
            wheel (site-packages/keras/src/...), with KERAS_BACKEND=
            tensorflow: saving, compile, models, dtype policies, optimizer
            and the model checkpoint callback. The checkout's pytest.ini
            and tests/conftest.py do not apply (a blank ini, confcutdir at
            the Keras package); the wheel ships no conftest of its own.
  tf_keras  This library's tests of compile, fit and saving under tf_keras
            (TF_USE_LEGACY_KERAS=1), with the checkout's pytest setup.

The JUnit XML reports and pytest's output go to LOGS_DIR.
"""

import dataclasses
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List

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
  tf_keras = Group(
      'tf_keras',
      ['-p', 'no:cacheprovider', '-q', '-k', _TF_KERAS_SELECTION,
       *_TF_KERAS_FILES],
      dict(base_env, TF_USE_LEGACY_KERAS='1'), _CHECKOUT)
  return [keras, tf_keras]


def _outcomes(junit: str) -> Dict[str, str]:
  """Test id -> passed, failed, error or skipped, from a JUnit XML report."""
  outcomes = {}
  for case in ElementTree.parse(junit).getroot().iter('testcase'):
    test = f'{case.get("classname")}::{case.get("name")}'
    outcome = 'passed'
    for child in case:
      if child.tag in ('failure', 'error', 'skipped'):
        outcome = {'failure': 'failed'}.get(child.tag, child.tag)
        break
    # A test that fails in its teardown is reported twice.
    if outcomes.get(test, 'passed') == 'passed':
      outcomes[test] = outcome
  return outcomes


def _read(path: str) -> str:
  if not os.path.exists(path):
    return ''
  with open(path) as f:
    return f.read()


def _run(group: Group, install: bool, logs: str) -> Dict[str, str]:
  label = f'{group.name}-{"install" if install else "plain"}'
  junit = os.path.join(logs, f'keras-tests-{label}.xml')
  args = [sys.executable, '-m', 'pytest', *group.args,
          f'--junitxml={junit}']
  env = dict(group.env)
  marker = os.path.join(logs, f'keras-tests-{label}.installed')
  if os.path.exists(marker):
    os.remove(marker)
  if install:
    args[3:3] = ['-p', 'install_compat_plugin']
    env['TF_LOSS_SCALE_CI_INSTALLED'] = marker
  start = time.monotonic()
  with open(os.path.join(logs, f'keras-tests-{label}.log'), 'w') as log:
    done = subprocess.run(args, env=env, cwd=group.cwd, stdout=log,
                          stderr=subprocess.STDOUT, check=False)
  seconds = time.monotonic() - start
  if install and not _read(marker).startswith('True'):
    print(f'{label}: the plugin did not report install() in effect')
    return {}
  outcomes = _outcomes(junit) if os.path.exists(junit) else {}
  counts = {}
  for outcome in outcomes.values():
    counts[outcome] = counts.get(outcome, 0) + 1
  shown = ', '.join(f'{n} {o}' for o, n in sorted(counts.items()))
  print(f'{label:<18}{shown or "no tests"} (pytest exit {done.returncode}, '
        f'{seconds:.0f} s)', flush=True)
  return outcomes


def main(logs: str) -> int:
  os.makedirs(logs, exist_ok=True)
  status = 0
  with tempfile.TemporaryDirectory() as scratch:
    for group in _groups(scratch):
      plain = _run(group, install=False, logs=logs)
      installed = _run(group, install=True, logs=logs)
      if not plain or not installed:
        print(f'{group.name}: a run collected no tests')
        status = 1
      bad = ('failed', 'error')
      differing = sorted(
          (test, plain.get(test, 'absent'), installed.get(test, 'absent'))
          for test in set(plain) | set(installed)
          if plain.get(test) != installed.get(test))
      for test, without, with_install in differing:
        print(f'  {test}: {without} plainly, {with_install} with install()')
      only_with_install = [t for t, without, with_install in differing
                           if with_install in bad and without not in bad]
      if only_with_install:
        print(f'{group.name}: {len(only_with_install)} test(s) fail only '
              'with install()')
        status = 1
  return status


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
