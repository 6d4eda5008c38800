"""Every private TensorFlow and Keras name the library uses, each with why.

The rest of the library calls these where no public API does the job; each
hook names the test that fails if TensorFlow or Keras changes it.
"""

import re
from typing import Any, Callable, Dict, List, Sequence

import tensorflow as tf

# TensorFlow 2.12 asks every `tf.compat.v1.train.Optimizer` for its slots by
# type, whatever its `dir()` lists, so a v1 wrapper forwarding its inner
# optimizer's slot names would have them claimed twice and saving fails; 2.15
# on asks only objects whose `dir()` lists `get_slot_names`. 2.13 and 2.14
# are treated as 2.12, which is safe either way.
V1_SLOT_NAMES_FORWARDED = tuple(
    int(part) for part in re.findall(r'\d+', tf.__version__)[:2]) >= (2, 15)


class HidesForwardedSlots:
  """Keeps a wrapper's forwarded `get_slot_names` out of object checkpoints.

  `tf.train.Checkpoint` and SavedModel collect slots from every object whose
  `dir()` lists `get_slot_names`: forwarded, the inner optimizer's slots
  would be claimed twice and saving fails ("A slot variable was re-used as a
  dependency"). They are saved under the inner optimizer, as TensorFlow's
  wrappers save them; calling `get_slot_names()` works as usual.
  """

  def __dir__(self) -> List[str]:
    return [name for name in super().__dir__() if name != 'get_slot_names']


