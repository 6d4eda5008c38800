"""TF 2.1-2.3: a `DynamicLossScale` object with its own growth schedule.

`tf.mixed_precision.experimental.DynamicLossScale(initial_loss_scale=1024,
increment_period=2, multiplier=4)` given to the experimental
`LossScaleOptimizer`. Batches 0 and 3 hold an inf: each of those steps is
skipped and divides the scale by 4; two finite steps in a row multiply it
by 4. The scale after every step is checked.
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


@tf.function
def step(x):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.5))
    scaled = optimizer.get_scaled_loss(loss)
  grads = optimizer.get_unscaled_gradients(tape.gradient(scaled, [w]))
  optimizer.apply_gradients(zip(grads, [w]))


scales = []
for i in range(6):
  step(tf.constant([[np.inf if i in (0, 3) else 1.0]]))
  scales.append(float(loss_scale()))

assert scales == [256.0, 256.0, 1024.0, 256.0, 256.0, 1024.0], scales
np.testing.assert_allclose(w.numpy()[0, 0], 1.5 * (1 - 0.8 ** 4), rtol=1e-6)
print(json.dumps({'loss_scales': scales, 'skipped': 2,
                  'w': float(w.numpy()[0, 0])}))
