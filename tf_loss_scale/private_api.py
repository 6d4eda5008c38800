"""Every private TensorFlow and Keras name the library uses, each with why.

The rest of the library calls these where no public API does the job.
"""

import re
from typing import Any, Callable, Dict, List, Sequence

import tensorflow as tf

# TensorFlow 2.12 asks every `tf.compat.v1.train.Optimizer` for its slots by
# type, whatever its `dir()` lists: there a v1 wrapper that forwarded its
# inner optimizer's slot names would have them claimed twice, and saving
# fails. TensorFlow 2.15 and later ask only objects whose `dir()` lists
# `get_slot_names` (`HidesForwardedSlots`); 2.13 and 2.14 are treated as
# 2.12, which is safe either way.
V1_SLOT_NAMES_FORWARDED = tuple(
    int(part) for part in re.findall(r'\d+', tf.__version__)[:2]) >= (2, 15)


class HidesForwardedSlots:
  """Keeps a wrapper's forwarded `get_slot_names` out of object checkpoints.

  `tf.train.Checkpoint` (and SavedModel) collect slot variables from every
  object whose `dir()` lists `get_slot_names`. A wrapper that forwards its
  inner optimizer's slots would have them claimed twice, once under the inner
  optimizer and once under itself, and saving fails ("A slot variable was
  re-used as a dependency"). The slots belong to the inner optimizer and are
  saved there, as TensorFlow's wrappers save them, so the name is left out of
  `dir()`; calling `get_slot_names()` works as usual.
  """

  def __dir__(self) -> List[str]:
    return [name for name in super().__dir__() if name != 'get_slot_names']


class SavedModelOnlyChildren:
  """Gives a SavedModel dependencies that object checkpoints do not see.

  Hook: `Trackable._trackable_children(save_type, **kwargs)`, TensorFlow's
  private way for an object to list its dependencies per kind of save; no
  public API gives a SavedModel a dependency that checkpoints leave out.
  Why: `DynamicLossScale`'s monitoring variables are captured by any traced
  step, so a SavedModel must track them, while its checkpoints must keep
  TensorFlow's layout (two variables) to interchange with TensorFlow's own
  class. Likewise a Keras 3 wrapper following tf_keras's class leaves out of
  checkpoints the constants Keras's layout gives it and tf_keras's has no
  place for, so that a restore of tf_keras's file matches every object.
  `tests/test_checkpointing.py` fails if TensorFlow changes the hook.
  """

  def _saved_model_only_children(self) -> Dict[str, Any]:
    """The extra dependencies, by name (a subclass says which)."""
    raise NotImplementedError

  def _children_checkpoints_leave_out(self) -> Sequence[str]:
    """Names of dependencies object checkpoints leave out (none here)."""
    return ()

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
  """Names checkpoint dependencies of an optimizer wrapper or a loss scale.

  Hook: `Trackable._track_trackable(child, name)`. A
  `tf.compat.v1.train.Optimizer` tracks nothing on attribute assignment and
  has no public way to name a dependency, and a Keras 3 optimizer names a
  dependency after its attribute. Why: TensorFlow's v1 wrapper names its
  dependencies `base_optimizer` and `loss_scale`, tf_keras's Keras wrapper
  names one `loss_scale`, a `LossScale` subclass's `_add_weight` names its
  variable's, and checkpoints interchange only if ours use the same names.
  A name already taken goes to the new child.
  `tests/test_checkpointing.py` fails if TensorFlow changes the hook.

  Args:
    wrapper: The trackable: an optimizer wrapper or a loss scale.
    **children: The trackables to depend on, by dependency name.
  """
  for name, child in children.items():
    wrapper._track_trackable(  # pylint: disable=protected-access
        child, name, overwrite=True)


