"""Keras: a model compiled under `mixed_float16` saved to `.keras`, loaded,
and trained on with the optimizer state it was saved with.

No loss scaling name is written: `compile` wraps the optimizer itself
(Keras's `LossScaleOptimizer`, or on Keras 3 after `compat.install()` TF
2.4-2.15's class in its place). Keras's loader must compile the loaded
model (it skips that for a model whose `compile` it takes for a user's
own) and restore the step count and Adam's slots: the loaded model then
trains on exactly as the one that was saved. 16 finite steps (the scale
stays at 2**15), then 8 more in each.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable
# Needs: a .keras loader that restores a LossScaleOptimizer

import json
import os
import tempfile

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')
rng = np.random.RandomState(0)
x = rng.uniform(0, 0.1, (64, 4)).astype('float32')
y = x.sum(axis=1, keepdims=True)


def fit(model):
  return model.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                   verbose=0).history['loss'][0]


def optimizer_state(model):
  variables = model.optimizer.variables
  variables = variables() if callable(variables) else variables
  return [v.numpy() for v in variables]


model = tf.keras.Sequential([
    tf.keras.Input(shape=(4,)),
    tf.keras.layers.Dense(8, activation='relu'),
    tf.keras.layers.Dense(1),
])
model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype('float32')
                   for w in model.get_weights()])
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss='mse')
fit(model)
fit(model)
path = os.path.join(tempfile.mkdtemp(), 'model.keras')
model.save(path)
loaded = tf.keras.models.load_model(path)

assert type(loaded.optimizer) is type(model.optimizer), (
    type(loaded.optimizer), type(model.optimizer))
assert int(loaded.optimizer.iterations) == 16, int(loaded.optimizer.iterations)


# 16 finite steps: the scale never moved from 2**15. (TF 2.15.1's loader
# restores the scale, and starts `dynamic_counter` afresh at 0.)
assert float(model.optimizer.loss_scale) == 2.0 ** 15
assert float(loaded.optimizer.loss_scale) == 2.0 ** 15
assert int(model.optimizer.dynamic_counter) == 16
saved_state, loaded_state = optimizer_state(model), optimizer_state(loaded)
assert len(loaded_state) == len(saved_state) > 4, len(loaded_state)
for saved, restored in zip(saved_state, loaded_state):
  np.testing.assert_array_equal(restored, saved)
for saved, restored in zip(model.get_weights(), loaded.get_weights()):
  np.testing.assert_array_equal(restored, saved)

losses = [fit(model), fit(loaded)]
assert losses[0] == losses[1], losses
for a, b in zip(model.get_weights(), loaded.get_weights()):
  np.testing.assert_array_equal(a, b)
assert int(loaded.optimizer.iterations) == 24
assert float(model.optimizer.loss_scale) == 2.0 ** 15
assert float(loaded.optimizer.loss_scale) == 2.0 ** 15
assert int(model.optimizer.dynamic_counter) == 24
print(json.dumps({'optimizer': type(loaded.optimizer).__name__,
                  'iterations': 24, 'loss_after_resume': losses[1],
                  'optimizer_class': (f'{type(loaded.optimizer).__module__}.'
                                      f'{type(loaded.optimizer).__qualname__}')}))
