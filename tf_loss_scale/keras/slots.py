"""An optimizer's per-variable state, found by the identity of the variable.

Keras 3's and Keras 2's new optimizers have no `get_slot`; TF 2.3's
wrapper had one. The experimental form records each slot the inner
optimizer creates while it builds it under the model variable itself (two
variables may share a name), through `private_api.slots_created`.
"""

from typing import Any, Dict, List, Sequence, Tuple

from tf_loss_scale import private_api


class SlotTable:
  """Slots by (variable identity, slot name)."""

  def __init__(self):
    # id(variable) -> (variable, {slot name: slot}); the variable is kept so
    # that its id is never reused for another while the table lives.
    self._by_variable: Dict[int, Tuple[Any, Dict[str, Any]]] = {}

  def add(self, variable: Any, name: str, slot: Any) -> None:
    """Records `slot` as the slot `name` of `variable`."""
    if name is not None:
      self._by_variable.setdefault(id(variable), (variable, {}))[1][name] = slot

  def get(self, variable: Any, name: str) -> Any:
    """Returns the slot `name` of `variable`.

    Raises:
      KeyError: If `variable` has no slots here, or none of that name.
    """
    variable_and_slots = self._by_variable.get(id(variable))
    if variable_and_slots is None or variable_and_slots[0] is not variable:
      raise KeyError(
          f'{_describe(variable)} is not a variable this optimizer was built '
          'with; call build(variables) or apply gradients to it first (an '
          'optimizer built before it was wrapped has no slots known by '
          'variable).')
    slots = variable_and_slots[1]
    if name not in slots:
      raise KeyError(f'No slot {name!r} for {_describe(variable)}; slots: '
                     f'{sorted(slots)}.')
    return slots[name]

  def names(self) -> List[str]:
    """The sorted names of the slots recorded."""
    return sorted({name for _, slots in self._by_variable.values()
                   for name in slots})


class SlotsByVariable:
  """TF 2.3's `get_slot`/`get_slot_names` for an inner optimizer without them.

  A mixin placed before `experimental.LossScaleOptimizer`: it keeps a
  `SlotTable` of the inner optimizer's slots, filled by `_build_inner`.
  """

  def __init__(self, *args: Any, **kwargs: Any):
    super().__init__(*args, **kwargs)
    object.__setattr__(self, '_slots', SlotTable())

  def _build_inner(self, var_list: Sequence[Any]) -> None:
    """Builds the inner optimizer for `var_list`, recording its slots."""
    with private_api.slots_created(self.inner_optimizer, self._slots.add):
      self.inner_optimizer.build(var_list)

  def add_slot(self, var: Any, slot_name: str,
               initializer: Any = 'zeros') -> Any:
    """Creates a slot `slot_name` of the inner optimizer for `var`.

    Args:
      var: The model variable the slot belongs to.
      slot_name: The slot's name.
      initializer: A Keras initializer or its name.
    """
    slot = self._new_slot(var, slot_name, initializer)
    self._slots.add(var, slot_name, slot)
    return slot

  def _new_slot(self, var: Any, slot_name: str, initializer: Any) -> Any:
    """Makes the inner optimizer create a slot (its Keras's way)."""
    raise NotImplementedError

  def get_slot(self, var: Any, slot_name: str) -> Any:
    """Returns the inner optimizer's slot `slot_name` of `var` (by identity).

    Raises:
      KeyError: If `var` is not one of the optimizer's variables or has no
        slot of that name.
    """
    return self._slots.get(var, slot_name)

  def get_slot_names(self) -> List[str]:
    """Returns the sorted names of the inner optimizer's slots."""
    return self._slots.names()


def _describe(variable: Any) -> str:
  return (f'variable {getattr(variable, "name", variable)!r} of shape '
          f'{tuple(getattr(variable, "shape", ()))}')
