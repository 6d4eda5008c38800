"""An optimizer's per-variable state, found by the identity of the variable.

Keras 3's and Keras 2's new optimizers have no `get_slot`; TF 2.3's wrapper
had one. The wrapper builds the inner optimizer and records each slot the
build created under its model variable (`owners`): told by the name the slot
carries and, among variables of one name, by shape and the build's order.
Only the inner optimizer's public `build` and `variables` are used. A slot
is known by TF 2.x's name (Adam's `m`, `v`) and by the inner optimizer's.
"""

import contextlib
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional,
                    Sequence, Tuple)


class SlotNaming(NamedTuple):
  """How a Keras names an optimizer's slot after its model variable.

  Attributes:
    key: The part of a model variable's name that its slots' names carry.
    splits: Every way to read a slot's name as `(key, kind)`, the kind being
      the slot's own name (such as 'momentum').
  """
  key: Callable[[Any], str]
  splits: Callable[[str], List[Tuple[str, str]]]


def _cuts(name: str, separator: str) -> List[int]:
  # The positions of `separator` in `name` with something either side.
  return [i for i in range(1, len(name) - 1) if name[i] == separator]


# Keras 3: `{path}_{kind}`, the path with `_` for `/` (for a `tf.Variable`,
# its name with `_` for `/` and `:`).
KERAS3 = SlotNaming(
    key=lambda var: (var.path.replace('/', '_') if hasattr(var, 'path') else
                     str(var.name).replace('/', '_').replace(':', '_')),
    splits=lambda name: [(name[:i], name[i + 1:]) for i in _cuts(name, '_')])


def _keras2_splits(name: str) -> List[Tuple[str, str]]:
  # `{kind}/{key}:0`, TensorFlow's `:0` after the name Keras 2 gave.
  if not name.endswith(':0'):
    return []
  given = name[:-2]
  return [(given[i + 1:], given[:i]) for i in _cuts(given, '/')]


# Keras 2's new optimizers: `{kind}/{name}:0`, the variable's name without
# its output index.
KERAS2 = SlotNaming(key=lambda var: var.name.partition(':')[0],
                    splits=_keras2_splits)


# The slots Keras 3's optimizers, or Keras 2's new ones, name otherwise than
# TF 2.x's optimizers of the same name: the optimizer's name -> {their name
# for a slot: TF 2.x's}. (SGD's momentum is `m` in Keras 2's new SGD; the
# infinity norm of Adamax is Keras 3's `norm`, Keras 2's `u`.)
_TF2_SLOT_NAMES = {
    'SGD': {'m': 'momentum'},
    'Adam': {'momentum': 'm', 'velocity': 'v', 'velocity_hat': 'vhat'},
    'Adamax': {'momentum': 'm', 'norm': 'v', 'u': 'v'},
    'Nadam': {'momentum': 'm', 'velocity': 'v'},
    'RMSprop': {'velocity': 'rms', 'average_gradient': 'mg'},
    'Adadelta': {'accumulated_grad': 'accum_grad',
                 'accumulated_delta_var': 'accum_var'},
}


def tf2_slot_names(optimizer: Any) -> Dict[str, str]:
  """TF 2.x's names for the slots `optimizer` names otherwise.

  Args:
    optimizer: A Keras optimizer, of Keras 3 or Keras 2.

  Returns:
    {its name for a kind of slot: TF 2.x's}, by its Keras class.
  """
  for cls in type(optimizer).__mro__:
    if cls.__module__.split('.')[0] in ('keras', 'tf_keras'):
      return _TF2_SLOT_NAMES.get(cls.__name__, {})
  return {}


