"""Checkpoint behaviour shared by the optimizer wrappers."""

from typing import Any, Dict, List


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
  class. `tests/test_checkpointing.py` fails if TensorFlow changes the hook.
  """

  def _saved_model_only_children(self) -> Dict[str, Any]:
    """The extra dependencies, by name (a subclass says which)."""
    raise NotImplementedError

  def _trackable_children(self, save_type='checkpoint', **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if getattr(save_type, 'value', save_type) == 'savedmodel':
      children.update(self._saved_model_only_children())
    return children


def name_v1_dependencies(wrapper: Any, **children: Any) -> None:
  """Names checkpoint dependencies of a `tf.compat.v1` optimizer wrapper.

  Hook: `Trackable._track_trackable(child, name)`. A
  `tf.compat.v1.train.Optimizer` tracks nothing on attribute assignment and
  has no public way to name a dependency. Why: TensorFlow's own wrapper names
  its dependencies `base_optimizer` and `loss_scale`, and checkpoints
  interchange only if ours uses the same names.
  `tests/test_checkpointing.py` fails if TensorFlow changes the hook.

  Args:
    wrapper: The wrapper (a `tf.compat.v1.train.Optimizer`).
    **children: The trackables to depend on, by dependency name.
  """
  for name, child in children.items():
    wrapper._track_trackable(child, name)  # pylint: disable=protected-access
