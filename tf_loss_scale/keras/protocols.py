"""Which gradients an apply takes: decided by the method called.

Keras 3's protocol (`scale_loss`, then an apply of the gradients of the
scaled loss) and TensorFlow's (`get_scaled_loss`, `get_unscaled_gradients`,
then `apply_gradients` of unscaled ones) on one optimizer, which may follow
both over its life (a `fit` warm-up, then a TF 2.4-2.15 custom loop):

- `apply` and `stateless_apply` take gradients of the scaled loss, always
  (TF 2.4-2.15's class had neither) where the subclass says so;
- `apply_gradients` takes gradients of the scaled loss when `scale_loss`
  was called for its step (since the last apply, as `fit` calls it), and
  takes them as given otherwise;
- a step's scaling calls must all be of one protocol: a call of the other
  raises where it is called (the gradients would be unscaled twice);
- an apply that takes gradients as given warns, naming the method
  forgotten, when `get_scaled_loss` or `get_unscaled_gradients` was never
  called on the optimizer (nor `scale_loss`), as tf_keras's class warned.

Nothing of an earlier step decides: the choice is made in Python when the
apply is called or traced, the same on every replica. See
docs/differences.md.
"""

from typing import Any, List, Optional, Sequence

from absl import logging

from tf_loss_scale import gradients

_KERAS3 = 'scale_loss'
_TENSORFLOW = 'get_scaled_loss/get_unscaled_gradients'


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
    "gradient" (float8 scaling factors receive values, not derivatives).

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
  scalar tensor; the Keras 3 form has one) and, once per apply, passes
  `_scaled_flags(grads, variables, ...)` to `step.apply_step` as `scaled`.
  """

  # Set on the instance: the protocol of the scaling calls since the last
  # apply and those calls' methods; every scaling method ever called.
  _this_step = None
  _this_step_calls = frozenset()
  _ever_called = frozenset()

  def _follow(self, protocol: str, method: str) -> None:
    if self._this_step not in (None, protocol):
      raise RuntimeError(
          f'{type(self).__name__}.{method}() cannot follow a call of '
          f'{self._this_step} in the same step: with scale_loss() (as Keras '
          "3's model.fit calls it) the next apply takes the gradients of the "
          'scaled loss and unscales them; with get_scaled_loss() and '
          'get_unscaled_gradients() it takes unscaled ones. Use the methods '
          'of one protocol between two applies.')
    self._this_step = protocol
    self._this_step_calls |= {method}
    self._ever_called |= {method}

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the scale; the next apply takes its gradients.

    Args and returns as `tf_loss_scale.keras.LossScaleOptimizer.scale_loss`.

    Raises:
      RuntimeError: If `get_scaled_loss` or `get_unscaled_gradients` was
        called since the last apply.
    """
    self._follow(_KERAS3, 'scale_loss')
    return gradients.scale_loss(loss, self._current_scale())

  def get_scaled_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss (tensor or callable) by the current loss scale.

    Raises:
      RuntimeError: If `scale_loss` was called since the last apply.
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
      RuntimeError: If `scale_loss` was called since the last apply.
    """
    self._follow(_TENSORFLOW, 'get_unscaled_gradients')
    return list(gradients.unscale(list(grads), self._current_scale()))

  def _scaled_flags(self, grads: Sequence[Any],
                    variables: Optional[Sequence[Any]],
                    method: Optional[str] = None) -> Optional[List[bool]]:
    """`step.apply_step`'s `scaled` for one apply, which ends the step.

    Args:
      grads: The gradients the apply was given.
      variables: Their variables, or None to mark every gradient.
      method: The name of a method that takes gradients of the scaled loss
        whatever the step called (`apply`, `stateless_apply`), or None for
        one that follows the step's scaling calls (`apply_gradients`).

    Returns:
      The flags of `scaled_flags` when the apply takes gradients of the
      scaled loss; None when it takes them as given.

    Raises:
      RuntimeError: If `method` is given and `get_unscaled_gradients` was
        called in the step (the gradients would be unscaled twice).
    """
    step_calls = self._this_step_calls
    self._this_step, self._this_step_calls = None, frozenset()
    if method is not None:
      if 'get_unscaled_gradients' in step_calls:
        raise RuntimeError(
            f'{type(self).__name__}.{method}() takes gradients of the scaled '
            'loss and unscales them, but get_unscaled_gradients() was called '
            'since the last apply: pass the unscaled gradients to '
            'apply_gradients() instead.')
      return scaled_flags(grads, variables, method)
    if 'scale_loss' in step_calls:
      return scaled_flags(grads, variables, 'apply_gradients')
    if 'scale_loss' not in self._ever_called:
      forgotten = [m for m in ('get_scaled_loss', 'get_unscaled_gradients')
                   if m not in self._ever_called]
      if forgotten:
        _warn_forgotten(type(self).__name__, forgotten)
    return None


def _warn_forgotten(class_name: str, methods: Sequence[str]) -> None:
  # tf_keras's words first, for those who search for them.
  logging.warning(
      'You forgot to call %s before calling %s.apply_gradients(): the '
      'gradients are applied as they are given. With TF 2.4-2.15\'s '
      'protocol, scale the loss with get_scaled_loss() and unscale its '
      'gradients with get_unscaled_gradients(); with Keras 3\'s, call '
      'scale_loss() and apply the gradients of the scaled loss.',
      ' and '.join(f'{class_name}.{m}()' for m in methods), class_name)
