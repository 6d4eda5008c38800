"""TF 1.14-1.15 code written for TF 2's API, as NVIDIA's AMP examples were.

`import tensorflow.compat.v2 as tf` and `tf.enable_v2_behavior()` on TF
1.15, the graph rewrite around one `tf.keras.optimizers.SGD(momentum=0.9)`
with its dynamic loss scale (2**15 at first), and `fit` of two models with
that one optimizer, 5 steps each, the third sample so large that the scaled
loss overflows and the step is skipped.
Prints the loss scale, `iterations` (TF 1.15's Keras counted applied steps
only) and the kernel after each `fit`. `tf-loss-scale run` reads TensorFlow
1.15 from `tf.enable_v2_behavior` after `tensorflow.compat.v2`.
"""

import json

import numpy as np
import tensorflow.compat.v2 as tf

tf.enable_v2_behavior()


def linear_model():
  return tf.keras.Sequential([
      tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                            input_shape=(1,)),
  ])


optimizer = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD(0.05, momentum=0.9), loss_scale='dynamic')
x = np.array([[1.0], [1.0], [1e20], [1.0], [1.0]], np.float32)
y = np.full((5, 1), 1.5, np.float32)
scales, iterations, kernels = [], [], []
for model in (linear_model(), linear_model()):
  model.compile(optimizer=optimizer, loss='mse')
  model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
  scales.append(float(optimizer.loss_scale()))
  iterations.append(int(optimizer.iterations.numpy()))
  kernels.append(float(model.get_weights()[0][0, 0]))
print(json.dumps({'loss_scale': scales, 'iterations': iterations,
                  'kernel': kernels}))
