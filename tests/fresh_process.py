"""Runs Python code in a fresh interpreter that imports this checkout.

For tests of process-wide state that cannot be undone in the test process:
what a plain import loads, `TF_USE_LEGACY_KERAS` (read once, when TensorFlow
is imported), scripts that set mixed precision policies.
"""

import json
import os
import subprocess
import sys
from typing import Any, Optional, Sequence

import tf_loss_scale

# The checkout whose tf_loss_scale the tests imported; the child imports it
# too, whatever copy the interpreter has installed.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(
    tf_loss_scale.__file__)))
_TESTS = os.path.dirname(os.path.abspath(__file__))


def run(args: Sequence[str], legacy_keras: bool = False,
        timeout: float = 300,
        cwd: Optional[str] = None) -> subprocess.CompletedProcess:
  """Runs `python *args` and returns the finished process.

  Args:
    args: The interpreter's arguments: `['-c', code]` or a script and its
      arguments.
    legacy_keras: Whether `TF_USE_LEGACY_KERAS=1` (`tf.keras` is `tf_keras`);
      otherwise the variable is removed and `tf.keras` is Keras 3.
    timeout: Seconds before the child is killed and the test fails.
    cwd: The child's working directory.

  Returns:
    The completed process, its output captured as text.
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=os.pathsep.join(
      [_CHECKOUT, _TESTS] + sys.path))
  env.pop('TF_USE_LEGACY_KERAS', None)
  if legacy_keras:
    env['TF_USE_LEGACY_KERAS'] = '1'
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, env=env, cwd=cwd, timeout=timeout,
                        check=False)


def run_json(args: Sequence[str], legacy_keras: bool = False,
             timeout: float = 300, cwd: Optional[str] = None) -> Any:
  """Runs `python *args`, which must succeed and print JSON as its last line.

  Args:
    args: As for `run`.
    legacy_keras: As for `run`.
    timeout: As for `run`.
    cwd: As for `run`.

  Returns:
    The parsed last line of the child's standard output.
  """
  result = run(args, legacy_keras, timeout, cwd)
  keras_name = 'tf_keras' if legacy_keras else 'Keras 3'
  assert result.returncode == 0, (
      f'child process ({keras_name}) exited with {result.returncode}:\n'
      f'{result.stderr[-4000:]}')
  return json.loads(result.stdout.strip().splitlines()[-1])
