"""TF 1.x session code that resets its metrics and keeps a `steps` counter.

Each epoch of three steps ends by reading a streaming mean of the loss and
re-running `tf.local_variables_initializer()`, as programs reset
`tf.metrics`. The program counts its own runs in a variable it names
`steps`, made after the optimizer, and saves and restores with a default
`Saver`, which finds every variable under the name it was given. The first
feature (64) overflows at the scale 2**10, which halves.
"""
# Runs after: compat.install(override=True)
# Keras: no
# Compared: TensorFlow's wrapper

import json
import os

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()


def skip_record(optimizer, session):
  """The library's report of the latest skipped step, as text; None where
  the wrapper is TensorFlow's, which keeps no report."""
  try:
    from tf_loss_scale import monitoring  # pylint: disable=g-import-not-at-top
    return str(monitoring.last_skip(optimizer, session))
  except (ImportError, TypeError):
    return None


x = tf.placeholder(tf.float32, [1, 1], name='x')
global_step = tf.train.get_or_create_global_step()
w = tf.get_variable('w', [1, 1], initializer=tf.zeros_initializer())
prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))
loss_scale = tf.train.experimental.DynamicLossScale(initial_loss_scale=2 ** 10)
optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    tf.train.GradientDescentOptimizer(0.1), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)
steps = tf.get_variable('steps', [], tf.int64, tf.zeros_initializer(),
                        trainable=False)
with tf.control_dependencies([train_op]):
  count = steps.assign_add(1)
mean_loss, update_mean = tf.metrics.mean(loss)
saver = tf.train.Saver()
path = os.path.join(os.getcwd(), 'metrics_reset', 'model')

means, records = [], []
with tf.Session() as sess:
  sess.run([tf.global_variables_initializer(),
            tf.local_variables_initializer()])
  for epoch in range(2):
    for feature in ([64.0, 1.0, 1.0] if epoch == 0 else [1.0] * 3):
      sess.run([count, update_mean], {x: [[feature]]})
    means.append(float(sess.run(mean_loss)))
    sess.run(tf.local_variables_initializer())
    records.append(skip_record(optimizer, sess))
  saver.save(sess, path)
  state = sess.run([w, global_step, loss_scale(), steps])

with tf.Session() as sess:
  saver.restore(sess, path)
  restored = sess.run([w, global_step, loss_scale(), steps])
for value, saved in zip(restored, state):
  np.testing.assert_array_equal(value, saved)

weight = float(state[0][0, 0])
assert [int(state[1]), float(state[2]), int(state[3])] == [5, 512.0, 6], state
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
# The skipped step's report outlives both resets.
report = 'step 0 skipped at loss scale 1024 (overflow): inf in w:0'
assert records in ([None, None], [report, report]), records
print(json.dumps({
    'w': weight, 'global_step': int(state[1]), 'loss_scale': float(state[2]),
    'steps': int(state[3]), 'mean_losses': means,
    'global_variables': [v.name for v in tf.global_variables()],
    'local_variables': [v.name for v in tf.local_variables()],
    'saved': sorted(name for name, _ in tf.train.list_variables(path)),
    'record': records[-1]}))
