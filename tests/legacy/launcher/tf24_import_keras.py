"""TF 2.4-2.15 code that imports `keras` itself, beside `tf.keras`.

`import keras` (Keras 2 on TensorFlow 2.6-2.15), `from keras import layers`
for a `tf.keras` model, `keras.mixed_precision.LossScaleOptimizer` around
`keras.optimizers.SGD` with `dynamic_growth_steps=2`, and
`get_scaled_loss`/`get_unscaled_gradients` in a `tf.function`; `keras.
__version__` is Keras 2's. The float16 kernel gradients of the first steps
overflow at the initial scale of 2**15. Prints the loss scale, `iterations`
and the kernel after each step. `tf-loss-scale run` gives `keras` as
tf_keras where `keras` is Keras 3.
"""

import json

import keras
from keras import layers
from keras.mixed_precision import LossScaleOptimizer
import numpy as np
import tensorflow as tf

assert keras.__version__.startswith('2.'), keras.__version__
keras.mixed_precision.set_global_policy('mixed_float16')
model = tf.keras.Sequential([
    layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                 input_shape=(1,)),
    layers.Activation('linear', dtype='float32'),
])
optimizer = LossScaleOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                               dynamic_growth_steps=2)
x = tf.ones((4, 1))
y = tf.fill((4, 1), 1.5)


@tf.function
def train_step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
    scaled_loss = optimizer.get_scaled_loss(loss)
  gradients = optimizer.get_unscaled_gradients(
      tape.gradient(scaled_loss, model.trainable_variables))
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))


scales, iterations, kernels = [], [], []
for _ in range(8):
  train_step()
  scales.append(float(optimizer.loss_scale))
  iterations.append(int(optimizer.iterations))
  kernels.append(float(model.get_weights()[0][0, 0]))
print(json.dumps({'loss_scale': scales, 'iterations': iterations,
                  'kernel': kernels}))
