"""One worker of a two-process MultiWorkerMirroredStrategy training run.

Usage: multi_worker_training.py PORT0 PORT1 INDEX

Each step one worker (or none) sees an inf gradient; the worker prints, as one
JSON line per step, its variable, loss scale and good-step count, so the test
can check that both workers skipped the same steps and agree on every value.
"""

import json
import os
import sys

port0, port1, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ['TF_CONFIG'] = json.dumps({
    'cluster': {'worker': [f'127.0.0.1:{port0}', f'127.0.0.1:{port1}']},
    'task': {'type': 'worker', 'index': index},
})
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tf_loss_scale  # pylint: disable=g-import-not-at-top

# Which worker injects an inf gradient at each step (-1: none).
INF_ON_WORKER = (-1, 1, -1, -1, 0, -1)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
  variable = tf.Variable([1.0, 2.0])
  optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.5),
      tf_loss_scale.DynamicLossScale(initial_loss_scale=8, increment_period=2))


@tf.function
def train_step(inf_on_worker):
  def replica_step():
    x = tf.where(tf.equal(inf_on_worker, index), float('inf'), 1.0)
    grads_and_vars = optimizer.compute_gradients(
        lambda: tf.reduce_sum(variable * x), [variable])
    return optimizer.apply_gradients(grads_and_vars)
  strategy.run(replica_step)


for step, worker in enumerate(INF_ON_WORKER):
  train_step(tf.constant(worker))
  print(json.dumps({
      'step': step,
      'variable': variable.numpy().tolist(),
      'scale': float(optimizer.loss_scale()),
      'good_steps': int(optimizer.loss_scale.good_steps.numpy()),
  }), flush=True)
