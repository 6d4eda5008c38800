"""`LossScaleOptimizer(optimizer, loss_scale)`: the TF 2.0-2.3 Keras form.

The class that `tf.keras.mixed_precision.experimental.LossScaleOptimizer`
was, for code written for TF 2.0-2.3. Its path is picked by the type of the
optimizer it wraps:

- a Keras 3 optimizer (`keras.optimizers.*`, what `tf.keras` is on TF 2.16
  and later): this module's class;
- a tf_keras optimizer, legacy (`tf_keras.optimizers.legacy.*`, what TF 2.3
  wrapped) or not: `tf_keras_optimizer.LossScaleOptimizerV2`/`V3`, imported
  only then.

`isinstance(opt, LossScaleOptimizer)` holds on every path. The contract is
TF 2.3's everywhere: `apply_gradients` takes unscaled gradients, `minimize`
takes the loss, `get_scaled_loss`/`get_unscaled_gradients` are for custom
loops, and nothing is remembered between calls.
"""

import sys
from typing import Any, List, Optional, Sequence

import keras
import tensorflow as tf

from tf_loss_scale import checkpointing
from tf_loss_scale import gradients
from tf_loss_scale import precision
from tf_loss_scale.keras import tf23_surface
from tf_loss_scale.keras import wrapping

LossScaleArgument = tf23_surface.LossScaleArgument


