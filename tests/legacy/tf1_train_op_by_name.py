"""TF 1.x: the train op run by its name, in a graph read back from its GraphDef.

A serving or driver program often holds only a GraphDef and the names of
its ops: it runs `init`, then the train op by the name the optimizer gave
it (`Momentum`, the inner optimizer's). That op must be the whole step: the
loss scale moves with it. Features 64 (an overflow at the scale 2**10,
which halves it), then 1.0: with a growth period of 2 the scale doubles
back after two finite steps and again after two more.
"""
# Runs after: compat.install(override=True)
# Keras: no
# Compared: TensorFlow's wrapper

import json

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
loss_scale = tf.train.experimental.DynamicLossScale(
    initial_loss_scale=2 ** 10, increment_period=2)
optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    tf.train.MomentumOptimizer(0.1, 0.5), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)
assert train_op.name == 'Momentum', train_op.name
tf.global_variables_initializer()  # 'init'
for name, value in (('w_now', w), ('step_now', global_step),
                    ('scale_now', loss_scale())):
  tf.identity(value, name=name)
names = sorted(v.name for v in tf.global_variables())
graph_def = tf.get_default_graph().as_graph_def()

# The first graph's report, after the same steps through its train op.
with tf.Session() as sess:
  sess.run('init')
  for feature in [64.0, 1.0, 1.0, 1.0, 1.0]:
    sess.run(train_op, {x: [[feature]]})
  record = skip_record(optimizer, sess)
  first = sess.run(['w_now:0', 'step_now:0', 'scale_now:0'])

with tf.Graph().as_default():
  tf.import_graph_def(graph_def, name='')
  with tf.Session() as sess:
    sess.run('init')
    for feature in [64.0, 1.0, 1.0, 1.0, 1.0]:
      sess.run('Momentum', {'x:0': [[feature]]})
    weight, step, scale = sess.run(['w_now:0', 'step_now:0', 'scale_now:0'])

assert (int(step), float(scale)) == (4, 2048.0), (step, scale)
for value, value_in_first in zip([weight, step, scale], first):
  np.testing.assert_array_equal(value, value_in_first)
assert record in (None, 'step 0 skipped at loss scale 1024 (overflow): inf '
                  'in w:0'), record
print(json.dumps({'w': float(weight[0, 0]), 'global_step': int(step),
                  'loss_scale': float(scale), 'global_variables': names,
                  'record': record}))
