"""Reading tf_keras's checkpoint layout into the wrapper of a Keras 3 optimizer.

The wrapper saves Keras's layout, as Keras's class, and reads tf_keras's
too: the inner optimizer's state on the optimizer's node (`_iterations`,
`_learning_rate`, slot lists such as `_momentums/1`, and `_variables`: the
step count, then the slots in creation order), plus `loss_scale/*`.

`_iterations`, `_learning_rate` and `_variables` mean the wrapper's own
variables in Keras's layout and the inner optimizer's in tf_keras's (and in
this library's earlier layout). TensorFlow looks a node's names up one at a
time, so the layout is known once all are seen (Keras's when the node holds
`inner_optimizer`): those names wait and are restored when the checkpoint
visits `_variables` (or at the build) into the layout the file was written
in. tf_keras's `_variables/{i}` is read only where Keras 3's optimizer
orders its slots as its tf_keras namesake; a file whose positions cannot be
read (Adafactor) is refused before anything of the optimizer is restored.
"""

from typing import Any, Dict, List, Optional, Set, Tuple
import weakref

import tensorflow as tf

from tf_loss_scale import private_api
from tf_loss_scale.keras.shared import keras3_support

# The names only Keras 3's wrapper saves: a node holding one was written by
# Keras's class (or by this one).
_KERAS3_WRAPPER = 'inner_optimizer'
# The name only a bare Keras 3 optimizer saves (its `_variables` are then
# in Keras 3's order).
_KERAS3_ONLY = '_trainable_variables'
# The names whose meaning depends on the layout: left until it is known.
_COUNTERS = ('_iterations', '_learning_rate')
# Keras 3 before 3.9 names its step count `iterations`; tf_keras, and Keras
# 3 from 3.9, `_iterations`.
_KERAS3_RENAMED = {'iterations': '_iterations'}
# Names a checkpoint may hold for what Keras 3 names otherwise: tf_keras's
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


class _Visit:
  """What one restore of the wrapper's node has shown of its layout."""

  def __init__(self, children: Optional[Dict[str, Any]] = None):
    self.children = children
    self.names: Set[str] = set()

  @property
  def keras_wrapper(self) -> bool:
    return _KERAS3_WRAPPER in self.names

  @property
  def keras_bare(self) -> bool:
    return _KERAS3_ONLY in self.names and not self.keras_wrapper


