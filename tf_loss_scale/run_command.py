"""`tf-loss-scale run PROGRAM.py [ARGS...]`: `python PROGRAM.py ARGS`, set up.

The launcher reads the program's generation (`--tf`, `--keras`, or from its
code: `run_guess`), writes the set-up into the environment and becomes
`python PROGRAM.py ARGS...` (the interpreter itself, in this process where
the platform can exec). The interpreter's start-up (`run_site`'s
`sitecustomize`) applies the set-up (`run_setup`) before the program's first
line, in the program and in the processes of this Python it starts.
"""

import importlib.util
import json
import os
import re
import site
import subprocess
import sys
from importlib import metadata
from typing import Any, Dict, List, Optional, Union

from tf_loss_scale import run_guess as guess
from tf_loss_scale import run_setup

KERAS_CHOICES = ('2', '3')
# What `--tf` takes: a release as users write it (1, 1.15, 2.3, 2.3.4).
TF_VERSION = re.compile(r'1(\.\d+){0,2}|2(\.\d+){1,2}')
_ERROR = 2
# TensorFlow's distributions: their versions are read without importing it.
_TENSORFLOW = ('tensorflow', 'tensorflow-cpu', 'tensorflow-macos',
               'tensorflow-intel', 'tf-nightly')


def run(program: str, args: List[str], keras: Optional[str] = None,
        tf_version: Optional[str] = None, check: bool = False) -> int:
  """Runs `python program *args` set up as its TensorFlow set it up.

  Args:
    program: The Python file to run, with `sys.argv == [program, *args]`.
    args: Its arguments.
    keras: The program's Keras, `'2'` or `'3'` (as `run --keras`). None:
      read from the program, else `'3'` for a program of TensorFlow 2.16 or
      later and `'2'` for the others.
    tf_version: The program's TensorFlow, e.g. `'1.15'` (as `run --tf`).
      None: read from the program and printed when found.
    check: Whether to print what the program gets, and warnings, instead.

  Returns:
    Only with `check` (1 when there are warnings), on an error (2: its Keras
    cannot be set up here, or no such file), or where the platform cannot
    exec (the program's exit status): otherwise this process is the program.

  Raises:
    ValueError: If `keras` is not '2' or '3', or `tf_version` no release.
  """
  if keras not in KERAS_CHOICES + (None,):
    raise ValueError(f'keras={keras!r}: pass one of {KERAS_CHOICES}')
  if tf_version is not None and not TF_VERSION.fullmatch(tf_version):
    raise ValueError(f"tf_version={tf_version!r}: pass a release, '1.15'")
  if not os.path.isfile(program):
    return _fail(f"can't open file {program!r}: no such file")
  names, marked = guess.read(program)
  read = guess.Generation() if tf_version else marked or guess.generation(
      names)
  if read.tf and keras != '3' or read.keras and keras is None:
    tf_version, keras = read.tf, keras or read.keras
  else:
    read = guess.Generation()
  version = run_setup.generation(tf_version)
  keras = keras or ('3' if version and version >= (2, 16) else '2')
  if keras == '3' and version and version < (2, 16):
    return _fail(f'a program of TensorFlow {tf_version} runs under Keras 2, '
                 'not --keras 3')
  legacy = _legacy_keras_setting(keras)
  if isinstance(legacy, str):
    return _fail(legacy)
  settings = {'keras': keras, 'alias': bool(legacy), 'tf': tf_version}
  if check:
    installed = tuple(map(int, (_version(*_TENSORFLOW) or '0').split('.')[:2]))
    lines, warnings = guess.report(names, settings, read.reason, installed)
    print('\n'.join([f'tf-loss-scale run {program}:'] + lines +
                     [f'warning: {w}' for w in warnings]))
    return 1 if warnings else 0
  if read.reason:
    what, flag = ((f'TensorFlow {tf_version}', '--tf') if read.tf else
                  (f'Keras {keras}', '--keras'))
    print(f'tf-loss-scale run: {program} reads as {what} code '
          f'({read.reason}); pass {flag} to say otherwise', file=sys.stderr)
  _set_environ(legacy, settings)
  argv = [sys.executable, program, *args]
  sys.stdout.flush()
  sys.stderr.flush()
  if os.name != 'posix':  # Windows' exec returns before the program ends.
    return subprocess.call(argv)
  os.execv(sys.executable, argv)


def _legacy_keras_setting(keras: str) -> Union[bool, None, str]:
  """True or False for `TF_USE_LEGACY_KERAS`, None to leave it, or an error."""
  keras_version = _version('keras')
  keras_3 = keras_version is not None and int(keras_version.split('.')[0]) >= 3
  if keras == '3':
    return False if keras_3 else ('--keras 3 needs Keras 3 (TensorFlow 2.16 or'
                                  f' later); installed: keras {keras_version}')
  if not keras_3:
    return None  # `tf.keras` is Keras 2 already (TensorFlow 2.15 or earlier).
  if importlib.util.find_spec('tf_keras') is None:
    minor = '.'.join((_version(*_TENSORFLOW) or '2.N').split('.')[:2])
    return (
        'the program runs under Keras 2 (tf_keras), which is not installed: '
        "pip install 'tf_loss_scale[tfkeras]' "
        f"'tf_keras~={minor}.0'"
        ' (or pass --keras 3 for a program ready for Keras 3)')
  return True


def _set_environ(legacy: Optional[bool], settings: Dict[str, Any]) -> None:
  """Writes into `os.environ`: `TF_USE_LEGACY_KERAS` (`legacy`), `run_site`
  first on `PYTHONPATH`, and `settings` with what other Pythons restore, this
  interpreter (only its processes are set up) and this library's folder
  (None in a site directory, where it would come before the standard
  library)."""
  environ = os.environ
  settings['environ'] = {name: environ.get(name) for name in (
      'PYTHONPATH', 'TF_USE_LEGACY_KERAS')}
  if legacy is not None:
    environ.pop('TF_USE_LEGACY_KERAS', None)
  if legacy:
    environ['TF_USE_LEGACY_KERAS'] = '1'
  package = os.path.dirname(os.path.abspath(__file__))
  folder = os.path.dirname(package)
  settings['path'] = None if folder in site.getsitepackages() + [
      site.getusersitepackages()] else folder
  settings['python'] = [sys.prefix, sys.version]
  environ[run_setup.ENVIRON] = json.dumps(settings)
  environ['PYTHONPATH'] = os.pathsep.join(
      [os.path.join(package, 'run_site')] +
      environ.get('PYTHONPATH', '').split(os.pathsep)).rstrip(os.pathsep)


def _version(*distributions: str) -> Optional[str]:
  """The version of the first of `distributions` installed, if any."""
  for name in distributions:
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return None


def _fail(message: str) -> int:
  print(f'tf-loss-scale run: error: {message}', file=sys.stderr)
  return _ERROR
