"""TF 2.3 Keras: `fit`, save to HDF5, load, `fit` again, inspect the optimizer.

Written as TF 2.3's mixed precision guide and Keras' saving guide wrote it:
`set_policy('mixed_float16')`, the experimental `LossScaleOptimizer` with a
`DynamicLossScale` (8, doubling after 2 finite steps), `compile`, `fit`,
`model.save('model.h5')`, `load_model`, `fit` again, then the optimizer's
`variables()`, `get_weights()` and slots read, and a custom loop resetting
each of `variables()` (the inner optimizer's; the loss scale stays). The
expected numbers come from this program's run on TF 2.3.4.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

mixed_precision.set_policy('mixed_float16')

model = tf.keras.Sequential([
    tf.keras.Input(shape=(3,)),
    tf.keras.layers.Dense(2, kernel_initializer='ones'),
    tf.keras.layers.Activation('linear', dtype='float32')])
loss_scale = tf.train.experimental.DynamicLossScale(
    initial_loss_scale=8, increment_period=2)
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1, momentum=0.9), loss_scale=loss_scale)
model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError())
x = np.ones((4, 3), 'float32')
y = np.zeros((4, 2), 'float32')
model.fit(x, y, batch_size=2, epochs=1, verbose=0)
# TF 2.3.4: two finite steps, so the scale doubled once.
assert float(optimizer.loss_scale()) == 16.0, float(optimizer.loss_scale())
assert int(optimizer.iterations) == 2

model.save('model.h5')
restored = tf.keras.models.load_model('model.h5')
optimizer = restored.optimizer
assert int(optimizer.iterations) == 2, int(optimizer.iterations)
restored.fit(x, y, batch_size=2, epochs=1, verbose=0)

kernel, bias = restored.layers[0].kernel, restored.layers[0].bias
slot_name = optimizer.get_slot_names()[0]
kernel_slot = optimizer.get_slot(kernel, slot_name).numpy()
bias_slot = optimizer.get_slot(bias, slot_name).numpy()
weights = optimizer.get_weights()
# TF 2.3.4: iterations 4, each momentum -0.2025, each kernel entry -0.3575.
np.testing.assert_allclose(kernel_slot, np.full((3, 2), -0.2025), rtol=1e-3)
np.testing.assert_allclose(bias_slot, np.full((2,), -0.2025), rtol=1e-3)
np.testing.assert_allclose(kernel.numpy(), np.full((3, 2), -0.3575),
                           rtol=1e-3)
assert int(weights[0]) == 4, weights[0]
assert any(w.shape == (3, 2) and np.allclose(w, kernel_slot)
           for w in weights)
# The scale after the second fit: 16 on TF 2.3.4, whose HDF5 files did not
# keep it (restarted at 8, doubled once); 32 where the file keeps it.
scale_after_resume = float(optimizer.loss_scale())
assert scale_after_resume in (16.0, 32.0), scale_after_resume

# A custom loop that starts the optimizer's state afresh.
for variable in optimizer.variables():
  variable.assign(tf.zeros_like(variable))
assert int(optimizer.iterations) == 0
assert float(optimizer.loss_scale()) == scale_after_resume
with tf.GradientTape() as tape:
  loss = tf.reduce_mean(tf.square(restored(x) - y))
  scaled_loss = optimizer.get_scaled_loss(loss)
grads = optimizer.get_unscaled_gradients(
    tape.gradient(scaled_loss, restored.trainable_variables))
optimizer.apply_gradients(zip(grads, restored.trainable_variables))
# TF 2.3.4: the loop's step from the restored weights, momentum 0. (Its
# float16 products round otherwise where oneDNN multiplies float16 natively,
# by 2e-3 of the value.)
np.testing.assert_allclose(kernel.numpy(), np.full((3, 2), -0.1148),
                           rtol=3e-3)
assert int(optimizer.iterations) == 1

print(json.dumps({'iterations': int(optimizer.iterations),
                  'scale_after_resume': scale_after_resume,
                  'kernel': float(kernel.numpy()[0, 0])}))
