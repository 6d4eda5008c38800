"""The check the Keras 3 form makes on the Keras 3 optimizer it wraps."""

from typing import Any

import keras

from tf_loss_scale.keras import ownership


def check_inner_optimizer(inner_optimizer: Any) -> None:
  """Refuses what no Keras loss scale optimizer of this library can wrap.

  Args:
    inner_optimizer: The optimizer about to be wrapped.

  Raises:
    TypeError: If it is not a Keras 3 optimizer.
    ValueError: If it is a loss scale optimizer, or is already wrapped by a
      live wrapper (it would take two steps per step and keep two scales).
  """
  if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
    raise ValueError(
        'inner_optimizer is already a loss scale optimizer '
        f'({type(inner_optimizer).__name__}); wrap the plain optimizer '
        'instead.')
  if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
    raise TypeError(
        'inner_optimizer must be a Keras 3 optimizer (keras.optimizers.*), '
        f'but got {inner_optimizer!r} of type '
        f'{type(inner_optimizer).__name__}.')
  ownership.check_not_wrapped(inner_optimizer, 'inner_optimizer')
