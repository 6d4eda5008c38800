"""TF 2.1-2.3: a `DynamicLossScale` object with its own growth schedule.

`tf.mixed_precision.experimental.DynamicLossScale(initial_loss_scale=1024,
increment_period=2, multiplier=4)` given to the experimental
`LossScaleOptimizer`, on a float32 variable used in float16. Batches 0 and
3 hold a 64: the gradient (64 * 2 * error, 192 and about 4200) is finite in
float16, its product with the scale of 1024 is not, so only a scaler that
multiplies by the scale skips those steps. Each skip divides the scale by
4; two finite steps in a row multiply it by 4. The scale and the weight
after every step are checked.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

loss_scale = tf.mixed_precision.experimental.DynamicLossScale(
    initial_loss_scale=1024, increment_period=2, multiplier=4)
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1), loss_scale=loss_scale)
w = tf.Variable([[0.0]])


def loss_of(x):
  prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
  return tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))


@tf.function
def step(x):
  with tf.GradientTape() as tape:
    scaled = optimizer.get_scaled_loss(loss_of(x))
  grads = optimizer.get_unscaled_gradients(tape.gradient(scaled, [w]))
  optimizer.apply_gradients(zip(grads, [w]))


# Unscaled, the first batch's gradient is finite in float16.
with tf.GradientTape() as tape:
  loss = loss_of(tf.constant([[64.0]]))
assert float(tape.gradient(loss, w)[0, 0]) == -192.0

scales, weights = [], []
for i in range(6):
  step(tf.constant([[64.0 if i in (0, 3) else 1.0]]))
  scales.append(float(loss_scale()))
  weights.append(float(w.numpy()[0, 0]))

assert scales == [256.0, 256.0, 1024.0, 256.0, 256.0, 1024.0], scales
# w += 0.2 * (1.5 - w) on the applied steps; float16 rounds w to 11 bits.
np.testing.assert_allclose(weights, [0.0, 0.3, 0.54, 0.54, 0.732, 0.8856],
                           rtol=1e-3)
print(json.dumps({'loss_scales': scales, 'skipped': 2, 'weights': weights}))
