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
  front_ends: a list of 'v1', 'experimental', 'mixed_precision' (TF
    2.4-2.15's form), 'keras', 'keras_fit'.

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
# This checkout's library and benchmarks, whatever is installed.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
if CONFIG['ports']:
  from benchmarks import local_cluster  # pylint: disable=g-import-not-at-top
  os.environ['TF_CONFIG'] = json.dumps(
      local_cluster.tf_config(CONFIG['ports'], CONFIG['index']))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import toy_training as toy  # pylint: disable=g-import-not-at-top
import tf_loss_scale  # pylint: disable=g-import-not-at-top
from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top
from tf_loss_scale import monitoring  # pylint: disable=g-import-not-at-top

ROWS = 2          # rows per replica per step
INITIAL_SCALE = 16.0
GROWTH_STEPS = 2

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
X, Y = toy.data(STEPS, REPLICAS, ROWS, CONFIG['overflow'])


def _loss(kernel, bias, step):
  """This replica's share of the global mean loss of `step`.

  Called inside strategy.run: the all-reduced sum of the replicas'
  gradients is then the gradient of the mean over the global batch.
  """
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  x, y = tf.gather(X, step)[replica], tf.gather(Y, step)[replica]
  return toy.squared_error(kernel, bias, x, y, float(ROWS * REPLICAS * 2))


def _step_record(scale, good_steps, weights):
  return {'scale': float(np.asarray(scale)),
          'good_steps': int(np.asarray(good_steps)),
          'weights': ''.join(np.asarray(w).tobytes().hex() for w in weights)}


def _print(name, per_step, final_variables, optimizer, names):
  """Prints one front end's results as a JSON line.

  The skip report is printed with the variables' names replaced by their
  labels in `names` ({framework name: label}).
  """
  report = monitoring.last_skip(optimizer)
  print(json.dumps({
      'front_end': name,
      'steps': per_step,
      'skip_report': None if report is None else {
          'step': report.step, 'loss_scale': report.loss_scale,
          'nan': [names[n] for n in report.nan],
          'inf': [names[n] for n in report.inf], 'cause': report.cause},
      'final': toy.record({
          label: strategy.experimental_local_results(v)
          for label, v in final_variables.items()}),
  }), flush=True)


def _train(name, replica_step, scale_and_good_steps, weights, final,
           optimizer, names):
  """Runs `replica_step(step)` in strategy.run in a tf.function, STEPS times.

  Args:
    name: The front end's name.
    replica_step: One replica's step.
    scale_and_good_steps: Returns the loss scale and good steps to record.
    weights: The model variables, fingerprinted after every step.
    final: Returns {label: variable} to record at the end.
    optimizer: The loss scale optimizer, for its skip report.
    names: {a variable's name in the report: its label}.
  """
  train_step = tf.function(
      lambda step: strategy.run(replica_step, args=(step,)))
  per_step = []
  for step in range(STEPS):
    train_step(tf.constant(step))
    per_step.append(_step_record(*scale_and_good_steps(), weights))
  _print(name, per_step, final(), optimizer, names)


def _loss_scale():
  return tf_loss_scale.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                        increment_period=GROWTH_STEPS)


def run_v1():
  """MixedPrecisionLossScaleOptimizer inside strategy.run in a tf.function."""
  with strategy.scope():
    kernel = tf.Variable(toy.KERNEL, name='kernel')
    bias = tf.Variable(toy.BIAS, name='bias')
    global_step = tf.Variable(0, dtype=tf.int64, name='global_step')
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.MomentumOptimizer(toy.LEARNING_RATE, toy.MOMENTUM),
        _loss_scale())

  def replica_step(step):
    grads_and_vars = optimizer.compute_gradients(
        lambda: _loss(kernel, bias, step), [kernel, bias])
    optimizer.apply_gradients(grads_and_vars, global_step)

  loss_scale = optimizer.loss_scale
  _train('v1', replica_step, lambda: (loss_scale(), loss_scale.good_steps),
         [kernel, bias], lambda: {
             'kernel': kernel, 'bias': bias,
             'kernel/momentum': optimizer.get_slot(kernel, 'momentum'),
             'bias/momentum': optimizer.get_slot(bias, 'momentum'),
             'loss_scale': loss_scale(),
             'good_steps': loss_scale.good_steps,
             'global_step': global_step,
         }, optimizer, {kernel.name: 'kernel', bias.name: 'bias'})


