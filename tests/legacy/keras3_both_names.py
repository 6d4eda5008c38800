"""Keras 3: a custom loop under both of Keras 3's names for its class.

`keras.optimizers.LossScaleOptimizer` is always Keras's class;
`keras.mixed_precision.LossScaleOptimizer` is this library's class on Keras
3 after `compat.install()`, and stays Keras's under TF_USE_LEGACY_KERAS=1
(where install() maps tf_keras's names). The library's class is also taken
by its own name, so that a run where the shared name is not mapped still
compares two classes. Written as Keras 3 writes it (positional
`initial_scale`, `scale_loss`, `apply_gradients` of the gradients of the
scaled loss), all train bit for bit alike: the first float16 kernel
gradient (-3 * 2**15) overflows, that step is skipped and not counted in
`iterations` (5 of 6), and the scale halves to 2**14.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 3

import json
import os

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale.keras import mixed_precision


def train(loss_scale_optimizer):
  layer = keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                             dtype='mixed_float16')
  layer.build((None, 1))
  opt = loss_scale_optimizer(keras.optimizers.SGD(0.1), 2.0**15, 2000)
  for _ in range(6):
    with tf.GradientTape() as tape:
      prediction = tf.cast(layer(tf.ones((4, 1))), tf.float32)
      loss = tf.reduce_mean(tf.square(prediction - 1.5))
      scaled_loss = opt.scale_loss(loss)
    grads = tape.gradient(scaled_loss, layer.trainable_variables)
    opt.apply_gradients(zip(grads, layer.trainable_variables))
  return opt, layer.kernel.numpy()


keras_class = keras.optimizers.LossScaleOptimizer
shared_name = keras.mixed_precision.LossScaleOptimizer
ours = mixed_precision.LossScaleOptimizer
legacy_keras = os.environ.get('TF_USE_LEGACY_KERAS') in ('1', 'true', 'True')
# The shared name is mapped only where tf.keras is Keras 3.
assert (shared_name is keras_class) == legacy_keras, shared_name
assert ours is not keras_class

by_optimizers, optimizers_kernel = train(keras_class)
by_mixed_precision, mixed_precision_kernel = train(shared_name)
by_ours, ours_kernel = train(ours)

assert type(by_optimizers) is keras_class
assert type(by_ours) is ours
assert isinstance(by_mixed_precision, shared_name)
np.testing.assert_array_equal(mixed_precision_kernel, optimizers_kernel)
np.testing.assert_array_equal(ours_kernel, optimizers_kernel)
# .numpy(): Keras 3.3's variables have no __float__.
# The inner optimizer's count: Keras's class keeps one of its own, which
# never moves, before Keras 3.9.
states = [(float(opt.dynamic_scale.numpy()),
           int(opt.inner_optimizer.iterations.numpy()))
          for opt in (by_optimizers, by_mixed_precision, by_ours)]
assert states == [(16384.0, 5)] * 3, states
kernel = float(optimizers_kernel[0, 0])
# 5 applied steps of SGD(0.1) on (w - 1.5)**2: w moves 1 - 2 * 0.1 of the
# way each step; float16 rounding of the layer's output keeps it near.
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-3)
print(json.dumps({
    'mixed_precision_class': (f'{type(by_mixed_precision).__module__}.'
                              f'{type(by_mixed_precision).__name__}'),
    'loss_scale': states[0][0], 'iterations': states[0][1],
    'kernel': kernel}))
