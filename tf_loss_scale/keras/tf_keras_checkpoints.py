"""tf_keras's checkpoint layout for a wrapper of a Keras 3 optimizer.

tf_keras's `mixed_precision.LossScaleOptimizer` stands in for its inner
optimizer in a `tf.train.Checkpoint`: the optimizer's node holds what the
inner optimizer saves, plus `loss_scale/current_loss_scale` and
`loss_scale/good_steps` when the scale is dynamic. A tf_keras optimizer saves

  `_iterations`, and `_learning_rate` unless it is a schedule;
  its slots in lists named by kind, one entry per variable it was built for
    in that order (`_momentums/1` is Adam's first moment of the second
    variable, `momentums/1` SGD's momentum);
  `_variables`: the step count, then the slots in the order it made them.

A Keras 3 optimizer saves the same names for the same lists (Lion's
`_momentums` excepted: tf_keras's Lion says `momentums`), but its
`_variables` also holds the learning rate after the step count, and it adds
`_trainable_variables`.

So the wrapper saves the Keras 3 optimizer's named dependencies, then a
`_variables` with the step count and only the variables that no name
reaches, at tf_keras's positions: a slot is saved and restored by kind and
variable, never by position. A position is where the two Keras disagree,
and a slot restored by it lands, unseen, in a slot of the same shape: Keras
3 reads `_variables/2` as the first slot, tf_keras as the second. tf_keras
reads slots by name too, so its class restores this layout whole.

Restoring, `_variables` of a checkpoint written by tf_keras is read for
the step count and, where Keras 3's optimizer orders its slots as its
tf_keras namesake does, for the slots (which tf_keras, restored before its
build, saves by position only); it is left to the names when Keras 3 wrote
it, bare or wrapped as this library's earlier releases saved this class
(`inner_optimizer`, `dynamic_scale`, `step_counter`, answered too). So
checkpoints of tf_keras's class, of a bare tf_keras or Keras 3 optimizer,
and of this layout restore into the wrapper, before or after it is built,
and this layout restores into tf_keras's class and into a bare tf_keras or
Keras 3 optimizer (Keras 3's SGD: once built, as it replaces its
`momentums` list when it builds).
"""

from typing import Any, Dict, List, Optional, Set
import weakref

import tensorflow as tf

from tf_loss_scale import private_api
from tf_loss_scale.keras import keras3_support

# What a Keras 3 optimizer saves that tf_keras's do not: the variables it
# was built for (the model's own, saved with the model).
_KERAS3_ONLY = frozenset({'_trainable_variables',
                          '_trainable_variables_indices'})
# What this library saved under this class before it took tf_keras's
# layout (Keras 3's `LossScaleOptimizer`'s, plus tf_keras's names).
_KERAS3_WRAPPER = frozenset({'inner_optimizer', 'dynamic_scale',
                             'step_counter'})
# The dependencies that are not slots, by name in both Keras.
_COUNTERS = ('_iterations', '_learning_rate')
# Keras 3 before 3.9 names its step count `iterations`; tf_keras, and Keras
# 3 from 3.9, `_iterations`.
_KERAS3_RENAMED = {'iterations': '_iterations'}
# Names a checkpoint may hold for what is saved here under another: tf_keras's
# Lion's slot list, and the step count of a Keras 3 optimizer before 3.9.
_TF_KERAS_ALIASES = {'momentums': '_momentums', **_KERAS3_RENAMED}
# Keras 3's optimizers that make their variables in the order tf_keras's
# namesakes do, so that `_variables/{i}` of tf_keras's is the i-th of
# Keras 3's less its learning rate (tests/test_keras_mixed_precision_
# checkpoints.py compares each with tf_keras's).
_SAME_ORDER_AS_TF_KERAS = frozenset({
    'Adadelta', 'Adagrad', 'Adam', 'AdamW', 'Adamax', 'Ftrl', 'Lion',
    'Nadam', 'RMSprop', 'SGD'})
# Keras 3's optimizers whose variables differ from their tf_keras
# namesake's: a position of tf_keras's cannot be read into them.
_OTHER_VARIABLES_THAN_TF_KERAS = frozenset({'Adafactor'})


