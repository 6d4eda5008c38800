"""A Bazel consumer of tf_loss_scale: a few TF1 steps with a dynamic loss scale."""

import os
import unittest

import tensorflow as tf

import tf_loss_scale


class TrainV1Test(unittest.TestCase):

  def test_imports_the_package_not_the_repository(self):
    self.assertEqual(
        os.path.basename(os.path.dirname(tf_loss_scale.__file__)),
        'tf_loss_scale')
    self.assertTrue(hasattr(tf_loss_scale, 'DynamicLossScale'))

  def test_a_few_float16_steps_with_a_dynamic_loss_scale(self):
    with tf.Graph().as_default():
      weight = tf.Variable([1.0, -1.0])
      # A float16 loss; its unscaled gradient is 2**-20 for each weight.
      loss = tf.reduce_sum(tf.cast(weight, tf.float16) *
                           tf.constant(2.0**-20, tf.float16))
      optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(2.0**20),
          tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0**10,
                                         increment_period=2))
      train_op = optimizer.minimize(loss, var_list=[weight])
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          session.run(train_op)
        # Each step subtracts lr * 2**-20 = 1 from both weights; the scale
        # doubles after every two finite steps.
        self.assertEqual(session.run(weight).tolist(), [-2.0, -4.0])
        self.assertEqual(session.run(optimizer.loss_scale()), 2.0**11)


if __name__ == '__main__':
  unittest.main()
