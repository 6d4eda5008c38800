"""The TF 2.0-2.3 `LossScaleOptimizer` around Keras 3 optimizers.

It subclasses `keras.optimizers.LossScaleOptimizer` only so that Keras 3's
`compile` under `mixed_float16` does not wrap it again. None of Keras's code
runs on it (Keras's `__init__` and `build` would give it state of its own):
every public member of Keras's classes is defined here, forwarded to the
inner optimizer, or an `assign*` acting only on the variable given.
"""

from typing import Any, Iterable, Optional, Sequence, Tuple

from absl import logging
import keras
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale.keras.experimental import base
from tf_loss_scale.keras.shared import families
from tf_loss_scale.keras.shared import keras3_support
from tf_loss_scale.keras.shared import tf2_members


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizer')
class LossScaleOptimizer(tf2_members.Keras3Members,
                         base.LossScaleOptimizer,
                         keras.optimizers.LossScaleOptimizer):
  """`base.LossScaleOptimizer` around a Keras 3 optimizer."""

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

  def __init__(self, optimizer: Any,
               loss_scale: base.LossScaleArgument):
    super().__init__(optimizer, loss_scale)
    # Read as TF 2.3's (`iterations` below), written as any forwarded name.
    object.__setattr__(self, '_forwarded_names',
                       self._forwarded_names - {'iterations'})
    # Keras's HDF5 writer names each variable of `variables` by its `path`,
    # which Keras variables have and the loss scale's tf.Variables lack.
    for variable in self.loss_scale.variables:
      if not hasattr(variable, 'path'):
        variable.path = f'loss_scale/{variable.name.partition(":")[0]}'

  __init__.__doc__ = base.LossScaleOptimizer.__init__.__doc__

  @property
  def iterations(self) -> tf.Variable:
    """The inner optimizer's step count, as TF 2.3's: a `tf.Variable`."""
    return keras3_support.tf_variable(self.inner_optimizer.iterations)

  @iterations.setter
  def iterations(self, value: Any) -> None:
    self.inner_optimizer.iterations.assign(value)

  @property
  def variables(self) -> tf2_members.CallableList:
    """The loss scale's variables, then the inner's; called, TF 2.3's."""
    return tf2_members.CallableList(
        list(self.loss_scale.variables) + list(self.inner_optimizer.variables),
        called=self.weights)

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the inner optimizer's variables for `var_list` (if any)."""
    var_list = list(var_list)
    if self.inner_optimizer.built or not var_list:
      return
    self._build_inner(var_list)
    self._set_held_weights()

  def check_finite(self, grads: Iterable[Any]) -> tf.Tensor:
    """Whether each gradient's sum across replicas is finite (bool tensor)."""
    return distribute.read(list(grads)).finite

  # ---- the step -----------------------------------------------------------

  def apply(self, grads: Sequence[Any],
            trainable_variables: Optional[Sequence[Any]] = None) -> None:
    """Applies gradients of the scaled loss if their sums are all finite.

    Call it in a replica context, as Keras 3's `apply` (`fit` calls it after
    `scale_loss`).

    Args:
      grads: One gradient per variable (None allowed).
      trainable_variables: The variables; required the first time.

    Raises:
      ValueError: In a cross-replica context, under an unsupported strategy,
        or without variables before the optimizer is built.
    """
    self._apply(grads, trainable_variables, method='apply')

  def _apply(self, grads: Sequence[Any],
             trainable_variables: Optional[Sequence[Any]],
             method: Optional[str]) -> None:
    """`apply`, or with `method` None `apply_gradients` (unscaled ones)."""
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
        inner_sums=True, variables=trainable_variables, method=method)

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True) -> Any:
    """Applies the gradients if their sums are all finite.

    Args:
      grads_and_vars: `(gradient, variable)` pairs.
      name: Optional name scope for the ops.
      experimental_aggregate_gradients: Must be True (Keras 3 optimizers
        always sum across replicas).

    Returns:
      The `iterations` variable.

    Raises:
      ValueError: If `experimental_aggregate_gradients` is False, or as
        `apply`.
    """
    if not experimental_aggregate_gradients:
      raise ValueError(
          'experimental_aggregate_gradients=False is not supported: Keras 3 '
          'optimizers always sum gradients across replicas. Pass the '
          'per-replica gradients instead.')
    pairs = list(grads_and_vars)
    with tf.name_scope(name or self.name):
      self._apply([g for g, _ in pairs], [v for _, v in pairs], method=None)
    return self.iterations

  def _on_skipped_step(self) -> Any:
    return keras3_support.count_skipped_step(self.inner_optimizer)

  def stateless_apply(self, optimizer_variables: Sequence[Any],
                      grads: Sequence[Any],
                      trainable_variables: Sequence[Any]) -> Any:
    """Not offered: TF 2.3's optimizer had no stateless form.

    Raises:
      NotImplementedError: Always.
    """
    raise NotImplementedError(
        'The experimental LossScaleOptimizer has no stateless_apply(); use '
        'tf_loss_scale.keras.LossScaleOptimizer.')

  # ---- slots and weights (the inner optimizer's) --------------------------

  def save_own_variables(self, store: Any) -> None:
    """Saves `variables` (loss scale, then inner optimizer) into `store`."""
    for i, variable in enumerate(self.variables):
      store[str(i)] = variable.numpy()

  def load_own_variables(self, store: Any) -> None:
    """Restores `variables`; as Keras's, warns and skips on a count mismatch."""
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
