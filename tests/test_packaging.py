"""The package as pip sees it: a wheel's metadata, the version, the Pythons.

The wheel is built from a copy of the package's files with pip, as
`pip install .` would build it, and its METADATA is read back.
"""

import ast
import email.parser
import functools
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import tf_loss_scale
import versions

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_ROOT, 'tf_loss_scale')
# What pip needs to build the wheel.
_SOURCES = ('pyproject.toml', 'setup.py', 'README.md', 'LICENSE')
# The oldest Python pyproject.toml declares.
_OLDEST_PYTHON = '3.8'


@functools.lru_cache(maxsize=None)
def _wheel_metadata(build_dir):
  source = os.path.join(build_dir, 'source')
  for name in _SOURCES:
    os.makedirs(source, exist_ok=True)
    shutil.copy(os.path.join(_ROOT, name), source)
  shutil.copytree(_PACKAGE, os.path.join(source, 'tf_loss_scale'),
                  ignore=shutil.ignore_patterns('__pycache__'))
  wheels = os.path.join(build_dir, 'wheels')
  done = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
       '--wheel-dir', wheels, source],
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, f'pip wheel failed:\n{done.stderr[-4000:]}'
  [wheel] = glob.glob(os.path.join(wheels, '*.whl'))
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    [metadata_name] = [n for n in names if n.endswith('.dist-info/METADATA')]
    metadata = email.parser.Parser().parsestr(
        archive.read(metadata_name).decode())
  return metadata, names


@pytest.fixture(name='wheel')
def _wheel(tmp_path_factory):
  return _wheel_metadata(str(tmp_path_factory.getbasetemp() / 'wheel'))


def _requirements(metadata):
  """Requires-Dist lines: (name, specifier text, extra or None)."""
  found = []
  for line in metadata.get_all('Requires-Dist') or []:
    requirement, _, marker = line.partition(';')
    extra = re.search(r'extra\s*==\s*["\']([^"\']*)["\']', marker)
    name = re.match(r'[A-Za-z0-9._-]+', requirement.strip()).group(0)
    found.append((name, requirement.strip()[len(name):].strip(),
                  extra.group(1) if extra else None))
  return found


def test_every_extra_is_declared_under_the_name_its_requirements_use(wheel):
  metadata, _ = wheel
  provided = metadata.get_all('Provides-Extra') or []
  used = {extra for _, _, extra in _requirements(metadata) if extra}
  assert sorted(provided) == sorted(used), (
      f'Provides-Extra {provided} but requirements use extras {sorted(used)}')
  assert sorted(provided) == ['demo', 'test', 'tfkeras']
  for extra in provided:
    # One lowercase word: nothing for any pip (20.3 and later) to normalise.
    assert re.fullmatch(r'[a-z0-9]+', extra), extra


def test_requirements_keep_the_installed_tensorflow_and_keras(wheel):
  metadata, _ = wheel
  requirements = _requirements(metadata)
  names = {name.lower().replace('_', '-') for name, _, _ in requirements}
  # keras>=3 would replace the Keras 2 of TensorFlow 2.15 and earlier.
  assert 'keras' not in names
  assert ('tensorflow', '<2.22,>=2.12', None) in requirements, requirements
  # tf_keras 2.N requires TensorFlow 2.N: only the tfkeras extra has it, and
  # neither the tests' nor the demo's extra may pull it.
  assert [extra for name, _, extra in requirements
          if name.lower().replace('_', '-') == 'tf-keras'] == ['tfkeras']
  # TensorBoard 2.21 needs protobuf 6, which TensorFlow up to 2.17 refuses.
  assert ('tensorboard', '<2.21,>=2.12', 'demo') in requirements, requirements


def test_wheel_metadata_names_version_license_and_pythons(wheel):
  metadata, names = wheel
  assert metadata['Name'] == 'tf_loss_scale'
  assert metadata['Version'] == tf_loss_scale.__version__
  assert metadata['License'] == 'Apache-2.0'
  assert any(re.search(r'\.dist-info/(licenses/)?LICENSE$', name)
             for name in names), names
  assert metadata['Requires-Python'] == '<3.14,>=3.8'
  assert metadata['Description-Content-Type'] == 'text/markdown'
  assert metadata.get_payload().startswith('# tf_loss_scale')
  classifiers = metadata.get_all('Classifier')
  assert [c.rsplit(' ', 1)[1] for c in classifiers
          if re.fullmatch(r'Programming Language :: Python :: 3\.\d+', c)] == [
              '3.8', '3.9', '3.10', '3.11', '3.12', '3.13']
  for module in ('keras3.py', 'experimental/keras2.py',
                 'mixed_precision/shared_name.py', 'shared/families.py'):
    assert f'tf_loss_scale/keras/{module}' in names, module
  assert 'tf_loss_scale/demo/runner.py' in names
  # No __init__.py (`tf-loss-scale run` puts the directory on PYTHONPATH):
  # the wheel has it as a namespace package.
  assert 'tf_loss_scale/run_site/sitecustomize.py' in names
  assert not [n for n in names if n.startswith(('tests/', 'benchmarks/'))]


