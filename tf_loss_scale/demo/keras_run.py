"""One demo run with Keras 3: `model.fit` and `tf_loss_scale.keras.LossScaleOptimizer`.

Also the Keras pieces the custom-loop run shares: the model, the strategy
and the gradient probe.
"""

import contextlib
import functools
import os
import time
from typing import Optional, TextIO

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale import monitoring
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import record
from tf_loss_scale.demo import results as results_lib

CHECKPOINT_FILE = 'scaled.keras'


@functools.lru_cache(maxsize=1)
def mirrored_strategy() -> tf.distribute.MirroredStrategy:
  """The process's one MirroredStrategy over the two logical CPUs.

  TensorFlow numbers the collective ops of every eager MirroredStrategy from
  the same keys, so a second strategy in one process can clash with the
  first: all runs share this one.

  Returns:
    The strategy, created on first use.
  """
  return tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])


def strategy_scope(config: config_lib.DemoConfig):
  """The strategy's scope, or a no-op without a strategy."""
  if config.strategy == 'mirrored':
    return mirrored_strategy().scope()
  return contextlib.nullcontext()


def build_model(kind: str, config: config_lib.DemoConfig) -> keras.Model:
  """The MLP, in float32 or `mixed_float16` as `kind` says, seeded."""
  policy = 'float32' if kind == config_lib.FLOAT32 else 'mixed_float16'
  keras.utils.set_random_seed(config.seed)
  return keras.Sequential([
      keras.Input((64,)),
      keras.layers.Dense(config.hidden_units, activation='relu', dtype=policy),
      keras.layers.Dense(config.hidden_units, activation='relu', dtype=policy),
      keras.layers.Dense(10, dtype=policy),
      # The softmax and the loss stay in float32, as mixed precision advises.
      keras.layers.Activation('softmax', dtype='float32'),
  ])


def make_probe(kind: str, model: keras.Model, config: config_lib.DemoConfig,
               digits: data_lib.Digits,
               optimizer: keras.optimizers.Optimizer) -> Optional[record.Probe]:
  """Measures a mixed model's gradients against a float32 copy's.

  Args:
    kind: One of `config.KINDS`.
    model: The model being trained.
    config: The demo's settings.
    digits: The data; the probe uses the first training examples.
    optimizer: The model's optimizer; its loss scale, if any, scales the
      mixed model's loss as in training.

  Returns:
    A `record.Probe`, or None for the float32 run.
  """
  if kind == config_lib.FLOAT32:
    return None
  reference = build_model(config_lib.FLOAT32, config)
  x = tf.constant(digits.x_train[:config_lib.PROBE_EXAMPLES])
  y = tf.constant(digits.y_train[:config_lib.PROBE_EXAMPLES])
  loss_fn = keras.losses.SparseCategoricalCrossentropy()
  # Probes run after training steps, once the optimizer holds its state.
  scaled = kind == config_lib.SCALED

  @tf.function
  def grads_of_both(scale):
    with tf.GradientTape() as tape:
      mixed_loss = config.loss_weight * loss_fn(y, model(x)) * scale
    mixed_grads = tape.gradient(mixed_loss, model.trainable_variables)
    with tf.GradientTape() as tape:
      reference_loss = config.loss_weight * loss_fn(y, reference(x))
    reference_grads = tape.gradient(reference_loss,
                                    reference.trainable_variables)
    flushed, nonzero = measure.flushed_counts(mixed_grads, reference_grads)
    return flushed, nonzero, measure.flat(reference_grads)

  def probe():
    reference.set_weights(model.get_weights())
    scale = (monitoring.state_tensors(optimizer)[monitoring.SCALE]
             if scaled else tf.constant(1.0))
    flushed, nonzero, values = grads_of_both(scale)
    return int(flushed), int(nonzero), values.numpy()

  return probe


def test_accuracy(model: keras.Model, digits: data_lib.Digits) -> float:
  """The share of test images the model classifies right."""
  predictions = np.argmax(model.predict(digits.x_test, verbose=0), axis=1)
  return float(np.mean(predictions == digits.y_test))


def train(kind: str, name: str, config: config_lib.DemoConfig,
          digits: data_lib.Digits, batches: np.ndarray, log_dir: str,
          checkpoint_dir: Optional[str],
          stream: TextIO) -> results_lib.RunResult:
  """Trains and evaluates one run with `model.fit`; saves a `.keras` file.

  The arguments and result are those of every API module (see
  `tf_loss_scale.demo`).
  """
  with strategy_scope(config):
    model = build_model(kind, config)
    optimizer = keras.optimizers.SGD(
        config.learning_rate / config.loss_weight, momentum=0.9)
    if kind == config_lib.SCALED:
      # Imported here: the custom-loop run shares this module without it.
      from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
      optimizer = LossScaleOptimizer(optimizer,
                                     initial_scale=config.initial_scale,
                                     dynamic_growth_steps=config.growth_steps)
    # Keras would wrap the optimizer of a mixed_float16 model in its own
    # LossScaleOptimizer; the run without scaling must stay unscaled.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  loss_weights=config.loss_weight, auto_scale_loss=False)
  recorder = record.Recorder(
      name, config, log_dir, stream,
      make_probe(kind, model, config, digits, optimizer))
  callbacks = [_StepsToRecorder(recorder, config.loss_weight)]
  if kind == config_lib.SCALED:
    callbacks.insert(0, monitoring.LossScaleCallback(log_dir, update_freq=1))
  order = batches.reshape(-1)
  start = time.perf_counter()
  model.fit(digits.x_train[order], digits.y_train[order],
            batch_size=config.batch_size, epochs=1, shuffle=False, verbose=0,
            callbacks=callbacks)
  wall_time = time.perf_counter() - start
  checkpoint = None
  if checkpoint_dir:
    os.makedirs(checkpoint_dir, exist_ok=True)
    checkpoint = os.path.join(checkpoint_dir, CHECKPOINT_FILE)
    model.save(checkpoint)
  return recorder.finish(
      test_accuracy(model, digits), wall_time, checkpoint,
      monitoring.last_skip(optimizer) if kind == config_lib.SCALED else None)


class _StepsToRecorder(keras.callbacks.Callback):
  """Hands each batch's loss and loss scale state to a `record.Recorder`."""

  def __init__(self, recorder: record.Recorder, loss_weight: float):
    super().__init__()
    self._recorder = recorder
    self._loss_weight = loss_weight

  def on_train_batch_begin(self, batch, logs=None):
    # Keras logs a running mean over the epoch; starting each batch from
    # fresh metrics makes the logged loss that batch's own.
    self.model.reset_metrics()

  def on_train_batch_end(self, batch, logs=None):
    self._recorder.step(batch, logs['loss'] / self._loss_weight,
                        logs.get(monitoring.SCALE),
                        logs.get(monitoring.SKIPPED_STEPS))
