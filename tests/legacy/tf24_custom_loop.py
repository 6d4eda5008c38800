"""TF 2.4-2.15 Keras: the mixed precision guide's custom loop, non-experimental.

`tf.keras.mixed_precision.LossScaleOptimizer(optimizer)` with
`get_scaled_loss` and `get_unscaled_gradients` inside a `tf.function`, on a
functional model with a float32 output layer. The first step overflows in
float16 at 2**15 and is skipped; the losses show it.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow import keras

keras.mixed_precision.set_global_policy('mixed_float16')
inputs = keras.Input(shape=(1,))
x = keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')(inputs)
outputs = keras.layers.Activation('linear', dtype='float32')(x)
model = keras.Model(inputs, outputs)

optimizer = keras.optimizers.SGD(learning_rate=0.1)
optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
loss_object = keras.losses.MeanSquaredError()


@tf.function
def train_step(x, y):
  variables = model.trainable_variables
  with tf.GradientTape() as tape:
    loss = loss_object(y, model(x, training=True))
    scaled_loss = optimizer.get_scaled_loss(loss)
  gradients = optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, variables))
  optimizer.apply_gradients(zip(gradients, variables))
  return loss


dataset = tf.data.Dataset.from_tensor_slices(
    (np.ones((24, 1), np.float32), np.full((24, 1), 1.5, np.float32))).batch(4)
losses = [float(train_step(x, y)) for x, y in dataset]

weights_before = [0.0, 0.0] + [1.5 * (1 - 0.8 ** k) for k in range(1, 5)]
np.testing.assert_allclose(losses, [(w - 1.5) ** 2 for w in weights_before],
                           rtol=1e-3)
scale = float(optimizer.loss_scale)
assert scale == 16384.0, scale
assert int(optimizer.dynamic_counter) == 5
kernel = float(model.trainable_variables[0].numpy()[0, 0])
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-3)
print(json.dumps({'loss_scale': scale, 'skipped': 1, 'kernel': kernel,
                  'losses': losses,
                  'optimizer_class': (f'{type(optimizer).__module__}.'
                                      f'{type(optimizer).__qualname__}')}))
