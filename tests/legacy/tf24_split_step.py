"""TF 2.4-2.15 Keras: gradients in a `tf.function` of their own, applied eagerly.

As gradient-accumulation loops are written: `LossScaleOptimizer(SGD)` (no
`dynamic=`), `get_scaled_loss`, the tape and `get_unscaled_gradients` in a
`tf.function` traced before the optimizer ever applied a step, then
`apply_gradients` eagerly. The first step overflows in float16 at 2**15 and
is skipped; every later one trains at 2**14, which the traced function must
read as the scale's current value.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')
inputs = tf.keras.Input(shape=(1,))
x = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')(inputs)
outputs = tf.keras.layers.Activation('linear', dtype='float32')(x)
model = tf.keras.Model(inputs, outputs)

optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1))
variables = model.trainable_variables


@tf.function
def compute_gradients(x, y):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    scaled_loss = optimizer.get_scaled_loss(loss)
  return optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, variables))


x, y = np.ones((4, 1), np.float32), np.full((4, 1), 1.5, np.float32)
kernels, scales = [], []
for _ in range(6):
  optimizer.apply_gradients(zip(compute_gradients(x, y), variables))
  kernels.append(float(variables[0].numpy()[0, 0]))
  scales.append(float(optimizer.loss_scale))

# Skipped, then SGD(0.1) on (w - 1.5)**2: w moves 0.2 of the way each step.
np.testing.assert_allclose(
    kernels, [0.0] + [1.5 * (1 - 0.8 ** k) for k in range(1, 6)], rtol=1e-3)
assert scales == [16384.0] * 6, scales
assert int(optimizer.dynamic_counter) == 5
print(json.dumps({'kernels': kernels, 'scales': scales,
                  'optimizer_class': (f'{type(optimizer).__module__}.'
                                      f'{type(optimizer).__qualname__}')}))
