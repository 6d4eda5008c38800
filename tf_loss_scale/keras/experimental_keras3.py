"""The TF 2.0-2.3 `LossScaleOptimizer` around Keras 3 optimizers.

Imported when `experimental.LossScaleOptimizer` is given a Keras 3
optimizer. The class subclasses `keras.optimizers.LossScaleOptimizer` for
one reason: under a `mixed_float16` policy, Keras 3's `compile` wraps every
optimizer that is not one in Keras's own, which would scale the loss again.
None of Keras's code runs on it: Keras's `__init__` and `build` would give
it state of its own (its own iterations, learning rate, loss scale, and with
`use_ema` or `gradient_accumulation_steps` a model-sized copy of the inner
optimizer's), and Keras's attributes differ between releases. Every public
member of Keras's classes is therefore either defined here, forwarded to
the inner optimizer (the rule in `experimental`), or one of `assign`,
`assign_add` and `assign_sub`, which only act on the variable they are
given.
"""

from typing import Any, Iterable, List, Optional, Sequence, Tuple

from absl import logging
import keras
import tensorflow as tf

from tf_loss_scale import private_api
from tf_loss_scale import distribute
from tf_loss_scale.keras import experimental
from tf_loss_scale.keras import families
from tf_loss_scale.keras import keras3_support
from tf_loss_scale.keras import slots


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizer')
class LossScaleOptimizer(slots.SlotsByVariable,
                         experimental.LossScaleOptimizer,
                         private_api.HidesForwardedSlots,
                         keras.optimizers.LossScaleOptimizer):
  """`experimental.LossScaleOptimizer` around a Keras 3 optimizer.

  Keras 3's `model.fit` works: it calls `scale_loss`, after which `apply`
  and `apply_gradients` take the gradients of the scaled loss (the rule in
  `tf_loss_scale.keras.protocols`); TF 2.3's loops, which unscale them with
  `get_unscaled_gradients`, work as before.
  """

  _keras = keras
  _kind = families.KERAS3
  # Keras's tools for optimizer implementations: the inner optimizer's.
  _INNER_METHODS = frozenset({
      'add_variable', 'add_variable_from_reference',
      'add_optimizer_variables', 'exclude_from_weight_decay', 'update_step',
      'finalize_variable_values'})

  @classmethod
  def _check_inner_optimizer(cls, optimizer: Any) -> None:
    super()._check_inner_optimizer(optimizer)
    keras3_support.check_replicas_are_summed('LossScaleOptimizer()')
    if getattr(optimizer, 'loss_scale_factor', None) is not None:
      raise ValueError(
          f'optimizer has loss_scale_factor={optimizer.loss_scale_factor!r}; '
          'the loss would be scaled twice. Create it with '
          'loss_scale_factor=None.')

  def _check_family_runs_here(self, where: str) -> None:
    keras3_support.check_replicas_are_summed(where)

  @property
  def built(self) -> bool:
    """Whether the inner optimizer has its variables."""
    return self.inner_optimizer.built

  @property
  def variables(self) -> List[Any]:
    """The loss scale's variables, then the inner optimizer's."""
    return list(self.loss_scale.variables) + list(
        self.inner_optimizer.variables)

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the inner optimizer's variables for `var_list`.

    Args:
      var_list: The trainable variables this optimizer will update.
    """
    if not self.inner_optimizer.built:
      self._build_inner(var_list)

  def check_finite(self, grads: Iterable[Any]) -> tf.Tensor:
    """Tells whether every gradient is finite, summed across replicas.

    Works in a replica or a cross-replica context, or with no strategy.

    Args:
      grads: A list of gradients (None entries are ignored).

    Returns:
      A scalar bool tensor, the same on every replica.
    """
    return distribute.all_finite_in_any_context(list(grads))

  # ---- the step -----------------------------------------------------------

  def apply(self, grads: Sequence[Any],
            trainable_variables: Optional[Sequence[Any]] = None) -> None:
    """Applies the gradients if their sums are all finite.

    The gradients are unscaled ones, or after `scale_loss` those of the
    scaled loss (`tf_loss_scale.keras.protocols`). Call it in a replica
    context (inside `strategy.run`, or with no strategy). A skipped step
    changes no model or optimizer variable; the loss scale is updated
    either way.

    Args:
      grads: One gradient per variable (None allowed).
      trainable_variables: The variables; optional once the optimizer is
        built, required the first time.

    Raises:
      ValueError: In a cross-replica context, under an unsupported strategy,
        or without variables before the optimizer is built.
    """
    grads = list(grads)
    if trainable_variables is None:
      if not self.built:
        raise ValueError(
            'LossScaleOptimizer.apply() needs trainable_variables the first '
            'time it is called (or call build(variables) first).')
    else:
      trainable_variables = list(trainable_variables)
      if len(grads) != len(trainable_variables):
        raise ValueError(
            f'apply() got {len(grads)} gradients for '
            f'{len(trainable_variables)} variables.')
      with tf.init_scope():  # Out of any tf.function, as the Keras 3 form.
        self.build(trainable_variables)
    # Keras 3's apply sums the gradients across replicas itself.
    self._apply_step(
        grads, lambda g: self.inner_optimizer.apply(g, trainable_variables),
        inner_sums=True, variables=trainable_variables)

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True) -> Any:
    """Applies the gradients if their sums are all finite.

    Args:
      grads_and_vars: `(gradient, variable)` pairs; gradients unscaled by
        `get_unscaled_gradients`, or after `scale_loss` those of the scaled
        loss (`tf_loss_scale.keras.protocols`).
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
    pairs = list(grads_and_vars)
    with tf.name_scope(name or self.name):
      self.apply([g for g, _ in pairs], [v for _, v in pairs])
    return self.iterations

  def _on_skipped_step(self) -> Any:
    # An accumulating optimizer has no counter of its own (Keras derives
    # `iterations` from its micro-step count), and counting a skipped
    # micro-step there would end its accumulation window early with a
    # gradient missing: it is left untouched, so its window is always its
    # number of finite micro-steps.
    if getattr(self.inner_optimizer, 'gradient_accumulation_steps', None):
      return None
    return super()._on_skipped_step()

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

  def _new_slot(self, var: Any, slot_name: str, initializer: Any) -> Any:
    return self.inner_optimizer.add_variable_from_reference(
        var, name=slot_name, initializer=initializer)

  def save_own_variables(self, store: Any) -> None:
    """Saves `variables` (loss scale, then inner optimizer) into `store`."""
    for i, variable in enumerate(self.variables):
      store[str(i)] = variable.numpy()

  def load_own_variables(self, store: Any) -> None:
    """Restores `variables` from what `save_own_variables` stored.

    As Keras's optimizers do, nothing is restored (and a warning is logged)
    when `store` holds another number of variables, e.g. before the
    optimizer is built.
    """
    variables = self.variables
    if len(store.keys()) != len(variables):
      logging.warning(
          'Not restoring LossScaleOptimizer: the saved optimizer has %d '
          'variables and this one %d. Build it (optimizer.build(model.'
          'trainable_variables)) before loading, with the same inner '
          'optimizer and loss scale.', len(store.keys()), len(variables))
      return
    for i, variable in enumerate(variables):
      variable.assign(store[str(i)])