class ReadsTfKerasLayout:
  """Reads tf_keras's layout too, into a Keras 3 `LossScaleOptimizer`.

  A mixin before the wrapper's Keras 3 class. The subclass calls
  `_start_reading_tf_keras()` when constructed, `_read_tf_keras_scale_into()`
  once it has `dynamic_scale` and `step_counter`, and
  `_restore_left_for_inner()` at the end of `build`; it has `_every_child()`
  and `_follow_tf_keras()` (a program reading tf_keras's file is of TF
  2.4-2.15). After reading tf_keras's file, its checkpoints leave out what
  tf_keras's layout has no place for, so the restore matches every object.
  """

  def _children_checkpoints_leave_out(self) -> Tuple[str, ...]:
    if self.__dict__.get('_tf_keras_file_read'):
      return ('_iterations', 'iterations', '_learning_rate', '_variables',
              '_trainable_variables')
    return ()

  def _reads_tf_keras_file(self) -> None:
    object.__setattr__(self, '_tf_keras_file_read', True)
    self._follow_tf_keras()

  def _start_reading_tf_keras(self) -> None:
    # Set past Keras's attribute tracking: nodes read, never written.
    object.__setattr__(self, '_tf_keras_loss_scale', tf.Module())
    # Through a weak reference: a cycle would keep a dropped wrapper alive,
    # and its inner optimizer wrapped (`guards`).
    owner = weakref.ref(self)
    object.__setattr__(self, '_read_variables', private_api.IndexedChildren(
        lambda i: owner()._variable_to_restore(i)))
    object.__setattr__(self, '_visit', _Visit())

  def _read_tf_keras_scale_into(self) -> None:
    loss_scale = self._tf_keras_loss_scale
    if hasattr(self, 'dynamic_scale') and not hasattr(
        loss_scale, 'current_loss_scale'):
      loss_scale.current_loss_scale = self.dynamic_scale
      loss_scale.good_steps = self.step_counter

  def _lookup_dependency(self, name: str, cached_dependencies=None) -> Any:
    # Without the children (Keras's attribute tracking, which asks whether a
    # name is taken, or TensorFlow 2.12 restoring), Keras's own answer.
    if cached_dependencies is None or '_visit' not in self.__dict__:
      return super()._lookup_dependency(name, cached_dependencies)
    if cached_dependencies is not self._visit.children:
      # A new restore: TensorFlow looks up every name of the node with one
      # `children` before it visits the next level.
      object.__setattr__(self, '_visit', _Visit(cached_dependencies))
    self._visit.names.add(name)
    if name in _COUNTERS or name in _KERAS3_RENAMED:
      return None  # Left until the layout is known (`_settle`).
    if name == '_variables':
      return self._read_variables
    if name == 'loss_scale':
      self._reads_tf_keras_file()
      return self._tf_keras_loss_scale
    if name in cached_dependencies:
      return cached_dependencies[name]
    return self._inner_child(name)  # tf_keras's: a slot list of the inner.

  def _settle(self) -> None:
    """Restores what waits under the names both layouts use, as the file's."""
    deferred = private_api.deferred_restorations(self)
    for name in [n for n in deferred if n in _COUNTERS or n in _KERAS3_RENAMED]:
      if self._visit.keras_wrapper and not (
          name != '_learning_rate' and 'loss_scale' in self._visit.names):
        target = self._every_child().get(name)
      else:
        target = self._inner_child(name)
      if target is not None:
        private_api.restore_deferred(self, name, target)

  def _restore_left_for_inner(self) -> None:
    """Restores into the inner optimizer, once built, what waited for it."""
    self._settle()
    own = self._every_child()
    for name in list(private_api.deferred_restorations(self)):
      child = None if name in own else self._inner_child(name)
      if child is not None:
        private_api.restore_deferred(self, name, child)
    self._read_variables.resolve()

  def _inner_child(self, name: str) -> Any:
    children = self._inner_children()
    return children.get(name, children.get(_TF_KERAS_ALIASES.get(name)))

  def _inner_children(self) -> Dict[str, Any]:
    return _renamed(private_api.checkpoint_children(self.inner_optimizer))

  def _variable_to_restore(self, index: int) -> Optional[Any]:
    """What restores `_variables/{index}` of the file; None to wait."""
    visit = self._visit
    tf_keras = not (visit.keras_wrapper or visit.keras_bare)
    if tf_keras and visit.children is not None:
      self._refuse_other_variables()  # Before anything of it restores.
      self._reads_tf_keras_file()
    self._settle()  # The node's names are all known now.
    if visit.keras_wrapper or visit.keras_bare:
      variables = (self._every_child() if visit.keras_wrapper else
                   private_api.checkpoint_children(self.inner_optimizer)
                  ).get('_variables', [])
      return variables[index] if index < len(variables) else None
    if index and visit.children is None:
      return None  # Unknown (TensorFlow 2.12): read by their names.
    # tf_keras's order.
    if index and not self._positions_are_tf_keras():
      return None
    variables = self._tf_keras_variable_list()
    if index >= len(variables):
      return None  # Not built yet: `_restore_left_for_inner` restores it.
    return variables[index]

  def _tf_keras_variable_list(self) -> List[Any]:
    """`_variables` as tf_keras's: the step count, then the rest by creation."""
    children = self._inner_children()
    counters = [children.get(name) for name in _COUNTERS]
    return [counters[0]] + [
        v for v in self.inner_optimizer.variables
        if not any(v is counter for counter in counters)]

  def _refuse_other_variables(self) -> None:
    """Refuses tf_keras's positions for an inner optimizer that differs."""
    name = type(self.inner_optimizer).__name__
    if _from_keras(self.inner_optimizer) and (
        name in _OTHER_VARIABLES_THAN_TF_KERAS):
      raise ValueError(
          f'This checkpoint holds tf_keras\'s {name} variables by position '
          '(`optimizer/_variables/1` on), and Keras 3\'s '
          f'{name} keeps other variables (its factored second moments differ '
          'for variables of fewer than two dimensions): restoring them would '
          'put values into the wrong variables, so nothing of the optimizer '
          'is restored. Restore the checkpoint with tf_keras\'s optimizer, '
          'or continue from the model weights with a fresh optimizer '
          '(restore the model alone).')

  def _positions_are_tf_keras(self) -> bool:
    """Whether `_variables/{i}` of tf_keras's is the inner's i-th slot."""
    inner = self.inner_optimizer
    return (_from_keras(inner) and keras3_support.SAVES_AS_TF_KERAS and
            type(inner).__name__ in _SAME_ORDER_AS_TF_KERAS and
            not getattr(inner, 'use_ema', False) and
            not getattr(inner, 'gradient_accumulation_steps', None))


def _from_keras(optimizer: Any) -> bool:
  return type(optimizer).__module__.startswith('keras.')


def _renamed(children: Dict[str, Any]) -> Dict[str, Any]:
  # A Keras 3 optimizer's dependencies under the names tf_keras gives them.
  return {_KERAS3_RENAMED.get(name, name): child
          for name, child in children.items()}
