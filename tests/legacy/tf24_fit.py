"""TF 2.4-2.15 Keras: `LossScaleOptimizer(opt)` passed to `compile`, then `fit`.

The non-experimental API: `set_global_policy('mixed_float16')`, the
optimizer wrapped by hand with the defaults (dynamic, 2**15, growth after
2000 finite steps), `loss_scale` a tensor and `dynamic_counter` the finite
steps since the last change. The first batch's float16 kernel gradient
(-3 * 2**15) overflows: one of six steps is skipped. The counts expected
are TF 2.15.1's, from a run of this program there; on Keras 3, whose `fit`
follows Keras 3's protocol (`scale_loss`), the library's class counts
`iterations` as Keras's class does, without the skipped step.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable

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

# TF 2.15.1's run of this program (tf.keras 2.15, LossScaleOptimizerV3):
# the loss scale, dynamic_counter and iterations after `fit`, and the kernel.
TF215 = {'loss_scale': 16384.0, 'dynamic_counter': 5, 'iterations': 6,
         'kernel': 1.0084960460662842}

assert model.optimizer is opt
assert opt.dynamic and opt.initial_scale == 2 ** 15
assert opt.dynamic_growth_steps == 2000
optimizer_class = f'{type(opt).__module__}.{type(opt).__qualname__}'
ran = {'loss_scale': float(opt.loss_scale),
       'dynamic_counter': int(opt.dynamic_counter),
       'iterations': int(opt.iterations),
       'kernel': float(model.get_weights()[0][0, 0])}
expected = dict(TF215)
# The library's class (the one install() names says it is Keras's).
if any(c.__module__.startswith('tf_loss_scale.') for c in type(opt).__mro__):
  expected['iterations'] -= 1  # Keras 3's `fit` counts applied steps only.
np.testing.assert_allclose(ran.pop('kernel'), expected.pop('kernel'),
                           rtol=1e-3)
assert ran == expected, (ran, expected, optimizer_class)
print(json.dumps({**ran, 'skipped': 1, 'optimizer_class': optimizer_class}))