class TfKerasCheckpointLayout(private_api.DelegatesCheckpointToInner):
  """Saves and restores a Keras 3 optimizer's wrapper as tf_keras's class.

  A mixin before the wrapper's Keras 3 class: SavedModels and `.keras`
  files keep Keras 3's layout. The subclass has `inner_optimizer`, calls
  `_start_tf_keras_layout(scale_variables)` when constructed, and builds as
  `held = self._hold_inner_restorations()`, its Keras build, then
  `self._finish_tf_keras_layout(held)`.
  """

  _delegates_saved_model = False

  def _start_tf_keras_layout(self, scale_variables: Optional[Any]) -> None:
    """Makes the nodes, before the inner optimizer's slots exist.

    Args:
      scale_variables: The loss scale and good steps variables of a dynamic
        scale, which a checkpoint restores at once; None for a fixed one.
    """
    loss_scale = None
    if scale_variables is not None:
      loss_scale = tf.Module()
      loss_scale.current_loss_scale, loss_scale.good_steps = scale_variables
    # Set past Keras's attribute tracking: nodes of the checkpoint only.
    object.__setattr__(self, '_tf_keras_loss_scale', loss_scale)
    # Through a weak reference: a cycle would keep a dropped wrapper alive,
    # and its inner optimizer wrapped (`guards`).
    owner = weakref.ref(self)
    object.__setattr__(self, '_tf_keras_variables',
                       private_api.IndexedChildren(
                           lambda: owner()._tf_keras_variables_to_save(),
                           lambda i: owner()._tf_keras_variable_to_restore(i)))
    object.__setattr__(self, '_restore_visit', None)
    object.__setattr__(self, '_restoring_keras3_layout', False)

  def _hold_inner_restorations(self) -> Dict[str, List[Any]]:
    """Takes what restores left for the inner optimizer's dependencies.

    Call it before the inner optimizer builds, and hand the result to
    `_finish_tf_keras_layout`: an optimizer that names a list and then
    replaces it (Keras 3's SGD, `momentums`) would leave the values with
    the first list. The wrapper's own names stay for Keras to restore.
    """
    positions = [int(name) for name in
                 private_api.deferred_restorations(self._tf_keras_variables)
                 if name.isdigit() and name != '0']
    if (positions and self._restore_visit is not None and
        not self._restoring_keras3_layout):
      # Refuses before anything of the optimizer restores.
      self._positions_are_tf_keras(min(positions))
    deferred = private_api.deferred_restorations(self.inner_optimizer)
    return {name: deferred.pop(name) for name in list(deferred)
            if name not in _KERAS3_WRAPPER}

  def _finish_tf_keras_layout(self, held: Dict[str, List[Any]]) -> None:
    """Restores into the inner optimizer's slots what waited for them.

    Args:
      held: What `_hold_inner_restorations` took before the build.
    """
    inner = self.inner_optimizer
    deferred = private_api.deferred_restorations(inner)
    children = self._inner_children()
    for name, positions in held.items():
      deferred.setdefault(name, []).extend(positions)
      child = children.get(name, children.get(_TF_KERAS_ALIASES.get(name)))
      if child is not None:
        private_api.restore_deferred(inner, name, child)
    self._tf_keras_variables.resolve()

  def _checkpoint_children(self, inner_children: Dict[str, Any]
                          ) -> Dict[str, Any]:
    inner_children = _renamed(inner_children)
    children = {name: inner_children[name] for name in _COUNTERS
                if name in inner_children}
    children.update(
        (name, child) for name, child in inner_children.items()
        if name not in _KERAS3_ONLY and name != '_variables')
    children['_variables'] = self._tf_keras_variables
    if self._tf_keras_loss_scale is not None:
      children['loss_scale'] = self._tf_keras_loss_scale
    return children

  def _lookup_dependency(self, name: str, cached_dependencies=None) -> Any:
    # Restoring, TensorFlow 2.13 and later pass the children; 2.12 does not,
    # and neither does Keras's attribute tracking, which asks whether a name
    # is taken: Keras names its own attributes in the constructor, before
    # the layout starts, and `_trainable_variables` in `build`.
    if cached_dependencies is None:
      if (self.__dict__.get('_tf_keras_variables') is None or
          name in _KERAS3_ONLY):
        # Keras's own answer, past the delegation's.
        return super(private_api.DelegatesCheckpointToInner,
                     self)._lookup_dependency(name)
      return self._checkpoint_dependency(name, self._trackable_children())
    self._note_restored_name(name, cached_dependencies)
    return self._checkpoint_dependency(name, cached_dependencies)

  def _note_restored_name(self, name: str, children: Dict[str, Any]) -> None:
    """Tells from the names of a restore whether Keras 3 wrote it.

    TensorFlow looks up every name of a node with one `children` before it
    visits the next level (`_variables`' entries): a new `children` is a
    new restore. Without them (TensorFlow 2.12) nothing is known, and
    `_variables` is read for the step count alone.
    """
    if children is not self._restore_visit:
      object.__setattr__(self, '_restore_visit', children)
      object.__setattr__(self, '_restoring_keras3_layout', False)
    if name in _KERAS3_ONLY or name in _KERAS3_WRAPPER:
      object.__setattr__(self, '_restoring_keras3_layout', True)

  def _checkpoint_dependency(self, name: str, children: Dict[str, Any]
                            ) -> Any:
    if name in _KERAS3_WRAPPER:
      # Keras 3's `LossScaleOptimizer` layout: its own names.
      return getattr(self, name, None)
    if name in children:
      return children[name]
    alias = _TF_KERAS_ALIASES.get(name)
    return children.get(alias) if alias else None

  def _inner_children(self) -> Dict[str, Any]:
    return _renamed(private_api.checkpoint_children(self.inner_optimizer))

  def _tf_keras_variable_list(self) -> List[Any]:
    """`_variables` as tf_keras's: the step count, then the rest by creation."""
    children = self._inner_children()
    counters = [children.get(name) for name in _COUNTERS]
    return [counters[0]] + [
        v for v in self.inner_optimizer.variables
        if not any(v is counter for counter in counters)]

  def _tf_keras_variables_to_save(self) -> Dict[int, Any]:
    """The entries of `_variables` saved: those no name of the inner reaches.

    A slot saved by position would be read by a bare Keras 3 optimizer that
    builds after restoring in Keras 3's order (the learning rate second),
    into another slot of the same shape; tf_keras reads slots by name.
    """
    named = self._ids_with_names()
    return {i: v for i, v in enumerate(self._tf_keras_variable_list())
            if i == 0 or id(v) not in named}

  def _tf_keras_variable_to_restore(self, index: int) -> Optional[Any]:
    """What restores `_variables/{index}` of a checkpoint; None to wait."""
    if self._restoring_keras3_layout or (
        index and self._restore_visit is None):
      return None  # Keras 3's order, or unknown: read by their names.
    variables = self._tf_keras_variable_list()
    if index >= len(variables):
      return None  # Not built yet: `_finish_tf_keras_layout` restores it.
    variable = variables[index]
    if index == 0 or self._positions_are_tf_keras(index):
      # tf_keras saved its slots by position and, after a restore before
      # its build, by position only; they are the same variables as by
      # name, when both exist.
      return variable
    if id(variable) in self._ids_with_names():
      return None  # Restored by kind and variable, by its name.
    return variable

  def _positions_are_tf_keras(self, index: int) -> bool:
    """Whether `_variables/{i}` of tf_keras's is the inner's i-th slot.

    Args:
      index: The first position of tf_keras's a checkpoint holds (for the
        message).

    Raises:
      ValueError: For an inner optimizer whose variables differ from those
        of its tf_keras namesake.
    """
    inner = self.inner_optimizer
    name = type(inner).__name__
    from_keras = type(inner).__module__.startswith('keras.')
    if from_keras and name in _OTHER_VARIABLES_THAN_TF_KERAS:
      raise ValueError(
          f'This checkpoint holds tf_keras\'s {name} variables by position '
          f'(`optimizer/_variables/{index}` on), and Keras 3\'s {name} keeps '
          'other variables (its factored second moments differ for '
          'variables of fewer than two dimensions): restoring them would '
          'put values into the wrong variables, so nothing of the optimizer '
          'is restored. Restore the '
          'checkpoint with tf_keras\'s optimizer, or continue from the model '
          'weights with a fresh optimizer (restore the model alone).')
    return (from_keras and keras3_support.SAVES_AS_TF_KERAS and
            name in _SAME_ORDER_AS_TF_KERAS and
            not getattr(inner, 'use_ema', False) and
            not getattr(inner, 'gradient_accumulation_steps', None))

  def _ids_with_names(self) -> Set[int]:
    """`id`s of the inner's variables that a name of its own reaches.

    (The inner optimizer holds them: an `id` is not reused meanwhile.)
    """
    found = set()
    for name, child in self._inner_children().items():
      if name in _KERAS3_ONLY or name == '_variables':
        continue
      found.add(id(child))
      found.update(map(id, private_api.checkpoint_children(child).values()))
    return found


def _renamed(children: Dict[str, Any]) -> Dict[str, Any]:
  # A Keras 3 optimizer's dependencies under the names tf_keras gives them.
  return {_KERAS3_RENAMED.get(name, name): child
          for name, child in children.items()}
