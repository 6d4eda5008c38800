"""Runs code that changes process-wide state, then puts the state back.

Used by the child processes that run README blocks and TF 2.3-era scripts
one after another: each gets its own working directory, and what one leaves
behind (a global mixed precision policy, `compat.install()`, Keras's name
counters, environment variables) does not reach the next.
"""

import os
import sys
import tempfile
import traceback
from typing import Callable, Optional, Tuple, TypeVar

T = TypeVar('T')


def run_isolated(run: Callable[[], T]) -> Tuple[Optional[T], Optional[str]]:
  """Calls `run()` in an empty working directory and restores global state.

  Args:
    run: The code to run.

  Returns:
    `(result, None)` if `run()` returned, `(None, traceback)` if it raised.
  """
  cwd, environ = os.getcwd(), dict(os.environ)
  with tempfile.TemporaryDirectory() as workdir:
    os.chdir(workdir)
    try:
      return run(), None
    except Exception:  # pylint: disable=broad-except
      # Reported to the test, which names the block or script that failed.
      return None, traceback.format_exc()
    finally:
      os.chdir(cwd)
      os.environ.clear()
      os.environ.update(environ)
      _restore_global_state()


def _restore_global_state() -> None:
  compat = sys.modules.get('tf_loss_scale.compat')
  if compat is not None:
    compat.uninstall()
  # Whichever Kerases were loaded: tf.keras is one of them.
  for name in ('keras', 'tf_keras'):
    package = sys.modules.get(name)
    if package is not None:
      package.mixed_precision.set_global_policy('float32')
      package.backend.clear_session()
