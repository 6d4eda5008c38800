"""TF 2.0-2.3's `enable_mixed_precision_graph_rewrite`, wrapping with ours.

The rewrite is TensorFlow's grappler pass `auto_mixed_precision`, switched
by TensorFlow's public `tf.compat.v1.mixed_precision` functions (the one
switch of both places it is read from), with their checks and warnings.
"""

import logging
import os
from typing import Any

import tensorflow as tf

from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import optimizer_v1

# As found on import, before `compat.install(override=True)` renames them.
_TF_ENABLE = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
_TF_DISABLE = tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite


def enable_mixed_precision_graph_rewrite(
    opt: Any, loss_scale: loss_scale_lib.Identifier = 'dynamic') -> Any:
  """Turns TensorFlow's mixed precision graph rewrite on; wraps `opt`.

  Args:
    opt: A `tf.compat.v1.train.Optimizer` (returned in
      `tf_loss_scale.MixedPrecisionLossScaleOptimizer`) or a Keras optimizer
      (in `tf_loss_scale.keras.experimental.LossScaleOptimizer`).
    loss_scale: `'dynamic'`, a number (a fixed scale) or a `LossScale`.

  Returns:
    The wrapped optimizer: compute and apply gradients with it only.

  Raises:
    ValueError: If `opt` is a loss scale optimizer or no optimizer, or (as
      TensorFlow's) if a mixed Keras 2 policy is set.
  """
  # The wrappers refuse a loss scale optimizer (TF 2.3's ValueError too).
  if isinstance(opt, tf.compat.v1.train.Optimizer):
    wrapped = optimizer_v1.MixedPrecisionLossScaleOptimizer(opt, loss_scale)
  elif guards.EXPERIMENTAL_FORM.accepts(opt):
    # pylint: disable-next=g-import-not-at-top
    from tf_loss_scale.keras import experimental
    wrapped = experimental.LossScaleOptimizer(opt, loss_scale)
  else:
    raise ValueError('"opt" must be a tf.compat.v1.train.Optimizer or a Keras '
                     f'optimizer, but got {opt!r}.')
  # TensorFlow's switch wraps too: a throwaway optimizer, with a fixed scale
  # (no variables) whose deprecation notice the caller did not earn.
  tf.get_logger().addFilter(_not_deprecation_notice)
  try:
    _TF_ENABLE(tf.compat.v1.train.GradientDescentOptimizer(0.0), loss_scale=1)
  except Exception:
    # Refused (a mixed Keras 2 policy is set): a refused call changes
    # nothing, so `opt` is free to be wrapped by a retry.
    guards.release(opt)
    raise
  finally:
    tf.get_logger().removeFilter(_not_deprecation_notice)
  return wrapped


def disable_mixed_precision_graph_rewrite() -> None:
  """Turns the rewrite off for new Sessions and `tf.function`s."""
  _TF_DISABLE()


def _not_deprecation_notice(record: logging.LogRecord) -> bool:
  return os.path.basename(record.pathname) != 'deprecation.py'
