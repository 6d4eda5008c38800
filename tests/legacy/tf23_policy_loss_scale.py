"""TF 2.1-2.3 Keras: a policy that carries a fixed loss scale.

`Policy('mixed_float16', loss_scale=1024)` made `compile` wrap the
optimizer with a `FixedLossScale(1024)`; `get_layer_policy` told which
policy a layer ran under. At 1024 the float16 kernel gradient (-3 * 1024 at
first) never overflows: all six steps apply and the scale stays.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras.mixed_precision import experimental as mixed_precision

policy = mixed_precision.Policy('mixed_float16', loss_scale=1024)
mixed_precision.set_policy(policy)
print('Loss scale: %s' % policy.loss_scale)

inputs = keras.Input(shape=(1,))
dense = keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros')
outputs = keras.layers.Activation('linear', dtype='float32')(dense(inputs))
model = keras.Model(inputs, outputs)
model.compile(keras.optimizers.SGD(0.1), loss='mean_squared_error')
model.fit(np.ones((24, 1)), np.full((24, 1), 1.5), batch_size=4, epochs=1,
          shuffle=False, verbose=0)

layer_policy = mixed_precision.get_layer_policy(dense)
assert layer_policy.name == 'mixed_float16', layer_policy
assert layer_policy.compute_dtype == 'float16'
assert float(policy.loss_scale()) == 1024.0
scale = float(model.optimizer.loss_scale())
kernel = float(dense.get_weights()[0][0, 0])
assert scale == 1024.0, scale
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 6), rtol=1e-2)
print(json.dumps({'loss_scale': scale, 'skipped': 0, 'kernel': kernel}))
