"""TF 2.4-2.15 Keras: one `LossScaleOptimizer` warmed up by `fit`, then a loop.

A model compiled with `LossScaleOptimizer(SGD)` under `mixed_float16` fits
three batches; the same optimizer then fine-tunes it in the guide's custom
loop (`get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`) for
three more. The first batch's float16 kernel gradient at 2**15
(-3 * 2**15) overflows in `fit`, and so does the loop's second batch, whose
feature of 64 makes the float16 gradient of the output infinite at 2**14:
both are skipped, each halving the scale. The scale, counter and
`iterations` after each loop step expected are TF 2.15.1's, from a run of
this program there, which counted both skipped steps. On Keras 3, `fit`
follows Keras 3's protocol and the library's class counts `iterations` as
Keras's does there (applied steps only), its loop steps as TF 2.15's.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')
model = tf.keras.Sequential([
    tf.keras.Input(shape=(1,)),
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
opt = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1))
model.compile(optimizer=opt, loss='mse')
model.fit(np.ones((12, 1)), np.full((12, 1), 1.5), batch_size=4, epochs=1,
          shuffle=False, verbose=0)
warmed_up = float(model.trainable_variables[0].numpy()[0, 0])
np.testing.assert_allclose(warmed_up, 1.5 * (1 - 0.8 ** 2), rtol=1e-3)
assert float(opt.loss_scale) == 16384.0

loss_object = tf.keras.losses.MeanSquaredError()


@tf.function
def train_step(x, y):
  variables = model.trainable_variables
  with tf.GradientTape() as tape:
    loss = loss_object(y, model(x, training=True))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))


kernels, states = [], []
for feature in (1.0, 64.0, 1.0):
  train_step(tf.fill((4, 1), feature), tf.fill((4, 1), 1.5))
  kernels.append(float(model.trainable_variables[0].numpy()[0, 0]))
  states.append((float(opt.loss_scale), int(opt.dynamic_counter),
                 int(opt.iterations)))

# TF 2.15.1's run of this program (tf.keras 2.15, LossScaleOptimizerV3):
# (loss scale, dynamic_counter, iterations) after each loop step.
TF215_STATES = [(16384.0, 3, 4), (8192.0, 0, 5), (8192.0, 1, 6)]
TF215_KERNELS = [0.7320312261581421, 0.7320312261581421, 0.8856444954872131]

np.testing.assert_allclose(kernels, TF215_KERNELS, rtol=1e-3)
optimizer_class = f'{type(opt).__module__}.{type(opt).__qualname__}'
expected = TF215_STATES
# The library's class (the one install() names says it is Keras's).
if any(c.__module__.startswith('tf_loss_scale.') for c in type(opt).__mro__):
  # Keras 3's `fit` did not count its skipped step.
  expected = [(scale, counter, iterations - 1)
              for scale, counter, iterations in TF215_STATES]
assert states == expected, (states, expected, optimizer_class)
print(json.dumps({'warmed_up': warmed_up, 'kernels': kernels,
                  'states': states, 'skipped': 2,
                  'optimizer_class': optimizer_class}))
