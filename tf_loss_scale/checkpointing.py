"""Checkpoint behaviour shared by the optimizer wrappers."""

from typing import List


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
