"""Loss scaling for mixed precision training on TensorFlow 2 and Keras 3.

Public API:
  LossScale, FixedLossScale, DynamicLossScale: the loss scale and its state.
  get, serialize, deserialize: identifiers and configs to loss scales.
  LossScaleCollapseError: raised when a DynamicLossScale told to raise
    collapses.
  MixedPrecisionLossScaleOptimizer: the `tf.compat.v1` optimizer wrapper.
Keras front ends live in `tf_loss_scale.keras`.
"""

from tf_loss_scale.loss_scale import DynamicLossScale
from tf_loss_scale.loss_scale import FixedLossScale
from tf_loss_scale.loss_scale import LossScale
from tf_loss_scale.loss_scale import LossScaleCollapseError
from tf_loss_scale.loss_scale import deserialize
from tf_loss_scale.loss_scale import get
from tf_loss_scale.loss_scale import serialize
from tf_loss_scale.optimizer_v1 import MixedPrecisionLossScaleOptimizer

__all__ = [
    'DynamicLossScale',
    'FixedLossScale',
    'LossScale',
    'LossScaleCollapseError',
    'MixedPrecisionLossScaleOptimizer',
    'deserialize',
    'get',
    'serialize',
]
