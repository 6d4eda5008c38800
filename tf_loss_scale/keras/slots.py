"""An optimizer's per-variable state, found by the identity of the variable.

Keras 3 optimizers and Keras 2's new optimizers have no `get_slot`: they
keep their slots (momentum, velocity, EMA averages, accumulators) in
private lists. TF 2.3's wrapper offered `get_slot(var, name)`, so the
experimental form answers it from a `SlotTable`: while the wrapper builds
the inner optimizer, every variable the inner optimizer creates through its
public `add_variable_from_reference(reference, name, ...)` is recorded
under the reference variable itself, not its name (two variables may share
a name, and the inner optimizer may be built in another order).
"""

import contextlib
import inspect
from typing import Any, Dict, Iterator, List, Tuple


class SlotTable:
  """Slots by (variable identity, slot name)."""

  def __init__(self):
    # id(variable) -> (variable, {slot name: slot}); the variable is kept so
    # that its id is never reused for another while the table lives.
    self._by_variable: Dict[int, Tuple[Any, Dict[str, Any]]] = {}

  @contextlib.contextmanager
  def recording(self, optimizer: Any) -> Iterator[None]:
    """Records the slots `optimizer` creates inside the `with` block.

    Args:
      optimizer: A Keras 3 or Keras 2 new optimizer.

    Yields:
      Nothing; on exit `optimizer` is as it was.
    """
    create = optimizer.add_variable_from_reference

    def create_and_record(*args, **kwargs):
      slot = create(*args, **kwargs)
      # The reference variable and the slot's name are the first two
      # arguments (their names differ between Keras 2 and Keras 3).
      signature = inspect.signature(create)
      reference_arg, name_arg = list(signature.parameters)[:2]
      given = signature.bind(*args, **kwargs).arguments
      self.add(given[reference_arg], given.get(name_arg), slot)
      return slot

    # An instance attribute shadows the class's method for this object only;
    # set and removed past Keras's attribute tracking.
    optimizer.__dict__['add_variable_from_reference'] = create_and_record
    try:
      yield
    finally:
      del optimizer.__dict__['add_variable_from_reference']

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


def _describe(variable: Any) -> str:
  return (f'variable {getattr(variable, "name", variable)!r} of shape '
          f'{tuple(getattr(variable, "shape", ()))}')
