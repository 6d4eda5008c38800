"""A TF 2.1-2.3 training library's `configure_optimizer` helper.

Model libraries of that time took the dtype and a loss scale from their
flags ('dynamic' or a number) and wrapped with the experimental
`LossScaleOptimizer`, then trained with `compile` and `fit`. Here the flag
is 'dynamic' and the first batch's float16 kernel gradient overflows at
2**15: one of six steps is skipped.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf


def configure_optimizer(optimizer, use_float16=False, loss_scale='dynamic'):
  """Wraps the optimizer in loss scaling when training in float16."""
  if use_float16:
    optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        optimizer, loss_scale=loss_scale)
  return optimizer


def set_mixed_precision_policy(dtype):
  if dtype == tf.float16:
    policy = tf.keras.mixed_precision.experimental.Policy('mixed_float16')
    tf.keras.mixed_precision.experimental.set_policy(policy)


flags = {'dtype': 'float16', 'loss_scale': 'dynamic'}
set_mixed_precision_policy(tf.as_dtype(flags['dtype']))
model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                          input_shape=(1,)),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
optimizer = configure_optimizer(tf.keras.optimizers.SGD(0.1),
                                use_float16=flags['dtype'] == 'float16',
                                loss_scale=flags['loss_scale'])
model.compile(optimizer=optimizer, loss='mse')
model.fit(np.ones((24, 1)), np.full((24, 1), 1.5), batch_size=4,
          shuffle=False, verbose=0)

kernel = float(model.get_weights()[0][0, 0])
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
assert float(optimizer.loss_scale()) == 16384.0
print(json.dumps({'loss_scale': 16384.0, 'skipped': 1, 'kernel': kernel}))
