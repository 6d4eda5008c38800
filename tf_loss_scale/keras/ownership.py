"""Which live wrapper owns an inner optimizer.

An optimizer wrapped by two loss scale optimizers would take two steps per
training step and be driven by two loss scales. Every Keras wrapper of this
library, whichever Keras its inner optimizer belongs to, registers here and
refuses an optimizer that another live wrapper holds.
"""

import weakref
from typing import Any

_WRAPPER_OF_INNER = weakref.WeakKeyDictionary()


def check_not_wrapped(inner_optimizer: Any, argument: str) -> None:
  """Refuses an optimizer that a live wrapper already wraps.

  Args:
    inner_optimizer: The optimizer about to be wrapped.
    argument: The constructor argument it was passed as, for the message.

  Raises:
    ValueError: If a wrapper that is still alive wraps it.
  """
  wrapper = _WRAPPER_OF_INNER.get(inner_optimizer)
  if wrapper is not None and wrapper() is not None:
    raise ValueError(
        f'{argument} {getattr(inner_optimizer, "name", inner_optimizer)!r} '
        f'is already wrapped by {getattr(wrapper(), "name", wrapper())!r}: '
        f'create a new {argument} for each wrapper.')


def remember_wrapper(inner_optimizer: Any, wrapper: Any) -> None:
  """Records that `wrapper` wraps `inner_optimizer` (while both live)."""
  _WRAPPER_OF_INNER[inner_optimizer] = weakref.ref(wrapper)
