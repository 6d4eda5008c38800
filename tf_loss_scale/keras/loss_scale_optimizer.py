"""The Keras 3 form under the module `.keras` files of it named before `keras3`.

Keras 3 before 3.9 loads a class a file names by importing its module; this
name keeps those files loading where the library is installed.
"""

from tf_loss_scale.keras.keras3 import LossScaleOptimizer  # pylint: disable=unused-import
