"""TF 2.4-2.10 Keras: HDF5 resume, then the optimizer's weights and slots.

Written as TF 2.4-2.10's mixed precision and saving guides wrote it:
`set_global_policy('mixed_float16')`, `LossScaleOptimizer(SGD(momentum))`
with `initial_scale=8, dynamic_growth_steps=2`, `compile`, `fit`,
`model.save('model.h5')`, `load_model`, `fit` again; then `get_weights()`,
`get_slot(var, 'momentum')`, `set_weights`, and a custom loop that first
resets each of `optimizer.variables()` (the inner optimizer's iterations and
slots; the loss scale stays). The expected numbers come from this program's
run on TF 2.15.1 with `tf.keras.optimizers.legacy.SGD` (TF 2.4-2.10's
`SGD`; TF 2.11-2.15's own `SGD` has no `get_slot` or `get_weights`).
"""
# Runs after: compat.install()
# Keras: 3 only
# Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable

import json

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')

model = tf.keras.Sequential([
    tf.keras.Input(shape=(3,)),
    tf.keras.layers.Dense(2, kernel_initializer='ones'),
    tf.keras.layers.Activation('linear', dtype='float32')])
optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=8,
    dynamic_growth_steps=2)
model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError())
x = np.ones((4, 3), 'float32')
y = np.zeros((4, 2), 'float32')
model.fit(x, y, batch_size=2, epochs=1, verbose=0)
assert float(optimizer.loss_scale) == 16.0, float(optimizer.loss_scale)
assert int(optimizer.iterations) == 2

model.save('model.h5')
restored = tf.keras.models.load_model('model.h5')
optimizer = restored.optimizer
restored.fit(x, y, batch_size=2, epochs=1, verbose=0)
kernel, bias = restored.layers[0].kernel, restored.layers[0].bias
# TF 2.15.1: iterations 4, each momentum -0.2025, each kernel entry -0.3575;
# get_weights() is [iterations, kernel momentum, bias momentum].
np.testing.assert_allclose(optimizer.get_slot(kernel, 'momentum').numpy(),
                           np.full((3, 2), -0.2025), rtol=1e-3)
np.testing.assert_allclose(kernel.numpy(), np.full((3, 2), -0.3575),
                           rtol=1e-3)
weights = optimizer.get_weights()
assert [np.shape(w) for w in weights] == [(), (3, 2), (2,)], weights
assert int(weights[0]) == 4
# The scale after the second fit: 16 on TF 2.15.1, whose HDF5 files did not
# keep it (restarted at 8, doubled once); 32 where the file keeps it.
scale_after_resume = float(optimizer.loss_scale)
assert scale_after_resume in (16.0, 32.0), scale_after_resume

# set_weights: halve the momentum.
weights[1] = weights[1] / 2
optimizer.set_weights(weights)
np.testing.assert_allclose(optimizer.get_slot(kernel, 'momentum').numpy(),
                           np.full((3, 2), -0.10125), rtol=1e-3)

# A custom loop that starts the optimizer's state afresh.
for variable in optimizer.variables():
  variable.assign(tf.zeros_like(variable))
assert int(optimizer.iterations) == 0
assert float(optimizer.loss_scale) == scale_after_resume


@tf.function
def train_step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(restored(x) - y))
    scaled_loss = optimizer.get_scaled_loss(loss)
  grads = optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, restored.trainable_variables))
  optimizer.apply_gradients(zip(grads, restored.trainable_variables))


train_step()
# TF 2.15.1: the loop's step from the restored weights, momentum 0. (Its
# float16 products round otherwise where oneDNN multiplies float16 natively,
# by 2e-3 of the value.)
np.testing.assert_allclose(kernel.numpy(), np.full((3, 2), -0.1148),
                           rtol=3e-3)
assert int(optimizer.iterations) == 1

print(json.dumps({
    'iterations': int(optimizer.iterations),
    'scale_after_resume': scale_after_resume,
    'kernel': float(kernel.numpy()[0, 0]),
    'optimizer_class': f'{type(optimizer).__module__}.'
                       f'{type(optimizer).__qualname__}'}))
