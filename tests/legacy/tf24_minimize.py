"""TF 2.11-2.15 Keras: `LossScaleOptimizer(opt).minimize(...)`.

`minimize` scales the loss and unscales the gradients inside, for a loss
callable and for a loss tensor with the tape that computed it, in a
`tf.function`. The first step's float16 kernel gradient at 2**15
(-3 * 2**15) overflows and is skipped; the five others apply. A skipped
step counts in `iterations`, as TF 2.4-2.15's custom loops counted it.
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
loss_object = tf.keras.losses.MeanSquaredError()


@tf.function
def step_with_callable(x, y):
  opt.minimize(lambda: loss_object(y, model(x, training=True)),
               model.trainable_variables)


@tf.function
def step_with_tape(x, y):
  with tf.GradientTape() as tape:
    loss = loss_object(y, model(x, training=True))
  opt.minimize(loss, model.trainable_variables, tape=tape)


x, y = tf.ones((4, 1)), tf.fill((4, 1), 1.5)
kernels = []
for step in (step_with_callable,) * 3 + (step_with_tape,) * 3:
  step(x, y)
  kernels.append(float(model.trainable_variables[0].numpy()[0, 0]))

# Skipped, then w <- w - 0.1 * 2 * (w - 1.5) = 1.5 * (1 - 0.8 ** k).
np.testing.assert_allclose(
    kernels, [0.0] + [1.5 * (1 - 0.8 ** k) for k in range(1, 6)], rtol=1e-3)
scale, counter = float(opt.loss_scale), int(opt.dynamic_counter)
assert (scale, counter) == (16384.0, 5), (scale, counter)
assert int(opt.iterations) == 6, int(opt.iterations)
print(json.dumps({'kernels': kernels, 'loss_scale': scale, 'skipped': 1,
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
