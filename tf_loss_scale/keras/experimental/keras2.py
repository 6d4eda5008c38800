"""The TF 2.0-2.3 `LossScaleOptimizer` around Keras 2 optimizers.

Keras 2 is `tf.keras` on TensorFlow <= 2.15 and `tf_keras` later.
`classes_for` makes, per Keras 2, `LossScaleOptimizerV2` (legacy optimizers,
TF 2.3's whole surface) and `LossScaleOptimizerV3` (new ones), subclasses of
that Keras's optimizer base and `mixed_precision.LossScaleOptimizer` (so
its `compile` keeps them), none of whose code runs on the wrapper.
"""

import types
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import private_api
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale.keras.experimental import base
from tf_loss_scale.keras.shared import families
from tf_loss_scale.keras.shared import slots

_PACKAGE = 'tf_loss_scale.experimental'
# One (legacy, new) pair of classes per Keras 2 optimizer base class.
_CLASSES: Dict[type, Tuple[type, type]] = {}


def classes_for(keras: types.ModuleType) -> Tuple[type, type]:
  """`(LossScaleOptimizerV2, LossScaleOptimizerV3)` of a Keras 2 namespace.

  Made and registered for serialization once per process.
  """
  key = keras.optimizers.legacy.Optimizer
  if key not in _CLASSES:
    lso = keras.mixed_precision.LossScaleOptimizer
    legacy = _subclass('LossScaleOptimizerV2', _Legacy,
                       (keras.optimizers.legacy.Optimizer, lso), keras)
    new = _subclass('LossScaleOptimizerV3', _New,
                    (keras.optimizers.Optimizer, lso), keras)
    _CLASSES[key] = (legacy, new)
  return _CLASSES[key]


def _subclass(name: str, family: type, keras_bases: Tuple[type, ...],
              keras: types.ModuleType) -> type:
  cls = types.new_class(name, (family,) + keras_bases, exec_body=lambda ns: (
      ns.update(__module__=__name__, __qualname__=name, _keras=keras,
                __doc__=family.__doc__)))
  return keras.utils.register_keras_serializable(package=_PACKAGE,
                                                 name=name)(cls)


class _Keras2(base.LossScaleOptimizer):
  """What Keras 2's `mixed_precision.LossScaleOptimizer` offers, from ours."""

  def __init__(self, optimizer: Any,
               loss_scale: base.LossScaleArgument):
    super().__init__(optimizer, loss_scale)
    if execution.in_tf1_graph():  # `fit` initialises the scale, as TF 2.3's.
      private_api.track_in_keras2_session(self._keras,
                                          self.loss_scale.variables)

  def _apply_pairs(self, pairs: List[Tuple[Any, Any]], summed: bool,
                   **inner_kwargs: Any) -> Optional[tf.Operation]:
    """Runs the step on pairs; the inner `apply_gradients` gets `inner_kwargs`.

    `summed`: whether the gradients are sums across replicas already.
    """
    variables = [v for _, v in pairs]
    return self._apply_step(
        [g for g, _ in pairs],
        lambda grads: self.inner_optimizer.apply_gradients(
            list(zip(grads, variables)), **inner_kwargs),
        summed=summed, variables=variables)

  @property
  def dynamic(self) -> bool:
    """Whether the loss scale is a `DynamicLossScale`."""
    return isinstance(self.loss_scale, loss_scale_lib.DynamicLossScale)

  @property
  def initial_scale(self) -> Optional[float]:
    """The loss scale's first or fixed value; None for a user's class."""
    if self.dynamic:
      return self.loss_scale.initial_loss_scale
    if isinstance(self.loss_scale, loss_scale_lib.FixedLossScale):
      return self.loss_scale.loss_scale_value
    return None

  @property
  def dynamic_growth_steps(self) -> Optional[int]:
    """Finite steps after which a dynamic scale grows; None if fixed."""
    return self.loss_scale.increment_period if self.dynamic else None

  @property
  def dynamic_counter(self) -> Optional[tf.Variable]:
    """Finite steps since a dynamic scale last changed; None if fixed."""
    return self.loss_scale.good_steps if self.dynamic else None


