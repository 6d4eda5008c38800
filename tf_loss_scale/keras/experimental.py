"""`LossScaleOptimizer(optimizer, loss_scale)`: the TF 2.0-2.3 Keras form.

The class that `tf.keras.mixed_precision.experimental.LossScaleOptimizer`
was, rebuilt on Keras 3 optimizers so that code written for TF 2.0-2.3 runs.
"""

import copy
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import keras
import tensorflow as tf

from tf_loss_scale import checkpointing
from tf_loss_scale import gradients
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale.keras import wrapping

LossScaleArgument = Union[str, float, int, loss_scale_lib.LossScale,
                          Dict[str, Any]]


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizer')
class LossScaleOptimizer(checkpointing.HidesForwardedSlots,
                         wrapping.LossScaleOptimizerBase):
  """Loss scaling around a Keras 3 optimizer, with TF 2.3's API.

  Custom loop (gradients are unscaled before `apply_gradients`, as in TF 2.3):

  ```python
  opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.1), 'dynamic')
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_fn())
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))
  ```

  `apply_gradients` applies the step only if every gradient on every
  replica is finite; a skipped step changes no variable or slot, the loss
  scale updates either way, and `iterations` counts every call. In
  `model.fit` (which calls `scale_loss` and then passes scaled gradients)
  the loss is scaled once and unscaled once.

  Everything else is the inner optimizer's: `learning_rate`/`lr`,
  `iterations`, clipping (applied to the unscaled gradients of finite steps
  only), slots, weights and hyperparameters such as `beta_1`. Slot names are
  the Keras 3 inner optimizer's (`'momentum'`, `'velocity'`, ...).
  """

  def __init__(self, optimizer: keras.optimizers.Optimizer,
               loss_scale: LossScaleArgument):
    """Wraps `optimizer`.

    Args:
      optimizer: A Keras 3 optimizer (what `tf.keras.optimizers.*` returns).
      loss_scale: `'dynamic'` (a `DynamicLossScale` with its defaults), a
        number (a fixed scale), a `LossScale`, or the output of
        `tf_loss_scale.serialize`.

    Raises:
      TypeError: If `optimizer` is not a Keras 3 optimizer.
      ValueError: If `optimizer` is a loss scale optimizer or already
        wrapped, or `loss_scale` is None or not one of the above.
    """
    super().__init__(optimizer, _loss_scale_from(loss_scale))
    # Whether scale_loss ran on this thread since the last apply: see
    # _grads_are_scaled.
    self._scaled_loss_pending = threading.local()

  @property
  def iterations(self) -> Any:
    """The inner optimizer's step counter; skipped steps count too."""
    return self.inner_optimizer.iterations

  @iterations.setter
  def iterations(self, value: Any) -> None:
    self.inner_optimizer.iterations.assign(value)

  def scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Scales a loss whose gradients then reach `apply_gradients` scaled.

    This is the hook Keras 3's `Model.fit` calls before differentiating; a
    TF 2.3-style loop calls `get_scaled_loss` and unscales the gradients
    itself instead.

    Args:
      loss: A loss tensor or a zero-argument callable returning one.

    Returns:
      The scaled loss (or callable).
    """
    self._scaled_loss_pending.value = True
    return super().scale_loss(loss)

  def _grads_are_scaled(self) -> bool:
    # Keras 3's Model.fit calls scale_loss and then apply_gradients on the
    # same thread (one thread per replica under MirroredStrategy); a TF 2.3
    # loop never calls scale_loss and passes unscaled gradients.
    pending = getattr(self._scaled_loss_pending, 'value', False)
    self._scaled_loss_pending.value = False
    return pending

  def _on_skipped_step(self) -> None:
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

  def minimize(self, loss: gradients.Loss,
               var_list: Union[Sequence[Any], Callable[[], Sequence[Any]]],
               grad_loss: Optional[tf.Tensor] = None,
               name: Optional[str] = None,
               tape: Optional[tf.GradientTape] = None) -> Any:
    """Scales `loss`, differentiates, unscales and applies, in one call.

    Args:
      loss: A zero-argument callable returning the loss, or a loss tensor
        computed under `tape`.
      var_list: The variables to train, or a callable returning them.
      grad_loss: Optional gradient of the loss.
      name: Optional name scope for the ops.
      tape: The tape that recorded `loss` (required for a tensor loss).

    Returns:
      The `iterations` variable.

    Raises:
      ValueError: If `loss` is a tensor and no `tape` is given.
    """
    if not callable(loss) and tape is None:
      raise ValueError(
          'minimize() needs tape= when loss is a tensor; or pass the loss as '
          'a zero-argument callable.')
    tape = tape if tape is not None else tf.GradientTape()
    with tape:
      if callable(loss):
        if not callable(var_list):
          tape.watch(var_list)
        loss = loss()
      scaled_loss = self.get_scaled_loss(loss)
    if callable(var_list):
      var_list = var_list()
    var_list = list(var_list)
    grads = tape.gradient(scaled_loss, var_list, grad_loss)
    return self.apply_gradients(
        zip(self.get_unscaled_gradients(grads), var_list), name=name)

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

    Args:
      var: A model variable the optimizer was built with.
      slot_name: One of `get_slot_names()`.

    Returns:
      The slot variable.

    Raises:
      KeyError: If `var` has no slot of that name.
    """
    wanted = f'{_slot_prefix(var)}_{slot_name}'
    for variable in self.inner_optimizer.variables:
      if variable.name == wanted:
        return variable
    raise KeyError(
        f'No slot {slot_name!r} for variable {var.name!r}; slots: '
        f'{self.get_slot_names()}.')

  def get_slot_names(self) -> List[str]:
    """Returns the sorted names of the inner optimizer's slots."""
    prefixes = [_slot_prefix(v) + '_'
                for v in getattr(self, '_trainable_variables', [])]
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

  def get_config(self) -> Dict[str, Any]:
    """Returns `{'optimizer': ..., 'loss_scale': ...}`, TF 2.3's format."""
    return {
        'optimizer': keras.optimizers.serialize(self.inner_optimizer),
        'loss_scale': loss_scale_lib.serialize(self.loss_scale),
    }

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer (without its state) from `get_config()`.

    Args:
      config: `{'optimizer': <serialized optimizer>, 'loss_scale':
        <serialized LossScale>}`.
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new, unbuilt `LossScaleOptimizer`.
    """
    # Keras's deserialize edits the dict it is given; the caller's must stay
    # as it was.
    optimizer = keras.optimizers.deserialize(
        copy.deepcopy(config['optimizer']), custom_objects=custom_objects)
    return cls(optimizer, config['loss_scale'])


def _loss_scale_from(loss_scale: Any) -> loss_scale_lib.LossScale:
  if loss_scale is None:
    raise ValueError(
        "loss_scale cannot be None: pass 'dynamic', a number, a LossScale or "
        'a serialized LossScale dict.')
  if isinstance(loss_scale, dict):
    return loss_scale_lib.deserialize(loss_scale)
  return loss_scale_lib.get(loss_scale)


def _slot_prefix(var: Any) -> str:
  # The prefix Keras 3 gives variables created from a reference variable.
  if hasattr(var, 'path'):
    return var.path.replace('/', '_')
  return str(var.name).replace('/', '_').replace(':', '_')