class DelegatesCheckpointToInner:
  """TF 2.3's layout: the inner optimizer's checkpoint plus `loss_scale`.

  TensorFlow's checkpoint code asks an object for its dependencies through
  the underscore methods of its Trackable protocol (the ones
  `tf.__internal__.tracking.Trackable` documents for subclasses to
  override); tests/test_checkpointing_keras.py fails if TensorFlow stops
  calling one of those answered here.

  TF 2.3's experimental Keras `LossScaleOptimizer` saved itself as its inner
  optimizer does (the same dependencies, slots and values) with one more
  dependency, `loss_scale`. A checkpoint then moves between the wrapper and
  the bare inner optimizer in both directions. The inner optimizer itself is
  not a node of the checkpoint: the wrapper stands in for it. tf_keras's
  `mixed_precision.LossScaleOptimizer` does the same.

  A subclass has `inner_optimizer` and `loss_scale`. One that saves another
  layout rewrites the inner optimizer's dependencies
  (`_checkpoint_children`) and answers the names a checkpoint asks for
  (`_checkpoint_dependency`).
  """

  def _trackable_children(self, save_type='checkpoint', **kwargs
                         ) -> Dict[str, Any]:
    # What TensorFlow saves under this object (and walks when restoring):
    # the inner optimizer's dependencies, plus the loss scale.
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

    Args:
      name: A dependency name found in the checkpoint being restored.
      children: This object's `_trackable_children()` of that restore.

    Returns:
      The object, or None to leave the values to whatever is created under
      that name later (`_deferred_dependencies`).
    """
    return children.get(name)

  @property
  def _deferred_dependencies(self) -> Dict[str, Any]:
    # Where restoring leaves the values of dependencies that do not exist
    # yet (an optimizer creates its hyperparameters and slots on its first
    # step): the inner optimizer's own, which it reads when it creates them.
    # (Keras's constructor tracks variables before it sets the inner one.)
    inner = getattr(self, 'inner_optimizer', None)
    if inner is None:
      return super()._deferred_dependencies
    return inner._deferred_dependencies  # pylint: disable=protected-access


def checkpoint_children(trackable: Any) -> Dict[str, Any]:
  """The dependencies `trackable` saves in a checkpoint, by name.

  Hook: `Trackable._trackable_children()`, the method TensorFlow's
  checkpoints call (see `DelegatesCheckpointToInner`); no public API lists
  an object's dependencies. Why: a wrapper that reads another Keras's
  layout restores a name of that layout into its own dependency or its
  inner optimizer's of that name (`tf_loss_scale.keras.
  tf_keras_checkpoints`).

  Args:
    trackable: Any trackable object.

  Returns:
    Its dependencies by name; empty for an object that is not trackable.
  """
  children = getattr(trackable, '_trackable_children', None)
  return dict(children()) if callable(children) else {}


def deferred_restorations(trackable: Any) -> Dict[str, List[Any]]:
  """What restores left on `trackable` for dependencies it does not have yet.

  Hook: `Trackable._deferred_dependencies`, the dict (name -> checkpoint
  positions) that TensorFlow fills when a checkpoint holds a dependency the
  object lacks, and reads when the object tracks one of that name. Why: a
  wrapper reading tf_keras's layout leaves the names that both layouts use
  there until the file's layout is known, and holds the inner optimizer's
  slots until the inner optimizer builds (`tf_loss_scale.keras.
  tf_keras_checkpoints`). tests/test_keras_mixed_precision_checkpoints.py
  fails if TensorFlow changes it.

  Args:
    trackable: A trackable object.

  Returns:
    The dict itself (changing it changes what the object will restore).
  """
  return trackable._deferred_dependencies  # pylint: disable=protected-access


def restore_deferred(trackable: Any, name: str, child: Any) -> None:
  """Restores into `child` what restores left on `trackable` under `name`.

  Hook: `Trackable._handle_deferred_dependencies(name, child)`, which
  TensorFlow runs when an object tracks a new dependency. Why: see
  `deferred_restorations`.

  Args:
    trackable: The object the values were left on.
    name: The dependency name they were saved under.
    child: The object that now stands under that name.
  """
  trackable._handle_deferred_dependencies(name, child)  # pylint: disable=protected-access


def track_in_keras2_session(keras: Any, variables: Sequence[Any]) -> None:
  """Has Keras 2's TF1 session initialise `variables`, as it does its own.

  Hook: `keras.__internal__.backend.track_variable`, Keras 2's own (its
  `__internal__` namespace, exported, not in its public API). Why: in a TF1
  graph Keras 2's `fit` initialises only the variables Keras tracks, and
  TF 2.0-2.3's wrapper tracked its loss scale's there; a `LossScale` made
  outside Keras (the core needs no Keras) is not. tests/legacy/launcher/
  tf1_keras_optimizer_two_models.py fails without it.

  Args:
    keras: A Keras 2 namespace (`tf_keras`, or `tf.keras` up to 2.15).
    variables: The variables to track.
  """
  for variable in variables:
    keras.__internal__.backend.track_variable(variable)


def untrack(trackable: Any, name: str) -> None:
  """Keeps attribute `name` of `trackable` (a list) out of checkpoints.

  Hook: deleting an attribute of a TensorFlow `AutoTrackable` drops the
  dependency it tracked (its `__delattr__`); setting it back with
  `object.__setattr__` skips the tracking. Why: before Keras 3.12 the Keras
  3 form runs the base optimizer's build, which Keras's class did not yet
  run, and that build records the variables as a tracked list; checkpoints
  must keep the layout of Keras's class, which saves no such list.
  `tests/test_keras_files_with_install.py` compares the layouts.

  Args:
    trackable: The object holding the attribute.
    name: The attribute, whose value stays as a plain list.
  """
  value = list(getattr(trackable, name))
  delattr(trackable, name)
  object.__setattr__(trackable, name, value)


class IndexedChildren(tf.__internal__.tracking.Trackable):
  """A checkpoint node read as a list (children '0', '1', ...), never saved.

  Hooks: `_lookup_dependency` as in `DelegatesCheckpointToInner`, and
  `restore_deferred`, with which it hands an object created after a restore
  the values that restore left for it. Why: the list `_variables` of an
  optimizer's node holds other variables in tf_keras's layout than in
  Keras's, which is known only once the node's names have all been seen.
  """

  def __init__(self, restoring: Callable[[int], Any]):
    """Makes the node.

    Args:
      restoring: Given an index found in a checkpoint, returns the object
        that restores it, or None to leave its values until `resolve`.
    """
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
    # Restoring a checkpoint asks the optimizer node for the slot of each
    # restored variable; the slots are the inner optimizer's (it creates
    # them, or restores them when its first step creates them).
    return self.inner_optimizer._create_or_restore_slot_variable(  # pylint: disable=protected-access
        *args, **kwargs)

  def _create_all_weights(self, var_list: Any) -> None:
    # Keras 2 creates a legacy optimizer's slots this way before it loads
    # optimizer weights from an HDF5 file or a SavedModel.
    self.inner_optimizer._create_all_weights(var_list)  # pylint: disable=protected-access


def enclosing_xla_context() -> Any:
  """The XLA context ops are being added to; None outside one.

  Hook: `tf.__internal__.get_enclosing_xla_context()`, which TensorFlow
  exports for Keras; no public API tells. Why: see
  `execution.in_xla_computation`. None on a TensorFlow without it.
  """
  internal = getattr(tf, '__internal__', None)
  enclosing = getattr(internal, 'get_enclosing_xla_context', None)
  return None if enclosing is None else enclosing()
