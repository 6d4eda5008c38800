"""`tf-loss-scale run PROGRAM.py [ARGS...]`: an old program, run unmodified.

The program runs as `__main__`, as `python PROGRAM.py ARGS...` runs it,
after `compat.install(override=True)`, under the Keras and the names of the
TensorFlow it was written for (`--tf`, or read by `run_guess`; set up by
`run_setup`). The set-up goes into the environment, so the processes the
program starts get it too. TensorFlow reads `TF_USE_LEGACY_KERAS` once, on
import: a process that had imported it runs the command in a new one.
"""

import importlib.util
import os
import re
import runpy
import site
import subprocess
import sys
from importlib import metadata
from typing import Dict, List, MutableMapping, Optional, Union

from tf_loss_scale import run_guess as guess
from tf_loss_scale import run_setup

KERAS_2 = '2'
KERAS_3 = '3'
KERAS_CHOICES = (KERAS_2, KERAS_3)
# What `--tf` takes: 1, or 2.N.
TF_VERSION = re.compile(r'1|2\.\d+')

# Set in the fresh interpreter, so that it never starts another one.
_FRESH = 'TF_LOSS_SCALE_RUN_FRESH'
_ERROR = 2


def run(program: str, args: List[str], keras: Optional[str] = None,
        tf_version: Optional[str] = None, check: bool = False) -> int:
  """Runs `program` as `__main__`, set up as its TensorFlow set it up.

  Args:
    program: The Python file to run, with `sys.argv == [program, *args]`.
    args: Its arguments.
    keras: The program's Keras, `'2'` or `'3'` (as `run --keras`). None:
      `'3'` for a program of TensorFlow 2.16 or later, else `'2'`.
    tf_version: The program's TensorFlow, `'1'` or `'2.N'` (as `run --tf`).
      None: read from the program and printed when found, unless `keras` is
      `'3'`.
    check: Whether to print what the program gets, and warnings, instead.

  Returns:
    The exit status: 0 when the program returned, 1 when it raised (its
    traceback printed from its own frames on), 2 when its Keras cannot be
    set up here or the file is missing; a `SystemExit` propagates. With
    `check`: 1 when there are warnings.

  Raises:
    ValueError: If `keras` is not '2' or '3', or `tf_version` no version.
  """
  if keras not in KERAS_CHOICES + (None,):
    raise ValueError(f'keras={keras!r}: pass one of {KERAS_CHOICES}')
  if tf_version is not None and not TF_VERSION.fullmatch(tf_version):
    raise ValueError(f"tf_version={tf_version!r}: pass '1' or '2.N'")
  if not os.path.isfile(program):
    return _fail(f"can't open file {program!r}: no such file")
  with open(program, encoding='utf-8', errors='replace') as f:
    source = f.read()
  guessed = None
  if tf_version is None:
    tf_version, guessed = guess.tensorflow(source)
    if keras == KERAS_3 and tf_version:
      tf_version = guessed = None  # Said on the command line: Keras 3.
  version = run_setup.generation(tf_version)
  if keras is None:
    keras = KERAS_3 if version and version >= (2, 16) else KERAS_2
  if keras == KERAS_3 and version and version < (2, 16):
    return _fail(f'a program of TensorFlow {tf_version} runs under Keras 2, '
                 'not --keras 3')
  legacy = _legacy_keras_setting(keras)
  if isinstance(legacy, str):
    return _fail(legacy)
  settings = {'keras': keras, 'alias': '1' if legacy else '0'}
  if tf_version:
    settings['tf'] = tf_version
  if check:
    lines, warnings = guess.report(source, settings, guessed)
    print('\n'.join([f'tf-loss-scale run {program}:'] + lines +
                     [f'warning: {w}' for w in warnings]))
    return 1 if warnings else 0
  if guessed:
    print(f'tf-loss-scale run: {program} reads as TensorFlow {tf_version} '
          f'code ({guessed}); pass --tf to say otherwise', file=sys.stderr)
  fresh = os.environ.pop(_FRESH, None) == '1'
  # The program's children start set up as it is (see run_setup).
  _set_environ(os.environ, legacy, settings)
  if not fresh and ('tensorflow' in sys.modules or run_setup.applied not in (
      None, settings)):
    # TensorFlow has read `TF_USE_LEGACY_KERAS` already, or this process was
    # set up otherwise: only a new interpreter can set it up.
    return subprocess.call(
        [sys.executable, '-m', 'tf_loss_scale', 'run', '--keras', keras] +
        (['--tf', tf_version] if tf_version else []) + [program, *args],
        env=dict(os.environ, **{_FRESH: '1'}))
  run_setup.apply(settings)
  return _run_main(program, args)


