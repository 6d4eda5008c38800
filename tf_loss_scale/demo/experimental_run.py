"""One demo run as TF 2.0-2.3 code: a custom loop with the experimental wrapper.

The loop is the one TF 2.3's mixed precision guide taught:
`get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`.
"""

import os
import time
from typing import Optional, TextIO

import keras
import numpy as np
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import monitoring
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import keras_run
from tf_loss_scale.demo import record
from tf_loss_scale.demo import results as results_lib
from tf_loss_scale.keras import experimental

CHECKPOINT_PREFIX = 'scaled'


def train(kind: str, name: str, config: config_lib.DemoConfig,
          digits: data_lib.Digits, batches: np.ndarray, log_dir: str,
          checkpoint_dir: Optional[str],
          stream: TextIO) -> results_lib.RunResult:
  """Trains and evaluates one run in a custom loop; saves a `tf.train.Checkpoint`.

  The arguments and result are those of every API module (see
  `tf_loss_scale.demo`).
  """
  strategy = (keras_run.mirrored_strategy() if config.strategy == 'mirrored'
              else tf.distribute.get_strategy())
  scaled = kind == config_lib.SCALED
  with strategy.scope():
    model = keras_run.build_model(kind, config)
    optimizer = keras.optimizers.SGD(
        config.learning_rate / config.loss_weight, momentum=0.9)
    if scaled:
      optimizer = experimental.LossScaleOptimizer(
          optimizer, tf_loss_scale.DynamicLossScale(config.initial_scale,
                                                    config.growth_steps))
    # Slots made here, not on the first call of the tf.function below, where
    # variable creation under a strategy would need its inputs twice.
    optimizer.build(model.trainable_variables)
  per_example_loss = keras.losses.SparseCategoricalCrossentropy(
      reduction='none')

  def replica_step(x, y):
    with tf.GradientTape() as tape:
      loss = config.loss_weight * tf.nn.compute_average_loss(
          per_example_loss(y, model(x, training=True)),
          global_batch_size=config.batch_size)
      scaled_loss = optimizer.get_scaled_loss(loss) if scaled else loss
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    if scaled:
      grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function
  def train_step(x, y):
    losses = strategy.run(replica_step, (x, y))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  order = batches.reshape(-1)
  dataset = tf.data.Dataset.from_tensor_slices(
      (digits.x_train[order], digits.y_train[order])).batch(config.batch_size)
  recorder = record.Recorder(
      name, config, log_dir, stream,
      keras_run.make_probe(kind, model, config, digits, optimizer))
  writer = tf.summary.create_file_writer(log_dir)
  start = time.perf_counter()
  for step, (x, y) in enumerate(strategy.experimental_distribute_dataset(
      dataset)):
    loss = float(train_step(x, y)) / config.loss_weight
    if scaled:
      with writer.as_default():
        monitoring.write_summaries(optimizer, step)
      state = monitoring.state_tensors(optimizer.loss_scale)
      recorder.step(step, loss, float(state[monitoring.SCALE]),
                    int(state[monitoring.SKIPPED_STEPS]))
    else:
      recorder.step(step, loss)
  wall_time = time.perf_counter() - start
  writer.close()
  checkpoint = None
  if checkpoint_dir:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
        os.path.join(checkpoint_dir, CHECKPOINT_PREFIX))
  return recorder.finish(keras_run.test_accuracy(model, digits), wall_time,
                         checkpoint,
                         monitoring.last_skip(optimizer) if scaled else None)
