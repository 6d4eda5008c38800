"""TF 2.3 code that trains two models with one loss scale optimizer.

`LossScaleOptimizer(SGD(momentum=0.9, decay=0.01), loss_scale=...)` of
`mixed_precision.experimental`, first in a `GradientTape` loop on one model
(`get_scaled_loss`, `get_unscaled_gradients`), then through `compile` and
`fit` of a second model: TF 2.3's optimizers (`OptimizerV2`) take variables
of any model, and `decay`. The dynamic scale starts at 2**15 and doubles
after 2 good steps; the float16 kernel gradients of the first steps
overflow at that scale, and those steps are skipped. Prints the loss scale
and `iterations` after each loop step and after `fit`, and the weights.
`tf-loss-scale run` reads TensorFlow 2.3 from `mixed_precision.experimental`
and gives it TF 2.3's optimizers.
"""

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

mixed_precision.set_policy('mixed_float16')


def linear_model(name):
  return tf.keras.Sequential([
      tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                            input_shape=(1,), name=name + '_dense'),
      tf.keras.layers.Activation('linear', dtype='float32'),
  ], name=name)


loss_scale = tf.mixed_precision.experimental.DynamicLossScale(
    initial_loss_scale=2 ** 15, increment_period=2)
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.05, momentum=0.9, decay=0.01), loss_scale)
x = np.ones((4, 1), np.float32)
y = np.full((4, 1), 1.5, np.float32)

first = linear_model('first')


@tf.function
def train_step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(first(x) - y))
    scaled_loss = optimizer.get_scaled_loss(loss)
  gradients = optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, first.trainable_variables))
  optimizer.apply_gradients(zip(gradients, first.trainable_variables))


scales, iterations = [], []
for _ in range(5):
  train_step()
  scales.append(float(optimizer.loss_scale()))
  iterations.append(int(optimizer.iterations))

second = linear_model('second')
second.compile(optimizer=optimizer, loss='mse')
second.fit(x, y, batch_size=4, epochs=6, verbose=0)
scales.append(float(optimizer.loss_scale()))
iterations.append(int(optimizer.iterations))

print(json.dumps({
    'loss_scale': scales, 'iterations': iterations,
    'first_kernel': float(first.get_weights()[0][0, 0]),
    'second_kernel': float(second.get_weights()[0][0, 0])}))
