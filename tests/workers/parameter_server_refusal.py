"""Builds a one-worker, one-ps ParameterServerStrategy in this process and
tries the Keras loss scale optimizers under it.

Prints one line per attempt: `<what>: ValueError: <message>` when refused, or
`<what>: accepted`. Runs in its own process because connecting to a cluster
changes device placement for the rest of the process.
"""

import os
import socket

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top


def _address():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


def _try(what, action):
  try:
    action()
    print(f'{what}: accepted', flush=True)
  except ValueError as error:
    print(f'{what}: ValueError: {error}', flush=True)


spec = tf.train.ClusterSpec({'worker': [_address()], 'ps': [_address()]})
servers = [tf.distribute.Server(spec, job_name=job, task_index=0,
                                protocol='grpc', start=True)
           for job in ('worker', 'ps')]
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer='grpc'))

forms = {
    'keras': lambda: tls_keras.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
    'experimental': lambda: tls_keras.experimental.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), 'dynamic'),
}
for name, make in forms.items():
  built_outside = make()
  variable = keras.Variable([1.0])
  with strategy.scope():
    _try(f'{name} construction', make)
    _try(f'{name} apply',
         lambda: built_outside.apply([tf.constant([1.0])], [variable]))
