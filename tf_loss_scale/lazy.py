"""Package attributes imported on first use (PEP 562 module `__getattr__`).

Importing a package must not load Keras (or `tf_keras`, or TensorFlow) before
the code that uses it runs, yet `package.name` must work after a plain
`import package`.
"""

import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple


def attributes(
    package: str, names: Dict[str, Tuple[str, Optional[str]]],
    package_globals: Dict[str, Any],
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
  """Returns a package's module-level `__getattr__` and `__dir__`.

  Args:
    package: The package's `__name__`.
    names: Public name -> `(module, attribute)`: the absolute module name and
      its attribute to return, or None for the module itself.
    package_globals: The package's `globals()`, where each value is stored
      once imported, so that later accesses skip `__getattr__`.
  """

  def __getattr__(name: str) -> Any:  # pylint: disable=invalid-name
    if name not in names:
      raise AttributeError(f'module {package!r} has no attribute {name!r}')
    module_name, attribute = names[name]
    value = importlib.import_module(module_name)
    if attribute is not None:
      value = getattr(value, attribute)
    package_globals[name] = value
    return value

  def __dir__() -> List[str]:  # pylint: disable=invalid-name
    return sorted(set(package_globals) | set(names))

  return __getattr__, __dir__
