"""One process of a loss-scaled training run on several replicas.

Usage: multi_worker_training.py CONFIG_JSON

CONFIG_JSON holds:
  ports: the cluster's worker ports on 127.0.0.1, or [] for one process
    with a MirroredStrategy over `local_replicas` logical CPUs.
  index: this worker's index in `ports`.
  local_replicas: replicas in this process (1 under MultiWorkerMirrored).
  steps: how many steps to train.
  overflow: [step, global replica]: that replica's input is multiplied by
    1e30 in that step, so its gradients (and only its) overflow.
  front_ends: a list of 'v1', 'experimental', 'keras', 'keras_fit'.

Every global replica gets the same two rows in a step whatever the layout, so
1 worker x 2 replicas and 2 workers x 1 replica train on the same data. For
each front end the process prints one JSON line: `front_end`, per-step
`scale`/`good_steps`/`weights` (hex of the weights' bytes), and `final`, the
bytes (hex) and values of every variable of the run (model, optimizer slots,
loss scale, step counters), one entry per local replica's copy.
"""

import json
import os
import sys

CONFIG = json.loads(sys.argv[1])
if CONFIG['ports']:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
  from benchmarks import local_cluster  # pylint: disable=g-import-not-at-top
  os.environ['TF_CONFIG'] = json.dumps(
      local_cluster.tf_config(CONFIG['ports'], CONFIG['index']))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tf_loss_scale  # pylint: disable=g-import-not-at-top
from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top

ROWS = 2          # rows per replica per step
INITIAL_SCALE = 16.0
GROWTH_STEPS = 2
LEARNING_RATE, MOMENTUM = 0.1, 0.9
KERNEL = [[0.5, -0.25], [0.125, 0.75], [-0.5, 0.25]]
BIAS = [0.0625, -0.125]

if CONFIG['ports']:
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * CONFIG['local_replicas'])
  strategy = tf.distribute.MirroredStrategy(
      [f'/cpu:{i}' for i in range(CONFIG['local_replicas'])])
REPLICAS = strategy.num_replicas_in_sync
STEPS = CONFIG['steps']


def _data():
  """Inputs and targets, [step, global replica, row, feature]."""
  cells = np.arange(STEPS * REPLICAS * ROWS * 3, dtype=np.float32)
  x = ((cells * 7) % 11 - 5).reshape(STEPS, REPLICAS, ROWS, 3) / 8
  y = ((cells[:STEPS * REPLICAS * ROWS * 2] * 5) % 7 - 3).reshape(
      STEPS, REPLICAS, ROWS, 2) / 4
  step, replica = CONFIG['overflow']
  x[step, replica] *= 1e30
  return x.astype(np.float32), y.astype(np.float32)


X, Y = _data()


def _replica_batch(step):
  """This replica's rows of `step` (a tensor), inside strategy.run."""
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  return tf.gather(X[:, :, :, :], step)[replica], tf.gather(Y, step)[replica]


def _loss(kernel, bias, x, y):
  # Each replica's share of the global mean, so the all-reduced sum of the
  # gradients is the gradient of the mean over the global batch.
  error = tf.matmul(x, kernel) + bias - y
  return tf.reduce_sum(error * error) / float(ROWS * REPLICAS * 2)


def _bytes_and_value(variable):
  copies = strategy.experimental_local_results(variable)
  return [{'hex': np.asarray(c).tobytes().hex(),
           'value': np.asarray(c).tolist()} for c in copies]


def _fingerprint(variables):
  return ''.join(np.asarray(v).tobytes().hex() for v in variables)


def _record(name, per_step, variables):
  print(json.dumps({
      'front_end': name,
      'steps': per_step,
      'final': {label: _bytes_and_value(v) for label, v in variables.items()},
  }), flush=True)


def _step_record(scale, good_steps, weights):
  return {'scale': float(np.asarray(scale)),
          'good_steps': int(np.asarray(good_steps)),
          'weights': _fingerprint(weights)}


def run_v1():
  """MixedPrecisionLossScaleOptimizer inside strategy.run in a tf.function."""
  with strategy.scope():
    kernel, bias = tf.Variable(KERNEL), tf.Variable(BIAS)
    global_step = tf.Variable(0, dtype=tf.int64, name='global_step')
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM),
        tf_loss_scale.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                       increment_period=GROWTH_STEPS))

  @tf.function
  def train_step(step):
    def replica_step():
      x, y = _replica_batch(step)
      grads_and_vars = optimizer.compute_gradients(
          lambda: _loss(kernel, bias, x, y), [kernel, bias])
      optimizer.apply_gradients(grads_and_vars, global_step)
    strategy.run(replica_step)

  per_step = []
  for step in range(STEPS):
    train_step(tf.constant(step))
    per_step.append(_step_record(optimizer.loss_scale(),
                                 optimizer.loss_scale.good_steps,
                                 [kernel, bias]))
  _record('v1', per_step, {
      'kernel': kernel, 'bias': bias,
      'kernel/momentum': optimizer.get_slot(kernel, 'momentum'),
      'bias/momentum': optimizer.get_slot(bias, 'momentum'),
      'current_loss_scale': optimizer.loss_scale.variables[0],
      'good_steps': optimizer.loss_scale.good_steps,
      'global_step': global_step,
  })


