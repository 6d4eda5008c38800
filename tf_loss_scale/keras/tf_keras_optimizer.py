"""The TF 2.0-2.3 `LossScaleOptimizer` around tf_keras (Keras 2) optimizers.

Imported only when `tf_loss_scale.keras.experimental.LossScaleOptimizer` is
given a tf_keras optimizer, so tf_keras stays optional. Two classes, one per
family of tf_keras optimizers:

- `LossScaleOptimizerV2` wraps `tf_keras.optimizers.legacy.*` (OptimizerV2,
  what TF 2.3 wrapped) and offers TF 2.3's whole surface, `get_gradients`
  and `get_updates` included.
- `LossScaleOptimizerV3` wraps `tf_keras.optimizers.*`.

Both subclass the tf_keras optimizer base class (tf_keras's `compile` and
`optimizers.get` accept only those) and `tf_keras.mixed_precision.
LossScaleOptimizer` (tf_keras's `compile` under a `mixed_float16` policy
wraps every optimizer that is not one); neither runs any of their code to
scale, check or apply.

Checkpoints follow TF 2.3: the wrapper's checkpoint is its inner
optimizer's, plus a `loss_scale` dependency, so a checkpoint moves between
the wrapper and the bare inner optimizer in both directions (and to and from
tf_keras's own `LossScaleOptimizer` around legacy optimizers, which kept
TF 2.3's format).
"""

from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import guards
from tf_loss_scale import precision
from tf_loss_scale import step
from tf_loss_scale.keras import tf23_surface

_DelegatingTrackable = tf.__internal__.tracking.DelegatingTrackableMixin


def wrap(optimizer: Any, loss_scale: Any) -> '_TfKerasLossScaleOptimizer':
  """Wraps a tf_keras optimizer in the class for its family.

  Args:
    optimizer: A `tf_keras.optimizers.legacy.*` or `tf_keras.optimizers.*`
      optimizer.
    loss_scale: The `loss_scale` argument of the experimental form.

  Returns:
    A `LossScaleOptimizerV2` or `LossScaleOptimizerV3`.
  """
  if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    return LossScaleOptimizerV2(optimizer, loss_scale)
  return LossScaleOptimizerV3(optimizer, loss_scale)


class _TfKerasLossScaleOptimizer(tf23_surface.TF23Surface,
                                 _DelegatingTrackable):
  """What both tf_keras paths share (construction, delegation, the step)."""

  def __init__(self, optimizer: Any,
               loss_scale: tf23_surface.LossScaleArgument):
    """Wraps `optimizer`.

    Args:
      optimizer: A tf_keras optimizer of this class's family.
      loss_scale: `'dynamic'`, a number, a `LossScale` or a serialized one.

    Raises:
      ValueError: If `optimizer` is a loss scale optimizer or already
        wrapped, `loss_scale` is invalid, or under an unsupported strategy.
    """
    guards.check_new_wrapper(optimizer, guards.EXPERIMENTAL_FORM, loss_scale)
    scale = tf23_surface.loss_scale_from(loss_scale)
    # Set without tf_keras's attribute tracking: with the checkpoint
    # delegated to the inner optimizer, a tracked attribute would become one
    # of the inner optimizer's dependencies.
    object.__setattr__(self, '_inner', optimizer)
    object.__setattr__(self, '_loss_scale', scale)
    object.__setattr__(self, '_trackable', optimizer)
    # TF 2.3's checkpoint format: the inner optimizer's plus `loss_scale`.
    self._track_trackable(scale, 'loss_scale', overwrite=True)
    precision.warn_if_scaling_is_not_needed(
        tf_keras.mixed_precision.global_policy().compute_dtype,
        'LossScaleOptimizer')
    object.__setattr__(self, '_hyperparameter_names',
                       tf23_surface.hyperparameter_names(optimizer))

  # ---- the inner optimizer's state ----------------------------------------

  @property
  def inner_optimizer(self) -> Any:
    """The optimizer that applies the gradients."""
    return self._inner

  @property
  def name(self) -> str:
    """The wrapper's name, as TF 2.3's was."""
    return 'LossScaleOptimizer'

  iterations = tf23_surface.InnerAttribute(
      "The inner optimizer's step counter; skipped steps count too.")

  def get_weights(self) -> List[Any]:
    """The values of the inner optimizer's weights."""
    return self.inner_optimizer.get_weights()

  def set_weights(self, weights: Sequence[Any]) -> None:
    """Sets the inner optimizer's weights from `get_weights()` values."""
    self.inner_optimizer.set_weights(weights)

  # ---- the step -----------------------------------------------------------

  def _apply_unscaled(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      apply_inner: Callable[[List[Tuple[Any, Any]]], Any],
                      aggregate: bool) -> Optional[tf.Operation]:
    """Runs the step on unscaled gradients (`step.apply_step`).

    Args:
      grads_and_vars: `(gradient, variable)` pairs, gradients unscaled.
      apply_inner: Applies a list of pairs with the inner optimizer, in a
        replica context, without summing the gradients across replicas.
      aggregate: Whether the gradients still need summing across replicas:
        then the step sums them once and decides on the sums; otherwise
        they are applied as given.

    Returns:
      In a TF1 graph, an op that runs the step; None otherwise.

    Raises:
      ValueError: In a cross-replica context or under an unsupported
        strategy.
    """
    where = f'{type(self).__name__}.apply_gradients()'
    guards.check_step(where, [self._loss_scale, self.inner_optimizer])
    distribute.require_replica_context(where)
    pairs = list(grads_and_vars)
    variables = [v for _, v in pairs]
    op = step.apply_step(
        [g for g, _ in pairs], step.LossScaleState(self._loss_scale),
        lambda grads: apply_inner(list(zip(grads, variables))),
        reduces=not aggregate,
        on_skip=lambda _: self._count_skipped_step()).op
    # Eagerly the step has run; in a tf.function its ops run in program
    # order.
    return op if execution.in_tf1_graph() else None

  def _count_skipped_step(self) -> Any:
    # TF 2.3: `iterations` counts every step, applied or skipped.
    return self.inner_optimizer.iterations.assign_add(1)

  # tf_keras's (de)serialization of the inner optimizer, for TF23Surface's
  # get_config/from_config.
  _serialize_inner = staticmethod(tf_keras.optimizers.serialize)
  _deserialize_inner = staticmethod(tf_keras.optimizers.deserialize)


