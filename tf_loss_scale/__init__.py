"""Loss scaling for mixed precision training on TensorFlow 2 and Keras 3.

Public API:
  LossScale, FixedLossScale, DynamicLossScale: the loss scale and its state.
  get, serialize, deserialize: identifiers and configs to loss scales.
  LossScaleCollapseError: raised when a DynamicLossScale told to raise
    collapses.
  MixedPrecisionLossScaleOptimizer: the `tf.compat.v1` optimizer wrapper.
Modules, imported on first use so that `import tf_loss_scale` loads no Keras:
  keras: the Keras `LossScaleOptimizer`s (`keras.experimental` for TF 2.0-2.3
    code).
  monitoring: TensorBoard summaries, a Keras callback and a v1 hook.
  compat: `install()` of the names TensorFlow 2.0-2.3 code uses.
  inspect_checkpoint: the loss scale state held in a checkpoint.
"""

from tf_loss_scale import lazy as _lazy
from tf_loss_scale.loss_scale import DynamicLossScale
from tf_loss_scale.loss_scale import FixedLossScale
from tf_loss_scale.loss_scale import LossScale
from tf_loss_scale.loss_scale import LossScaleCollapseError
from tf_loss_scale.loss_scale import deserialize
from tf_loss_scale.loss_scale import get
from tf_loss_scale.loss_scale import serialize
from tf_loss_scale.optimizer_v1 import MixedPrecisionLossScaleOptimizer

__getattr__, __dir__ = _lazy.attributes(__name__, {
    module: (f'{__name__}.{module}', None)
    for module in ('compat', 'inspect_checkpoint', 'keras', 'monitoring')
}, globals())

__all__ = [
    'DynamicLossScale',
    'FixedLossScale',
    'LossScale',
    'LossScaleCollapseError',
    'MixedPrecisionLossScaleOptimizer',
    'deserialize',
    'get',
    'serialize',
]
