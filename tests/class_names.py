"""How tests name the class of an optimizer they check."""

import sys


def class_name(cls: type) -> str:
  """`module.qualname` of `cls`, or of the library class it stands for.

  The class `compat.install()` puts under Keras 3's `LossScaleOptimizer`
  name says it is in `keras.optimizers`, so that files name Keras's class
  (tf_loss_scale/keras/mixed_precision/shared_name.py); tests name it by the
  library class it subclasses, and tell it from Keras's that way.
  """
  ours = next((c for c in cls.__mro__
               if c.__module__.startswith('tf_loss_scale')), cls)
  return f'{ours.__module__}.{ours.__qualname__}'


def defining_name(cls: type) -> str:
  """`module.qualname` of the module that defines `cls`.

  Tells apart what `class_name` does not: Keras's `LossScaleOptimizer`,
  the library's TF 2.4-2.15 class, and its subclass that `compat.install()`
  puts under Keras's name
  (`tf_loss_scale.keras.mixed_precision.shared_name`), which says
  it is Keras's `keras.optimizers.LossScaleOptimizer`. A class that is not
  what its `__module__` holds under its name is named by the library
  module that holds it, or said to be neither.
  """
  qualname = cls.__qualname__
  if vars(sys.modules.get(cls.__module__, sys)).get(qualname) is cls:
    return f'{cls.__module__}.{qualname}'
  for name, module in sorted(sys.modules.items()):
    if name.startswith('tf_loss_scale') and vars(module).get(qualname) is cls:
      return f'{name}.{qualname}'
  return f'{cls.__module__}.{qualname}, which is not there'
