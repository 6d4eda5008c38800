"""TF 2.1-2.3 Keras: `set_policy('mixed_float16')`, then `compile` and `fit`.

Under a mixed policy TF 2.3's `compile` wrapped the optimizer in the
experimental `LossScaleOptimizer` with a dynamic loss scale (2**15, doubling
after 2000 finite steps), so the script never names the wrapper; it reads
the scale through `model.optimizer.loss_scale`. One Dense unit, zero at
first, learns 1.5: the first batch's float16 kernel gradient, -3 * 2**15,
overflows, so one of the six steps is skipped and the scale halves.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

mixed_precision.set_policy('mixed_float16')

model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                          input_shape=(1,)),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
              loss='mse')
x = np.ones((24, 1), np.float32)
y = np.full((24, 1), 1.5, np.float32)
history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

scale = float(model.optimizer.loss_scale())
kernel = float(model.get_weights()[0][0, 0])
assert scale == 16384.0, scale
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
assert model.layers[0].compute_dtype == 'float16'
print(json.dumps({'loss_scale': scale, 'skipped': 1, 'kernel': kernel,
                  'loss': history.history['loss']}))
