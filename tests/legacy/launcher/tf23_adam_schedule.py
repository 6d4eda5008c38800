"""TF 2.3 code: Adam with the user's own learning-rate schedule, loss scaled.

The schedule (`LearningRateSchedule` with `__call__` only, no `get_config`,
as users wrote them) goes to `Adam`, which `mixed_precision.experimental.
LossScaleOptimizer` wraps with a dynamic scale that starts at 2**15 and
doubles after 2 good steps; a custom loop of 6 steps on a float16 model
whose first kernel gradients overflow at 2**15. Prints the loss scale,
`iterations` and the kernel after each step.
"""

import json

import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision


class InverseTime(tf.keras.optimizers.schedules.LearningRateSchedule):

  def __call__(self, step):
    return 0.1 / (1.0 + tf.cast(step, tf.float32))


mixed_precision.set_policy('mixed_float16')
model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                          input_shape=(1,)),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.Adam(InverseTime()),
    tf.mixed_precision.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 15, increment_period=2))
x = tf.ones((4, 1))
y = tf.fill((4, 1), 1.5)


@tf.function
def train_step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
    scaled_loss = optimizer.get_scaled_loss(loss)
  gradients = optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, model.trainable_variables))
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))


scales, iterations, kernels = [], [], []
for _ in range(6):
  train_step()
  scales.append(float(optimizer.loss_scale()))
  iterations.append(int(optimizer.iterations))
  kernels.append(float(model.get_weights()[0][0, 0]))
print(json.dumps({'loss_scale': scales, 'iterations': iterations,
                  'kernel': kernels}))
