"""What TF 2.x programs called on a loss scale optimizer, for Keras 3's forms.

TF 2.3's experimental `LossScaleOptimizer` and TF 2.4-2.15's
`LossScaleOptimizer` wrapped optimizers with a surface Keras 3's lack:
weights read and set as NumPy values, slots found by variable, `add_weight`,
graph-mode `get_gradients`/`get_updates`, and `variables` as a method. Both
forms on Keras 3 take these members from here, so each is written once:

- `InnerWeights`: `weights`, `get_weights`, `set_weights`, the inner
  optimizer's state (every Keras family).
- `Keras3Members`: the rest, around a Keras 3 inner optimizer, with the
  slots of `slots.SlotsByVariable`.

`variables` is a `CallableList`: read as an attribute it is the list Keras
reads (for Keras 3's form, Keras's own), and called, `opt.variables()`, it
is what TF 2.3's and TF 2.11-2.15's returned: the inner optimizer's
variables only, never the loss scale's, so a loop that resets each of them
leaves the scale alone.
"""

import inspect
from typing import Any, FrozenSet, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import private_api
from tf_loss_scale.keras.shared import families
from tf_loss_scale.keras.shared import slots


def settings_of(optimizer: Any) -> Tuple[FrozenSet[str], FrozenSet[str]]:
  """The settings an optimizer's constructor takes, and which are flags.

  Read from the constructors' signatures along the class's bases, not from
  `get_config()`: a config serializes the learning rate, which a user's
  schedule may refuse (no `get_config`) or warn about (a lambda), in
  programs that never save.

  Args:
    optimizer: Any Keras optimizer.

  Returns:
    `(settings, flags)`: the named arguments but `name`, and those of them
    whose default is a bool (`nesterov`, `amsgrad`, `use_ema`, ...).
  """
  settings, flags = set(), set()
  for cls in type(optimizer).__mro__:
    if '__init__' not in vars(cls) or cls is object:
      continue
    for name, parameter in inspect.signature(
        vars(cls)['__init__']).parameters.items():
      if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD,
                            parameter.KEYWORD_ONLY) and name != 'self':
        settings.add(name)
        if isinstance(parameter.default, bool):
          flags.add(name)
  settings.discard('name')
  return frozenset(settings), frozenset(flags)


class CallableList(list):
  """A list that can also be called, as TF 2.11-2.15's `variables`.

  Calling it returns `called` (a new list), or the list itself when no
  `called` was given.
  """

  def __init__(self, items: Sequence[Any] = (),
               called: Optional[Sequence[Any]] = None):
    super().__init__(items)
    self._called = called

  def __call__(self) -> List[Any]:
    return list(self if self._called is None else self._called)


class InnerWeights:
  """`weights`, `get_weights`, `set_weights`: the inner optimizer's state.

  As TF 2.3's and TF 2.4-2.15's wrappers, these never include the loss
  scale, which checkpoints keep instead. A class using it has an
  `inner_optimizer`.
  """

  @property
  def weights(self) -> List[Any]:
    """The inner optimizer's variables, in its order, but its learning rate.

    TF 2.x's optimizers kept their hyperparameters out of `weights` (and
    `variables()`): a loop that resets each of them leaves the learning
    rate, which a Keras 3 optimizer holds in a variable of its own, as it
    leaves the loss scale.
    """
    inner = self.inner_optimizer
    variables = inner.variables
    variables = variables() if callable(variables) else variables
    rate = getattr(inner, 'learning_rate', None)
    return [variable for variable in variables if variable is not rate]

  def get_weights(self) -> List[Any]:
    """Returns the values of `weights`, as NumPy arrays."""
    if execution.in_tf1_graph():  # Keras 2's session runs the reads.
      return self._keras_backend().batch_get_value(self.weights)
    return [variable.numpy() for variable in self.weights]

  def _keras_backend(self) -> Any:
    return families.family_of(self.inner_optimizer).keras.backend

  def set_weights(self, weights: Sequence[Any]) -> None:
    """Sets the inner optimizer's variables from `get_weights()` values.

    Values of every variable of `variables` (the list read as an attribute,
    which Keras's HDF5 files keep for an optimizer) are taken too: Keras's
    HDF5 loader passes them.

    Args:
      weights: One value per variable of `weights`, or of `variables`, in
        its order.

    Raises:
      ValueError: If the count or a shape differs from both.
    """
    weights = list(weights)
    own = self.weights
    every = self.variables
    every = list(every if isinstance(every, list) else every())
    if len(weights) != len(own) and len(weights) == len(every):
      own = every
    if len(weights) != len(own):
      raise ValueError(
          f'set_weights() got {len(weights)} values for the {len(own)} '
          f'variables of the inner optimizer ({[v.name for v in own]}); pass '
          'what get_weights() returned for an optimizer built for the same '
          'variables (build it first: optimizer.build(variables)).')
    for variable, value in zip(own, weights):
      if tuple(variable.shape) != tuple(getattr(value, 'shape', ())):
        raise ValueError(
            f'set_weights(): {variable.name} has shape '
            f'{tuple(variable.shape)}, the value given has shape '
            f'{tuple(getattr(value, "shape", ()))}.')
    if execution.in_tf1_graph():  # Keras 2's session runs the assignments.
      self._keras_backend().batch_set_value(list(zip(own, weights)))
      return
    for variable, value in zip(own, weights):
      variable.assign(value)


