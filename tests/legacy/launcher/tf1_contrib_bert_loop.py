"""A TF 1.15 training loop of NVIDIA's BERT's shape, as TF 1.15 ran it.

`import tensorflow as tf`, no estimator: a float16 model with float32
weights, an Adam with decoupled weight decay written as BERT's own
`tf.train.Optimizer` subclass (slots by `tf.get_variable`, no global step of
its own), `tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager`
from 2**32 halving every 2 overflows (decr_ratio=0.5), the gradients clipped
by their global norm when finite, and the global step advanced by the loop
only on a finite step, as BERT's `create_optimizer` does. Prints, per step,
the loss scale and the global step after it, and the weights at the end.
`tf-loss-scale run` runs it unmodified (TensorFlow 1 is read from
`tf.placeholder`).
"""

import json
import re
import sys

import numpy as np
import tensorflow as tf


class AdamWeightDecayOptimizer(tf.train.Optimizer):
  """Adam with weight decay added to the update, as BERT wrote it."""

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               name='AdamWeightDecayOptimizer'):
    super(AdamWeightDecayOptimizer, self).__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None or param is None:
        continue
      param_name = re.match('^(.*):\\d+$', param.name).group(1)
      m = tf.get_variable(name=param_name + '/adam_m',
                          shape=param.shape.as_list(), dtype=tf.float32,
                          trainable=False,
                          initializer=tf.zeros_initializer())
      v = tf.get_variable(name=param_name + '/adam_v',
                          shape=param.shape.as_list(), dtype=tf.float32,
                          trainable=False,
                          initializer=tf.zeros_initializer())
      next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
      next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      if self.weight_decay_rate and 'bias' not in param_name:
        update += self.weight_decay_rate * param
      next_param = param - self.learning_rate * update
      assignments.extend([param.assign(next_param), m.assign(next_m),
                          v.assign(next_v)])
    return tf.group(*assignments, name=name)


x = tf.placeholder(tf.float32, [None, 2], name='x')
y = tf.placeholder(tf.float32, [None, 1], name='y')
with tf.variable_scope('dense'):
  kernel = tf.get_variable('kernel', [2], tf.float32,
                           tf.constant_initializer(0.1))
  bias = tf.get_variable('bias', [1], tf.float32, tf.zeros_initializer())
# The products in float16, their sum in float32 (TF 1.15's float16 matmul
# rounds its sums in float16: its results are its kernel's own).
products = tf.cast(x, tf.float16) * tf.cast(kernel, tf.float16)
prediction = tf.reduce_sum(tf.cast(products, tf.float32), axis=1,
                           keepdims=True) + bias
loss = tf.reduce_mean(tf.square(prediction - y))
global_step = tf.train.get_or_create_global_step()

optimizer = AdamWeightDecayOptimizer(learning_rate=0.01,
                                     weight_decay_rate=0.01)
loss_scale_manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(
    init_loss_scale=2**32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,
    decr_ratio=0.5)
optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer,
                                                          loss_scale_manager)
tvars = tf.trainable_variables()
grads_and_vars = optimizer.compute_gradients(loss, tvars)
grads, tvars = list(zip(*grads_and_vars))
all_are_finite = tf.reduce_all([tf.reduce_all(tf.is_finite(g)) for g in grads])
clipped, _ = tf.clip_by_global_norm(
    grads, clip_norm=1.0,
    use_norm=tf.cond(all_are_finite, lambda: tf.global_norm(grads),
                     lambda: tf.constant(1.0)))
train_op = optimizer.apply_gradients(list(zip(clipped, tvars)),
                                     global_step=global_step)
new_global_step = tf.cond(all_are_finite, lambda: global_step + 1,
                          lambda: global_step)
train_op = tf.group(train_op, [global_step.assign(new_global_step)])

features = np.array([[3.0, 4.0], [0.5, -1.0]], np.float32)
targets = np.array([[3.0], [1.0]], np.float32)
scales, steps = [], []
with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  for _ in range(50):
    sess.run(train_op, {x: features, y: targets})
    scales.append(float(sess.run(loss_scale_manager.get_loss_scale())))
    steps.append(int(sess.run(global_step)))
  weights = sess.run(kernel).tolist() + sess.run(bias).tolist()

print(json.dumps({'loss_scale': scales, 'global_step': steps,
                  'weights': [float(w) for w in weights],
                  'argv': sys.argv[1:]}))
