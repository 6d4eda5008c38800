"""TF 1.x between-graph training: a parameter server and two workers.

Each worker builds its own graph under `replica_device_setter`, which puts
the variables (the loss scale's included) on the parameter server, shared
by both workers; each worker runs its own session. Worker 0 initialises the
variables and takes two steps, the first of which overflows (feature 64 at
the scale 2**10, which halves); worker 1 resets its local variables, as a
metrics reset does, and takes two finite steps. The servers run in this
process, on free local ports.
"""
# Runs after: compat.install(override=True)
# Keras: no
# Compared: TensorFlow's wrapper

import json
import socket

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


def free_port():
  probe = socket.socket()
  probe.bind(('localhost', 0))
  port = probe.getsockname()[1]
  probe.close()
  return port


cluster = tf.train.ClusterSpec({
    'ps': ['localhost:%d' % free_port()],
    'worker': ['localhost:%d' % free_port() for _ in range(2)]})
tf.train.Server(cluster, 'ps', 0)
servers = [tf.train.Server(cluster, 'worker', task) for task in range(2)]


def worker(task):
  """One worker's graph: its train op, input, optimizer and reads."""
  graph = tf.Graph()
  with graph.as_default(), tf.device(tf.train.replica_device_setter(
      worker_device='/job:worker/task:%d' % task, cluster=cluster)):
    x = tf.placeholder(tf.float32, [1, 1])
    global_step = tf.train.get_or_create_global_step()
    w = tf.get_variable('w', [1, 1], initializer=tf.zeros_initializer())
    prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
    loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - 1.5))
    loss_scale = tf.train.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 10)
    optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
        tf.train.GradientDescentOptimizer(0.1), loss_scale)
    train_op = optimizer.minimize(loss, global_step=global_step)
    init = tf.global_variables_initializer()
    local_init = tf.local_variables_initializer()
    reads = [w, global_step, loss_scale()]
    session = tf.Session(servers[task].target, graph=graph)
  return session, train_op, x, optimizer, init, local_init, reads


workers = [worker(task) for task in range(2)]
session, train_op, x, optimizer, init, _, _ = workers[0]
session.run(init)
for feature in [64.0, 1.0]:
  session.run(train_op, {x: [[feature]]})
session, train_op, x, optimizer, _, local_init, reads = workers[1]
session.run(local_init)
for feature in [1.0, 1.0]:
  session.run(train_op, {x: [[feature]]})
weight, step, scale = session.run(reads)
records = [skip_record(parts[3], parts[0]) for parts in workers]
for parts in workers:
  parts[0].close()

assert (int(step), float(scale)) == (3, 512.0), (step, scale)
np.testing.assert_allclose(weight[0, 0], 1.5 * (1 - 0.8 ** 3), rtol=1e-2)
# Each worker's own record: the skip was worker 0's.
assert records in ([None, None], [
    'step 0 skipped at loss scale 1024 (overflow): inf in w:0',
    'None']), records
print(json.dumps({'w': float(weight[0, 0]), 'global_step': int(step),
                  'loss_scale': float(scale),
                  'record': None if records[0] is None else records}))