class _Legacy(private_api.ForwardsLegacySlotRestoration, _Keras2):
  """Loss scaling around a Keras 2 legacy optimizer (TF 2.3's contract)."""

  _kind = families.KERAS2_LEGACY
  # The inner optimizer's slots and weights, as TF 2.3's wrapper forwarded.
  _INNER_METHODS = frozenset({'add_weight', 'add_slot', 'get_slot',
                              'get_slot_names', 'variables', 'weights',
                              'get_weights'})

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True) -> Any:
    """Applies unscaled gradients if their sums are all finite.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, gradients unscaled.
      name: Passed to the inner optimizer.
      experimental_aggregate_gradients: False for sums across replicas.

    Returns:
      In a TF1 graph, the op that runs the step; None otherwise.
    """
    return self._apply_pairs(list(grads_and_vars),
                             not experimental_aggregate_gradients, name=name,
                             experimental_aggregate_gradients=False)

  def get_gradients(self, loss: tf.Tensor, params: Sequence[Any]) -> List[Any]:
    """Unscaled gradients of `loss` (a graph tensor), via the scaled loss."""
    scaled = self.inner_optimizer.get_gradients(self.get_scaled_loss(loss),
                                                params)
    return self.get_unscaled_gradients(scaled)

  def get_updates(self, loss: tf.Tensor, params: Sequence[Any]) -> List[Any]:
    """`[op]` running one step on `loss` (Keras 2 graph training)."""
    params = list(params)
    return [self.apply_gradients(zip(self.get_gradients(loss, params),
                                     params))]


class _New(slots.SlotsByVariable, private_api.HidesForwardedSlots, _Keras2):
  """Loss scaling around a Keras 2 new optimizer; slots found by variable."""

  _kind = families.KERAS2
  _slot_naming = slots.KERAS2
  # Keras 2's tools for optimizer implementations, and the variables (which
  # `.keras` files save): the inner optimizer's.
  _INNER_METHODS = frozenset({
      'add_variable', 'add_variable_from_reference', 'aggregate_gradients',
      'exclude_from_weight_decay', 'update_step', 'finalize_variable_values',
      'variables', 'save_own_variables', 'load_own_variables'})

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                      name: Optional[str] = None,
                      skip_gradients_aggregation: bool = False,
                      **kwargs: Any) -> Any:
    """Applies unscaled gradients if their sums are all finite.

    Args:
      grads_and_vars, name: As `LossScaleOptimizerV2.apply_gradients`.
      skip_gradients_aggregation: True for sums across replicas.
      **kwargs: Passed to the inner optimizer.

    Returns:
      In a TF1 graph, the op that runs the step; None otherwise.
    """
    pairs = list(grads_and_vars)
    with tf.init_scope():
      # Where the inner optimizer would build itself, for the variables it
      # would build for (those with a gradient).
      self.build([v for g, v in pairs if g is not None])
    return self._apply_pairs(pairs, skip_gradients_aggregation, name=name,
                             skip_gradients_aggregation=True, **kwargs)

  def compute_gradients(self, loss: Any, var_list: Any,
                        tape: Optional[tf.GradientTape] = None
                       ) -> List[Tuple[Any, Any]]:
    """Unscaled `(gradient, variable)` pairs of `loss`; args as `minimize`."""
    grads, var_list = self._unscaled_gradients_of(loss, var_list, tape)
    return list(zip(grads, var_list))

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the inner optimizer's variables for `var_list`."""
    self._build_inner(var_list)

  def _new_slot(self, var: Any, slot_name: str,
                initializer: Any) -> tf.Variable:
    initial_value = self._keras.initializers.get(initializer)(
        shape=var.shape, dtype=var.dtype)
    return self.inner_optimizer.add_variable_from_reference(
        var, slot_name, initial_value=initial_value)
