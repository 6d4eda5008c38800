"""A `tf.estimator.Estimator` whose model_fn wraps its optimizer in loss scaling.

TF 1.15-2.15 estimator code: the model_fn builds a float16 linear model on
float32 variables and minimizes through
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` with the
'dynamic' loss scale (2**15 at first). At that scale the float16 kernel
gradient of the first batch (-3 * scale) overflows: that step is skipped,
and the global step, which the wrapper only advances with an applied step,
ends one short of the six batches.
"""
# Runs after: compat.install(override=True)
# Keras: no
# Needs: tf.estimator

import json

import numpy as np
import tensorflow as tf


def model_fn(features, labels, mode):
  w = tf.compat.v1.get_variable('w', [1, 1],
                                initializer=tf.zeros_initializer())
  prediction = tf.matmul(tf.cast(features['x'], tf.float16),
                         tf.cast(w, tf.float16))
  loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - labels))
  optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
  train_op = optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
  x = np.ones((24, 1), np.float32)
  y = np.full((24, 1), 1.5, np.float32)
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(4)


estimator = tf.estimator.Estimator(model_fn, model_dir='estimator_model')
estimator.train(input_fn)
weight = float(estimator.get_variable_value('w')[0, 0])
global_step = int(estimator.get_variable_value('global_step'))

assert global_step == 5, global_step
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
print(json.dumps({'global_step': global_step, 'skipped': 1, 'w': weight}))
