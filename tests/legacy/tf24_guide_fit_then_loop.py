"""The TF 2.4-2.15 mixed precision guide in one program: `fit`, then a loop.

As the guide (`site/en/guide/mixed_precision.ipynb`, TF 2.4-2.15) wrote it:
`set_global_policy('mixed_float16')`, its model (two ReLU layers, float16
logits, a float32 softmax), `compile` with a plain RMSprop (which `compile`
wraps in a `LossScaleOptimizer`) and `fit`; then, from the same initial
weights, its custom loop with `LossScaleOptimizer(RMSprop())`,
`get_scaled_loss` and `get_unscaled_gradients` in a `tf.function`. The
guide's CPU width (64 units) and a small synthetic stand-in for MNIST keep
it short. The loss scale, `dynamic_counter` and `iterations` expected are
TF 2.15.1's, from a run of this program there.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable

import json

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras import mixed_precision

mixed_precision.set_global_policy('mixed_float16')

num_units = 64
inputs = keras.Input(shape=(784,), name='digits')
x = layers.Dense(num_units, activation='relu', name='dense_1')(inputs)
x = layers.Dense(num_units, activation='relu', name='dense_2')(x)
x = layers.Dense(10, name='dense_logits')(x)
outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)
model = keras.Model(inputs=inputs, outputs=outputs)

# Stand-in for MNIST: 784 noisy pixels; digit k brightens pixels 78k..78k+77.
rng = np.random.RandomState(0)
strokes = np.repeat(np.eye(10, dtype='float32'), 78, axis=1)
y_train = rng.randint(10, size=512)
x_train = rng.uniform(size=(512, 784)).astype('float32')
x_train[:, :780] += strokes[y_train]
y_test = rng.randint(10, size=128)
x_test = rng.uniform(size=(128, 784)).astype('float32')
x_test[:, :780] += strokes[y_test]

model.compile(loss='sparse_categorical_crossentropy',
              optimizer=keras.optimizers.RMSprop(),
              metrics=['accuracy'])
initial_weights = model.get_weights()
history = model.fit(x_train, y_train, batch_size=64, epochs=2,
                    validation_split=0.2, verbose=0)
test_scores = model.evaluate(x_test, y_test, verbose=0)
fit_optimizer = model.optimizer
fit_state = (float(fit_optimizer.loss_scale),
             int(fit_optimizer.dynamic_counter),
             int(fit_optimizer.iterations))

optimizer = keras.optimizers.RMSprop()
optimizer = mixed_precision.LossScaleOptimizer(optimizer)
loss_object = tf.keras.losses.SparseCategoricalCrossentropy()
train_dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                 .shuffle(512, seed=0).batch(64))
test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(64)


@tf.function
def train_step(x, y):
  with tf.GradientTape() as tape:
    predictions = model(x)
    loss = loss_object(y, predictions)
    scaled_loss = optimizer.get_scaled_loss(loss)
  scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
  gradients = optimizer.get_unscaled_gradients(scaled_gradients)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  return loss


@tf.function
def test_step(x):
  return model(x, training=False)


model.set_weights(initial_weights)
epoch_losses = []
for epoch in range(3):
  epoch_loss_avg = tf.keras.metrics.Mean()
  test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
      name='test_accuracy')
  for x, y in train_dataset:
    loss = train_step(x, y)
    epoch_loss_avg(loss)
  for x, y in test_dataset:
    predictions = test_step(x)
    test_accuracy.update_state(y, predictions)
  epoch_losses.append(float(epoch_loss_avg.result()))
loop_state = (float(optimizer.loss_scale), int(optimizer.dynamic_counter),
              int(optimizer.iterations))

# TF 2.15.1's run of this program (tf.keras 2.15, LossScaleOptimizerV3):
# (loss scale, dynamic_counter, iterations) after `fit` and after the loop.
TF215_FIT_STATE = (32768.0, 14, 14)
TF215_LOOP_STATE = (32768.0, 24, 24)
assert (fit_state, loop_state) == (TF215_FIT_STATE, TF215_LOOP_STATE), (
    fit_state, loop_state)
assert all(np.isfinite(history.history['loss'] + epoch_losses))
assert epoch_losses[-1] < epoch_losses[0], epoch_losses
print(json.dumps({
    'fit_state': fit_state, 'loop_state': loop_state,
    'fit_losses': history.history['loss'], 'epoch_losses': epoch_losses,
    'optimizer_class': f'{type(optimizer).__module__}.'
                       f'{type(optimizer).__qualname__}'}))