def run_tf_loop(name):
  """A custom loop as TF 2.3 (`experimental`) or TF 2.4-2.15 code wrote it.

  `get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`. TF 2.4's
  form is not built beforehand: it builds in the first traced step.
  """
  with strategy.scope():
    kernel, bias = keras.Variable(toy.KERNEL), keras.Variable(toy.BIAS)
    inner = keras.optimizers.SGD(toy.LEARNING_RATE, momentum=toy.MOMENTUM)
    if name == 'experimental':
      optimizer = tls_keras.experimental.LossScaleOptimizer(inner,
                                                            _loss_scale())
      optimizer.build([kernel, bias])
      state = lambda: (optimizer.loss_scale(),
                       optimizer.loss_scale.good_steps)
    else:
      optimizer = tls_keras.mixed_precision.LossScaleOptimizer(
          inner, initial_scale=INITIAL_SCALE,
          dynamic_growth_steps=GROWTH_STEPS)
      state = lambda: (optimizer.loss_scale, optimizer.dynamic_counter)

  def replica_step(step):
    with tf.GradientTape() as tape:
      scaled_loss = optimizer.get_scaled_loss(_loss(kernel, bias, step))
    scaled_grads = tape.gradient(scaled_loss, [kernel, bias])
    grads = optimizer.get_unscaled_gradients(scaled_grads)
    optimizer.apply_gradients(zip(grads, [kernel, bias]))

  _train(name, replica_step, state, [kernel, bias],
         lambda: {'kernel': kernel, 'bias': bias,
                  **toy.keras_optimizer_state(optimizer)},
         optimizer, {kernel.path: 'kernel', bias.path: 'bias'})


def run_keras():
  """The Keras 3 form in a custom loop: scale_loss, then apply."""
  with strategy.scope():
    kernel, bias = keras.Variable(toy.KERNEL), keras.Variable(toy.BIAS)
    optimizer = toy.keras_form(INITIAL_SCALE, GROWTH_STEPS)
    optimizer.build([kernel, bias])

  def replica_step(step):
    with tf.GradientTape() as tape:
      scaled_loss = optimizer.scale_loss(_loss(kernel, bias, step))
    optimizer.apply(tape.gradient(scaled_loss, [kernel, bias]),
                    [kernel, bias])

  _train('keras', replica_step,
         lambda: (optimizer.dynamic_scale, optimizer.step_counter),
         [kernel, bias],
         lambda: {'kernel': kernel, 'bias': bias,
                  **toy.keras_optimizer_state(optimizer)},
         optimizer, {kernel.path: 'kernel', bias.path: 'bias'})


def run_keras_fit():
  """The Keras 3 form in model.fit, one step per batch.

  Only under MirroredStrategy: Keras 3's model.fit itself fails under
  MultiWorkerMirroredStrategy (keras-team/keras#20585).
  """
  with strategy.scope():
    model = toy.keras_model()
    optimizer = toy.keras_form(INITIAL_SCALE, GROWTH_STEPS)
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
  kernel, bias = model.trainable_variables
  _print('keras_fit', per_step, {
      **{f'model/{v.path}': v for v in model.variables},
      **toy.keras_optimizer_state(optimizer)},
         optimizer, {kernel.path: 'kernel', bias.path: 'bias'})


for front_end in CONFIG['front_ends']:
  if front_end in ('experimental', 'mixed_precision'):
    run_tf_loop(front_end)
  else:
    {'v1': run_v1, 'keras': run_keras, 'keras_fit': run_keras_fit}[front_end]()
