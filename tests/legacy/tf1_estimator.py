"""A `tf.estimator.Estimator` whose model_fn wraps its optimizer in loss scaling.

TF 1.15-2.15 estimator code: the model_fn builds a float16 linear model on
float32 variables and minimizes through
`tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer` with the
'dynamic' loss scale (2**15 at first). At that scale the float16 kernel
gradient of the first batch (-3 * scale) overflows: that step is skipped,
and the global step, which the wrapper only advances with an applied step,
ends one short of the six batches. The estimator's `Scaffold` checks every
variable with its `ready_op` and saves every global one.
"""
# Runs after: compat.install(override=True)
# Keras: no
# Needs: tf.estimator
# Compared: TensorFlow's wrapper

import json
import tempfile

import numpy as np
import tensorflow as tf

optimizers, records = [], []


def skip_record(optimizer, session):
  """The library's report of the latest skipped step, as text; None where
  the wrapper is TensorFlow's, which keeps no report."""
  try:
    from tf_loss_scale import monitoring  # pylint: disable=g-import-not-at-top
    return str(monitoring.last_skip(optimizer, session))
  except (ImportError, TypeError):
    return None


class RecordReader(tf.compat.v1.train.SessionRunHook):
  """Reads the skip record as training ends."""

  def end(self, session):
    records.append(skip_record(optimizers[-1], session))


def model_fn(features, labels, mode):
  w = tf.compat.v1.get_variable('w', [1, 1],
                                initializer=tf.compat.v1.zeros_initializer())
  prediction = tf.matmul(tf.cast(features['x'], tf.float16),
                         tf.cast(w, tf.float16))
  loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - labels))
  optimizer = tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
  optimizers.append(optimizer)
  train_op = optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
  x = np.ones((24, 1), np.float32)
  y = np.full((24, 1), 1.5, np.float32)
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(4)


estimator = tf.estimator.Estimator(model_fn, model_dir=tempfile.mkdtemp())
estimator.train(input_fn, hooks=[RecordReader()])
weight = float(estimator.get_variable_value('w')[0, 0])
global_step = int(estimator.get_variable_value('global_step'))

assert global_step == 5, global_step
np.testing.assert_allclose(weight, 1.5 * (1 - 0.8 ** 5), rtol=1e-2)
assert records in ([None], [
    'step 0 skipped at loss scale 32768 (overflow): inf in w:0']), records
print(json.dumps({'global_step': global_step, 'skipped': 1, 'w': weight,
                  'saved': sorted(estimator.get_variable_names()),
                  'record': records[0]}))
