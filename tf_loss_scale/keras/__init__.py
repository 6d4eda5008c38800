"""Keras 3 loss scale optimizers.

Public API:
  LossScaleOptimizer: the Keras 3 form (`inner_optimizer, initial_scale,
    dynamic_growth_steps`), for `model.fit` and custom loops.
  experimental.LossScaleOptimizer: the TF 2.0-2.3 form
    (`optimizer, loss_scale`) with `get_scaled_loss`/`get_unscaled_gradients`.
"""

from tf_loss_scale.keras import experimental
from tf_loss_scale.keras.loss_scale_optimizer import LossScaleOptimizer

__all__ = ['LossScaleOptimizer', 'experimental']