def owners(var_list: Sequence[Any], created: Sequence[Any],
           naming: SlotNaming) -> List[Tuple[Any, str, Any]]:
  """Tells which variable of a build each variable it created is a slot of.

  A created variable is a slot of the variable whose name its own carries
  (the longer name, where two fit); among variables of that name, of one of
  its shape, then of the first in `var_list` without that kind of slot yet
  (optimizers make slots in the build's order). One whose name carries no
  variable's (Keras 3.3's Adagrad and Ftrl: `accumulator`) is a slot of the
  first variable of its shape without one, unless it is a variable's name.

  Args:
    var_list: The variables the optimizer was built for, in that order.
    created: The variables the build created, in the order it did.
    naming: How the optimizer's Keras names slots.

  Returns:
    `(variable, kind, slot)` triples, one per created variable that is a
    slot; the others (such as an optimizer's own counters) are left out.
  """
  by_key = {}
  for i, var in enumerate(var_list):
    by_key.setdefault(naming.key(var), []).append(i)
  names = {var.name for var in var_list}
  found = []
  taken = set()
  for slot in created:
    fits = sorted((len(kind), _shape(slot) != _shape(var_list[i]), i, kind)
                  for key, kind in naming.splits(slot.name)
                  for i in by_key.get(key, ()))
    if not fits and slot.name not in names:
      fits = [(i, slot.name) for i, var in enumerate(var_list)
              if _shape(var) == _shape(slot)]
    for *_, i, kind in fits:
      if (i, kind) not in taken:
        taken.add((i, kind))
        found.append((var_list[i], kind, slot))
        break
  return found


def _shape(variable: Any) -> Tuple[Any, ...]:
  return tuple(variable.shape)


class SlotTable:
  """Slots by (variable identity, slot name).

  Args:
    renamed: {another name for a kind of slot: the name it is kept under}.
  """

  def __init__(self, renamed: Optional[Dict[str, str]] = None):
    self._renamed = dict(renamed or {})
    # id(variable) -> (variable, {slot name: slot}); the variable is kept so
    # that its id is never reused for another while the table lives.
    self._by_variable: Dict[int, Tuple[Any, Dict[str, Any]]] = {}

  def add(self, variable: Any, name: str, slot: Any) -> None:
    """Records `slot` as the slot `name` of `variable`."""
    name = self._renamed.get(name, name)
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
    name = self._renamed.get(name, name)
    if name not in slots:
      raise KeyError(f'No slot {name!r} for {_describe(variable)}; slots: '
                     f'{sorted(slots)}.')
    return slots[name]

  def names(self) -> List[str]:
    """The names of the slots recorded, in the order first recorded."""
    return list(dict.fromkeys(name for _, slots in self._by_variable.values()
                              for name in slots))


class SlotsByVariable:
  """TF 2.3's `get_slot`/`get_slot_names` for an inner optimizer without them.

  A mixin before a wrapper's bases: a `SlotTable` of the inner optimizer's
  slots, filled when it is built (`build`, `_build_inner`). A class using it
  says how its Keras names slots in `_slot_naming`.
  """

  _slot_naming: SlotNaming

  def __init__(self, *args: Any, **kwargs: Any):
    super().__init__(*args, **kwargs)
    object.__setattr__(self, '_slots', SlotTable(
        tf2_slot_names(self.inner_optimizer)))

  def _build_inner(self, var_list: Sequence[Any]) -> None:
    """Builds the inner optimizer for `var_list`, recording its slots."""
    var_list = list(var_list)
    with self._recording_slots(var_list):
      self.inner_optimizer.build(var_list)

  def build(self, var_list: Sequence[Any]) -> None:
    """Builds as the next class does, recording the inner optimizer's slots.

    For a wrapper whose Keras builds the inner optimizer within its own
    `build`; a class that builds it itself overrides this with
    `_build_inner`.
    """
    var_list = list(var_list)
    with self._recording_slots(var_list):
      super().build(var_list)

  @contextlib.contextmanager
  def _recording_slots(self, var_list: List[Any]) -> Iterator[None]:
    """Within: the inner optimizer may build; its new slots are recorded."""
    before = {id(v) for v in self.inner_optimizer.variables}
    yield
    created = [v for v in self.inner_optimizer.variables
               if id(v) not in before]
    for var, name, slot in owners(var_list, created, self._slot_naming):
      self._slots.add(var, name, slot)

  def add_slot(self, var: Any, slot_name: str,
               initializer: Any = 'zeros') -> Any:
    """Creates a slot `slot_name` of the inner optimizer for `var`.

    As TF 2.x's: if `var` has that slot already, returns it.

    Args:
      var: The model variable the slot belongs to.
      slot_name: The slot's name.
      initializer: A Keras initializer or its name.
    """
    try:
      return self._slots.get(var, slot_name)
    except KeyError:
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
    """Returns the names of the inner optimizer's slots (TF 2.x's)."""
    return self._slots.names()


def _describe(variable: Any) -> str:
  return (f'variable {getattr(variable, "name", variable)!r} of shape '
          f'{tuple(getattr(variable, "shape", ()))}')
