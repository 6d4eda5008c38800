"""TF 2.0-2.3's `tf.keras.mixed_precision.experimental`, on every Keras.

`LossScaleOptimizer(optimizer, loss_scale)` (`base.py`) is, once made, of
its inner optimizer's family's class: `keras3.py`'s, or one of `keras2.py`'s
(legacy and new), picked here. TF 2.3's `Policy` and its functions
(`policy.py`) are imported on first use: they need Keras.
"""

from tf_loss_scale import lazy
from tf_loss_scale.keras.experimental import base
from tf_loss_scale.keras.shared import families

LossScaleOptimizer = base.LossScaleOptimizer


def class_for(family: families.Family) -> type:
  """The wrapper class for an inner optimizer of `family`."""
  # pylint: disable=g-import-not-at-top
  if family.kind == families.KERAS3:
    from tf_loss_scale.keras.experimental import keras3
    return keras3.LossScaleOptimizer
  from tf_loss_scale.keras.experimental import keras2
  legacy, new = keras2.classes_for(family.keras)
  return legacy if family.kind == families.KERAS2_LEGACY else new


# pylint: disable-next=protected-access
LossScaleOptimizer._class_for = staticmethod(class_for)


def _register_for_loaded_keras2() -> None:
  # Keras 2 restores an optimizer from an HDF5 file or a SavedModel by its
  # registered name: importing this package is what makes the Keras 2 classes
  # known to the Keras 2 packages already imported (tf.keras on TensorFlow
  # <= 2.15), before any optimizer is wrapped in this process.
  for keras in families.loaded_namespaces():
    if families.is_keras2(keras):
      class_for(families.Family(families.KERAS2, keras))


_register_for_loaded_keras2()

# TF 2.3's policy names, imported on first use (they need Keras).
POLICY_NAMES = ('Policy', 'set_policy', 'global_policy', 'get_layer_policy')
__getattr__, __dir__ = lazy.attributes(__name__, {
    name: (f'{__name__}.policy', name) for name in POLICY_NAMES}, globals())
