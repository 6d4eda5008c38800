"""TF 2.1-2.3 Keras: the guide's custom training loop with a dynamic scale.

`LossScaleOptimizer(optimizer, loss_scale='dynamic')`, then in a
`tf.function`: scale the loss, take the scaled gradients, unscale them,
apply. At the initial scale of 2**15 the float16 kernel gradient of the
first step (-3 * scale) overflows, so that step is skipped; the losses show
it (the second equals the first).
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)

model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
model.build((None, 1))
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1), loss_scale='dynamic')
loss_object = tf.keras.losses.MeanSquaredError()


@tf.function
def train_step(x, y):
  with tf.GradientTape() as tape:
    loss = loss_object(y, model(x))
    scaled_loss = optimizer.get_scaled_loss(loss)
  scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
  gradients = optimizer.get_unscaled_gradients(scaled_gradients)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  return loss


x = tf.ones((4, 1))
y = tf.fill((4, 1), 1.5)
losses = [float(train_step(x, y)) for _ in range(6)]

scale = float(optimizer.loss_scale())
kernel = float(model.trainable_variables[0].numpy()[0, 0])
weights_before = [0.0, 0.0] + [1.5 * (1 - 0.8 ** k) for k in range(1, 5)]
np.testing.assert_allclose(losses, [(w - 1.5) ** 2 for w in weights_before],
                           rtol=1e-2)
assert scale == 16384.0, scale
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
print(json.dumps({'loss_scale': scale, 'skipped': 1, 'kernel': kernel,
                  'losses': losses}))