class _PathByInnerOptimizer(type):
  """Builds the class for the inner optimizer's type; `isinstance` spans all.

  Only `LossScaleOptimizer` itself dispatches: a subclass is always itself.
  """

  def __call__(cls, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    if cls is LossScaleOptimizer and _is_tf_keras_optimizer(optimizer):
      # pylint: disable=g-import-not-at-top
      from tf_loss_scale.keras import tf_keras_optimizer
      return tf_keras_optimizer.wrap(optimizer, *args, **kwargs)
    return super().__call__(optimizer, *args, **kwargs)

  def __instancecheck__(cls, instance: Any) -> bool:
    if cls is LossScaleOptimizer and isinstance(instance,
                                                tf23_surface.TF23Surface):
      return True
    return super().__instancecheck__(instance)


def _is_tf_keras_optimizer(optimizer: Any) -> bool:
  # No tf_keras optimizer can exist before tf_keras is imported, so it is
  # never imported here.
  tf_keras = sys.modules.get('tf_keras')
  if tf_keras is None:
    return False
  return isinstance(optimizer, (tf_keras.optimizers.legacy.Optimizer,
                                tf_keras.optimizers.Optimizer))


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizer')
class LossScaleOptimizer(tf23_surface.TF23Surface,
                         checkpointing.HidesForwardedSlots,
                         wrapping.LossScaleOptimizerBase,
                         metaclass=_PathByInnerOptimizer):
  """Loss scaling with TF 2.3's API, around any Keras or tf_keras optimizer.

  Custom loop (as in TF 2.3):

  ```python
  opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.1), 'dynamic')
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_fn())
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))
  ```

  `apply_gradients` (and `apply`) take unscaled gradients and apply them
  only if every gradient on every replica is finite; a skipped step changes
  no variable or slot, the loss scale updates either way, and `iterations`
  counts every call (an inner optimizer that accumulates gradients is left
  untouched by a skipped step instead). `minimize` takes the loss.

  Everything else is the inner optimizer's: `learning_rate`/`lr`,
  `iterations`, clipping (of the unscaled gradients of finite steps only),
  slots, weights, and its hyperparameters (the arguments in its
  `get_config()`, read and written on it). The checkpoint is the inner
  optimizer's plus a `loss_scale` dependency, so checkpoints move between
  the wrapper and the bare inner optimizer in both directions.

  With a Keras 3 inner optimizer, Keras 3's `model.fit` cannot be used: it
  passes gradients of `scale_loss` to `apply_gradients`, which here takes
  unscaled ones (see `scale_loss`). Use `tf_loss_scale.keras.
  LossScaleOptimizer` there, or a tf_keras optimizer with tf_keras.
  """

  def __init__(self, optimizer: keras.optimizers.Optimizer,
               loss_scale: LossScaleArgument):
    """Wraps `optimizer`.

    Args:
      optimizer: A Keras 3 optimizer, or a tf_keras optimizer (then the
        object made is of a tf_keras class, still an instance of this one).
      loss_scale: `'dynamic'` (a `DynamicLossScale` with its defaults), a
        number (a fixed scale), a `LossScale`, or the output of
        `tf_loss_scale.serialize`.

    Raises:
      TypeError: If `optimizer` is not an optimizer of either family.
      ValueError: If `optimizer` is a loss scale optimizer or already
        wrapped, or `loss_scale` is None or not one of the above.
    """
    super().__init__(optimizer, tf23_surface.loss_scale_from(loss_scale))
    precision.warn_if_scaling_is_not_needed(
        keras.mixed_precision.global_policy().compute_dtype,
        'LossScaleOptimizer')
    names = tf23_surface.hyperparameter_names(optimizer)
    # Keras's base __init__ gave the wrapper its own unused copies of some
    # hyperparameters (weight_decay, use_ema, ...); drop them so that every
    # hyperparameter is read and written on the inner optimizer.
    for name in names & set(self.__dict__):
      del self.__dict__[name]
    self._hyperparameter_names = names

  @property
  def iterations(self) -> Any:
    """The inner optimizer's step counter; skipped steps count too."""
    return self.inner_optimizer.iterations

  @iterations.setter
  def iterations(self, value: Any) -> None:
    self.inner_optimizer.iterations.assign(value)

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Refused: Keras 3's protocol conflicts with TF 2.3's `apply_gradients`.

    Keras 3's `model.fit` (and Keras 3 custom loops) call `scale_loss` and
    then pass the gradients of the scaled loss to `apply_gradients`; this
    class's `apply_gradients` takes unscaled gradients, as in TF 2.3, and
    cannot tell the two apart. Refusing here, where the mix starts, is what
    keeps both from silently taking a step `loss_scale` times too large.

    Raises:
      RuntimeError: Always, saying what to use instead.
    """
    raise RuntimeError(
        'The experimental (TF 2.3) LossScaleOptimizer has no scale_loss(): '
        'its apply_gradients() takes unscaled gradients. In a custom loop, '
        'use get_scaled_loss() and get_unscaled_gradients() (or minimize()). '
        'For Keras 3 model.fit, use tf_loss_scale.keras.LossScaleOptimizer('
        'inner_optimizer, initial_scale, dynamic_growth_steps) instead, or a '
        'tf_keras optimizer with tf_keras (TF_USE_LEGACY_KERAS=1).')

  def _on_skipped_step(self) -> None:
    # TF 2.3 counts a skipped step in `iterations`. An accumulating optimizer
    # has no such counter of its own (Keras derives `iterations` from its
    # micro-step count), and counting a skipped micro-step there would end
    # its accumulation window early with a gradient missing: it is left
    # untouched, so its window is always its number of finite micro-steps.
    if not self.inner_optimizer.gradient_accumulation_steps:
      self.inner_optimizer.iterations.assign_add(1)

  def apply_gradients(self, grads_and_vars: Any, name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True) -> Any:
    """Applies unscaled gradients if they are all finite on every replica.

    Call it in a replica context (inside `strategy.run`, or with no strategy).

    Args:
      grads_and_vars: `(gradient, variable)` pairs; gradients already
        unscaled by `get_unscaled_gradients`.
      name: Optional name scope for the ops.
      experimental_aggregate_gradients: Must be True: Keras 3 optimizers
        always sum the gradients across replicas.

    Returns:
      The `iterations` variable.

    Raises:
      ValueError: If `experimental_aggregate_gradients` is False, or in a
        cross-replica context.
    """
    if not experimental_aggregate_gradients:
      raise ValueError(
          'experimental_aggregate_gradients=False is not supported: Keras 3 '
          'optimizers always sum gradients across replicas. Pass the '
          'per-replica gradients instead.')
    with tf.name_scope(name or self.name):
      return super().apply_gradients(grads_and_vars)

  def stateless_apply(self, optimizer_variables: Sequence[Any],
                      grads: Sequence[Any],
                      trainable_variables: Sequence[Any]) -> Any:
    """Not offered: TF 2.3's optimizer had no stateless form.

    Raises:
      NotImplementedError: Always; `tf_loss_scale.keras.LossScaleOptimizer`
        has `stateless_apply`.
    """
    raise NotImplementedError(
        'The experimental LossScaleOptimizer has no stateless_apply(); use '
        'tf_loss_scale.keras.LossScaleOptimizer.')

  # ---- slots and weights (the inner optimizer's) --------------------------

  def add_slot(self, var: Any, slot_name: str,
               initializer: Any = 'zeros') -> Any:
    """Creates a variable of the inner optimizer shaped like `var`.

    Args:
      var: The model variable the slot belongs to.
      slot_name: The slot's name.
      initializer: A Keras initializer or its name.

    Returns:
      The new slot variable.
    """
    return self.inner_optimizer.add_variable_from_reference(
        var, name=slot_name, initializer=initializer)

  def get_slot(self, var: Any, slot_name: str) -> Any:
    """Returns the inner optimizer's slot `slot_name` for `var`.

    Found by `var`'s identity: Keras names a slot after its variable, and
    two variables may share a name (two unnamed `tf.Variable`s do), so among
    slots of the same name the one created for `var`'s position is taken.

    Args:
      var: A model variable the optimizer was built with.
      slot_name: One of `get_slot_names()`.

    Returns:
      The slot variable.

    Raises:
      KeyError: If `var` is not one of the optimizer's variables or has no
        slot of that name.
    """
    trainable = list(getattr(self, '_trainable_variables', []))
    position = next((i for i, v in enumerate(trainable) if v is var), None)
    if position is None:
      raise KeyError(
          f'{_describe(var)} is not a variable this optimizer was built '
          'with; call build(variables) or apply the gradients first.')
    prefix = _slot_prefix(var)
    # Variables before `var` with the same name own the earlier slots of
    # that name: Keras creates slots in the order of the variables.
    rank = sum(1 for v in trainable[:position] if _slot_prefix(v) == prefix)
    same_name = [v for v in self.inner_optimizer.variables
                 if v.name == f'{prefix}_{slot_name}']
    if rank >= len(same_name):
      raise KeyError(
          f'No slot {slot_name!r} for {_describe(var)}; slots: '
          f'{self.get_slot_names()}.')
    return same_name[rank]

  def get_slot_names(self) -> List[str]:
    """Returns the sorted names of the inner optimizer's slots."""
    prefixes = {_slot_prefix(v) + '_'
                for v in getattr(self, '_trainable_variables', [])}
    return sorted({
        variable.name[len(prefix):]
        for variable in self.inner_optimizer.variables
        for prefix in prefixes
        if variable.name.startswith(prefix)
    })

  @property
  def weights(self) -> List[Any]:
    """The inner optimizer's variables (iterations, hyperparameters, slots)."""
    return list(self.inner_optimizer.variables)

  def get_weights(self) -> List[Any]:
    """Returns the values of `weights` as NumPy arrays."""
    return [variable.numpy() for variable in self.weights]

  def set_weights(self, weights: Sequence[Any]) -> None:
    """Sets the inner optimizer's variables from `get_weights()` values."""
    self.inner_optimizer.set_weights(weights)

  # ---- config -------------------------------------------------------------

  def _trackable_children(self, save_type='checkpoint', **kwargs):
    # TF 2.3's checkpoint format: the inner optimizer's dependencies plus
    # `loss_scale`, so that a checkpoint of the wrapper restores into the
    # bare inner optimizer and back. The wrapper's own unused Keras state
    # (its iterations and learning rate) is left out.
    children = dict(self.inner_optimizer._trackable_children(  # pylint: disable=protected-access
        save_type, **kwargs))
    children['loss_scale'] = self.loss_scale
    return children

  # Keras 3's (de)serialization of the inner optimizer, for TF23Surface's
  # get_config/from_config.
  _serialize_inner = staticmethod(keras.optimizers.serialize)
  _deserialize_inner = staticmethod(keras.optimizers.deserialize)


def _describe(var: Any) -> str:
  return f'variable {getattr(var, "name", var)!r} of shape {tuple(var.shape)}'


def _slot_prefix(var: Any) -> str:
  # The prefix Keras 3 gives variables created from a reference variable.
  if hasattr(var, 'path'):
    return var.path.replace('/', '_')
  return str(var.name).replace('/', '_').replace(':', '_')