class SavedModelOnlyChildren:
  """Gives a SavedModel dependencies that object checkpoints do not see.

  Hook: `Trackable._trackable_children(save_type, **kwargs)`; no public API
  gives a SavedModel a dependency that checkpoints leave out. Why: the
  monitoring variables of a `DynamicLossScale` are captured by any traced
  step, so a SavedModel must track them, while its checkpoints keep
  TensorFlow's two-variable layout. Likewise a Keras 3 wrapper following
  tf_keras's class leaves out of checkpoints the constants tf_keras's layout
  has no place for. `tests/test_checkpointing.py` fails if the hook changes.
  """

  def _saved_model_only_children(self) -> Dict[str, Any]:
    raise NotImplementedError  # The extra dependencies, by name.

  def _children_checkpoints_leave_out(self) -> Sequence[str]:
    return ()  # Names of dependencies object checkpoints leave out.

  def _trackable_children(self, save_type='checkpoint', **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if getattr(save_type, 'value', save_type) == 'savedmodel':
      children.update(self._saved_model_only_children())
    else:
      for name in self._children_checkpoints_leave_out():
        children.pop(name, None)
    return children

  def _every_child(self) -> Dict[str, Any]:
    """The checkpoint dependencies, with those left out."""
    return dict(super()._trackable_children('checkpoint'))


def name_dependencies(wrapper: Any, **children: Any) -> None:
  """Makes `children` dependencies of `wrapper` (a wrapper or a loss scale),
  under the names they are passed by.

  Hook: `Trackable._track_trackable(child, name)`: a v1 optimizer tracks
  nothing on assignment, and a Keras 3 optimizer names a dependency after its
  attribute. Why: checkpoints interchange only under TensorFlow's names
  (`base_optimizer` and `loss_scale` of the v1 wrapper, tf_keras's
  `loss_scale`, a `LossScale` subclass's weights). A name already taken goes
  to the new child. `tests/test_checkpointing.py` fails if the hook changes.
  """
  for name, child in children.items():
    wrapper._track_trackable(  # pylint: disable=protected-access
        child, name, overwrite=True)


class DelegatesCheckpointToInner:
  """TF 2.3's layout: the inner optimizer's checkpoint plus `loss_scale`.

  TF 2.3's experimental Keras `LossScaleOptimizer` (and tf_keras's) stood
  in for its inner optimizer, saving its dependencies plus `loss_scale`, so
  a checkpoint moves between the wrapper and the bare inner optimizer.
  Hooks: the Trackable methods `tf.__internal__.tracking.Trackable`
  documents for subclasses; tests/test_checkpointing_keras.py fails if
  TensorFlow stops calling one. A subclass has `inner_optimizer` and
  `loss_scale`; one of another layout overrides `_checkpoint_children` and
  `_checkpoint_dependency`.
  """

  def _trackable_children(self, save_type='checkpoint', **kwargs
                         ) -> Dict[str, Any]:
    return self._checkpoint_children(dict(
        self.inner_optimizer._trackable_children(  # pylint: disable=protected-access
            save_type, **kwargs)))

  def _checkpoint_children(self, inner_children: Dict[str, Any]
                          ) -> Dict[str, Any]:
    """The wrapper's dependencies, given its inner optimizer's (by name)."""
    inner_children['loss_scale'] = self.loss_scale
    return inner_children

  def _lookup_dependency(self, name: str, cached_dependencies=None) -> Any:
    # How restoring finds the object saved under `name` (TensorFlow <= 2.12
    # passes no cache).
    if cached_dependencies is None:
      cached_dependencies = self._trackable_children()
    return self._checkpoint_dependency(name, cached_dependencies)

  def _checkpoint_dependency(self, name: str, children: Dict[str, Any]
                            ) -> Any:
    """The object that restores what a checkpoint saved under `name`.

    Returns None to leave the values to whatever is created under that name
    later (`_deferred_dependencies`); `children` are this restore's
    `_trackable_children()`.
    """
    return children.get(name)

  @property
  def _deferred_dependencies(self) -> Dict[str, Any]:
    # Values of dependencies that do not exist yet (hyperparameters, slots)
    # wait on the inner optimizer, which reads them when it creates them.
    # (Keras's constructor tracks variables before it sets the inner one.)
    inner = getattr(self, 'inner_optimizer', None)
    if inner is None:
      return super()._deferred_dependencies
    return inner._deferred_dependencies  # pylint: disable=protected-access


def checkpoint_children(trackable: Any) -> Dict[str, Any]:
  """The dependencies `trackable` saves in a checkpoint, by name.

  Hook: `Trackable._trackable_children()`; no public API lists them. Why: a
  wrapper reading another Keras's layout restores a name of that layout into
  its own dependency or its inner optimizer's (`tf_keras_checkpoints`).
  Empty for an object that is not trackable.
  """
  children = getattr(trackable, '_trackable_children', None)
  return dict(children()) if callable(children) else {}


def deferred_restorations(trackable: Any) -> Dict[str, List[Any]]:
  """What restores left on `trackable` for dependencies it does not have yet.

  Hook: `Trackable._deferred_dependencies` (name -> checkpoint positions),
  returned itself: changing it changes what the object will restore. Why: a
  wrapper reading tf_keras's layout leaves names both layouts use there until
  the file's layout is known, and the inner optimizer's slots until it builds
  (`tf_keras_checkpoints`). tests/test_keras_mixed_precision_checkpoints.py
  fails if TensorFlow changes it.
  """
  return trackable._deferred_dependencies  # pylint: disable=protected-access


def restore_deferred(trackable: Any, name: str, child: Any) -> None:
  """Restores into `child` what restores left on `trackable` under `name`.

  Hook: `Trackable._handle_deferred_dependencies(name, child)`, which
  TensorFlow runs when an object tracks a new dependency. Why: see
  `deferred_restorations`.
  """
  trackable._handle_deferred_dependencies(name, child)  # pylint: disable=protected-access


def track_in_keras2_session(keras: Any, variables: Sequence[Any]) -> None:
  """Has Keras 2's TF1 session initialise `variables`, as it does its own.

  Hook: `keras.__internal__.backend.track_variable` of a Keras 2 namespace
  (`tf_keras`, or `tf.keras` up to 2.15). Why: in a TF1 graph Keras 2's
  `fit` initialises only the variables Keras tracks, as TF 2.0-2.3's wrapper
  tracked its loss scale's; the core's `LossScale` needs no Keras.
  tests/legacy/launcher/tf1_keras_optimizer_two_models.py fails without it.
  """
  for variable in variables:
    keras.__internal__.backend.track_variable(variable)


def untrack(trackable: Any, name: str) -> None:
  """Keeps attribute `name` of `trackable` (a list) out of checkpoints.

  Hook: deleting an attribute of an `AutoTrackable` drops its dependency;
  `object.__setattr__` sets it back untracked. Why: before Keras 3.12 the
  Keras 3 form runs the base optimizer's build, which Keras's class did not
  yet run and which records the variables as a tracked list that Keras's
  layout lacks. `tests/test_keras_files_with_install.py` compares layouts.
  """
  value = list(getattr(trackable, name))
  delattr(trackable, name)
  object.__setattr__(trackable, name, value)


class IndexedChildren(tf.__internal__.tracking.Trackable):
  """A checkpoint node read as a list (children '0', '1', ...), never saved.

  Hooks: `_lookup_dependency` as in `DelegatesCheckpointToInner`, and
  `restore_deferred`. Why: an optimizer's `_variables` list holds other
  variables in tf_keras's layout than in Keras's, known only once the node's
  names have all been seen. `restoring(index)` returns the object that
  restores an index found in a checkpoint, or None to wait for `resolve`.
  """

  def __init__(self, restoring: Callable[[int], Any]):
    self._maybe_initialize_trackable()
    self._restoring = restoring

  def _lookup_dependency(self, name: str, cached_dependencies=None) -> Any:
    del cached_dependencies
    return self._restoring(int(name)) if name.isdigit() else None

  def resolve(self) -> None:
    """Restores the values left for later into the objects that now exist."""
    for name in list(self._deferred_dependencies):
      child = self._restoring(int(name)) if name.isdigit() else None
      if child is not None:
        restore_deferred(self, name, child)


class ForwardsLegacySlotRestoration:
  """What Keras 2 asks a legacy (OptimizerV2) optimizer on the inner's behalf.

  A subclass has `inner_optimizer`, a Keras 2 legacy optimizer, and stands
  in for it in checkpoints (`DelegatesCheckpointToInner`).
  """

  def _create_or_restore_slot_variable(self, *args, **kwargs) -> Any:
    # A restore asks the optimizer node for each variable's slot: the inner
    # optimizer's (it creates it, or restores it when its first step does).
    return self.inner_optimizer._create_or_restore_slot_variable(  # pylint: disable=protected-access
        *args, **kwargs)

  def _create_all_weights(self, var_list: Any) -> None:
    # How Keras 2 creates the slots before loading an HDF5 or SavedModel.
    self.inner_optimizer._create_all_weights(var_list)  # pylint: disable=protected-access


def enclosing_xla_context() -> Any:
  """The XLA context ops are being added to; None outside one.

  Hook: `tf.__internal__.get_enclosing_xla_context()`, exported for Keras.
  Why: see `execution.in_xla_computation`. None on a TensorFlow without it.
  """
  internal = getattr(tf, '__internal__', None)
  enclosing = getattr(internal, 'get_enclosing_xla_context', None)
  return None if enclosing is None else enclosing()