def test_license_is_the_apache_license_2_0():
  with open(os.path.join(_ROOT, 'LICENSE')) as f:
    text = f.read()
  assert text.split()[:4] == ['Apache', 'License', 'Version', '2.0,']
  assert 'TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION' in text
  assert text.rstrip().endswith('limitations under the License.')


@versions.LIBRARY_INSTALLED.mark
def test_version_is_the_installed_distributions():
  assert tf_loss_scale.__version__ == importlib.metadata.version(
      'tf_loss_scale')


def test_version_is_read_without_importing_tensorflow():
  done = subprocess.run(
      [sys.executable, '-c',
       'import sys, tf_loss_scale; '
       'print(tf_loss_scale.__version__, "tensorflow" in sys.modules)'],
      capture_output=True, text=True, timeout=120, check=False, cwd=_ROOT,
      env=dict(os.environ, PYTHONPATH=_ROOT))
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == [tf_loss_scale.__version__, 'False']


def _python_files():
  return sorted(glob.glob(os.path.join(_PACKAGE, '**', '*.py'),
                          recursive=True))


# Builtins that only Python 3.9 lets annotations subscript at run time.
_NOT_SUBSCRIPTABLE_IN_3_8 = {'dict', 'frozenset', 'list', 'set', 'tuple',
                             'type'}


def _annotations(tree):
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      arguments = node.args
      for arg in (arguments.posonlyargs + arguments.args +
                  arguments.kwonlyargs + [arguments.vararg, arguments.kwarg]):
        if arg is not None and arg.annotation is not None:
          yield arg.annotation
      if node.returns is not None:
        yield node.returns
    elif isinstance(node, ast.AnnAssign):
      yield node.annotation


def _newer_than_3_8(annotation):
  for node in ast.walk(annotation):
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
        and node.value.id in _NOT_SUBSCRIPTABLE_IN_3_8):
      return f'{node.value.id}[...] (Python 3.9)'
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
      return 'X | Y (Python 3.10)'
  return None


def test_annotations_run_on_the_oldest_declared_python():
  # Syntax is checked by compiling under that Python (below); annotations
  # compile there but are evaluated when a module is imported.
  problems = []
  for path in _python_files():
    with open(path) as f:
      source = f.read()
    name = os.path.relpath(path, _ROOT)
    if 'from __future__ import annotations' in source:
      continue
    for annotation in _annotations(ast.parse(source, name)):
      newer = _newer_than_3_8(annotation)
      if newer:
        problems.append(f'{name}:{annotation.lineno}: annotation uses {newer}')
  assert not problems, (f'Python {_OLDEST_PYTHON} (the oldest in '
                        'requires-python) cannot run:\n' + '\n'.join(problems))


@functools.lru_cache(maxsize=None)
def _oldest_python():
  """A working interpreter of the oldest declared Python, or None."""
  candidates = sorted(glob.glob(os.path.expanduser(
      f'~/.pyenv/versions/{_OLDEST_PYTHON}*/bin/python'))) + [
          shutil.which(f'python{_OLDEST_PYTHON}')]
  for candidate in filter(None, candidates):
    # (A pyenv shim exists even where it cannot run.)
    done = subprocess.run([candidate, '--version'], capture_output=True,
                          text=True, timeout=60, check=False)
    if done.returncode == 0 and done.stdout.split()[-1].startswith(
        _OLDEST_PYTHON + '.'):
      return candidate
  return None


@pytest.mark.skipif(
    _oldest_python() is None,
    reason=f'no Python {_OLDEST_PYTHON} interpreter on this machine')
def test_package_compiles_under_the_oldest_declared_python():
  done = subprocess.run(
      [_oldest_python(), '-c',
       'import sys\n'
       'for path in sys.argv[1:]:\n'
       '  with open(path) as f:\n'
       '    compile(f.read(), path, "exec")\n'] + _python_files(),
      capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr
