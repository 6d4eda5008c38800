"""One demo run with Keras 3: `model.fit` and `tf_loss_scale.keras.LossScaleOptimizer`."""

import contextlib
import functools
import time
from typing import Optional, TextIO

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale import monitoring
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib


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


def train(kind: str, name: str, config: config_lib.DemoConfig,
          digits: data_lib.Digits, batches: np.ndarray, log_dir: str,
          stream: TextIO) -> results_lib.RunResult:
  """Trains and evaluates one run with `model.fit`.

  Args:
    kind: One of `config.KINDS`.
    name: The run's display name.
    config: The demo's settings.
    digits: The data.
    batches: `[steps, batch_size]` training indices.
    log_dir: Where this run's TensorBoard event files go.
    stream: Where the progress bar is drawn.

  Returns:
    The run's `RunResult`.
  """
  strategy = mirrored_strategy() if config.strategy == 'mirrored' else None
  policy = 'float32' if kind == config_lib.FLOAT32 else 'mixed_float16'
  with strategy.scope() if strategy else contextlib.nullcontext():
    model = _build_model(policy, config)
    optimizer = keras.optimizers.SGD(config.learning_rate, momentum=0.9)
    if kind == config_lib.SCALED:
      from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
      optimizer = LossScaleOptimizer(optimizer,
                                     initial_scale=config.initial_scale,
                                     dynamic_growth_steps=config.growth_steps)
    # Keras would wrap the optimizer of a mixed_float16 model in its own
    # LossScaleOptimizer; the run without scaling must stay unscaled.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  auto_scale_loss=False)
  recorder = _Recorder(name, config, digits, kind, log_dir, stream)
  callbacks = [recorder]
  if kind == config_lib.SCALED:
    callbacks.insert(0, monitoring.LossScaleCallback(log_dir, update_freq=1))
  order = batches.reshape(-1)
  start = time.perf_counter()
  model.fit(digits.x_train[order], digits.y_train[order],
            batch_size=config.batch_size, epochs=1, shuffle=False, verbose=0,
            callbacks=callbacks)
  wall_time = time.perf_counter() - start
  recorder.close()
  predictions = np.argmax(model.predict(digits.x_test, verbose=0), axis=1)
  return results_lib.RunResult(
      name=name, losses=recorder.losses,
      scales=recorder.scales if kind == config_lib.SCALED else None,
      skipped=recorder.skipped, flushed_fraction=recorder.flushed_fraction,
      test_accuracy=float(np.mean(predictions == digits.y_test)),
      wall_time=wall_time)


def _build_model(policy: str, config: config_lib.DemoConfig) -> keras.Model:
  keras.utils.set_random_seed(config.seed)
  return keras.Sequential([
      keras.Input((64,)),
      keras.layers.Dense(config.hidden_units, activation='relu', dtype=policy),
      keras.layers.Dense(config.hidden_units, activation='relu', dtype=policy),
      keras.layers.Dense(10, dtype=policy),
      # The softmax and the loss stay in float32, as mixed precision advises.
      keras.layers.Activation('softmax', dtype='float32'),
  ])


class _Recorder(keras.callbacks.Callback):
  """Records each step's loss and loss scale state, and probes gradients."""

  def __init__(self, name: str, config: config_lib.DemoConfig,
               digits: data_lib.Digits, kind: str, log_dir: str,
               stream: TextIO):
    super().__init__()
    self.losses, self.scales, self.skipped = [], [], []
    self._config = config
    self._probe_x = tf.constant(digits.x_train[:512])
    self._probe_y = tf.constant(digits.y_train[:512])
    self._probing = kind != config_lib.FLOAT32
    self._reference = _build_model('float32', config) if self._probing else None
    self._flushed = self._nonzero = 0
    self._writer = tf.summary.create_file_writer(log_dir)
    self._bar = report.ProgressBar(name, config.steps, stream)
    self._loss_fn = keras.losses.SparseCategoricalCrossentropy()

  @property
  def flushed_fraction(self) -> Optional[float]:
    if not self._probing:
      return None
    return self._flushed / max(self._nonzero, 1)

  def on_train_batch_begin(self, batch, logs=None):
    # Keras logs a running mean over the epoch; starting each batch from
    # fresh metrics makes the logged loss that batch's own.
    self.model.reset_metrics()

  def on_train_batch_end(self, batch, logs=None):
    self.losses.append(float(logs['loss']))
    with self._writer.as_default():
      monitoring.write_scalar('loss', logs['loss'], batch)
    if monitoring.SCALE in logs:
      self.scales.append(logs[monitoring.SCALE])
      self.skipped.append(logs[monitoring.SKIPPED_STEPS] > sum(self.skipped))
    else:
      self.skipped.append(False)
    if self._probing and (batch % self._config.probe_every == 0 or
                          batch == self._config.steps - 1):
      self._probe()
    self._bar.update(batch + 1)

  def close(self) -> None:
    self._bar.close()
    self._writer.flush()

  def _probe(self) -> None:
    self._reference.set_weights(self.model.get_weights())
    scale = getattr(self.model.optimizer, 'loss_scale', None)
    scale = tf.constant(1.0) if scale is None else scale()
    flushed, nonzero = _flushed_counts(self.model, self._reference,
                                       self._loss_fn, self._probe_x,
                                       self._probe_y, scale)
    self._flushed += int(flushed)
    self._nonzero += int(nonzero)


@tf.function
def _flushed_counts(model, reference, loss_fn, x, y, scale):
  with tf.GradientTape() as tape:
    mixed_loss = loss_fn(y, model(x, training=True)) * scale
  mixed_grads = tape.gradient(mixed_loss, model.trainable_variables)
  with tf.GradientTape() as tape:
    reference_loss = loss_fn(y, reference(x, training=True))
  reference_grads = tape.gradient(reference_loss, reference.trainable_variables)
  return measure.flushed_counts(mixed_grads, reference_grads)
