"""What TF 2.x programs called on a loss scale optimizer, for Keras 3's forms.

TF 2.3's and TF 2.4-2.15's wrappers had a surface Keras 3's optimizers
lack: weights as NumPy values, slots by variable, `add_weight`, graph-mode
`get_gradients`/`get_updates`, `variables()` a method. Written once here:
`InnerWeights` (`weights`, `get_weights`, `set_weights`: the inner
optimizer's state, every Keras family) and `Keras3Members` (the rest,
around a Keras 3 inner optimizer). `variables` is a `CallableList`: read,
the list Keras reads; called, TF 2.x's (the inner optimizer's variables
only, never the loss scale's).
"""

import inspect
from typing import Any, FrozenSet, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import private_api
from tf_loss_scale.keras.shared import families
from tf_loss_scale.keras.shared import slots


def settings_of(optimizer: Any) -> Tuple[FrozenSet[str], FrozenSet[str]]:
  """The settings an optimizer's constructor takes, and which are flags.

  Read from the constructors' signatures: `get_config()` may refuse or warn
  about a user's schedule in programs that never save.

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

  As TF 2.x's wrappers, never the loss scale (checkpoints keep it).
  """

  @property
  def weights(self) -> List[Any]:
    """The inner optimizer's variables but its learning rate, as TF 2.x's."""
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

    Args:
      weights: One value per variable of `weights`, or of `variables` (as
        Keras's HDF5 loader passes them), in its order.

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

  A mixin placed before the wrapper's Keras bases.
  """

  _slot_naming = slots.KERAS3

  @property
  def variables(self) -> CallableList:
    """Keras's list of the wrapper's variables; called, TF 2.x's `weights`."""
    return CallableList(super().variables, called=self.weights)

  def build(self, var_list: Sequence[Any]) -> None:
    """Builds as the next class does; for no variables, builds nothing.

    Keras's HDF5 loader builds for a model's own variables (none, for a
    `Sequential`); the first step builds for the variables it trains, and
    sets the values `set_weights` held until then.
    """
    var_list = list(var_list)
    if not var_list and not self.built:
      return
    super().build(var_list)
    self._set_held_weights()

  def set_weights(self, weights: Sequence[Any]) -> None:
    """As `InnerWeights.set_weights`; unbuilt, a surplus waits for `build`.

    Values for more variables than an unbuilt optimizer has (a built one's,
    from an HDF5 file) set the rest when it is built.
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
    """TF 2.x's `add_weight`: a variable of the inner optimizer.

    Args:
      name, shape: The variable's.
      dtype: Its dtype; float32 when None.
      initializer: A Keras initializer or its name.
      trainable: Must not be True.
      synchronization: Must be `tf.VariableSynchronization.AUTO`.
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
    """Unscaled gradients of `loss` for `params`, in a graph (as TF 2.x's).

    Args:
      loss, params: A loss tensor of the current graph, and the variables.

    Returns:
      One unscaled gradient per variable (None where `loss` has none).

    Raises:
      RuntimeError: When executing eagerly, as in TF 2.x.
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

    Args:
      loss, params: As `get_gradients`.

    Returns:
      A one-element list: what `apply_gradients` returned.

    Raises:
      RuntimeError: When executing eagerly.
    """
    params = list(params)
    grads = self.get_gradients(loss, params)
    return [self.apply_gradients(zip(grads, params))]
