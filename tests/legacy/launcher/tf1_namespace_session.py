"""TF 1.x code written against TF 1.x's own namespace, as TF 1.15 ran it.

`import tensorflow as tf`, placeholders, `tf.train.MomentumOptimizer`
wrapped in `tf.train.experimental.MixedPrecisionLossScaleOptimizer` with a
`DynamicLossScale` that doubles after 2 good steps, a global step, and a
`tf.Session`. The linear model starts at w = 0 with target 1.5; the float16
kernel gradient (about -3 * scale at first) overflows at 2**15, so steps are
skipped while the scale is that high. Prints, per step, the loss scale and
the global step after it. `tf-loss-scale run` runs it unmodified
(TensorFlow 1 is read from `tf.placeholder`).
"""

import json
import sys

import numpy as np
import tensorflow as tf

x = tf.placeholder(tf.float32, [None, 1], name='x')
y = tf.placeholder(tf.float32, [None, 1], name='y')
w = tf.get_variable('w', [1, 1], tf.float32, tf.zeros_initializer())
prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - y))
global_step = tf.train.get_or_create_global_step()

loss_scale = tf.train.experimental.DynamicLossScale(
    initial_loss_scale=2 ** 15, increment_period=2)
optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    tf.train.MomentumOptimizer(learning_rate=0.05, momentum=0.9), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)

features = np.ones((4, 1), np.float32)
targets = np.full((4, 1), 1.5, np.float32)
scales, steps, weights = [], [], []
with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  for _ in range(8):
    sess.run(train_op, {x: features, y: targets})
    scales.append(float(sess.run(loss_scale())))
    steps.append(int(sess.run(global_step)))
    weights.append(float(sess.run(w)[0, 0]))

print(json.dumps({'loss_scale': scales, 'global_step': steps,
                  'skipped': sum(1 for a, b in zip([0.0] + weights, weights)
                                 if a == b),
                  'w': weights, 'argv': sys.argv[1:]}))
