"""The graph rewrite under its TF 2.4+ `tf.compat.v1.mixed_precision` name.

TF1-style code kept running on TensorFlow 2.4-2.15 wrote
`tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(opt)`
with the default 'dynamic' loss scale (2**15 at first). The program builds
its own graph and session; a NaN target in the first batch makes that
step's gradients NaN. The weight shows exactly one step skipped.
"""
# Runs after: compat.install(override=True)
# Keras: no

import json

import numpy as np
import tensorflow as tf

graph = tf.Graph()
with graph.as_default():
  x = tf.compat.v1.placeholder(tf.float32, [None])
  y = tf.compat.v1.placeholder(tf.float32, [None])
  w = tf.compat.v1.get_variable('w', [], initializer=tf.zeros_initializer())
  b = tf.compat.v1.get_variable('b', [], initializer=tf.zeros_initializer())
  loss = tf.reduce_mean(tf.square(w * x + b - y))
  global_step = tf.compat.v1.train.get_or_create_global_step()
  opt = tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.0)
  opt = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite(opt)
  train_op = opt.minimize(loss, global_step=global_step)
  init = tf.compat.v1.global_variables_initializer()

xs = np.array([1., 2., 3., 4.], np.float32)
session = tf.compat.v1.Session(graph=graph)
session.run(init)
for step in range(8):
  ys = 2 * xs + 1 if step else np.array([np.nan, 3., 5., 7.], np.float32)
  session.run(train_op, {x: xs, y: ys})
w_value, b_value = session.run([w, b])
session.close()
tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite()

# Full-batch gradient descent on the same data for the 7 steps that applied.
w_ref = b_ref = 0.0
for _ in range(7):
  error = w_ref * xs + b_ref - (2 * xs + 1)
  w_ref -= 0.05 * float(np.mean(2 * error * xs))
  b_ref -= 0.05 * float(np.mean(2 * error))
np.testing.assert_allclose([w_value, b_value], [w_ref, b_ref], rtol=1e-4)
print(json.dumps({'skipped': 1, 'w': float(w_value), 'b': float(b_value)}))
