"""TF 2.4-2.15 Keras: a fixed loss scale, `dynamic=False, initial_scale=1024`.

The scale never changes; the program checks the scaled loss, the unscaled
gradient, the properties, and six applied eager steps.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')
layer = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')
layer.build((None, 1))
opt = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1), dynamic=False, initial_scale=1024)
assert not opt.dynamic and opt.initial_scale == 1024
assert opt.dynamic_growth_steps is None

x, y = tf.ones((4, 1)), tf.fill((4, 1), 1.5)
for step in range(6):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(tf.cast(layer(x), 'float32') - y))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(
      tape.gradient(scaled_loss, layer.trainable_variables))
  if step == 0:
    np.testing.assert_allclose(
        [float(scaled_loss), float(grads[0][0, 0])], [2.25 * 1024, -3.0],
        rtol=1e-3)
  opt.apply_gradients(zip(grads, layer.trainable_variables))

kernel = float(layer.kernel.numpy()[0, 0])
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 6), rtol=1e-3)
assert float(opt.loss_scale) == 1024.0
print(json.dumps({'loss_scale': 1024.0, 'skipped': 0, 'kernel': kernel,
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
