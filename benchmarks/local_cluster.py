"""Runs a few worker processes on 127.0.0.1 as one TensorFlow cluster.

Used by the multi-worker tests and by the collective count of the benchmark.
Every worker is bounded in time, and no worker outlives the call: when one
fails or the time is up, the others (which would wait forever for their
peer's collectives) are killed.
"""

import os
import socket
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence


class WorkerError(RuntimeError):
  """A worker exited with an error or did not finish in time."""


def free_ports(count: int) -> List[int]:
  """Returns `count` distinct TCP ports that are free on 127.0.0.1 now."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def tf_config(ports: Sequence[int], index: int) -> Dict:
  """The TF_CONFIG of worker `index` in a cluster of workers on `ports`."""
  return {
      'cluster': {'worker': [f'127.0.0.1:{port}' for port in ports]},
      'task': {'type': 'worker', 'index': index},
  }


def run_workers(command_of: Callable[[int], List[str]], count: int,
                timeout: float,
                env: Optional[Dict[str, str]] = None) -> List[str]:
  """Runs `count` processes at once and returns what each printed.

  Args:
    command_of: Gives the command line of worker `index`.
    count: How many workers to start.
    timeout: Seconds all of them together may take.
    env: Their environment (by default this process's, without GPUs).

  Returns:
    Each worker's standard output, in worker order.

  Raises:
    WorkerError: When a worker exits with a non-zero status (the message
      holds the end of its standard error) or the time runs out; every
      worker still running is killed first.
  """
  env = dict(os.environ if env is None else env, CUDA_VISIBLE_DEVICES='')
  with tempfile.TemporaryDirectory() as logs:
    outputs = [open(os.path.join(logs, f'{i}.out'), 'w+') for i in range(count)]
    errors = [open(os.path.join(logs, f'{i}.err'), 'w+') for i in range(count)]
    workers = [
        subprocess.Popen(command_of(i), stdout=outputs[i], stderr=errors[i],
                         env=env) for i in range(count)
    ]
    try:
      _wait_all(workers, errors, time.monotonic() + timeout)
    finally:
      for worker in workers:
        if worker.poll() is None:
          worker.kill()
          worker.wait()
      for f in errors:
        f.close()
    results = []
    for f in outputs:
      f.seek(0)
      results.append(f.read())
      f.close()
    return results


def _wait_all(workers: List[subprocess.Popen], errors: List,
              deadline: float) -> None:
  while True:
    codes = [worker.poll() for worker in workers]
    for index, code in enumerate(codes):
      if code not in (None, 0):
        raise WorkerError(f'worker {index} exited with status {code}:\n'
                          f'{_tail(errors[index])}')
    if all(code == 0 for code in codes):
      return
    if time.monotonic() > deadline:
      running = [i for i, code in enumerate(codes) if code is None]
      raise WorkerError(
          f'workers {running} did not finish in time; the end of worker '
          f'{running[0]}\'s log:\n{_tail(errors[running[0]])}')
    time.sleep(0.2)


def _tail(log, chars: int = 3000) -> str:
  log.flush()
  log.seek(0)
  return log.read()[-chars:]
