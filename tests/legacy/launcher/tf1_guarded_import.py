"""TF 1.x code that imports TensorFlow inside `try:`, as many scripts did.

`import tensorflow as tf` guarded by `except ImportError`, then, in a
function, TF 1.x's own namespace: a placeholder, `tf.get_variable`,
`tf.train.GradientDescentOptimizer` wrapped in
`tf.train.experimental.MixedPrecisionLossScaleOptimizer` with a
`DynamicLossScale` that starts at 2**15 and doubles after 2 good steps, and
a `tf.Session`. The float16 gradient overflows at 2**15, so the first step
is skipped. Prints the loss scale and the weight after each of 5 steps.
`tf-loss-scale run` reads TensorFlow 1 from `tf.placeholder`.
"""

import json
import sys

try:
  import tensorflow as tf
except ImportError:
  sys.exit('this program needs TensorFlow')


def main():
  x = tf.placeholder(tf.float32, [None, 1], name='x')
  w = tf.get_variable('w', [1, 1], tf.float32, tf.zeros_initializer())
  prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
  loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))
  loss_scale = tf.train.experimental.DynamicLossScale(
      initial_loss_scale=2 ** 15, increment_period=2)
  optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
      tf.train.GradientDescentOptimizer(0.05), loss_scale)
  train_op = optimizer.minimize(loss)
  scales, weights = [], []
  with tf.Session() as session:
    session.run(tf.global_variables_initializer())
    for _ in range(5):
      session.run(train_op, {x: [[1.0]] * 4})
      scales.append(float(session.run(loss_scale())))
      weights.append(float(session.run(w)[0, 0]))
  print(json.dumps({'loss_scale': scales, 'w': weights}))


main()
