"""Watching the loss scale: TensorBoard summaries, a Keras callback, a v1 hook.

Three views of the same numbers, read from the loss scale's state machine:

- `loss_scale`: the current scale;
- `good_steps`: finite steps since the scale last changed;
- `skipped_steps`: steps skipped because a gradient was not finite, counted by
  `DynamicLossScale` itself (a `FixedLossScale` never skips, so it reports 0).

Use `write_summaries` in a custom training loop, `LossScaleCallback` with
Keras `model.fit`, and `LossScaleHook` with `tf.compat.v1` sessions.
"""

from typing import Any, Dict, Optional, Union

import keras
import tensorflow as tf

from tf_loss_scale import loss_scale as loss_scale_lib

SCALE = 'loss_scale'
GOOD_STEPS = 'good_steps'
SKIPPED_STEPS = 'skipped_steps'

# TensorBoard tags, grouped under one section.
TAGS = {
    SCALE: 'loss_scale/scale',
    GOOD_STEPS: 'loss_scale/good_steps',
    SKIPPED_STEPS: 'loss_scale/skipped_steps',
}

LossScaleSource = Union[loss_scale_lib.LossScale, Any]


def find_loss_scale(source: LossScaleSource) -> loss_scale_lib.LossScale:
  """Returns the `LossScale` of a loss scale or of an optimizer holding one.

  Args:
    source: A `LossScale`, or an optimizer (any front end of this library)
      whose `loss_scale` property is one.

  Returns:
    The `LossScale`.

  Raises:
    TypeError: If `source` is neither.
  """
  if isinstance(source, loss_scale_lib.LossScale):
    return source
  found = getattr(source, 'loss_scale', None)
  if isinstance(found, loss_scale_lib.LossScale):
    return found
  raise TypeError(
      'Expected a tf_loss_scale LossScale or an optimizer whose loss_scale '
      f'property is one, but got {source!r} of type {type(source).__name__}. '
      'Wrap the optimizer in a tf_loss_scale optimizer to monitor it.')


def state_tensors(loss_scale: loss_scale_lib.LossScale) -> Dict[str, tf.Tensor]:
  """Reads the loss scale's state.

  Args:
    loss_scale: A `LossScale`.

  Returns:
    A dict with keys `'loss_scale'` (float32), `'good_steps'` and
    `'skipped_steps'` (int64) of scalar tensors. In a TF1 graph these are
    tensors to run; eagerly they hold the values.
  """
  if isinstance(loss_scale, loss_scale_lib.DynamicLossScale):
    good_steps = tf.identity(loss_scale.good_steps)
    skipped_steps = loss_scale.skipped_steps
  else:
    good_steps = skipped_steps = tf.constant(0, tf.int64)
  return {
      SCALE: tf.convert_to_tensor(loss_scale()),
      GOOD_STEPS: good_steps,
      SKIPPED_STEPS: skipped_steps,
  }


# What TensorBoard's scalar plugin reads; written with the core `tf.summary.write`
# so that the `tensorboard` package is not needed to produce event files.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name='scalars'),
    data_class='DATA_CLASS_SCALAR')


def write_scalar(tag: str, value: Any,
                 step: Optional[Union[int, tf.Tensor]] = None) -> None:
  """Writes one scalar that TensorBoard plots, to the default summary writer.

  Unlike `tf.summary.scalar`, this works without the `tensorboard` package.

  Args:
    tag: The scalar's name.
    value: A real number or a scalar tensor; written as float32.
    step: The summary step; by default `tf.summary.experimental.get_step()`.
  """
  tf.summary.write(tag, tf.cast(value, tf.float32), step=step,
                   metadata=_SCALAR_METADATA)


def write_summaries(source: LossScaleSource,
                    step: Optional[Union[int, tf.Tensor]] = None) -> None:
  """Writes the loss scale's state as `tf.summary` scalars.

  Call it in a custom training loop (eager or inside `tf.function`) under a
  default writer, e.g. `with writer.as_default(): write_summaries(opt, step)`.

  Args:
    source: A `LossScale` or an optimizer holding one.
    step: The summary step; by default `tf.summary.experimental.get_step()`.

  Raises:
    TypeError: If `source` holds no `LossScale`.
  """
  values = state_tensors(find_loss_scale(source))
  for key, tag in TAGS.items():
    write_scalar(tag, values[key], step)