@tf_keras.utils.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizerV2')
class LossScaleOptimizerV2(_TfKerasLossScaleOptimizer,
                           tf_keras.optimizers.legacy.Optimizer,
                           tf_keras.mixed_precision.LossScaleOptimizer):
  """Loss scaling around a `tf_keras.optimizers.legacy` optimizer (TF 2.3).

  TF 2.3's contract: `apply_gradients` takes unscaled gradients;
  `minimize` and `get_gradients` take a loss and scale it themselves; a
  step with a non-finite gradient on any replica is skipped (no variable or
  slot changes), the loss scale updates either way and `iterations` counts
  every step.
  """

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True) -> Any:
    """Applies unscaled gradients if they are all finite on every replica.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, gradients already
        unscaled (see `get_unscaled_gradients`).
      name: Passed to the inner optimizer.
      experimental_aggregate_gradients: Whether to sum the gradients across
        replicas (once; the verdict is taken on the sums).

    Returns:
      In a TF1 graph, an op that runs the step; None otherwise.
    """
    return self._apply_unscaled(
        grads_and_vars,
        lambda pairs: self.inner_optimizer.apply_gradients(
            pairs, name=name, experimental_aggregate_gradients=False),
        aggregate=experimental_aggregate_gradients)

  def get_gradients(self, loss: tf.Tensor, params: Sequence[Any]) -> List[Any]:
    """Gradients of `loss`, computed on the scaled loss and unscaled (graphs).

    Args:
      loss: A loss tensor in a graph.
      params: The variables.

    Returns:
      The unscaled gradients.
    """
    scaled = self.inner_optimizer.get_gradients(self.get_scaled_loss(loss),
                                                params)
    return self.get_unscaled_gradients(scaled)

  def get_updates(self, loss: tf.Tensor, params: Sequence[Any]) -> List[Any]:
    """The update ops of one step on `loss` (Keras 2 graph training).

    Args:
      loss: A loss tensor in a graph.
      params: The variables.

    Returns:
      A one-element list: the op that runs the step.
    """
    params = list(params)
    return [self.apply_gradients(zip(self.get_gradients(loss, params),
                                     params))]

  def get_slot(self, var: Any, slot_name: str) -> tf.Variable:
    """The inner optimizer's slot `slot_name` of `var`."""
    return self.inner_optimizer.get_slot(var, slot_name)

  def add_slot(self, var: Any, slot_name: str, initializer: Any = 'zeros',
               shape: Any = None) -> tf.Variable:
    """Adds a slot to the inner optimizer."""
    return self.inner_optimizer.add_slot(var, slot_name, initializer, shape)

  def get_slot_names(self) -> List[str]:
    """The inner optimizer's slot names."""
    return self.inner_optimizer.get_slot_names()

  def variables(self) -> List[tf.Variable]:
    """The inner optimizer's variables (iterations, hyperparameters, slots)."""
    return self.inner_optimizer.variables()

  @property
  def weights(self) -> List[tf.Variable]:
    """The inner optimizer's weights."""
    return self.inner_optimizer.weights

  # TensorFlow's checkpoint code and tf_keras's weight loading ask the
  # optimizer object in the checkpoint (this one) to create or restore slots
  # and weights; they are the inner optimizer's.
  def _create_all_weights(self, var_list: Sequence[Any]) -> None:
    self.inner_optimizer._create_all_weights(var_list)  # pylint: disable=protected-access

  def _restore_slot_variable(self, slot_name, variable, slot_variable):
    return self.inner_optimizer._restore_slot_variable(  # pylint: disable=protected-access
        slot_name, variable, slot_variable)

  def _create_or_restore_slot_variable(self, slot_variable_position,
                                       slot_name, variable):
    return self.inner_optimizer._create_or_restore_slot_variable(  # pylint: disable=protected-access
        slot_variable_position, slot_name, variable)


