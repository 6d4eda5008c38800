"""TF 1.x training with `MonitoredTrainingSession` and a loss-scaled optimizer.

Hooks stop training at a global step; the v1 wrapper does not advance the
global step on a step it skips (TensorFlow's wrapper applies nothing then),
so a run with one skipped step takes one extra `run`. The model computes
in float16; the first batch's feature is 64, whose gradient (-192) is
finite in float16 and overflows once multiplied by the loss scale, which
starts at 2**10 and halves once. TensorFlow 2.15.1's own wrapper, run on
this program, gives the same runs, scale, global step and weight.
"""
# Runs after: compat.install(override=True)
# Keras: no

import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

global_step = tf.train.get_or_create_global_step()
features = tf.placeholder(tf.float32, [None, 1])
labels = tf.placeholder(tf.float32, [None, 1])
w = tf.get_variable('w', [1, 1], initializer=tf.zeros_initializer())
prediction = tf.matmul(tf.cast(features, tf.float16), tf.cast(w, tf.float16))
loss = tf.losses.mean_squared_error(labels, tf.cast(prediction, tf.float32))
loss_scale = tf.mixed_precision.DynamicLossScale(initial_loss_scale=2 ** 10)
optimizer = tf.mixed_precision.MixedPrecisionLossScaleOptimizer(
    tf.train.GradientDescentOptimizer(0.1), loss_scale)
train_op = optimizer.minimize(loss, global_step=global_step)
current_scale = loss_scale()

runs = 0
hooks = [tf.train.StopAtStepHook(last_step=5)]
with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
  while not sess.should_stop():
    value = 64.0 if runs == 0 else 1.0
    sess.run(train_op, {features: [[value]], labels: [[1.5]]})
    runs += 1
    if not sess.should_stop():
      scale, step, weight = sess.run([current_scale, global_step, w])

assert runs == 6, runs
assert (scale, step) == (512.0, 4), (scale, step)  # read before the last run
# Four applied steps of w += 0.2 * (1.5 - w), float16 rounding w to 11 bits.
np.testing.assert_allclose(weight[0, 0], 1.5 * (1 - 0.8 ** 4), rtol=1e-3)
print(json.dumps({'runs': runs, 'loss_scale': float(scale), 'skipped': 1,
                  'w': float(weight[0, 0])}))