def _legacy_keras_setting(keras: str) -> Union[bool, None, str]:
  """True or False for `TF_USE_LEGACY_KERAS`, None to leave it, or an error."""
  keras_version = _version('keras')
  keras_3 = keras_version is not None and int(keras_version.split('.')[0]) >= 3
  if keras == KERAS_3:
    if not keras_3:
      return (f'--keras 3 needs Keras 3 (TensorFlow 2.16 or later); '
              f'installed: keras {keras_version}')
    return False
  if not keras_3:
    return None  # `tf.keras` is Keras 2 already (TensorFlow 2.15 or earlier).
  if importlib.util.find_spec('tf_keras') is None:
    tf_minor = _tensorflow_minor()
    return (
        'the program runs under Keras 2 (tf_keras), which is not installed: '
        "pip install 'tf_loss_scale[tfkeras]' "
        f"'tf_keras~={tf_minor}.0'"
        ' (or pass --keras 3 for a program ready for Keras 3)')
  return True


def _set_environ(environ: MutableMapping[str, str], legacy: Optional[bool],
                 settings: Dict[str, str]) -> None:
  """Sets `TF_USE_LEGACY_KERAS` (`legacy`), the set-up, and `PYTHONPATH`:
  `run_site` (for its `sitecustomize`) and this library's directory unless
  it is a site directory (there it would come before the standard library)."""
  if legacy is True:
    environ['TF_USE_LEGACY_KERAS'] = '1'
  elif legacy is False:
    environ.pop('TF_USE_LEGACY_KERAS', None)
  environ[run_setup.ENVIRON] = run_setup.encode(settings)
  package = os.path.dirname(os.path.abspath(__file__))
  paths = [os.path.join(package, 'run_site')]
  if os.path.dirname(package) not in site.getsitepackages() + [
      site.getusersitepackages()]:
    paths.append(os.path.dirname(package))
  environ['PYTHONPATH'] = os.pathsep.join(paths + [
      p for p in environ.get('PYTHONPATH', '').split(os.pathsep)
      if p and p not in paths])


def _run_main(program: str, args: List[str]) -> int:
  """Runs the file as `python program args...` would."""
  path = os.path.abspath(program)
  sys.argv = [program, *args]
  sys.path[0] = os.path.dirname(path)  # the program's imports of neighbours
  try:
    runpy.run_path(program, run_name='__main__')
  except (SystemExit, KeyboardInterrupt):
    raise
  except BaseException as error:  # pylint: disable=broad-except
    # The traceback starts at the program's module, as Python's own does;
    # the interpreter's hook prints it, or the program's own hook.
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename not in (
        program, path):
      tb = tb.tb_next
    tb = tb or error.__traceback__
    # The interpreter's printer reads the exception's own traceback.
    sys.excepthook(type(error), error.with_traceback(tb), tb)
    return 1
  return 0


def _version(distribution: str) -> Optional[str]:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return None


def _tensorflow_minor() -> str:
  """'2.N' of the installed TensorFlow, read without importing it."""
  for name in ('tensorflow', 'tensorflow-cpu', 'tensorflow-macos',
               'tensorflow-intel', 'tf-nightly'):
    version = _version(name)
    if version:
      return '.'.join(version.split('.')[:2])
  return '2.N'


def _fail(message: str) -> int:
  print(f'tf-loss-scale run: error: {message}', file=sys.stderr)
  return _ERROR

