"""Keras loss scale optimizers.

Public API, one place each, imported on first use (`import
tf_loss_scale.keras` loads no Keras); what they share is in `shared/`:
  LossScaleOptimizer (`keras3.py`): the Keras 3 form, `(inner_optimizer,
    initial_scale, dynamic_growth_steps)`. Needs Keras 3 (TensorFlow 2.16+);
    elsewhere an ImportError names the experimental form.
  mixed_precision.LossScaleOptimizer: the TF 2.4-2.15 form, on Keras 3.
  experimental.LossScaleOptimizer: the TF 2.0-2.3 form, `(optimizer,
    loss_scale)`, around the optimizers of every Keras.
"""

import importlib
from typing import Any

from tf_loss_scale import lazy as _lazy

_lazy_getattr, __dir__ = _lazy.attributes(__name__, {
    'LossScaleOptimizer': (f'{__name__}.keras3', 'LossScaleOptimizer'),
    'experimental': (f'{__name__}.experimental', None),
    'mixed_precision': (f'{__name__}.mixed_precision', None),
}, globals())


def __getattr__(name: str) -> Any:  # pylint: disable=invalid-name
  if name in ('LossScaleOptimizer', 'mixed_precision'):
    # Without Keras 3, say what works instead of failing inside the module.
    importlib.import_module(f'{__name__}.shared.families').require_keras3(
        f'{__name__}.{name}')
  return _lazy_getattr(name)


__all__ = ['LossScaleOptimizer', 'experimental', 'mixed_precision']
