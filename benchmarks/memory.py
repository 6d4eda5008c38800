"""Peak resident memory of one variant, measured in a process of its own.

RSS cannot be attributed to one of several variants sharing a process, so
each variant is built and stepped in a fresh child process, which reports
its peak RSS (`VmHWM` of /proc/self/status; not `ru_maxrss`, which Linux
carries over from the parent through fork and exec): the TensorFlow
runtime's own footprint plus the
variant's variables, gradients and temporaries. Differences between variants
of the same row are therefore what the wrappers add.
"""

import json
import os
import subprocess
import sys
from typing import Dict

_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'run.py')


def peak_rss_mb(mode: str, family: str, variant: str, shape: str,
                steps: int) -> float:
  """Runs `steps` steps of one variant in a child process; its peak RSS in MB.

  Args:
    mode: A mode of `variants.MODES`.
    family: 'v1' or 'keras'.
    variant: The variant's name within the family.
    shape: A workload name.
    steps: Steps to run after building.

  Returns:
    The child's peak resident set size in MiB.

  Raises:
    RuntimeError: If the child fails.
  """
  spec = ':'.join([mode, family, variant, shape, str(steps)])
  done = subprocess.run([sys.executable, _RUN, '--child', spec],
                        capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f'memory child {spec} failed:\n{done.stderr[-2000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])['peak_rss_mb']


def child_report() -> Dict[str, float]:
  """The JSON line a child prints: its own peak RSS in MiB."""
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith('VmHWM:'):
        return {'peak_rss_mb': round(int(line.split()[1]) / 1024.0, 1)}
  raise RuntimeError('no VmHWM in /proc/self/status')
