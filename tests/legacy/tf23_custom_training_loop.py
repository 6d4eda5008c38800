"""The TF 2.3 mixed precision guide, as TF 2.3 code: `fit`, then a custom loop.

Written for TensorFlow 2.3 and left in that style: the API calls of the
guide (`tensorflow/docs`, `site/en/guide/mixed_precision.ipynb` before it
moved to the non-experimental API) in the guide's order, on the guide's CPU
model size, with a small synthetic data set instead of the MNIST download
and fewer epochs. First `compile` and `fit` with a plain optimizer (under
`mixed_float16`, `compile` adds the loss scaling), then, from the same
initial weights, the custom training loop with
`LossScaleOptimizer(optimizer, loss_scale='dynamic')`. It must run unchanged
once `tf_loss_scale.compat.install()` has been called, whether `tf.keras` is
Keras 3 or tf_keras (`TF_USE_LEGACY_KERAS=1`).
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)
print('Compute dtype: %s' % policy.compute_dtype)
print('Variable dtype: %s' % policy.variable_dtype)

num_units = 64  # the guide's size without a GPU
inputs = keras.Input(shape=(784,), name='digits')
dense1 = layers.Dense(num_units, activation='relu', name='dense_1')
x = dense1(inputs)
dense2 = layers.Dense(num_units, activation='relu', name='dense_2')
x = dense2(x)
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
print('Test loss:', test_scores[0])
print('Test accuracy:', test_scores[1])

optimizer = keras.optimizers.RMSprop()
optimizer = mixed_precision.LossScaleOptimizer(optimizer, loss_scale='dynamic')

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
  print('Epoch {}: loss={}, test accuracy={}'.format(
      epoch, epoch_loss_avg.result(), test_accuracy.result()))
