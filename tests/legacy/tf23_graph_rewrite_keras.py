"""TF 2.0-2.3: the graph rewrite around a Keras optimizer, in eager code.

`tf.train.experimental.enable_mixed_precision_graph_rewrite(opt)` returned
the optimizer wrapped in the experimental `LossScaleOptimizer` with a
dynamic scale and turned on Grappler's float16 rewrite of `tf.function`s
(on GPUs). Custom loops had to scale the loss themselves. The first batch
holds an inf: that step is skipped and 2**15 halves once. The rewrite is
turned off at the end, as the API asked before using a mixed policy.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Dense(
    2, kernel_initializer='zeros', bias_initializer='zeros')])
model.build((None, 3))
opt = tf.keras.optimizers.SGD(learning_rate=0.2)
opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(opt)


@tf.function
def train_step(x, y):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(
      tape.gradient(scaled_loss, model.trainable_variables))
  opt.apply_gradients(zip(grads, model.trainable_variables))
  return loss


x = np.eye(3, dtype=np.float32)
y = np.array([[1., 0.], [0., 1.], [1., 1.]], np.float32)
bad_x = x.copy()
bad_x[0, 0] = np.inf
losses = [float(train_step(bad_x if i == 0 else x, y)) for i in range(5)]
tf.train.experimental.disable_mixed_precision_graph_rewrite()

# The same 4 applied steps, in float64 without scaling.
kernel, bias = np.zeros((3, 2)), np.zeros(2)
for _ in range(4):
  error = (x @ kernel + bias - y) * 2 / y.size
  kernel -= 0.2 * x.T @ error
  bias -= 0.2 * error.sum(axis=0)
got_kernel, got_bias = [v.numpy() for v in model.trainable_variables]
np.testing.assert_allclose(got_kernel, kernel, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(got_bias, bias, rtol=1e-5, atol=1e-6)
assert not np.isfinite(losses[0]) and np.isfinite(losses[1:]).all(), losses
assert float(opt.loss_scale()) == 16384.0
print(json.dumps({'loss_scale': 16384.0, 'skipped': 1,
                  'kernel': got_kernel.tolist(), 'bias': got_bias.tolist()}))
