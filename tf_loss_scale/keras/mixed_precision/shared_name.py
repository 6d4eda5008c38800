"""The class `compat.install()` puts under Keras 3's `LossScaleOptimizer` name.

On TensorFlow 2.16 and later `tf.keras.mixed_precision` is
`keras.mixed_precision`: one name that TF 2.4-2.15 code and Keras 3 code
both use. What stands under it after `install()` is TF 2.4-2.15's class
(`tf_loss_scale.keras.mixed_precision.LossScaleOptimizer`) in behaviour,
and Keras's class in how files name it, so that what a Keras 3 program
saves under `install()` loads where the library is not installed.

Why a class of its own: Keras names a class in its files after the class,
not the instance (`.h5` files by its registered name, `.keras` files by its
module and registered name). The library's own class is registered under
the library's name, so that files holding it load wherever the library is
imported; this one is not registered and says it is in `keras.optimizers`,
so its files name Keras's class, and Keras without the library loads them
into that class. Under `install()` Keras's custom objects map the bare name
`LossScaleOptimizer` to this class, so that such files (and `.h5` files of
Keras's class, which name it the same way) load back into it.
"""

from typing import Any

import keras

from tf_loss_scale.keras import mixed_precision


class _TakesKerasClassInstances(type(mixed_precision.LossScaleOptimizer)):
  """`isinstance(x, LossScaleOptimizer)` holds for Keras's class too.

  Before `install()` the name was Keras's class; a TF 2.4-2.15 `train_step`
  that branches on that `isinstance` must still take its loss scale branch
  for an optimizer of Keras's class, and fail loudly there (no
  `get_scaled_loss`) as without `install()`, not train silently on
  gradients Keras's class divides by the scale.
  """

  def __instancecheck__(cls, instance: Any) -> bool:
    if cls is LossScaleOptimizer and isinstance(
        instance, keras.optimizers.LossScaleOptimizer):
      return True
    return super().__instancecheck__(instance)


class LossScaleOptimizer(mixed_precision.LossScaleOptimizer,
                         metaclass=_TakesKerasClassInstances):
  """TF 2.4-2.15's `LossScaleOptimizer`, named in files as Keras's class.

  Everything but the name it saves under, and its being Keras's class
  until a TF 2.4-2.15 method is called, is
  `tf_loss_scale.keras.mixed_precision.LossScaleOptimizer`'s (see there);
  the module docstring says why the two differ.
  """

  # Where Keras's class is exported: a `.keras` file's config names this
  # module, and Keras finds its own class there.
  __module__ = 'keras.optimizers'
  # Keras's class to Keras 3 programs (`mixed_precision`'s docstring).
  _KERAS_CLASS_UNTIL_TF24_CALL = True
