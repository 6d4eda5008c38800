"""The demo's settings, the runs it makes, and how its numbers are written."""

import dataclasses
import math
import re
from typing import Optional

from tf_loss_scale.demo import onednn

KERAS, EXPERIMENTAL, V1 = 'keras', 'experimental', 'v1'
APIS = (KERAS, EXPERIMENTAL, V1)
# Runs the first API that works with the installed TensorFlow and Keras.
AUTO = 'auto'
STRATEGIES = ('none', 'mirrored')
# The three runs: (name in results.RUN_NAMES order, float16?, loss scaled?).
FLOAT32, MIXED, SCALED = 'float32', 'mixed', 'scaled'
KINDS = (FLOAT32, MIXED, SCALED)
# The fixed batch of training images on which the flushed gradients are
# measured (the first ones of the training set).
PROBE_EXAMPLES = 512


@dataclasses.dataclass(frozen=True)
class DemoConfig:
  """Settings of a demo invocation.

  Attributes:
    api: `'keras'` (Keras 3 `model.fit`), `'experimental'` (the TF 2.0-2.3
      wrapper in a custom loop), `'v1'` (a TF1 session loop), or `'auto'`:
      `'keras'` where Keras 3 is installed, else `'v1'` (see `apis`).
    strategy: `'none'` or `'mirrored'` (two logical CPU devices).
    steps: Training steps per run.
    batch_size: Examples per step (split between replicas when mirrored).
    hidden_units: Width of the two hidden layers.
    learning_rate: SGD-with-momentum learning rate for the unweighted loss;
      the optimizer gets `learning_rate / loss_weight`, so that float32
      takes the same steps whatever the weight.
    loss_weight: Factor on the cross-entropy, a positive number. The default
      makes the gradients as small as those of a loss averaged over 2**18
      outputs, which float16 flushes to zero unless the loss is scaled; 1
      trains the plain classifier, where the three runs agree.
    initial_scale: The dynamic loss scale's first value. The default is
      high enough that the first steps overflow float16 (the loss weight
      makes 2**40 act as 2**22 on the unweighted loss): the scale comes down
      in a few skipped steps, and the skip report says why each was skipped.
    growth_steps: Finite steps after which the dynamic scale doubles. The
      demo uses a short period so the scale's ups and downs show in a short
      run (libraries default to 2000).
    probe_every: Steps between two measurements of flushed gradients.
    seed: Seed of the data order and of the initial weights.
    out: Directory for the PNG, `results.json`, TensorBoard event files
      and, unless verbose, TensorFlow's log.
    verbose: Whether TensorFlow's own log lines reach the terminal.
    onednn: TensorFlow's oneDNN kernels: `'auto'` (off on a CPU-only
      machine, see `onednn`), `'on'` or `'off'`. Takes effect only if
      TensorFlow is not imported yet.
  """
  api: str = AUTO
  strategy: str = 'none'
  steps: int = 1000
  batch_size: int = 128
  hidden_units: int = 128
  learning_rate: float = 0.1
  loss_weight: float = 2.0**-18
  initial_scale: float = 2.0**40
  growth_steps: int = 100
  probe_every: int = 50
  seed: int = 0
  out: str = './tf_loss_scale_demo'
  verbose: bool = False
  onednn: str = onednn.AUTO

  def __post_init__(self):
    if self.api not in APIS + (AUTO,):
      raise ValueError(
          f'api must be one of {APIS + (AUTO,)}, but got {self.api!r}.')
    if self.onednn not in onednn.SETTINGS:
      raise ValueError(f'onednn must be one of {onednn.SETTINGS}, but got '
                       f'{self.onednn!r}.')
    if self.strategy not in STRATEGIES:
      raise ValueError(
          f'strategy must be one of {STRATEGIES}, but got {self.strategy!r}.')
    for name in ('steps', 'batch_size', 'hidden_units', 'growth_steps',
                 'probe_every'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int, but got {value!r}.')
    for name in ('learning_rate', 'loss_weight', 'initial_scale'):
      value = getattr(self, name)
      if not 0 < value < float('inf'):
        raise ValueError(
            f'{name} must be a finite positive number, but got {value!r}.')
    if self.strategy == 'mirrored' and self.batch_size % 2:
      raise ValueError(
          'batch_size must be even with strategy mirrored (two replicas), but '
          f'got {self.batch_size}.')


_POWER_OF_TWO = re.compile(r'2\s*(?:\*\*|\^)\s*([+-]?\d+)')


def parse_number(text: str) -> float:
  """Reads a number written plainly (`0.1`, `1e-3`) or as a power of two.

  Args:
    text: The number, or a power of two as `2**-18` or `2^-18`.

  Returns:
    Its value.

  Raises:
    ValueError: If `text` is neither, naming it.
  """
  match = _POWER_OF_TWO.fullmatch(text.strip())
  try:
    return 2.0**int(match.group(1)) if match else float(text)
  except (ValueError, OverflowError):
    pass
  raise ValueError(f'expected a number or a power of two such as 2**-18 or '
                   f'2^-18, but got {text!r}')


def power_of_two_exponent(value: float) -> Optional[int]:
  """`e` if `value` is `2**e` for an integer `e`, else None."""
  if not 0 < value < float('inf'):
    return None
  mantissa, exponent = math.frexp(value)
  return exponent - 1 if mantissa == 0.5 else None


def format_number(value: float) -> str:
  """Writes `value` as `parse_number` reads it: `2**-18`, `2**15`, `0.1`.

  Powers of two from 1 to 8 stay plain numbers.
  """
  exponent = power_of_two_exponent(value)
  if exponent is None or 0 <= exponent <= 3:
    return f'{value:g}'
  return f'2**{exponent}'