class LossScaleCallback(keras.callbacks.Callback):
  """Adds the loss scale's state to Keras logs and, optionally, TensorBoard.

  Every batch and every epoch, `loss_scale`, `good_steps` and
  `skipped_steps` are put in the logs, so the progress bar, `History` and
  later callbacks see them (list this callback before those you want to see
  them). With `log_dir`, they are also written as TensorBoard scalars.

  ```python
  model.compile(optimizer=tf_loss_scale.keras.LossScaleOptimizer(opt), ...)
  model.fit(x, y, callbacks=[LossScaleCallback(log_dir='logs/train')])
  ```
  """

  def __init__(self,
               log_dir: Optional[str] = None,
               update_freq: Union[str, int] = 'epoch',
               loss_scale: Optional[loss_scale_lib.LossScale] = None):
    """Creates the callback.

    Args:
      log_dir: Directory for TensorBoard event files, or None for logs only.
      update_freq: `'epoch'` to write summaries once per epoch (at the
        epoch's index), or a positive int N to write every N batches (at the
        index of the batch counted from the start of training).
      loss_scale: The `LossScale` to watch; by default the one of
        `model.optimizer` (its `loss_scale` property).

    Raises:
      ValueError: If `update_freq` is neither `'epoch'` nor a positive int.
      TypeError: If `loss_scale` is given and is not a `LossScale`.
    """
    super().__init__()
    if update_freq != 'epoch' and not _is_positive_int(update_freq):
      raise ValueError(
          "update_freq must be 'epoch' or a positive int, but got "
          f'{update_freq!r}.')
    if loss_scale is not None and not isinstance(loss_scale,
                                                 loss_scale_lib.LossScale):
      raise TypeError(
          f'loss_scale must be a LossScale or None, but got {loss_scale!r}.')
    self._log_dir = log_dir
    self._update_freq = update_freq
    self._loss_scale = loss_scale
    self._watched = None
    self._writer = None
    self._batches_seen = 0

  def on_train_begin(self, logs=None):
    self._watched = self._loss_scale or find_loss_scale(self.model.optimizer)
    if self._log_dir is not None and self._writer is None:
      self._writer = tf.summary.create_file_writer(self._log_dir)

  def on_train_batch_end(self, batch, logs=None):
    values = self._read(logs)
    if isinstance(self._update_freq, int) and (
        self._batches_seen % self._update_freq == 0):
      self._write(values, self._batches_seen)
    self._batches_seen += 1

  def on_epoch_end(self, epoch, logs=None):
    values = self._read(logs)
    if self._update_freq == 'epoch':
      self._write(values, epoch)

  def on_train_end(self, logs=None):
    if self._writer is not None:
      self._writer.flush()

  def _read(self, logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    values = {key: tensor.numpy()
              for key, tensor in state_tensors(self._watched).items()}
    values = {SCALE: float(values[SCALE]),
              GOOD_STEPS: int(values[GOOD_STEPS]),
              SKIPPED_STEPS: int(values[SKIPPED_STEPS])}
    if logs is not None:
      logs.update(values)
    return values

  def _write(self, values: Dict[str, Any], step: int) -> None:
    if self._writer is None:
      return
    with self._writer.as_default():
      for key, tag in TAGS.items():
        write_scalar(tag, values[key], step)


class LossScaleHook(tf.compat.v1.train.SessionRunHook):
  """Logs the loss scale's state from `tf.compat.v1` training sessions.

  For `MonitoredTrainingSession` (or any session that runs hooks): every
  `every_n_steps` training runs it reads the state once the run is done,
  logs it with `tf.compat.v1.logging.info`, writes TensorBoard scalars to
  `output_dir` (if given) and keeps the last values in `latest`.

  Steps are counted by the hook (runs since the session started, plus the
  global step at that time), not read from the global step, because a
  skipped step does not advance the global step. Every `session.run` that
  the hooks see counts, so run evaluation fetches without hooks, e.g. with
  `session.run_step_fn(lambda ctx: ctx.session.run(fetches))`.

  ```python
  opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(opt, 'dynamic')
  train_op = opt.minimize(loss, global_step=global_step)
  hook = LossScaleHook(opt, output_dir='logs', every_n_steps=100)
  with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
    ...
  ```
  """

  def __init__(self,
               source: LossScaleSource,
               output_dir: Optional[str] = None,
               every_n_steps: int = 100):
    """Creates the hook; build it in the graph that trains.

    Args:
      source: A `LossScale`, or an optimizer whose `loss_scale` is one.
      output_dir: Directory for TensorBoard event files, or None.
      every_n_steps: Read the state every this many runs, a positive int.

    Raises:
      TypeError: If `source` holds no `LossScale`.
      ValueError: If `every_n_steps` is not a positive int.
    """
    if not _is_positive_int(every_n_steps):
      raise ValueError(
          f'every_n_steps must be a positive int, but got {every_n_steps!r}.')
    self._loss_scale = find_loss_scale(source)
    self._output_dir = output_dir
    self._every_n_steps = every_n_steps
    self._fetches = None
    self._global_step = None
    self._writer = None
    self._step = 0
    self.latest: Dict[str, Any] = {}

  def begin(self):
    self._fetches = state_tensors(self._loss_scale)
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._output_dir is not None:
      self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)

  def after_create_session(self, session, coord):
    del coord
    self._step = (0 if self._global_step is None else
                  int(session.run(self._global_step)))

  def after_run(self, run_context, run_values):
    del run_values
    # A separate read, after the train op has finished: fetched with the
    # train op, the variables could be read before or after its update.
    if self._step % self._every_n_steps == 0:
      self._record(run_context.session.run(self._fetches), self._step)
    self._step += 1

  def end(self, session):
    del session
    if self._writer is not None:
      self._writer.flush()

  def _record(self, values: Dict[str, Any], step: int) -> None:
    self.latest = {SCALE: float(values[SCALE]),
                   GOOD_STEPS: int(values[GOOD_STEPS]),
                   SKIPPED_STEPS: int(values[SKIPPED_STEPS]),
                   'step': step}
    tf.compat.v1.logging.info(
        'step %d: loss scale %g, good steps %d, skipped steps %d', step,
        self.latest[SCALE], self.latest[GOOD_STEPS],
        self.latest[SKIPPED_STEPS])
    if self._writer is not None:
      summary = tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag=tag, simple_value=self.latest[key])
          for key, tag in TAGS.items()
      ])
      self._writer.add_summary(summary, step)


def _is_positive_int(value: Any) -> bool:
  return (isinstance(value, int) and not isinstance(value, bool) and
          value >= 1)
