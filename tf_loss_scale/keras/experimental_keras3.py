"""The TF 2.0-2.3 form around Keras 3 optimizers, under its earlier module.

`.keras` files of it written before `experimental.keras3` name this module;
Keras 3 before 3.9 loads a class a file names by importing its module.
"""

from tf_loss_scale.keras.experimental.keras3 import LossScaleOptimizer  # pylint: disable=unused-import
