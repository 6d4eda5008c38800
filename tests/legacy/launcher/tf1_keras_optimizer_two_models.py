"""TF 1.15 Keras code that fits two models with one loss scaled SGD.

`import tensorflow as tf` in graph mode, as TF 1.15 ran by default:
`tf.keras.mixed_precision.experimental.LossScaleOptimizer` around
`tf.keras.optimizers.SGD(momentum=0.9)` with a `DynamicLossScale` that
starts at 2**15 and doubles after 2 good steps, for a `mixed_float16`
layer (TF 1.15 takes no global policy in graph mode); `compile` and `fit`
of one model, then of a second with the same optimizer, as TF 1.15's
optimizers (`OptimizerV2`) allowed. Prints the loss scale and `iterations`
after each `fit`, and the kernels. `tf-loss-scale run` reads TensorFlow 1
from `tf.keras.backend.get_session`.
"""

import json

import numpy as np
import tensorflow as tf



def linear_model():
  return tf.keras.Sequential([
      tf.keras.layers.Dense(
          1, use_bias=False, kernel_initializer='zeros', input_shape=(1,),
          dtype=tf.keras.mixed_precision.experimental.Policy('mixed_float16')),
      tf.keras.layers.Activation('linear', dtype='float32'),
  ])


optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.05, momentum=0.9),
    tf.train.experimental.DynamicLossScale(initial_loss_scale=2 ** 15,
                                           increment_period=2))
x = np.ones((4, 1), np.float32)
y = np.full((4, 1), 1.5, np.float32)
session = tf.keras.backend.get_session()
scales, iterations, kernels = [], [], []
for model in (linear_model(), linear_model()):
  model.compile(optimizer=optimizer, loss='mse')
  model.fit(x, y, batch_size=4, epochs=5, verbose=0)
  scales.append(float(session.run(optimizer.loss_scale())))
  iterations.append(int(session.run(optimizer.iterations)))
  kernels.append(float(model.get_weights()[0][0, 0]))
print(json.dumps({'loss_scale': scales, 'iterations': iterations,
                  'kernel': kernels}))