def run_experimental():
  """The TF 2.3 Keras wrapper in a custom loop, as TF 2.3 code wrote it."""
  with strategy.scope():
    kernel, bias = keras.Variable(KERNEL), keras.Variable(BIAS)
    optimizer = tls_keras.experimental.LossScaleOptimizer(
        keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
        tf_loss_scale.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                       increment_period=GROWTH_STEPS))
    optimizer.build([kernel, bias])

  @tf.function
  def train_step(step):
    def replica_step():
      x, y = _replica_batch(step)
      with tf.GradientTape() as tape:
        loss = _loss(kernel, bias, x, y)
        scaled_loss = optimizer.get_scaled_loss(loss)
      scaled_grads = tape.gradient(scaled_loss, [kernel, bias])
      grads = optimizer.get_unscaled_gradients(scaled_grads)
      optimizer.apply_gradients(zip(grads, [kernel, bias]))
    strategy.run(replica_step)

  per_step = []
  for step in range(STEPS):
    train_step(tf.constant(step))
    per_step.append(_step_record(optimizer.loss_scale(),
                                 optimizer.loss_scale.good_steps,
                                 [kernel, bias]))
  _record('experimental', per_step, {
      'kernel': kernel, 'bias': bias,
      **{f'optimizer/{i}/{v.name}': v for i, v in
         enumerate(optimizer.variables)},
  })


def run_keras():
  """The Keras 3 form in a custom loop: scale_loss, then apply."""
  with strategy.scope():
    kernel, bias = keras.Variable(KERNEL), keras.Variable(BIAS)
    optimizer = tls_keras.LossScaleOptimizer(
        keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
        initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS)
    optimizer.build([kernel, bias])

  @tf.function
  def train_step(step):
    def replica_step():
      x, y = _replica_batch(step)
      with tf.GradientTape() as tape:
        scaled_loss = optimizer.scale_loss(_loss(kernel, bias, x, y))
      optimizer.apply(tape.gradient(scaled_loss, [kernel, bias]),
                      [kernel, bias])
    strategy.run(replica_step)

  per_step = []
  for step in range(STEPS):
    train_step(tf.constant(step))
    per_step.append(_step_record(optimizer.dynamic_scale,
                                 optimizer.step_counter, [kernel, bias]))
  _record('keras', per_step, {
      'kernel': kernel, 'bias': bias,
      **{f'optimizer/{i}/{v.name}': v for i, v in
         enumerate(optimizer.variables)},
  })


def run_keras_fit():
  """The Keras 3 form in model.fit, one step per batch.

  Only under MirroredStrategy: Keras 3's model.fit itself fails under
  MultiWorkerMirroredStrategy (keras-team/keras#20585).
  """
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(
            2, kernel_initializer=keras.initializers.Constant(KERNEL),
            bias_initializer=keras.initializers.Constant(BIAS)),
    ])
    optimizer = tls_keras.LossScaleOptimizer(
        keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
        initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS)
    model.compile(optimizer=optimizer, loss='mean_squared_error')

  def dataset_fn(context):
    # One element per (step, local replica), in that order: each local
    # replica takes the next element of its worker's pipeline.
    local = REPLICAS // context.num_input_pipelines
    first = context.input_pipeline_id * local
    x = X[:, first:first + local].reshape(STEPS * local, ROWS, 3)
    y = Y[:, first:first + local].reshape(STEPS * local, ROWS, 2)
    return tf.data.Dataset.from_tensor_slices((x, y))

  per_step = []

  class Record(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      per_step.append(_step_record(optimizer.dynamic_scale,
                                   optimizer.step_counter,
                                   model.trainable_variables))

  model.fit(strategy.distribute_datasets_from_function(dataset_fn),
            epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=[Record()])
  _record('keras_fit', per_step, {
      **{f'model/{v.path}': v for v in model.variables},
      **{f'optimizer/{i}/{v.name}': v for i, v in
         enumerate(optimizer.variables)},
  })


for front_end in CONFIG['front_ends']:
  {'v1': run_v1, 'experimental': run_experimental, 'keras': run_keras,
   'keras_fit': run_keras_fit}[front_end]()
