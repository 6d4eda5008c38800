"""TF 1.x graph code that turns on the automatic mixed precision rewrite.

The TF 1.14-1.15 recipe: build the float32 graph, wrap the v1 optimizer with
`tf.train.experimental.enable_mixed_precision_graph_rewrite` (which adds
dynamic loss scaling and asks Grappler to cast to float16 on GPUs), train,
and turn it off again. The first batch holds an inf feature, so its
gradients are NaN: that step is skipped and the scale, a `DynamicLossScale`
the program passes, halves once. The other five apply.
"""
# Runs after: compat.install(override=True)
# Keras: no

import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

x = tf.placeholder(tf.float32, [None, 2])
y = tf.placeholder(tf.float32, [None, 1])
w = tf.get_variable('w', [2, 1], initializer=tf.zeros_initializer())
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))

loss_scale = tf.train.experimental.DynamicLossScale(initial_loss_scale=1024.)
opt = tf.train.GradientDescentOptimizer(learning_rate=0.1)
opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    opt, loss_scale=loss_scale)
train_op = opt.minimize(loss)

good_x = np.array([[1., 0.], [0., 1.]], np.float32)
bad_x = np.array([[np.inf, 0.], [0., 1.]], np.float32)
targets = np.array([[1.], [2.]], np.float32)
with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  for step in range(6):
    sess.run(train_op, {x: bad_x if step == 0 else good_x, y: targets})
  scale = float(sess.run(loss_scale()))
  weights = sess.run(w)[:, 0].tolist()
tf.train.experimental.disable_mixed_precision_graph_rewrite()

# Each weight follows w <- w - 0.1 * (w - target) over 5 applied steps.
assert scale == 512.0, scale
np.testing.assert_allclose(weights, [t * (1 - 0.9 ** 5) for t in (1., 2.)],
                           rtol=1e-5)
print(json.dumps({'loss_scale': scale, 'skipped': 1, 'w': weights}))
