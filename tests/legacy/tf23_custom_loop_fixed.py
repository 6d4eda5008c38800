"""TF 2.1-2.3 Keras: a custom loop with a fixed loss scale given as a number.

`LossScaleOptimizer(opt, loss_scale=1024)` meant `FixedLossScale(1024)`.
The program checks the pieces a custom loop relies on: the scaled loss is
the loss times 1024, the unscaled gradients are the true ones, and all six
eager steps apply.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

mixed_precision.set_policy('mixed_float16')
dense = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')
dense.build((None, 1))
opt = mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1),
                                         loss_scale=1024)

x = tf.ones((4, 1))
y = tf.fill((4, 1), 1.5)
first = None
for step in range(6):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(tf.cast(dense(x), tf.float32) - y))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(
      tape.gradient(scaled_loss, dense.trainable_variables))
  if first is None:
    first = (float(loss), float(scaled_loss), float(grads[0][0, 0]))
  opt.apply_gradients(zip(grads, dense.trainable_variables))

np.testing.assert_allclose(first, [2.25, 2.25 * 1024, -3.0], rtol=1e-3)
kernel = float(dense.kernel.numpy()[0, 0])
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 6), rtol=1e-2)
assert float(opt.loss_scale()) == 1024.0
print(json.dumps({'loss_scale': 1024.0, 'skipped': 0, 'kernel': kernel}))
