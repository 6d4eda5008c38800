"""TF 2.4-2.15 Keras: a dynamic scale with its own start and growth period.

`LossScaleOptimizer(opt, initial_scale=1024, dynamic_growth_steps=2)` on a
float32 variable. Batches 0 and 3 hold an inf: each skip halves the scale,
two finite steps in a row double it. The scale and the counter after each
step are checked, in a `tf.function` with `jit_compile=True` as TF 2.5+
allowed.
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


@tf.function(jit_compile=True)
def train_step(x):
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(tf.reduce_mean((x @ w - 1.5) ** 2))
  (grad,) = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [w]))
  opt.apply_gradients([(grad, w)])


history = []
for i in range(6):
  train_step(tf.constant([[np.inf if i in (0, 3) else 1.0]]))
  history.append((float(opt.loss_scale), int(opt.dynamic_counter)))

assert history == [(512.0, 0), (512.0, 1), (1024.0, 0), (512.0, 0),
                   (512.0, 1), (1024.0, 0)], history
np.testing.assert_allclose(w.numpy()[0, 0], 1.5 * (1 - 0.8 ** 4), rtol=1e-6)
print(json.dumps({'history': history, 'skipped': 2,
                  'w': float(w.numpy()[0, 0])}))
