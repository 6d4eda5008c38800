"""A training script written for TensorFlow 2.3, left exactly in that style.

It follows the TF 2.3 mixed precision guide's custom training loop (with
synthetic data instead of a download). It must run unchanged once
`tf_loss_scale.compat.install()` has been called.
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)

inputs = keras.Input(shape=(784,), name='digits')
x = layers.Dense(64, activation='relu', name='dense_1')(inputs)
x = layers.Dense(64, activation='relu', name='dense_2')(x)
x = layers.Dense(10, name='dense_logits')(x)
outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)
model = keras.Model(inputs=inputs, outputs=outputs)

loss_scale = tf.mixed_precision.experimental.DynamicLossScale(
    initial_loss_scale=2 ** 8, increment_period=10)
optimizer = keras.optimizers.RMSprop(learning_rate=1e-3)
optimizer = mixed_precision.LossScaleOptimizer(optimizer, loss_scale=loss_scale)
loss_object = tf.keras.losses.SparseCategoricalCrossentropy()

rng = np.random.RandomState(0)
x_train = rng.uniform(size=(256, 784)).astype('float32')
y_train = (x_train[:, :10].argmax(axis=1)).astype('int64')
train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)


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


losses = []
for epoch in range(3):
  for x, y in train_dataset:
    losses.append(float(train_step(x, y)))
print('first loss %.4f, last loss %.4f, loss scale %s' %
      (losses[0], losses[-1], float(optimizer.loss_scale())))
