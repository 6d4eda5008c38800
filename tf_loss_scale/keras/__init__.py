"""Keras loss scale optimizers.

Public API:
  LossScaleOptimizer: the Keras 3 form (`inner_optimizer, initial_scale,
    dynamic_growth_steps`), for `model.fit` and custom loops.
  experimental.LossScaleOptimizer: the TF 2.0-2.3 form
    (`optimizer, loss_scale`) with `get_scaled_loss`/`get_unscaled_gradients`.

Both are imported on first use: `import tf_loss_scale.keras` loads neither
Keras 3 nor `tf_keras`.
"""

from tf_loss_scale import lazy as _lazy

__getattr__, __dir__ = _lazy.attributes(__name__, {
    'LossScaleOptimizer': (f'{__name__}.loss_scale_optimizer',
                           'LossScaleOptimizer'),
    'experimental': (f'{__name__}.experimental', None),
}, globals())

__all__ = ['LossScaleOptimizer', 'experimental']
