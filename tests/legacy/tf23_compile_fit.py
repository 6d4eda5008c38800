"""A TF 2.3-era `compile`/`fit` script on the experimental mixed precision API.

Left exactly in TF 2.3's style: `set_policy`, a `LossScaleOptimizer` around
a Keras optimizer with a `tf.train.experimental.DynamicLossScale`, then
`compile`, `fit` with a validation split, and `evaluate`. It must run
unchanged once `tf_loss_scale.compat.install()` has been called with
`tf.keras` being tf_keras (`TF_USE_LEGACY_KERAS=1`). Under Keras 3 its first
`fit` step is refused: Keras 3's `fit` passes scaled gradients to
`apply_gradients`, which in TF 2.3's form takes unscaled ones.
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

mixed_precision.set_policy('mixed_float16')
print('Global policy: %s' % mixed_precision.global_policy().name)

inputs = keras.Input(shape=(20,))
x = layers.Dense(32, activation='relu')(inputs)
x = layers.Dense(4)(x)
outputs = layers.Activation('softmax', dtype='float32')(x)
model = keras.Model(inputs, outputs)

loss_scale = tf.train.experimental.DynamicLossScale(
    initial_loss_scale=2 ** 8, increment_period=10)
optimizer = mixed_precision.LossScaleOptimizer(
    keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
    loss_scale=loss_scale)
model.compile(optimizer=optimizer, loss='sparse_categorical_crossentropy',
              metrics=['accuracy'])

# The label is which of the first four features is largest.
rng = np.random.RandomState(0)
x_train = rng.normal(size=(320, 20)).astype('float32')
y_train = x_train[:, :4].argmax(axis=1)
x_test = rng.normal(size=(128, 20)).astype('float32')
y_test = x_test[:, :4].argmax(axis=1)

history = model.fit(x_train, y_train, batch_size=32, epochs=3,
                    validation_split=0.2, verbose=0)
test_loss, test_accuracy = model.evaluate(x_test, y_test, verbose=0)
print('Test loss: %.4f, test accuracy: %.4f' % (test_loss, test_accuracy))
