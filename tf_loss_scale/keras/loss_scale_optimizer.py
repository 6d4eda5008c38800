"""`LossScaleOptimizer`: the Keras 3 form, with TensorFlow's loss scale rule."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tf_loss_scale import gradients
from tf_loss_scale import step
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale.keras import wrapping

# Keras 3 accepts these base-optimizer arguments only at their defaults (old
# configs carry them); any other value belongs on the inner optimizer.
_BASE_OPTIMIZER_DEFAULTS = {
    'weight_decay': None,
    'clipnorm': None,
    'global_clipnorm': None,
    'clipvalue': None,
    'use_ema': False,
    'ema_momentum': 0.99,
    'ema_overwrite_frequency': None,
    'loss_scale_factor': None,
    'gradient_accumulation_steps': None,
}


@keras.saving.register_keras_serializable(
    package='tf_loss_scale', name='LossScaleOptimizer')
class LossScaleOptimizer(wrapping.LossScaleOptimizerBase):
  """Dynamic loss scaling around a Keras 3 optimizer, as in Keras 3.

  A drop-in for `keras.optimizers.LossScaleOptimizer` whose scale follows
  `tf_loss_scale.DynamicLossScale`: a step with any non-finite gradient (on
  any replica) is skipped and halves the scale; `dynamic_growth_steps`
  finite steps in a row double it. Two differences from Keras 3, both fixes:
  the scale never falls below 1 and never grows to inf, and under
  MirroredStrategy an overflow on any replica skips the step on all of them.

  `scale_loss` multiplies the loss; `apply`/`apply_gradients` take the
  gradients of that scaled loss and unscale them. `iterations` is the inner
  optimizer's, so skipped steps are not counted.

  Custom loop:

  ```python
  opt = tf_loss_scale.keras.LossScaleOptimizer(keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(loss_fn())
  opt.apply(tape.gradient(loss, model.trainable_variables),
            model.trainable_variables)
  ```

  In `model.compile(optimizer=opt)` under a `mixed_float16` policy the
  optimizer is used as it is (Keras does not wrap it again).
  """

  def __init__(self,
               inner_optimizer: keras.optimizers.Optimizer,
               initial_scale: float = 2.0**15,
               dynamic_growth_steps: int = 2000,
               name: Optional[str] = None,
               **kwargs: Any):
    """Wraps `inner_optimizer`.

    Args:
      inner_optimizer: The Keras 3 optimizer that applies the gradients.
      initial_scale: The first loss scale, a positive number. High is cheap:
        a too-high scale costs a few skipped steps.
      dynamic_growth_steps: Finite steps in a row after which the scale
        doubles, an integer of at least 1.
      name: The optimizer's name.
      **kwargs: Only Keras 3's base-optimizer arguments at their default
        values (as found in configs), and `dynamic=True`.

    Raises:
      TypeError: If `inner_optimizer` is not a Keras 3 optimizer, or a
        number is of the wrong type.
      ValueError: For `dynamic=False`, a non-default base-optimizer argument
        (set it on the inner optimizer), an unknown argument, an out of range
        number, or an inner optimizer that cannot be wrapped.
    """
    _check_kwargs(kwargs)
    try:
      loss_scale = loss_scale_lib.DynamicLossScale(
          initial_loss_scale=initial_scale,
          increment_period=dynamic_growth_steps,
          multiplier=2.0)
    except (TypeError, ValueError) as error:
      raise type(error)(
          f'initial_scale={initial_scale!r}, dynamic_growth_steps='
          f'{dynamic_growth_steps!r}: {error}') from error
    super().__init__(inner_optimizer, loss_scale, name=name)

  @property
  def initial_scale(self) -> float:
    """The loss scale training started with."""
    return self.loss_scale.initial_loss_scale

  @property
  def dynamic_growth_steps(self) -> int:
    """Finite steps in a row after which the scale doubles."""
    return self.loss_scale.increment_period

  @property
  def dynamic_scale(self) -> tf.Variable:
    """The variable holding the current loss scale."""
    return self.loss_scale.current_loss_scale

  @property
  def step_counter(self) -> tf.Variable:
    """The variable counting finite steps since the scale last changed."""
    return self.loss_scale.good_steps

  def _grads_are_scaled(self) -> bool:
    return True

  def stateless_apply(
      self, optimizer_variables: Sequence[Any], grads: Sequence[Any],
      trainable_variables: Sequence[Any]) -> Tuple[List[Any], List[Any]]:
    """Computes one step from values, leaving every variable unchanged.

    The loss scale's next state comes from `next_dynamic_state`, the same
    rule `apply` uses. Keras's TensorFlow backend optimizers can only update
    real variables, so the inner optimizer's step is run on its variables
    and they are restored afterwards. Not available under a strategy.

    Args:
      optimizer_variables: Values for `self.variables`, in that order.
      grads: Gradients of the scaled loss, one per trainable variable.
      trainable_variables: Values for the variables the optimizer was built
        with, in that order.

    Returns:
      `(new_trainable_values, new_optimizer_values)`.

    Raises:
      ValueError: If the optimizer is not built, the lists have the wrong
        lengths, or a strategy is in use.
    """
    if not self.built:
      raise ValueError(
          'stateless_apply() needs a built optimizer: call '
          'build(trainable_variables) first.')
    if tf.distribute.has_strategy():
      raise ValueError(
          'stateless_apply() is not supported under a tf.distribute strategy; '
          'use apply() inside strategy.run.')
    variables = self.variables
    model_variables = list(self._trainable_variables)
    if (len(optimizer_variables) != len(variables) or
        len(trainable_variables) != len(model_variables)):
      raise ValueError(
          f'stateless_apply() expects {len(variables)} optimizer values and '
          f'{len(model_variables)} trainable values, but got '
          f'{len(optimizer_variables)} and {len(trainable_variables)}.')
    values = {id(v): tf.convert_to_tensor(x)
              for v, x in zip(variables, optimizer_variables)}
    inner_variables = list(self.inner_optimizer.variables)
    old_model = [tf.convert_to_tensor(x) for x in trainable_variables]
    old_inner = [values[id(v)] for v in inner_variables]
    _, (new_scale, new_good_steps), (new_model, new_inner) = (
        step.stateless_step(
            grads, values[id(self.loss_scale.current_loss_scale)],
            values[id(self.loss_scale.good_steps)], self.dynamic_growth_steps,
            self.loss_scale.multiplier,
            [not getattr(v, 'overwrite_with_gradient', False)
             for v in model_variables],
            lambda unscaled: _run_on_values(
                self.inner_optimizer, unscaled,
                model_variables + inner_variables, old_model + old_inner,
                len(model_variables)),
            lambda: (old_model, old_inner)))
    values.update(zip(map(id, inner_variables), new_inner))
    values[id(self.loss_scale.current_loss_scale)] = new_scale
    values[id(self.loss_scale.good_steps)] = new_good_steps
    return list(new_model), [values[id(v)] for v in variables]

  def get_config(self) -> Dict[str, Any]:
    """Returns exactly the constructor's arguments, as Keras 3 does."""
    return {
        'name': self.name,
        'inner_optimizer': keras.saving.serialize_keras_object(
            self.inner_optimizer),
        'initial_scale': self.initial_scale,
        'dynamic_growth_steps': self.dynamic_growth_steps,
    }

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer (without its state) from `get_config()`.

    Args:
      config: The output of `get_config`, or of Keras 3's own
        `LossScaleOptimizer.get_config`.
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new, unbuilt `LossScaleOptimizer`.
    """
    config = dict(config)
    inner = keras.saving.deserialize_keras_object(
        config.pop('inner_optimizer'), custom_objects=custom_objects)
    return cls(inner, **config)


def _check_kwargs(kwargs: Dict[str, Any]) -> None:
  if not kwargs.pop('dynamic', True):
    raise ValueError(
        'LossScaleOptimizer does not take dynamic=False: for a fixed scale, '
        'set loss_scale_factor on the inner optimizer instead (and do not '
        'wrap it), or use tf_loss_scale.keras.experimental.LossScaleOptimizer'
        '(optimizer, loss_scale=<number>).')
  for name, default in _BASE_OPTIMIZER_DEFAULTS.items():
    if name in kwargs and kwargs.pop(name) != default:
      raise ValueError(
          f'LossScaleOptimizer does not take {name}: set {name} on the '
          'inner_optimizer instead.')
  if kwargs:
    raise ValueError(
        f'LossScaleOptimizer got unknown arguments: {sorted(kwargs)}.')


def _run_on_values(inner: keras.optimizers.Optimizer, grads: List[Any],
                   targets: List[Any], values: List[tf.Tensor],
                   num_model: int) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
  """Runs `inner.apply` on `values` in `targets`, then restores `targets`."""
  saved = [tf.identity(_read(t)) for t in targets]
  for target, value in zip(targets, values):
    target.assign(value)
  inner.apply(grads, targets[:num_model])
  results = [tf.identity(_read(t)) for t in targets]
  for target, value in zip(targets, saved):
    target.assign(value)
  return results[:num_model], results[num_model:]


def _read(variable: Any) -> tf.Tensor:
  return tf.convert_to_tensor(variable)
