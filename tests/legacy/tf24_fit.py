"""TF 2.4-2.15 Keras: `LossScaleOptimizer(opt)` passed to `compile`, then `fit`.

The non-experimental API: `set_global_policy('mixed_float16')`, the
optimizer wrapped by hand with the defaults (dynamic, 2**15, growth after
2000 finite steps), `loss_scale` a tensor and `dynamic_counter` the finite
steps since the last change. The first batch's float16 kernel gradient
(-3 * 2**15) overflows: one of six steps is skipped. TF 2.4-2.15's `fit`
counted it in `iterations` (six); on Keras 3, whose `fit` follows Keras 3's
protocol (`scale_loss`), the library's class counts as Keras's class does
(five).
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

mixed_precision.set_global_policy('mixed_float16')
model = tf.keras.Sequential([
    tf.keras.Input(shape=(1,)),
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
opt = mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
model.compile(optimizer=opt, loss='mse')
model.fit(np.ones((24, 1)), np.full((24, 1), 1.5), batch_size=4, epochs=1,
          shuffle=False, verbose=0)

assert model.optimizer is opt
assert opt.dynamic and opt.initial_scale == 2 ** 15
assert opt.dynamic_growth_steps == 2000
scale = float(opt.loss_scale)
counter = int(opt.dynamic_counter)
kernel = float(model.get_weights()[0][0, 0])
assert (scale, counter) == (16384.0, 5), (scale, counter)
optimizer_class = f'{type(opt).__module__}.{type(opt).__qualname__}'
counted = 5 if optimizer_class.startswith('tf_loss_scale.') else 6
assert int(opt.iterations) == counted, (int(opt.iterations), optimizer_class)
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-3)
print(json.dumps({'loss_scale': scale, 'dynamic_counter': counter,
                  'skipped': 1, 'kernel': kernel,
                  'optimizer_class': optimizer_class}))