@tf_keras.utils.register_keras_serializable(
    package='tf_loss_scale.experimental', name='LossScaleOptimizerV3')
class LossScaleOptimizerV3(_TfKerasLossScaleOptimizer,
                           tf_keras.optimizers.Optimizer,
                           tf_keras.mixed_precision.LossScaleOptimizer):
  """Loss scaling around a `tf_keras.optimizers` optimizer.

  The same contract as `LossScaleOptimizerV2` with the methods these
  optimizers have (`compute_gradients`, `build`; no `get_gradients`).
  """

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      skip_gradients_aggregation: bool = False,
                      **kwargs: Any) -> Any:
    """Applies unscaled gradients if they are all finite on every replica.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, gradients already
        unscaled (see `get_unscaled_gradients`).
      name: Passed to the inner optimizer.
      skip_gradients_aggregation: Whether the gradients are already summed
        across replicas (otherwise they are summed once and the verdict is
        taken on the sums).
      **kwargs: Passed to the inner optimizer.

    Returns:
      In a TF1 graph, an op that runs the step; None otherwise.
    """
    return self._apply_unscaled(
        grads_and_vars,
        lambda pairs: self.inner_optimizer.apply_gradients(
            pairs, name=name, skip_gradients_aggregation=True, **kwargs),
        aggregate=not skip_gradients_aggregation)

  def compute_gradients(self, loss: Any, var_list: Any,
                        tape: Optional[tf.GradientTape] = None
                       ) -> List[Tuple[Any, Any]]:
    """`(gradient, variable)` pairs of `loss`, scaled then unscaled.

    Args:
      loss: A zero-argument callable, or a tensor recorded by `tape`.
      var_list: The variables, or a callable returning them.
      tape: The tape that recorded `loss` (required for a tensor loss).

    Returns:
      The unscaled gradients paired with their variables.
    """
    grads, var_list = self.gradients_of_scaled_loss(loss, var_list, tape)
    return list(zip(grads, var_list))

  def minimize(self, loss: Any, var_list: Any,
               tape: Optional[tf.GradientTape] = None) -> Any:
    """Scales `loss`, differentiates, unscales and applies, in one call.

    Args:
      loss: A zero-argument callable, or a tensor recorded by `tape`.
      var_list: The variables, or a callable returning them.
      tape: The tape that recorded `loss` (required for a tensor loss).

    Returns:
      In a TF1 graph, an op that runs the step; None otherwise.
    """
    return self.apply_gradients(self.compute_gradients(loss, var_list, tape))

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the inner optimizer's variables for `var_list`."""
    self.inner_optimizer.build(var_list)

  @property
  def variables(self) -> List[tf.Variable]:
    """The inner optimizer's variables."""
    return self.inner_optimizer.variables

  def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
    """Lets the inner optimizer finalize `var_list` (for example its EMA)."""
    self.inner_optimizer.finalize_variable_values(var_list)
