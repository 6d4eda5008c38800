"""The public members of an object, as a program sees them: kind and parameters.

Shared by `enumerate_originals.py` (run by each original TensorFlow's own
Python, 3.7 and later: no newer syntax here) and by the surface test, which
describes this library's objects the same way, so that both sides of a
comparison come from one reading.

A member's kind says how a program uses it:
  method:    its value is a function or bound method (called).
  property:  its class defines it as a data descriptor (read, maybe set);
             `callable` says whether its value can also be called.
  attribute: anything else (instance attributes, class constants, names
             forwarded by `__getattr__`).
"""

import inspect
import types

_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              types.BuiltinMethodType)


def _static(cls, name):
  """The object `name` is in the first class of `cls`'s MRO that has it."""
  for klass in inspect.getmro(cls):
    if name in vars(klass):
      return vars(klass)[name]
  return None


def _is_data_descriptor(value):
  kind = type(value)
  return hasattr(kind, '__get__') and (hasattr(kind, '__set__') or
                                       hasattr(kind, '__delete__'))


def parameters(function):
  """[name, kind] of each parameter of `function` as called, or None.

  `kind` is inspect's parameter kind name with a `=` appended when the
  parameter has a default (POSITIONAL_OR_KEYWORD=, VAR_KEYWORD, ...).
  """
  try:
    signature = inspect.signature(function)
  except (TypeError, ValueError):
    return None
  described = []
  for parameter in signature.parameters.values():
    kind = parameter.kind.name
    if parameter.default is not inspect.Parameter.empty:
      kind += '='
    described.append([parameter.name, kind])
  return described


def describe(value, static):
  """The description of one member: kind, callable, parameters, type."""
  if static is not None and _is_data_descriptor(static):
    kind = 'property'
  elif isinstance(value, _FUNCTIONS) or isinstance(static, (
      staticmethod, classmethod, types.FunctionType)):
    kind = 'method'
  else:
    kind = 'attribute'
  described = {'kind': kind, 'callable': callable(value),
               'type': type(value).__name__}
  if callable(value):
    params = parameters(value)
    # A method read from a class (not an instance) still names `self`.
    if (isinstance(static, types.FunctionType) and params and
        isinstance(value, types.FunctionType) and params[0][0] == 'self'):
      params = params[1:]
    described['parameters'] = params
  return described


def member(obj, name):
  """The description of `obj`'s member `name`, or None if it has none.

  Looked up by name, so a member forwarded by `__getattr__` that `dir` does
  not list still counts.
  """
  cls = obj if isinstance(obj, type) else type(obj)
  static = _static(cls, name)
  try:
    value = getattr(obj, name)
  except AttributeError:
    if static is None:
      return None
    value, raised = static, 'AttributeError'
  except Exception as error:  # pylint: disable=broad-except
    # Some members raise when read in one state; what a program sees is
    # still the member's kind.
    value, raised = static, type(error).__name__
  else:
    raised = None
  described = describe(value, static)
  if raised:
    described['raises'] = raised
  return described


def public_members(obj):
  """{name: description} of every public name `dir(obj)` lists."""
  return {name: member(obj, name) for name in sorted(dir(obj))
          if not name.startswith('_')}


def function(fn):
  """The description of a module-level function."""
  return {'kind': 'function', 'callable': True, 'type': type(fn).__name__,
          'parameters': parameters(fn)}
