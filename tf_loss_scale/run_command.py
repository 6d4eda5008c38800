"""`tf-loss-scale run PROGRAM.py [ARGS...]`: an old program, run unmodified.

The program runs as `__main__` after `compat.install(override=True)`, under
the Keras it was written for: Keras 2 (tf_keras through
`TF_USE_LEGACY_KERAS=1` where `keras` is Keras 3), or Keras 3 when asked.
TensorFlow reads `TF_USE_LEGACY_KERAS` once, when it is imported, so the
variable is set before anything imports TensorFlow; a process that had
imported TensorFlow already runs the command again in a fresh interpreter.
"""

import importlib.util
import os
import runpy
import subprocess
import sys
from importlib import metadata
from typing import List, MutableMapping, Optional, Union

KERAS_2 = '2'
KERAS_3 = '3'
KERAS_CHOICES = (KERAS_2, KERAS_3)

# Set in the fresh interpreter, so that it never starts another one.
_FRESH = 'TF_LOSS_SCALE_RUN_FRESH'
_ERROR = 2


def run(program: str, args: List[str], keras: str = KERAS_2) -> int:
  """Runs `program` as `__main__` after `install(override=True)`.

  Args:
    program: The path of the Python file to run.
    args: Its arguments: the program sees `sys.argv == [program, *args]`.
    keras: `'2'`: the Keras 2 the program was written for (tf_keras, with
      `TF_USE_LEGACY_KERAS=1`, where `keras` is Keras 3); `'3'`: Keras 3.

  Returns:
    The exit status: 0 when the program returned, 1 when it raised (its
    traceback printed from its own frames on), 2 when its Keras cannot be
    set up here or the file is missing. A `SystemExit` the program raises
    propagates with its code.

  Raises:
    ValueError: If `keras` is not '2' or '3'.
  """
  if keras not in KERAS_CHOICES:
    raise ValueError(f'keras={keras!r}: pass one of {KERAS_CHOICES}')
  if not os.path.isfile(program):
    return _fail(f"can't open file {program!r}: no such file")
  legacy = _legacy_keras_setting(keras)
  if isinstance(legacy, str):
    return _fail(legacy)
  if 'tensorflow' in sys.modules and os.environ.get(_FRESH) != '1':
    # TensorFlow has read the variable already: only a new interpreter can
    # choose the Keras.
    return _run_fresh(program, args, keras, legacy)
  _set_legacy_keras(os.environ, legacy)
  from tf_loss_scale import compat  # pylint: disable=g-import-not-at-top
  compat.install(override=True)
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


def _set_legacy_keras(environ: MutableMapping[str, str],
                      legacy: Optional[bool]) -> None:
  if legacy is True:
    environ['TF_USE_LEGACY_KERAS'] = '1'
  elif legacy is False:
    environ.pop('TF_USE_LEGACY_KERAS', None)


def _run_fresh(program: str, args: List[str], keras: str,
               legacy: Optional[bool]) -> int:
  env = dict(os.environ, **{_FRESH: '1'})
  _set_legacy_keras(env, legacy)
  checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = os.pathsep.join(
      [checkout] + [p for p in [env.get('PYTHONPATH')] if p])
  return subprocess.call([sys.executable, '-m', 'tf_loss_scale', 'run',
                          '--keras', keras, program, *args], env=env)


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

