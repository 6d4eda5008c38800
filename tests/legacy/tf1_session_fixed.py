"""TF 1.x session code with a fixed loss scale, the optimizer named under train.

TF 1.14-1.15 put the wrapper at `tf.train.experimental`; with a number for
the loss scale it is fixed. The float16 kernel gradient at scale 128 is
-3 * 128, far from overflow, so all six steps apply; `compute_gradients`
hands back the gradients unscaled.
"""
# Runs after: compat.install(override=True)
# Keras: no

import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

graph = tf.Graph()
with graph.as_default():
  x = tf.placeholder(tf.float32, [None, 1])
  y = tf.placeholder(tf.float32, [None, 1])
  w = tf.Variable([[0.0]], name='w')
  prediction = tf.cast(tf.matmul(tf.cast(x, tf.float16),
                                 tf.cast(w, tf.float16)), tf.float32)
  loss = tf.reduce_mean(tf.square(prediction - y))
  optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
      tf.train.GradientDescentOptimizer(0.1), loss_scale=128)
  grads_and_vars = optimizer.compute_gradients(loss, var_list=[w])
  train_op = optimizer.apply_gradients(grads_and_vars)
  init = tf.global_variables_initializer()

feed = {x: np.ones((4, 1)), y: np.full((4, 1), 1.5)}
with tf.Session(graph=graph) as sess:
  sess.run(init)
  first_gradient = float(sess.run(grads_and_vars[0][0], feed)[0, 0])
  for _ in range(6):
    sess.run(train_op, feed)
  weight = float(sess.run(w)[0, 0])

# compute_gradients returns unscaled gradients: d/dw (w - 1.5)**2 at w = 0.
np.testing.assert_allclose(first_gradient, -3.0, rtol=1e-3)
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 6), rtol=1e-2)
print(json.dumps({'loss_scale': 128, 'skipped': 0, 'w': weight,
                  'first_gradient': first_gradient}))
