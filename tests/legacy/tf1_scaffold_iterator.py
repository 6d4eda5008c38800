"""TF 1.x training from an initializable iterator, with a custom `Scaffold`.

An initializable dataset iterator is started by a `Scaffold` whose
`local_init_op` runs its initializer; the Scaffold's `ready_op` then checks
every global and local variable, so the session starts only if those two
initialisers leave nothing uninitialised. The model computes in float16;
the first feature (64) gives a gradient (-192) that overflows once
multiplied by the loss scale, 2**10, which halves; `StopAtStepHook` stops
at global step 5, one run later than without the skip. The program prints
the variables of the graph, the trained weight and state, and (with this
library's wrapper) its report of the skipped step.
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


features = [64.0, 1.0, 1.0, 1.0, 1.0, 1.0]
dataset = tf.data.Dataset.from_tensor_slices(
    (np.array(features, np.float32).reshape(-1, 1, 1),
     np.full((6, 1, 1), 1.5, np.float32)))
iterator = tf.data.make_initializable_iterator(dataset)
x, y = iterator.get_next()

global_step = tf.train.get_or_create_global_step()
w = tf.get_variable('w', [1, 1], initializer=tf.zeros_initializer())
prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.losses.mean_squared_error(y, tf.cast(prediction, tf.float32))
loss_scale = tf.train.experimental.DynamicLossScale(initial_loss_scale=2 ** 10)
optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    tf.train.GradientDescentOptimizer(0.1), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)
# Read once the step has run, in the step's own run.
with tf.control_dependencies([train_op]):
  after_step = {'w': tf.identity(w), 'global_step': tf.identity(global_step),
                'scale': tf.identity(loss_scale())}

scaffold = tf.train.Scaffold(local_init_op=iterator.initializer)
runs = 0
with tf.train.MonitoredTrainingSession(
    scaffold=scaffold, hooks=[tf.train.StopAtStepHook(last_step=5)]) as sess:
  while not sess.should_stop():
    state = sess.run(after_step)
    runs += 1
    if not sess.should_stop():
      record = skip_record(optimizer, sess)

weight = float(state['w'][0, 0])
assert runs == 6, runs
assert int(state['global_step']) == 5 and float(state['scale']) == 512.0, state
# Five applied steps of SGD on (w - 1.5)**2 from 0: w <- 0.8 w + 0.3.
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
assert record in (None, 'step 0 skipped at loss scale 1024 (overflow): inf '
                  'in w:0'), record
print(json.dumps({
    'runs': runs, 'w': weight, 'global_step': int(state['global_step']),
    'loss_scale': float(state['scale']),
    'global_variables': [v.name for v in tf.global_variables()],
    'local_variables': [v.name for v in tf.local_variables()],
    'record': record}))