# TF 2.x's `tf.VariableAggregation` to Keras 3's names for it.
def _aggregation_name(aggregation: Any) -> str:
  # Imported here: it refuses Keras 2, which the other mixins here serve.
  from tf_loss_scale.keras.shared import keras3_support  # pylint: disable=g-import-not-at-top
  name = getattr(aggregation, 'name', str(aggregation)).lower()
  if name == 'none' and not keras3_support.VARIABLES_TAKE_AGGREGATION_NONE:
    return 'mean'  # Keras's default, which reached TensorFlow as NONE.
  return name


class Keras3Members(slots.SlotsByVariable, private_api.HidesForwardedSlots,
                    InnerWeights):
  """TF 2.x's members of a wrapper around a Keras 3 inner optimizer.

  A mixin placed before the wrapper's Keras bases. Slots are those of
  `slots.SlotsByVariable`, recorded when the inner optimizer is built.
  """

  _slot_naming = slots.KERAS3

  @property
  def variables(self) -> CallableList:
    """Keras's list of the wrapper's variables; called, the inner's only.

    Read as an attribute it is what the next class gives (Keras's, for
    Keras 3's form); `variables()` is TF 2.x's: `weights`.
    """
    return CallableList(super().variables, called=self.weights)

  def build(self, var_list: Sequence[Any]) -> None:
    """Builds as the next class does; for no variables, builds nothing.

    Keras's HDF5 loader builds a model's optimizer for the model's own
    variables (none, for a `Sequential`), which would leave it unable to
    take the variables it trains; the first step builds it for those.
    Values that `set_weights` held until then are set after the build.
    """
    var_list = list(var_list)
    if not var_list and not self.built:
      return
    super().build(var_list)
    self._set_held_weights()

  def set_weights(self, weights: Sequence[Any]) -> None:
    """Sets `weights` (or `variables`) from their values.

    Before the optimizer is built, values for more variables than it has
    (those of a built optimizer, as Keras's HDF5 files hold them) set the
    variables it has, which come first in the built list too, and the rest
    when it is built (`build`).

    Args:
      weights: As `InnerWeights.set_weights`.

    Raises:
      ValueError: As `InnerWeights.set_weights`.
    """
    weights = list(weights)
    count = len(self.variables)
    if not self.built and len(weights) > count:
      # Read now: Keras's HDF5 loader passes datasets of a file it closes.
      object.__setattr__(self, '_held_weights',
                         [np.array(value) for value in weights])
      weights = weights[:count]
    super().set_weights(weights)

  def _set_held_weights(self) -> None:
    """Sets the values `set_weights` held for after the build, if any."""
    held = self.__dict__.get('_held_weights')
    if held is None:
      return
    object.__setattr__(self, '_held_weights', None)
    if len(held) == len(self.variables):
      self.set_weights(held)
      return
    logging.warning(
        'Not restoring the %s\'s state read from a file: it holds %d values '
        'and the optimizer built for this model has %d variables. Load it '
        'into a model of the same variables, with the same inner optimizer '
        'and loss scale.', type(self).__name__, len(held),
        len(self.variables))

  def _new_slot(self, var: Any, slot_name: str, initializer: Any) -> Any:
    return self.inner_optimizer.add_variable_from_reference(
        var, name=slot_name, initializer=initializer)

  def add_weight(self, name: str, shape: Any, dtype: Any = None,
                 initializer: Any = 'zeros', trainable: Optional[bool] = None,
                 synchronization: Any = tf.VariableSynchronization.AUTO,
                 aggregation: Any = tf.VariableAggregation.NONE) -> Any:
    """Creates a variable of the inner optimizer, saved with its state.

    TF 2.x's `OptimizerV2.add_weight`, on Keras 3's `add_variable`.

    Args:
      name: The variable's name.
      shape: Its shape.
      dtype: Its dtype; float32 when None.
      initializer: A Keras initializer or its name.
      trainable: Must not be True: optimizer variables are not trained.
      synchronization: Must be `tf.VariableSynchronization.AUTO` (Keras 3
        chooses).
      aggregation: A `tf.VariableAggregation`, or Keras 3's name for one.

    Returns:
      The new Keras variable.

    Raises:
      ValueError: If `trainable` is True or `synchronization` is not AUTO.
    """
    if trainable:
      raise ValueError(
          f'add_weight({name!r}, trainable=True): a Keras 3 optimizer\'s '
          'variables are not trainable; make a trainable variable a layer\'s '
          '(layer.add_weight) instead.')
    if synchronization not in (tf.VariableSynchronization.AUTO, 'auto'):
      raise ValueError(
          f'add_weight({name!r}, synchronization={synchronization!r}): Keras '
          '3 optimizers choose how their variables synchronize; leave '
          'synchronization at tf.VariableSynchronization.AUTO.')
    return self.inner_optimizer.add_variable(
        shape=shape, initializer=initializer, dtype=dtype or 'float32',
        aggregation=_aggregation_name(aggregation), name=name)

  def get_gradients(self, loss: tf.Tensor, params: Sequence[Any]
                   ) -> List[Any]:
    """Unscaled gradients of `loss` for `params`, in a graph.

    As TF 2.x's, for graph code (inside a `tf.function`): differentiates the
    scaled loss with `tf.gradients` and unscales the result.

    Args:
      loss: A loss tensor of the current graph.
      params: The variables.

    Returns:
      One unscaled gradient per variable (None where the loss does not
      depend on it).

    Raises:
      RuntimeError: When executing eagerly, where graph gradients do not
        exist (as in TF 2.x).
    """
    if tf.executing_eagerly():
      raise RuntimeError(
          'get_gradients() needs a graph (call it inside a tf.function), as '
          'in TF 2.x. Eagerly, record the loss with tf.GradientTape: scaled '
          '= opt.get_scaled_loss(loss); grads = opt.get_unscaled_gradients('
          'tape.gradient(scaled, variables)).')
    params = list(params)
    grads = tf.gradients(self.get_scaled_loss(loss),
                         [getattr(v, 'value', v) for v in params])
    return self.get_unscaled_gradients(grads)

  def get_updates(self, loss: tf.Tensor, params: Sequence[Any]) -> List[Any]:
    """Runs one step on `loss` in a graph: `[apply_gradients(...)]`.

    Keras 3 collects no symbolic updates; inside a `tf.function` the step
    runs where this is called, as TF 2.x's ran where its op ran.

    Args:
      loss: A loss tensor of the current graph.
      params: The variables.

    Returns:
      A one-element list: what `apply_gradients` returned.

    Raises:
      RuntimeError: When executing eagerly (see `get_gradients`).
    """
    params = list(params)
    grads = self.get_gradients(loss, params)
    return [self.apply_gradients(zip(grads, params))]


def aggregate_gradients(grads_and_vars: Sequence[Any]) -> List[Any]:
  """TF 2.11-2.15's `aggregate_gradients`: sums across replicas.

  Args:
    grads_and_vars: `(gradient, variable)` pairs, in a replica context.

  Returns:
    The pairs with each gradient summed across replicas (as given with no
    strategy).
  """
  pairs = list(grads_and_vars)
  sums = distribute.all_reduce_in_replica([g for g, _ in pairs])
  return list(zip(sums, [v for _, v in pairs]))
