"""TF 1.15 code that resumes training from its own `tf.train.Saver` file.

`import tensorflow as tf`, placeholders, `tf.train.AdamOptimizer` wrapped in
`tf.train.experimental.MixedPrecisionLossScaleOptimizer` with a
`DynamicLossScale` that starts at 2**15 and doubles after 2 good steps, a
global step and a `tf.Session`. The float16 kernel gradient overflows at
2**15, so the first step is skipped. Three steps, a `Saver` file in
./checkpoints/, then as a resumed job does: a new graph, the same model,
`tf.train.latest_checkpoint` restored, three more steps. Prints the loss
scale, the global step and the weight after each step, and the names the
file holds (Adam's beta powers among them).
"""

import json

import numpy as np
import tensorflow as tf

features = np.ones((4, 1), np.float32)
targets = np.full((4, 1), 1.5, np.float32)


def build():
  x = tf.placeholder(tf.float32, [None, 1], name='x')
  y = tf.placeholder(tf.float32, [None, 1], name='y')
  w = tf.get_variable('w', [1, 1], tf.float32, tf.zeros_initializer())
  prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
  loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - y))
  global_step = tf.train.get_or_create_global_step()
  loss_scale = tf.train.experimental.DynamicLossScale(
      initial_loss_scale=2 ** 15, increment_period=2)
  optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
      tf.train.AdamOptimizer(learning_rate=0.1), loss_scale)
  train_op = optimizer.minimize(loss, global_step=global_step)
  return x, y, w, global_step, loss_scale(), train_op


def train(sess, graph, steps, printed):
  x, y, w, global_step, scale, train_op = graph
  for _ in range(steps):
    sess.run(train_op, {x: features, y: targets})
    printed['loss_scale'].append(float(sess.run(scale)))
    printed['global_step'].append(int(sess.run(global_step)))
    printed['w'].append(float(sess.run(w)[0, 0]))


printed = {'loss_scale': [], 'global_step': [], 'w': []}
with tf.Graph().as_default():
  graph = build()
  saver = tf.train.Saver()
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    train(sess, graph, 3, printed)
    saver.save(sess, 'checkpoints/model', global_step=graph[3])

with tf.Graph().as_default():
  graph = build()
  saver = tf.train.Saver()
  with tf.Session() as sess:
    path = tf.train.latest_checkpoint('checkpoints')
    saver.restore(sess, path)
    train(sess, graph, 3, printed)

printed['checkpoint'] = sorted(name for name, _ in tf.train.list_variables(path))
print(json.dumps(printed))
