"""Keeps TensorFlow's log lines off the terminal, in a file instead."""

import contextlib
import os
import sys
import warnings
from typing import Iterator


@contextlib.contextmanager
def tensorflow_output_to(path: str) -> Iterator[None]:
  """Sends what TensorFlow and Keras log to `path` while the block runs.

  TensorFlow's C++ code writes to file descriptor 2 directly (start-up
  notices, oneDNN, CUDA and CPU-feature messages), so descriptor 2 itself
  is pointed at the file; Python's log handlers and warnings, which write to
  `sys.stderr`, follow it. Standard output is untouched. Descriptor 2 and the
  warning hook are restored on exit, before an exception propagates, so
  tracebacks reach the terminal.

  Args:
    path: The log file, appended to.

  Yields:
    Nothing.
  """
  sys.stderr.flush()
  saved_stderr = os.dup(2)
  saved_showwarning = warnings.showwarning
  with open(path, 'a') as log:
    os.dup2(log.fileno(), 2)

    def to_log(message, category, filename, lineno, file=None, line=None):
      del file  # Always the log.
      log.write(warnings.formatwarning(message, category, filename, lineno,
                                       line))

    warnings.showwarning = to_log
    try:
      yield
    finally:
      sys.stderr.flush()
      log.flush()
      os.dup2(saved_stderr, 2)
      os.close(saved_stderr)
      warnings.showwarning = saved_showwarning

