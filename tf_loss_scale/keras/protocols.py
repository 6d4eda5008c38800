"""Which gradients `apply_gradients` takes: one rule for two protocols.

Keras 3's (`scale_loss`, then applies take gradients of the scaled loss) and
TensorFlow's (`get_scaled_loss`, `get_unscaled_gradients`, then applies take
unscaled ones). The first scaling method called on an optimizer fixes its
protocol for life; a method of the other raises where it is called. Nothing
is consumed by a call, and the choice is made in Python at trace time, the
same on every replica. See docs/differences.md.
"""

from typing import Any, List, Optional, Sequence

from tf_loss_scale import gradients

_KERAS3 = 'scale_loss'
_TENSORFLOW = 'get_scaled_loss/get_unscaled_gradients'


def scaled_flags(grads: Sequence[Any],
                 variables: Optional[Sequence[Any]]) -> List[bool]:
  """Marks the gradients of a scaled loss, for `step.apply_step`'s `scaled`.

  Args:
    grads: One gradient per variable.
    variables: The variables, or None to mark every gradient.

  Returns:
    One bool per gradient: False for variables Keras overwrites with their
    "gradient" (float8 scaling factors receive values, not derivatives).

  Raises:
    ValueError: If `grads` and `variables` differ in length.
  """
  if variables is None:
    return [True] * len(grads)
  if len(grads) != len(variables):
    raise ValueError(
        f'apply() got {len(grads)} gradients for {len(variables)} variables: '
        'pass one gradient per trainable variable.')
  return [not getattr(v, 'overwrite_with_gradient', False) for v in variables]


class TwoProtocols:
  """Keras 3's and TensorFlow's protocols on one optimizer (module rule).

  A subclass gives `_current_scale()` (the loss scale now, a float32
  scalar tensor; the Keras 3 form has one) and passes `_scaled_flags(grads,
  variables)` to `step.apply_step` as `scaled`.
  """

  _protocol = None  # Set on the instance by its first scaling call.

  def _follow(self, protocol: str, method: str) -> None:
    if self._protocol is None:
      self._protocol = protocol
    elif self._protocol != protocol:
      raise RuntimeError(
          f'{type(self).__name__}.{method}() cannot be used on an optimizer '
          f'that already follows the {self._protocol} protocol: with '
          'scale_loss() (as Keras 3\'s model.fit calls it) apply_gradients() '
          'takes the gradients of the scaled loss and unscales them; with '
          'get_scaled_loss() and get_unscaled_gradients() it takes unscaled '
          'ones. Use one protocol per optimizer (a new LossScaleOptimizer for '
          'the other).')

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the scale; applies then take its gradients.

    Args and returns as `tf_loss_scale.keras.LossScaleOptimizer.scale_loss`.

    Raises:
      RuntimeError: If `get_scaled_loss` or `get_unscaled_gradients` was
        called on this optimizer.
    """
    self._follow(_KERAS3, 'scale_loss')
    return gradients.scale_loss(loss, self._current_scale())

  def get_scaled_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss (tensor or callable) by the current loss scale.

    Raises:
      RuntimeError: If `scale_loss` was called on this optimizer.
    """
    self._follow(_TENSORFLOW, 'get_scaled_loss')
    return gradients.scale_loss(loss, self._current_scale())

  def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
    """Divides gradients of a scaled loss by the current loss scale.

    Args:
      grads: A list of gradients; `None` entries and `tf.IndexedSlices` are
        kept as they are (slices rescaled, still sparse).

    Returns:
      A new list of the same length, each gradient in its own dtype.

    Raises:
      RuntimeError: If `scale_loss` was called on this optimizer.
    """
    self._follow(_TENSORFLOW, 'get_unscaled_gradients')
    return list(gradients.unscale(list(grads), self._current_scale()))

  def _scaled_flags(self, grads: Sequence[Any],
                    variables: Optional[Sequence[Any]]) -> Optional[List[bool]]:
    """`step.apply_step`'s `scaled`: None unless `scale_loss` was called."""
    flags = scaled_flags(grads, variables)
    return flags if self._protocol == _KERAS3 else None
