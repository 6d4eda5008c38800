"""What one training run of the demo records."""

import dataclasses
from typing import List, Optional

import numpy as np

RUN_NAMES = ('float32', 'mixed_float16, no loss scaling',
             'mixed_float16, dynamic loss scale')


@dataclasses.dataclass
class RunResult:
  """The measurements of one run.

  Attributes:
    name: One of `RUN_NAMES`.
    losses: Training loss at each step.
    scales: Loss scale after each step, or None without loss scaling.
    skipped: Whether each step was skipped (all False without scaling).
    flushed_fraction: Over the probes taken during training, the share of
      gradient values that are non-zero in float32 but exactly zero after
      passing through float16; None for the float32 run itself.
    test_accuracy: Accuracy on the test set after training.
    wall_time: Seconds spent training, probes included.
  """
  name: str
  losses: List[float]
  scales: Optional[List[float]]
  skipped: List[bool]
  flushed_fraction: Optional[float]
  test_accuracy: float
  wall_time: float

  @property
  def skipped_steps(self) -> int:
    """How many steps were skipped."""
    return int(sum(self.skipped))

  @property
  def final_scale(self) -> Optional[float]:
    """The loss scale after the last step, or None without scaling."""
    return self.scales[-1] if self.scales else None

  def final_loss(self, window: int = 50) -> float:
    """Mean training loss over the last `window` steps."""
    return float(np.mean(self.losses[-window:]))
