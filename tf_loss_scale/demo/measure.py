"""What float16 does to gradients: values flushed to zero, and their magnitudes."""

from typing import Sequence, Tuple

import numpy as np
import tensorflow as tf

# float16's limits, as powers of two.
SMALLEST_SUBNORMAL_LOG2 = -24.0
SMALLEST_NORMAL_LOG2 = -14.0
LARGEST_LOG2 = float(np.log2(65504.0))

# Bins of log2 |gradient|: half an octave wide, wide enough for the demo's
# weighted loss; values outside land in the first or last bin.
LOG2_EDGES = np.arange(-64.0, 24.5, 0.5)


def flushed_counts(mixed_grads: Sequence[tf.Tensor],
                   float32_grads: Sequence[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
  """Compares gradients that went through float16 with float32 ones.

  Both lists are gradients of the same weights on the same batch. A value
  that is non-zero in float32 but exactly zero in the mixed run underflowed
  somewhere in float16 (casting float16 to float32 keeps every non-zero
  value non-zero, and so does unscaling, so zero means lost).

  Args:
    mixed_grads: Gradients computed with float16 activations.
    float32_grads: The same gradients computed entirely in float32.

  Returns:
    `(flushed, nonzero)`: int64 counts of values zero only in the mixed run,
    and of non-zero float32 values.
  """
  flushed = []
  nonzero = []
  for mixed, reference in zip(mixed_grads, float32_grads):
    lost = tf.logical_and(tf.equal(mixed, 0), tf.not_equal(reference, 0))
    flushed.append(tf.math.count_nonzero(lost))
    nonzero.append(tf.math.count_nonzero(reference))
  return tf.add_n(flushed), tf.add_n(nonzero)


def flat(grads: Sequence[tf.Tensor]) -> tf.Tensor:
  """All gradient values in one float32 vector."""
  return tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads],
                   axis=0)


def log2_histogram(values: np.ndarray) -> np.ndarray:
  """Counts the non-zero `values` by log2 of their magnitude.

  Args:
    values: Gradient values, any shape.

  Returns:
    Counts per bin of `LOG2_EDGES` (one fewer than the edges); zeros are not
    counted, values beyond the edges go to the outer bins.
  """
  magnitudes = np.abs(np.asarray(values, np.float64)).ravel()
  exponents = np.log2(magnitudes[magnitudes > 0])
  exponents = np.clip(exponents, LOG2_EDGES[0], LOG2_EDGES[-1] - 1e-9)
  counts, _ = np.histogram(exponents, LOG2_EDGES)
  return counts


def share_below(counts: np.ndarray, log2_threshold: float,
                shift: float = 0.0) -> float:
  """The share of a histogram's values below `2**log2_threshold`.

  Args:
    counts: Counts per bin of `LOG2_EDGES`.
    log2_threshold: The threshold's exponent; a multiple of the bin width.
    shift: Added to every value's exponent first (log2 of a loss scale).

  Returns:
    The fraction in [0, 1]; 0 for an empty histogram.
  """
  total = counts.sum()
  if not total:
    return 0.0
  below = (LOG2_EDGES[1:] + shift) <= log2_threshold
  return float(counts[below].sum() / total)
