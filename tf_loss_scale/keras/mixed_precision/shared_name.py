"""The class `compat.install()` puts under Keras 3's `LossScaleOptimizer` name.

On TensorFlow 2.16+ `tf.keras.mixed_precision` is `keras.mixed_precision`,
one name for TF 2.4-2.15 code and Keras 3 code. After `install()` it holds
TF 2.4-2.15's class in behaviour, and Keras's class in how files name it,
so that what a Keras 3 program saves under `install()` loads where the
library is not installed. Keras names a class in its files after the class
(`.h5` by registered name, `.keras` by module and registered name): this one
is unregistered and says it is in `keras.optimizers`, so its files name
Keras's class. Under `install()` Keras's custom objects map the bare name
back to this class.
"""

from typing import Any

import keras

from tf_loss_scale.keras import mixed_precision


class _TakesKerasClassInstances(type(mixed_precision.LossScaleOptimizer)):
  """`isinstance(x, LossScaleOptimizer)` holds for Keras's class too.

  So that a TF 2.4-2.15 `train_step` branching on it takes its loss scale
  branch for Keras's class, and fails there (no `get_scaled_loss`) as
  without `install()`, rather than train on gradients divided by the scale.
  """

  def __instancecheck__(cls, instance: Any) -> bool:
    if cls is LossScaleOptimizer and isinstance(
        instance, keras.optimizers.LossScaleOptimizer):
      return True
    return super().__instancecheck__(instance)


class LossScaleOptimizer(mixed_precision.LossScaleOptimizer,
                         metaclass=_TakesKerasClassInstances):
  """TF 2.4-2.15's `LossScaleOptimizer`, named in files as Keras's class.

  Keras's class until a TF 2.4-2.15 method is called (see the module
  docstrings here and of `mixed_precision`).
  """

  # Where Keras's class is exported: a `.keras` file's config names this
  # module, and Keras finds its own class there.
  __module__ = 'keras.optimizers'
  # Keras's class to Keras 3 programs (`mixed_precision`'s docstring).
  _KERAS_CLASS_UNTIL_TF24_CALL = True

  def __reduce__(self) -> Any:
    """Pickles as Keras's class does, and names Keras's class, as files do.

    Keras pickles an optimizer as its `.keras` file and a loader of its
    class; the loader named here is Keras's class's, so a pickle loads
    where this library is not installed, and into this class under
    `install()` (the file's name maps to it there).
    """
    loader, args = super().__reduce__()
    return getattr(keras.optimizers.LossScaleOptimizer, loader.__name__), args
