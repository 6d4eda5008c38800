"""Interleaved timing of several step functions in one process.

The machine is shared and its speed drifts, so variants are never timed one
after the other: every repetition times one block of steps of each variant,
in a rotated order, and overheads are computed as ratios within the same
repetition before taking medians.
"""

import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple


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


def ratio_quartiles(times: List[float], reference: List[float],
                    baseline: List[float]
                   ) -> Optional[Tuple[float, float]]:
  """The spread of the overhead ratio over the repetitions of one run.

  Each repetition gives its own ratio of `times`' overhead over `baseline`
  to `reference`'s (all three timed in that repetition). Their first and
  third quartiles show how much the ratio moves from block to block; the
  median over a run moves less.

  Args:
    times: Per-step seconds of the measured variant, one per repetition.
    reference: The same for the variant it is compared with.
    baseline: The same for the bare step both add to.

  Returns:
    (first quartile, third quartile), or None when some repetition's
    reference added nothing to compare with.
  """
  ratios = []
  for t, r, b in zip(times, reference, baseline):
    if r <= b:
      return None
    ratios.append((t / b - 1.0) / (r / b - 1.0))
  quartiles = statistics.quantiles(ratios, n=4)
  return quartiles[0], quartiles[2]
