"""How tests name the class of an optimizer they check."""


def class_name(cls: type) -> str:
  """`module.qualname` of `cls`, or of the library class it stands for.

  The class `compat.install()` puts under Keras 3's `LossScaleOptimizer`
  name says it is in `keras.optimizers`, so that files name Keras's class
  (tf_loss_scale/keras/shared_name.py); tests name it by the library class
  it subclasses, and tell it from Keras's that way.
  """
  ours = next((c for c in cls.__mro__
               if c.__module__.startswith('tf_loss_scale')), cls)
  return f'{ours.__module__}.{ours.__qualname__}'
