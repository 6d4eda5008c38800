"""TF 2.4-2.15 Keras: a dynamic scale with its own start and growth period.

`LossScaleOptimizer(opt, initial_scale=1024, dynamic_growth_steps=2)` on a
float32 variable used in float16. Batches 0 and 3 hold a 64: the gradient
(64 * 2 * error, 192 and about 4200) is finite in float16, its product with
the scale (about 2e5 and 4e6) is not, so only a scaler that multiplies by
the scale skips those steps. Each skip halves the scale, two finite steps in
a row double it. The scale, the counter and the weight after each step are
checked. The step runs eagerly: compiled, TensorFlow may compute the
float16 product in a wider type (XLA on TensorFlow 2.16) or reassociate it
(Grappler, for tf_keras's class), and no step overflows.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

opt = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1), initial_scale=1024,
    dynamic_growth_steps=2)
w = tf.Variable([[0.0]])


def loss_of(x):
  prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
  return tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))


def train_step(x):
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_of(x))
  (grad,) = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [w]))
  opt.apply_gradients([(grad, w)])


# Unscaled, the first batch's gradient is finite in float16.
with tf.GradientTape() as tape:
  loss = loss_of(tf.constant([[64.0]]))
assert float(tape.gradient(loss, w)[0, 0]) == -192.0

history = []
for i in range(6):
  train_step(tf.constant([[64.0 if i in (0, 3) else 1.0]]))
  history.append((float(opt.loss_scale), int(opt.dynamic_counter),
                  float(w.numpy()[0, 0])))

assert [h[:2] for h in history] == [(512.0, 0), (512.0, 1), (1024.0, 0),
                                    (512.0, 0), (512.0, 1),
                                    (1024.0, 0)], history
# w += 0.2 * (1.5 - w) on the applied steps; float16 rounds w to 11 bits.
np.testing.assert_allclose([h[2] for h in history],
                           [0.0, 0.3, 0.54, 0.54, 0.732, 0.8856], rtol=1e-3)
assert int(opt.iterations) == 6
print(json.dumps({'history': history, 'skipped': 2,
                  'w': float(w.numpy()[0, 0]),
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
