"""Counts the gradient values float16 flushed to zero."""

from typing import Sequence, Tuple

import tensorflow as tf


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
