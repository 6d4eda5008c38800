"""TF 1.13-1.15's `tf.contrib` loss scaling API, over this library's step.

`tf_loss_scale.contrib.mixed_precision` is what `tf.contrib.mixed_precision`
was; nothing else of `tf.contrib` is served.
"""
