"""Which gradients an apply takes: told by the program's scaling calls.

One optimizer may serve Keras 3's protocol (`scale_loss`, then an apply of
gradients of the scaled loss, as `fit`) and TensorFlow's (`get_scaled_loss`,
`get_unscaled_gradients`, then `apply_gradients` of unscaled ones) over its
life:

- `apply` and `stateless_apply` always take gradients of the scaled loss;
- `apply_gradients` does too until the program follows TensorFlow's
  protocol (TF 2.4-2.15's form: from its first `get_scaled_loss`,
  `get_unscaled_gradients` or `dynamic=`; TF 2.3's: from construction);
- then it takes them as given, but in the same graph as a latest scaling
  call that was `scale_loss` (a step of `fit`), and warns, as tf_keras's
  class did, when `get_scaled_loss` or `get_unscaled_gradients` was never
  called.
Nothing is consumed by an apply: traced functions, replica threads and
split steps decide alike.
"""

import weakref
from typing import Any, List, Optional, Sequence

from absl import logging

import tensorflow as tf

from tf_loss_scale import gradients

_TF2_METHODS = ('get_scaled_loss', 'get_unscaled_gradients')


def scaled_flags(grads: Sequence[Any],
                 variables: Optional[Sequence[Any]],
                 method: str = 'apply') -> List[bool]:
  """Marks the gradients of a scaled loss, for `step.apply_step`'s `scaled`.

  Args:
    grads: One gradient per variable.
    variables: The variables, or None to mark every gradient.
    method: The apply's name, for the message.

  Returns:
    One bool per gradient: False for variables Keras overwrites with their
    "gradient" (float8 scaling factors).

  Raises:
    ValueError: If `grads` and `variables` differ in length.
  """
  if variables is None:
    return [True] * len(grads)
  if len(grads) != len(variables):
    raise ValueError(
        f'{method}() got {len(grads)} gradients for {len(variables)} '
        'variables: pass one gradient per trainable variable.')
  return [not getattr(v, 'overwrite_with_gradient', False) for v in variables]


class TwoProtocols:
  """Keras 3's and TensorFlow's protocols on one optimizer (module rule).

  A subclass gives `_current_scale()` (the loss scale now, a float32
  scalar tensor), `_keras_scale_loss(loss)` (Keras 3's `scale_loss`, in its
  peer's dtype) and `_follows_tensorflow()` (module rule), and, once per
  apply, passes `_scaled_flags(grads, variables, ...)` to
  `step.apply_step` as `scaled`.
  """

  # Set on the instance: the scaling methods ever called on it; the latest
  # one and (a weak reference to) the graph it was called in.
  _ever_called = frozenset()
  _latest_call = (None, None)

  def _follows_tensorflow(self) -> bool:
    """Whether the program follows TensorFlow's protocol (module rule)."""
    raise NotImplementedError

  def _called(self, method: str) -> None:
    """Records a call of a scaling method, and the graph it is made in."""
    # Past Keras's and TensorFlow's attribute tracking: nothing saves it.
    object.__setattr__(self, '_ever_called', self._ever_called | {method})
    object.__setattr__(self, '_latest_call', (
        method, weakref.ref(tf.compat.v1.get_default_graph())))

  def _scale_loss_in_this_graph(self) -> bool:
    method, graph = self._latest_call
    return method == 'scale_loss' and (
        graph() is tf.compat.v1.get_default_graph())

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the current scale, as Keras 3's class.

    Args and returns as `tf_loss_scale.keras.LossScaleOptimizer.scale_loss`;
    `apply_gradients` then takes gradients of the scaled loss.
    """
    self._called('scale_loss')
    return self._keras_scale_loss(loss)

  def get_scaled_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss (tensor or callable) by the current loss scale."""
    self._called('get_scaled_loss')
    return gradients.scale_loss(loss, self._current_scale())

  def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
    """Divides gradients of a scaled loss by the current loss scale.

    Args:
      grads: A list of gradients (None kept; `tf.IndexedSlices` stay sparse).

    Returns:
      A new list of the same length, each gradient in its own dtype.
    """
    self._called('get_unscaled_gradients')
    return list(gradients.unscale(list(grads), self._current_scale()))

  def _scaled_flags(self, grads: Sequence[Any],
                    variables: Optional[Sequence[Any]],
                    method: Optional[str] = None) -> Optional[List[bool]]:
    """`step.apply_step`'s `scaled` for one apply.

    `method` is `apply` or `stateless_apply` (always gradients of the scaled
    loss), or None for `apply_gradients`. Returns `scaled_flags` when the
    apply takes gradients of the scaled loss; None when it takes them as
    given.
    """
    if (method is not None or not self._follows_tensorflow() or
        self._scale_loss_in_this_graph()):
      return scaled_flags(grads, variables, method or 'apply_gradients')
    forgotten = [m for m in _TF2_METHODS if m not in self._ever_called]
    if forgotten:
      _warn_forgotten(type(self).__name__, forgotten)
    return None


def _warn_forgotten(class_name: str, methods: Sequence[str]) -> None:
  # tf_keras's words first, for those who search for them.
  logging.warning(
      'You forgot to call %s before calling %s.apply_gradients(): the '
      'gradients are applied as they are given. With TF 2.x\'s protocol, '
      'scale the loss with get_scaled_loss() and unscale its gradients with '
      'get_unscaled_gradients(); with Keras 3\'s, call scale_loss() and '
      'apply() the gradients of the scaled loss.',
      ' and '.join(f'{class_name}.{m}()' for m in methods), class_name)
