"""Interleaved timing of several step functions in one process.

The machine is shared and its speed drifts, so variants are never timed one
after the other: every repetition times one block of steps of each variant,
in a rotated order, and overheads are computed as ratios within the same
repetition before taking medians.
"""

import statistics
import time
from typing import Callable, Dict, List


def steps_per_block(step: Callable[[], None], target_seconds: float) -> int:
  """How many steps of `step` take about `target_seconds` (at least 2)."""
  start = time.perf_counter()
  step()
  step()
  per_step = (time.perf_counter() - start) / 2
  return max(2, int(target_seconds / max(per_step, 1e-6)))


def interleaved(steps: Dict[str, Callable[[], None]], repetitions: int,
                block: int) -> Dict[str, List[float]]:
  """Times `block` steps of every variant, `repetitions` times, interleaved.

  Args:
    steps: Variant name -> its step function (already warmed up).
    repetitions: How many blocks to time per variant.
    block: Steps per timed block.

  Returns:
    Variant name -> the per-step seconds of each repetition, in order.
  """
  names = list(steps)
  times = {name: [] for name in names}
  for rep in range(repetitions):
    # Rotate the order so no variant always runs first (or right after
    # another particular one).
    order = names[rep % len(names):] + names[:rep % len(names)]
    for name in order:
      step = steps[name]
      start = time.perf_counter()
      for _ in range(block):
        step()
      times[name].append((time.perf_counter() - start) / block)
  return times


def median_overhead(times: List[float], baseline: List[float]) -> float:
  """Median over repetitions of `times / baseline - 1` (paired per block)."""
  return statistics.median(t / b - 1.0 for t, b in zip(times, baseline))
