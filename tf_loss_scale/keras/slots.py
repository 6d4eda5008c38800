"""An optimizer's per-variable state, found by the identity of the variable.

Keras 3 optimizers and Keras 2's new optimizers have no `get_slot`: they
keep their slots (momentum, velocity, EMA averages, accumulators) in
private lists. TF 2.3's wrapper offered `get_slot(var, name)`, so the
experimental form answers it from a `SlotTable`: while the wrapper builds
the inner optimizer, every slot it creates is recorded under the model
variable itself, not its name (two variables may share a name, and the
inner optimizer may be built in another order), through
`private_api.slots_created`: no public API of either Keras tells.
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
    """Creates a variable of the inner optimizer shaped like `var`.

    Args:
      var: The model variable the slot belongs to.
      slot_name: The slot's name.
      initializer: A Keras initializer or its name.

    Returns:
      The new slot variable.
    """
    slot = self._new_slot(var, slot_name, initializer)
    self._slots.add(var, slot_name, slot)
    return slot

  def _new_slot(self, var: Any, slot_name: str, initializer: Any) -> Any:
    """Makes the inner optimizer create a slot (its Keras's way)."""
    raise NotImplementedError

  def get_slot(self, var: Any, slot_name: str) -> Any:
    """Returns the inner optimizer's slot `slot_name` of `var`.

    Found by `var` itself, so variables that share a name each get their
    own.

    Args:
      var: A model variable the optimizer was built with.
      slot_name: One of `get_slot_names()`.

    Returns:
      The slot variable.

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
