"""Chooses TensorFlow's oneDNN setting for the demo, before TensorFlow loads.

TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` once, when it is imported. On x86
CPUs its oneDNN kernels are on by default, and on some CPUs their float16
path makes a `mixed_float16` model tens of times slower than the same model
in float32 (on others it costs little). The demo shows what loss scaling does to the
numbers, not float16 speed on a CPU, so on a machine without an accelerator
it turns that path off unless told to keep it.

Whether an accelerator is present is told from device files, because
TensorFlow cannot be asked without importing it, and importing it fixes the
setting.
"""

import glob
import os
import sys
from typing import Mapping, MutableMapping

ENV = 'TF_ENABLE_ONEDNN_OPTS'
AUTO, ON, OFF = 'auto', 'on', 'off'
SETTINGS = (AUTO, ON, OFF)

# Device files of the accelerators TensorFlow runs on under Linux: NVIDIA
# GPUs, AMD GPUs (ROCm's kernel driver) and Cloud TPU VMs.
_NVIDIA = ('dev/nvidia[0-9]*', 'proc/driver/nvidia/gpus/*')
_ROCM = ('dev/kfd',)
_TPU = ('dev/accel[0-9]*', 'dev/vfio/[0-9]*')


def accelerator_visible(environ: Mapping[str, str] = os.environ,
                        root: str = '/') -> bool:
  """Whether this machine shows TensorFlow a GPU or TPU.

  Args:
    environ: The environment; `CUDA_VISIBLE_DEVICES` or `HIP_VISIBLE_DEVICES`
      set to '' or '-1' hides that vendor's GPUs.
    root: The file system root to look under (a test's fake tree).

  Returns:
    True if a device file of an NVIDIA or AMD GPU that is not hidden, or of
    a TPU, exists.
  """

  def present(patterns):
    return any(glob.glob(os.path.join(root, pattern)) for pattern in patterns)

  def hidden(variable):
    return environ.get(variable, 'unset').strip() in ('', '-1')

  return ((present(_NVIDIA) and not hidden('CUDA_VISIBLE_DEVICES')) or
          (present(_ROCM) and not hidden('HIP_VISIBLE_DEVICES')) or
          present(_TPU))


def configure(setting: str, environ: MutableMapping[str, str] = os.environ,
              accelerator: bool = False,
              tensorflow_loaded: bool = False) -> str:
  """Sets `TF_ENABLE_ONEDNN_OPTS` in `environ` as `setting` asks.

  Args:
    setting: `'auto'` (off on a machine without an accelerator, unless the
      environment already sets it; TensorFlow's default otherwise), `'on'`
      or `'off'`.
    environ: The environment to change.
    accelerator: Whether a GPU or TPU is visible (`accelerator_visible()`).
    tensorflow_loaded: Whether TensorFlow is already imported, in which case
      the setting can no longer change and `environ` is left alone.

  Returns:
    One line of text that says what oneDNN does in this run and why.

  Raises:
    ValueError: If `setting` is not one of `SETTINGS`.
  """
  if setting not in SETTINGS:
    raise ValueError(
        f'onednn must be one of {SETTINGS}, but got {setting!r}.')
  current = environ.get(ENV)
  if tensorflow_loaded:
    return (f'oneDNN: as TensorFlow was imported with ({ENV}='
            f'{current if current is not None else "unset"}); it was loaded '
            'before the demo, which can no longer change it.')
  if setting in (ON, OFF):
    environ[ENV] = '1' if setting == ON else '0'
    return f'oneDNN: {setting} (--onednn {setting}, {ENV}={environ[ENV]}).'
  if current is not None:
    return (f'oneDNN: {ENV}={current} from the environment '
            '(--onednn on|off overrides it).')
  if accelerator:
    return ("oneDNN: TensorFlow's default, as a GPU or TPU is visible "
            '(--onednn off turns it off).')
  environ[ENV] = '0'
  return ('oneDNN: off on this CPU-only machine (its float16 kernels can '
          'slow mixed_float16 many times over); --onednn on keeps it.')


def configure_for_this_process(setting: str) -> str:
  """`configure` on `os.environ`, for this machine and this process."""
  return configure(setting, os.environ, accelerator_visible(),
                   'tensorflow' in sys.modules)
