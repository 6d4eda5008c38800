"""TF 2.4-2.15 Keras: one `LossScaleOptimizer` warmed up by `fit`, then a loop.

A model compiled with `LossScaleOptimizer(SGD)` under `mixed_float16` fits
three batches; the same optimizer then fine-tunes it in the guide's custom
loop (`get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`) for
three more. The first batch's float16 kernel gradient at 2**15
(-3 * 2**15) overflows and is skipped; the five others apply, whichever
ran them. TF 2.4-2.15's `fit` counted the skipped step in `iterations`; on
Keras 3, whose `fit` follows Keras 3's protocol, the library's class counts
as Keras's does (only applied steps), and its loop steps as tf_keras's.
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


kernels = []
for _ in range(3):
  train_step(tf.ones((4, 1)), tf.fill((4, 1), 1.5))
  kernels.append(float(model.trainable_variables[0].numpy()[0, 0]))

np.testing.assert_allclose(
    kernels, [1.5 * (1 - 0.8 ** k) for k in (3, 4, 5)], rtol=1e-3)
scale, counter = float(opt.loss_scale), int(opt.dynamic_counter)
assert (scale, counter) == (16384.0, 5), (scale, counter)
optimizer_class = f'{type(opt).__module__}.{type(opt).__qualname__}'
counted = 5 if optimizer_class.startswith('tf_loss_scale.') else 6
assert int(opt.iterations) == counted, (int(opt.iterations), optimizer_class)
print(json.dumps({'warmed_up': warmed_up, 'kernels': kernels,
                  'loss_scale': scale, 'skipped': 1,
                  'optimizer_class': optimizer_class}))
