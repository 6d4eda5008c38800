"""TF 1.13-1.15's `tf.contrib` loss scaling API, over this library's step.

`tf_loss_scale.contrib.mixed_precision` is what `tf.contrib.mixed_precision`
was (imported on first use); nothing else of `tf.contrib` is served.
"""

from tf_loss_scale import lazy as _lazy

__getattr__, __dir__ = _lazy.attributes(__name__, {
    'mixed_precision': (f'{__name__}.mixed_precision', None)}, globals())
