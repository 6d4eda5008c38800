"""A TF 1.x loss scale of the program's own, written as TensorFlow's were.

The subclass of `tf.train.experimental.LossScale` makes its state with the
base class's `_add_weight`, as TensorFlow's own subclasses did: a scale and
a count of the updates it saw. A `Saver` saves the weights under their
names. (The optimizer lists them among its variables on TensorFlow 2, not
on 1.15: tests/test_tf1_graphs.py compares that.)
"""
# Runs after: compat.install(override=True)
# Keras: no
# Compared: TensorFlow's wrapper

import json
import os

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()


class SteadyLossScale(tf.train.experimental.LossScale):
  """A scale that never changes and never skips a step."""

  def __init__(self, value):
    super(SteadyLossScale, self).__init__()
    self._value = self._add_weight('steady_scale', float(value))

  def __call__(self):
    return tf.convert_to_tensor(self._value)

  def update(self, grads):
    del grads
    return tf.no_op(), True

  def get_config(self):
    return {}


x = tf.placeholder(tf.float32, [1, 1], name='x')
global_step = tf.train.get_or_create_global_step()
w = tf.get_variable('w', [1, 1], initializer=tf.zeros_initializer())
prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))
loss_scale = SteadyLossScale(256)
optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    tf.train.GradientDescentOptimizer(0.1), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)
path = os.path.join(os.getcwd(), 'custom_loss_scale', 'model')

with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  for _ in range(3):
    sess.run(train_op, {x: [[1.0]]})
  tf.train.Saver().save(sess, path)
  weight, step, scale = sess.run([w, global_step, loss_scale()])

assert (int(step), float(scale)) == (3, 256.0), (step, scale)
np.testing.assert_allclose(weight[0, 0], 1.5 * (1 - 0.8 ** 3), rtol=1e-2)
saved = sorted(name for name, _ in tf.train.list_variables(path))
assert saved == ['global_step', 'steady_scale', 'w'], saved
print(json.dumps({
    'w': float(weight[0, 0]), 'global_step': int(step),
    'loss_scale': float(scale),
    'global_variables': [v.name for v in tf.global_variables()],
    'saved': saved}))
