"""TF 2.1-2.3's dtype `Policy` with a loss scale, and `compile` applying it.

On the Keras that `tf.keras` is; `compat.install()` puts these under TF 2.3's
names and wraps `compile` (on the class that defines it) with
`compile_with_policy_loss_scale`.
"""

import functools
import inspect
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf

from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale.keras.experimental import base

_keras = tf.keras
# Keras 3.3's layers take only its float (and quantized) policy class.
_KerasPolicy = getattr(getattr(_keras, 'dtype_policies', None),
                       'FloatDTypePolicy', _keras.mixed_precision.Policy)


# Registered, so that layer configs holding one load it back.
@_keras.utils.register_keras_serializable('tf_loss_scale')
class Policy(_KerasPolicy):
  """A Keras dtype policy (layers take it) carrying TF 2.3's `loss_scale`."""

  def __init__(self, name: str, loss_scale: Any = 'auto'):
    """Makes the policy.

    Args:
      name: A Keras policy name, e.g. `'mixed_float16'` or `'float32'`.
      loss_scale: `'auto'` (`'dynamic'` for `'mixed_float16'`, else None),
        None, or as the experimental `LossScaleOptimizer` takes it.

    Raises:
      TypeError, ValueError: If `name` or `loss_scale` is none of these.
    """
    super().__init__(name)
    self._default_loss_scale = isinstance(loss_scale, str) and (
        loss_scale == 'auto')
    if self._default_loss_scale:
      loss_scale = 'dynamic' if name == 'mixed_float16' else None
    elif loss_scale is not None and self.compute_dtype != 'float16':
      logging.warning('Policy %r computes in %s, which needs no loss_scale '
                      '(got %r).', name, self.compute_dtype, loss_scale)
    self._loss_scale = (None if loss_scale is None else
                        base.loss_scale_from(loss_scale))

  @property
  def loss_scale(self) -> Optional[loss_scale_lib.LossScale]:
    """The `LossScale` compiled models train with, or None."""
    return self._loss_scale

  def __repr__(self) -> str:
    return f'<Policy "{self.name}", loss_scale={self._loss_scale}>'

  def get_config(self) -> Dict[str, Any]:
    config = super().get_config()
    if not self._default_loss_scale:  # TF 2.3 left the default out.
      config['loss_scale'] = (None if self._loss_scale is None else
                              loss_scale_lib.serialize(self._loss_scale))
    return config

  @classmethod
  def from_config(cls, config: Dict[str, Any], custom_objects: Any = None
                 ) -> 'Policy':
    del custom_objects  # Unused: the loss scales are this library's.
    return cls(**config)


def set_policy(policy: Any) -> None:
  """Sets the global policy; a name is `Policy(name)`, None is floatx's."""
  policy = _keras.backend.floatx() if policy is None else policy
  _keras.mixed_precision.set_global_policy(
      Policy(policy) if isinstance(policy, str) else policy)


def global_policy() -> Policy:
  """The global policy; one that Keras set is given its default loss scale."""
  policy = _keras.mixed_precision.global_policy()
  return policy if isinstance(policy, Policy) else Policy(policy.name)


def get_layer_policy(layer: Any) -> Any:
  """Returns `layer.dtype_policy`; a ValueError if `layer` is no layer."""
  if not isinstance(layer, _keras.layers.Layer):
    raise ValueError(f'get_layer_policy() takes a Keras layer, got {layer!r}.')
  return layer.dtype_policy


def compile_with_policy_loss_scale(
    compile_fn: Callable[..., Any], tf24_form: Optional[type] = None
) -> Callable[..., Any]:
  """Wraps `Model.compile` to apply the loss scale of the model's `Policy`.

  As TF 2.3's: the optimizer of a model whose `Policy` has a loss scale is
  wrapped in the experimental `LossScaleOptimizer` with it, unless it is a
  loss scale optimizer; with a `Policy` without one, Keras 3 is told not to
  add its own. With `tf24_form`, a Keras `LossScaleOptimizer` that
  `compile` made (under `mixed_float16`) is replaced by `tf24_form` with
  the same inner optimizer, settings and name, so that TF 2.4-2.15 code
  asking `isinstance` of that name takes its loss scale branch (saved
  models still name the optimizer given to `compile`).

  Args:
    compile_fn: The `compile` to wrap, a function taking the model first.
    tf24_form: The class that replaces a compile-made Keras 3
      `LossScaleOptimizer`, or None.

  Returns:
    The wrapper, for the class that defines `compile_fn`.
  """
  can_refuse_scaling = 'auto_scale_loss' in inspect.signature(
      compile_fn).parameters
  keras_wrapper = (getattr(_keras.optimizers, 'LossScaleOptimizer', None)
                   if tf24_form is not None else None)

  @functools.wraps(compile_fn)
  def compile(model, optimizer='rmsprop', *args, **kwargs):  # pylint: disable=redefined-builtin
    policy = model.dtype_policy
    if isinstance(policy, Policy) and policy.loss_scale is not None:
      optimizer = _keras.optimizers.get(optimizer)
      if not guards.is_loss_scale_optimizer(optimizer):
        optimizer = base.LossScaleOptimizer(optimizer, policy.loss_scale)
    elif isinstance(policy, Policy) and can_refuse_scaling:
      kwargs.setdefault('auto_scale_loss', False)
    result = compile_fn(model, optimizer, *args, **kwargs)
    made = getattr(model, 'optimizer', None)
    # Exactly Keras's class (a subclass is someone's choice), and not the
    # one the caller passed.
    if (keras_wrapper is not None and type(made) is keras_wrapper and
        made is not optimizer):
      guards.release(made.inner_optimizer)
      model.optimizer = tf24_form(
          made.inner_optimizer, initial_scale=made.initial_scale,
          dynamic_growth_steps=made.dynamic_growth_steps, name=made.name)
    return result

  return compile
