"""TF 1.x session code with a dynamically loss-scaled v1 optimizer.

As TF 1.15 code was carried to TensorFlow 2: `tensorflow.compat.v1` with v2
behaviour off, float32 variables cast to float16 for the compute, and the
v1 optimizer wrapped in `MixedPrecisionLossScaleOptimizer` with a
`DynamicLossScale` object the program reads in the session.

The linear model starts at w = 0 with target 1.5: at the initial scale of
2**15 the float16 gradient of the kernel (-3 * scale) overflows, so the
first step is skipped and the scale halves; the other five apply.
TensorFlow 2.15.1's own wrapper, run on this program, gives the same
scales, losses and weight.
"""
# Runs after: compat.install(override=True)
# Keras: no

import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

x = tf.placeholder(tf.float32, [None, 1], name='x')
y = tf.placeholder(tf.float32, [None, 1], name='y')
w = tf.get_variable('w', [1, 1], tf.float32, tf.zeros_initializer())
prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - y))

loss_scale = tf.mixed_precision.DynamicLossScale()
optimizer = tf.mixed_precision.MixedPrecisionLossScaleOptimizer(
    tf.train.GradientDescentOptimizer(learning_rate=0.1), loss_scale)
train_op = optimizer.minimize(loss)

features = np.ones((4, 1), np.float32)
targets = np.full((4, 1), 1.5, np.float32)
scales, losses = [], []
with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  for _ in range(6):
    step_loss, _ = sess.run([loss, train_op], {x: features, y: targets})
    losses.append(float(step_loss))
    scales.append(float(sess.run(loss_scale())))
  weight = float(sess.run(w)[0, 0])

# Skipped: step 0 only (2**15 -> 2**14); then plain SGD on (w - 1.5)**2.
assert scales == [16384.0] * 6, scales
expected = [0.0, 0.0] + [1.5 * (1 - 0.8 ** k) for k in range(1, 5)]
np.testing.assert_allclose(losses, [(e - 1.5) ** 2 for e in expected],
                           rtol=1e-2)
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
print(json.dumps({'loss_scale': scales[-1], 'skipped': 1, 'w': weight,
                  'losses': losses}))
