"""Loss scaling for mixed precision training on TensorFlow 2 and Keras 3.

Public API:
  LossScale, FixedLossScale, DynamicLossScale: the loss scale and its state.
  get, serialize, deserialize: identifiers and configs to loss scales.
  LossScaleCollapseError: raised when a DynamicLossScale told to raise
    collapses.
  MixedPrecisionLossScaleOptimizer: the `tf.compat.v1` optimizer wrapper.
Modules (every name here is imported on first use, so that `import
tf_loss_scale` loads neither TensorFlow nor Keras until they are needed):
  keras: the Keras `LossScaleOptimizer`s (`keras.experimental` for TF 2.0-2.3
    code).
  monitoring: TensorBoard summaries, a Keras callback and a v1 hook.
  compat: `install()` of the names TensorFlow 2.0-2.3 code uses.
  inspect_checkpoint: the loss scale state held in a checkpoint.
  contrib: TF 1.13-1.15's `tf.contrib.mixed_precision`
    (`contrib.mixed_precision`).
"""

from tf_loss_scale import lazy as _lazy

# The package version; pyproject.toml reads it from here.
__version__ = '0.1.0'

_CORE = {
    'loss_scale': ('DynamicLossScale', 'FixedLossScale', 'LossScale',
                   'LossScaleCollapseError', 'deserialize', 'get',
                   'serialize'),
    'optimizer_v1': ('MixedPrecisionLossScaleOptimizer',),
}

# Every public name is imported on first use, the core classes included, so
# that `python -m tf_loss_scale` can route TensorFlow's start-up log lines
# before TensorFlow loads.
__getattr__, __dir__ = _lazy.attributes(__name__, {
    **{name: (f'{__name__}.{module}', name)
       for module, names in _CORE.items() for name in names},
    **{module: (f'{__name__}.{module}', None)
       for module in ('compat', 'contrib', 'inspect_checkpoint', 'keras',
                      'monitoring')},
}, globals())

__all__ = sorted(name for names in _CORE.values() for name in names)
