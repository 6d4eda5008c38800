"""Watching the loss scale: TensorBoard summaries, a Keras callback, a v1 hook.

`state_tensors` reads the scale and the counters the source keeps (the keys
below) from every front end; `write_summaries` writes them in a custom loop,
`LossScaleCallback` in `model.fit` of either Keras family, `LossScaleHook` in
`tf.compat.v1` sessions. `last_skip` says why the latest step was skipped.
See docs/monitoring.md.
"""

from typing import Any, Dict, Optional, Union

from absl import logging
import keras
import tensorflow as tf

from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import step_record

SkipReport = step_record.SkipReport

SCALE = 'loss_scale'
GOOD_STEPS = 'good_steps'
SKIPPED_STEPS = 'skipped_steps'
NON_FINITE_STREAK = 'non_finite_streak'
SKIPS_AT_FLOOR = 'skips_at_floor'
# In Keras logs: why the latest step was skipped, as a number (for `History`).
SKIP_CAUSE = 'skip_cause'
SKIP_CAUSE_CODES = {None: 0, step_record.OVERFLOW: 1, step_record.NAN: 2}
# Skipped steps logged one by one before only powers of two are.
SKIPS_LOGGED_EACH = 10

# TensorBoard tags, grouped under one section.
TAGS = {SCALE: 'loss_scale/scale', **{
    key: f'loss_scale/{key}' for key in (GOOD_STEPS, SKIPPED_STEPS,
                                         NON_FINITE_STREAK, SKIPS_AT_FLOOR,
                                         SKIP_CAUSE)}}
# The skip reports, as TensorBoard text.
SKIP_REPORT_TAG = 'loss_scale/skipped_step'


# The counters, each with the attribute names that hold it, in order.
_COUNTERS = {
    GOOD_STEPS: ('good_steps', 'step_counter'),
    SKIPPED_STEPS: ('skipped_steps',),
    NON_FINITE_STREAK: ('non_finite_streak',),
    SKIPS_AT_FLOOR: ('skips_at_floor',),
}

LossScaleSource = Any


def state_tensors(source: LossScaleSource) -> Dict[str, tf.Tensor]:
  """Reads the loss scale's state from any front end.

  Args:
    source: A `LossScale`; an optimizer whose `loss_scale` property is one;
      a Keras 3-style loss scale optimizer (`dynamic_scale`, `step_counter`
      and maybe `skipped_steps`); or Keras 2's own loss scale optimizer.

  Returns:
    Scalar tensors: `'loss_scale'` (float32), and each counter the source
    keeps (int64).

  Raises:
    TypeError: If `source` is none of the above.
    ValueError: If `source` is a Keras loss scale optimizer not built yet.
  """
  holder = _state_holder(source)
  if isinstance(holder, loss_scale_lib.FixedLossScale):
    zero = tf.constant(0, tf.int64)
    return {SCALE: holder(), GOOD_STEPS: zero, SKIPPED_STEPS: zero}
  if isinstance(holder, loss_scale_lib.LossScale):
    scale = holder()
  elif _is_keras_2_loss_scale_optimizer(holder):
    values = {SCALE: tf.cast(holder.loss_scale, tf.float32)}
    # None when its scale is fixed: it keeps no count then.
    if holder.dynamic_counter is not None:
      values[GOOD_STEPS] = tf.cast(holder.dynamic_counter, tf.int64)
    return values
  elif getattr(holder, 'dynamic_scale', None) is not None:
    scale = holder.dynamic_scale
  elif _is_contrib_optimizer(holder):
    # TF 1.13-1.15's managers keep their own counters, in their own way.
    return {SCALE: tf.cast(holder.loss_scale_manager.get_loss_scale(),
                           tf.float32),
            SKIPPED_STEPS: holder._monitor.skipped_steps()}  # pylint: disable=protected-access
  else:
    raise ValueError(
        f'{type(holder).__name__} {getattr(holder, "name", "")!r} has no loss '
        'scale state yet: it creates it when built. Read it after the first '
        'training step, or call its build(variables) first.')
  values = {SCALE: tf.cast(scale, tf.float32)}
  for key, names in _COUNTERS.items():
    found = [getattr(holder, name, None) for name in names]
    found = [value for value in found if value is not None]
    if found:
      values[key] = tf.cast(found[0], tf.int64)
  return values


def _state_holder(source: LossScaleSource) -> Any:
  """The object whose attributes hold `source`'s loss scale state."""
  if isinstance(source, loss_scale_lib.LossScale):
    return source
  found = getattr(source, 'loss_scale', None)
  if isinstance(found, loss_scale_lib.LossScale):
    return found
  if _is_keras_2_loss_scale_optimizer(source) or _is_contrib_optimizer(source):
    return source
  # Keras 3's class creates its two variables when it is built, on the first
  # step; it is known for one before that by its type.
  keras_3_class = getattr(keras.optimizers, 'LossScaleOptimizer', None)
  if (keras_3_class is not None and isinstance(source, keras_3_class)) or all(
      getattr(source, name, None) is not None
      for name in ('dynamic_scale', 'step_counter')):
    return source
  raise TypeError(
      'Expected a tf_loss_scale LossScale, an optimizer whose loss_scale '
      'property is one, or a Keras LossScaleOptimizer (with dynamic_scale and '
      f'step_counter variables), but got {source!r} of type '
      f'{type(source).__name__}. Wrap the optimizer in a loss scale '
      'optimizer to monitor it.')


def last_skip(source: LossScaleSource,
              session: Any = None) -> Optional[SkipReport]:
  """Why the latest skipped step was skipped:

  ```python
  report = tf_loss_scale.monitoring.last_skip(opt)
  if report is not None and report.cause == 'nan':
    print('no loss scale cures this:', report.nan)
  ```

  Args:
    source: A `DynamicLossScale`; an optimizer whose `loss_scale` property
      is a `LossScale` (the v1 and TF 2.3-style wrappers); or this library's
      Keras 3-form `LossScaleOptimizer`.
    session: For a loss scale built in a TF1 graph, the `Session` (or
      `MonitoredSession`) that runs it.

  Returns:
    The latest skipped step's `SkipReport` in this process; None before any
    skip, and always for a `FixedLossScale`.

  Raises:
    TypeError: If `source` is none of the above.
    ValueError: For a loss scale built in a TF1 graph, without its session.
  """
  record = _record_of(source)
  if session is not None and not (hasattr(session, 'run') and
                                  hasattr(session, 'graph')):
    raise TypeError(
        'session must be the tf.compat.v1.Session (or MonitoredSession) that '
        f'runs the step, but got {session!r} of type '
        f'{type(session).__name__}.')
  return None if record is None else record.read(session)


def _record_of(source: LossScaleSource) -> Optional[step_record.StepRecord]:
  """The record `last_skip` reads; None for a `FixedLossScale`."""
  found = getattr(source, 'loss_scale', None)
  holder = source if isinstance(source, loss_scale_lib.LossScale) else found
  if isinstance(holder, loss_scale_lib.FixedLossScale):
    return None
  if isinstance(holder, loss_scale_lib.DynamicLossScale):
    record = loss_scale_lib.step_record_of(holder)
  else:
    # This library's Keras 3 form keeps its record next to Keras's state.
    record = getattr(source, '_monitor', None)
  if not isinstance(record, step_record.StepRecord):
    raise TypeError(
        'last_skip() reads the skip report that tf_loss_scale keeps: pass a '
        'DynamicLossScale, an optimizer whose loss_scale is one '
        '(MixedPrecisionLossScaleOptimizer, '
        'tf_loss_scale.keras.experimental.LossScaleOptimizer) or a '
        f'tf_loss_scale.keras.LossScaleOptimizer, but got {source!r} of type '
        f'{type(source).__name__}.')
  return record


def _skip_log(source: LossScaleSource) -> Optional['_SkipLog']:
  """A `_SkipLog` of `source`, if `last_skip` reads it."""
  try:
    return None if _record_of(source) is None else _SkipLog(source)
  except TypeError:
    return None


class _SkipLog:
  """Logs a source's skip reports: the first `SKIPS_LOGGED_EACH`, then one
  each time the count of skipped steps reaches a power of two."""

  def __init__(self, source: LossScaleSource):
    self._source = source
    self._seen = 0
    self._logged = 0
    self.cause = SKIP_CAUSE_CODES[None]

  def follow(self, skipped: int, session: Any = None) -> Optional[str]:
    """Logs the latest report if due, given the skip count; returns the line."""
    if skipped <= self._seen:
      return None
    self._seen = skipped
    report = last_skip(self._source, session)
    if report is None:
      return None
    self.cause = SKIP_CAUSE_CODES[report.cause]
    previous = self._logged
    if not (previous < SKIPS_LOGGED_EACH or
            skipped.bit_length() > previous.bit_length()):
      return None
    self._logged = skipped
    line = f'Loss scale: {report} [{skipped} skipped so far]'
    if previous < SKIPS_LOGGED_EACH <= skipped:
      line += ('; from here on, one line each time the count reaches a power '
               'of two')
    logging.warning(line)
    return line


def _is_contrib_optimizer(source: Any) -> bool:
  # tf_loss_scale.contrib.mixed_precision's: a manager and this library's
  # record of the steps.
  return (getattr(source, 'loss_scale_manager', None) is not None and
          isinstance(getattr(source, '_monitor', None),
                     step_record.StepRecord))


def _is_keras_2_loss_scale_optimizer(source: Any) -> bool:
  # Keras 2's class (keras 2.x, tf_keras) keeps its good steps as
  # `dynamic_counter` (None for a fixed scale) and has no `dynamic_scale`.
  return (hasattr(type(source), 'dynamic_counter') and
          getattr(source, 'dynamic_scale', None) is None and
          tf.is_tensor(getattr(source, 'loss_scale', None)))


def _plugin_metadata(plugin: str, data_class: str) -> Any:
  return tf.compat.v1.SummaryMetadata(
      plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name=plugin),
      data_class=data_class)


# What TensorBoard's plugins read, written with the core `tf.summary.write`
# so that event files need no `tensorboard` package.
_SCALAR_METADATA = _plugin_metadata('scalars', 'DATA_CLASS_SCALAR')
_TEXT_METADATA = _plugin_metadata('text', 'DATA_CLASS_TENSOR')


def write_scalar(tag: str, value: Any,
                 step: Optional[Union[int, tf.Tensor]] = None) -> None:
  """`tf.summary.scalar(tag, value, step)` without the `tensorboard` package.

  The value is written as float32; `step` defaults to
  `tf.summary.experimental.get_step()`.
  """
  tf.summary.write(tag, tf.cast(value, tf.float32), step=step,
                   metadata=_SCALAR_METADATA)


def write_summaries(source: LossScaleSource,
                    step: Optional[Union[int, tf.Tensor]] = None) -> None:
  """Writes the loss scale's state as `tf.summary` scalars.

  Call it in a custom training loop (eager or inside `tf.function`) under a
  default writer, e.g. `with writer.as_default(): write_summaries(opt, step)`.

  Args:
    source: Any source `state_tensors` reads (else TypeError).
    step: The summary step; by default `tf.summary.experimental.get_step()`.
  """
  for key, value in state_tensors(source).items():
    write_scalar(TAGS[key], value, step)


class LossScaleCallback(keras.callbacks.Callback):
  """Adds the loss scale's state to Keras logs and, optionally, TensorBoard.

  For `model.fit` of Keras 3 or Keras 2. Every batch and epoch the state
  goes into the logs (list this callback before those that read them) and,
  with `log_dir`, to TensorBoard; for this library's optimizers each skip
  report is logged and the logs carry `skip_cause` (`SKIP_CAUSE_CODES`).

  ```python
  model.compile(optimizer=tf_loss_scale.keras.LossScaleOptimizer(opt), ...)
  model.fit(x, y, callbacks=[LossScaleCallback(log_dir='logs/train')])
  ```
  """

  # Keras 2's fit asks every callback which batch hooks it implements and
  # whether it takes tensors in its logs; Keras 3's base class cannot say.
  _supports_tf_logs = False
  _chief_worker_only = None

  def _implements_train_batch_hooks(self) -> bool:
    return True

  def _implements_test_batch_hooks(self) -> bool:
    return False

  def _implements_predict_batch_hooks(self) -> bool:
    return False

  def __init__(self, log_dir: Optional[str] = None,
               update_freq: Union[str, int] = 'epoch',
               loss_scale: Optional[LossScaleSource] = None):
    """Creates the callback.

    Args:
      log_dir: Directory for TensorBoard event files, or None for logs only.
      update_freq: `'epoch'`, or a positive int N to write every N batches
        (counted from the start of training).
      loss_scale: What to watch, any source `state_tensors` reads; by default
        `model.optimizer`.

    Raises:
      ValueError: If `update_freq` is neither `'epoch'` nor a positive int.
      TypeError: If `loss_scale` is given and `state_tensors` cannot read it.
    """
    super().__init__()
    if update_freq != 'epoch' and not _is_positive_int(update_freq):
      raise ValueError(
          "update_freq must be 'epoch' or a positive int, but got "
          f'{update_freq!r}.')
    if loss_scale is not None:
      _state_holder(loss_scale)
    self._log_dir = log_dir
    self._update_freq = update_freq
    self._loss_scale = loss_scale
    self._watched = None
    self._skips = None
    self._writer = None
    # Keras numbers batches from 0 in every epoch; these turn its numbers
    # into indices counted from the start of training.
    self._epoch_start = 0
    self._last_index = -1

  def on_train_begin(self, logs=None):
    self._watched = (self._loss_scale if self._loss_scale is not None else
                     self.model.optimizer)
    _state_holder(self._watched)
    self._skips = _skip_log(self._watched)
    self._epoch_start = 0
    self._last_index = -1
    if self._log_dir is not None and self._writer is None:
      self._writer = tf.summary.create_file_writer(self._log_dir)

  def on_epoch_begin(self, epoch, logs=None):
    # Batches per epoch when Keras knows them: the index it last reported
    # may be the first of several batches run at once.
    steps = (self.params or {}).get('steps')
    self._epoch_start = (epoch * steps if steps else self._last_index + 1)

  def on_train_batch_end(self, batch, logs=None):
    index = self._epoch_start + batch
    values = self._read(logs, index)
    if isinstance(self._update_freq, int) and (
        index // self._update_freq > self._last_index // self._update_freq):
      self._write(values, index)
    self._last_index = index

  def on_epoch_end(self, epoch, logs=None):
    values = self._read(logs, self._last_index)
    if self._update_freq == 'epoch':
      self._write(values, epoch)

  def on_train_end(self, logs=None):
    if self._writer is not None:
      self._writer.flush()

  def _read(self, logs: Optional[Dict[str, Any]], index: int
           ) -> Dict[str, Any]:
    values = _to_python(state_tensors(self._watched))
    if self._skips is not None:
      line = self._skips.follow(values[SKIPPED_STEPS])
      values[SKIP_CAUSE] = self._skips.cause
      if line is not None and self._writer is not None:
        with self._writer.as_default():
          tf.summary.write(SKIP_REPORT_TAG, tf.constant(line), step=index,
                           metadata=_TEXT_METADATA)
    if logs is not None:
      logs.update(values)
    return values

  def _write(self, values: Dict[str, Any], step: int) -> None:
    if self._writer is None:
      return
    with self._writer.as_default():
      for key, value in values.items():
        write_scalar(TAGS[key], value, step)


class LossScaleHook(tf.compat.v1.train.SessionRunHook):
  """Logs the loss scale's state from `tf.compat.v1` training sessions.

  Every `every_n_steps` runs it logs the state, writes it to `output_dir`
  (if given) and keeps it in `latest`; skip reports are logged as by
  `LossScaleCallback`. It counts the runs it sees (a skipped step does not
  advance the global step), so run evaluation fetches without hooks. A run
  it does not log costs no run of its own: a skip is seen in the run that
  fetches the step, or else at the next logged run.

  ```python
  opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(opt, 'dynamic')
  train_op = opt.minimize(loss, global_step=global_step)
  hook = LossScaleHook(opt, output_dir='logs', every_n_steps=100)
  with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
    ...
  ```
  """

  def __init__(self, source: LossScaleSource, output_dir: Optional[str] = None,
               every_n_steps: int = 100):
    """Creates the hook; build it in the graph that trains.

    Args:
      source: A `LossScale`, an optimizer whose `loss_scale` is one, or a
        `tf_loss_scale.contrib.mixed_precision.LossScaleOptimizer` (else
        TypeError).
      output_dir: Directory for TensorBoard event files, or None.
      every_n_steps: Read the state every this many runs, a positive int
        (else ValueError).
    """
    if not _is_positive_int(every_n_steps):
      raise ValueError(
          f'every_n_steps must be a positive int, but got {every_n_steps!r}.')
    _state_holder(source)
    self._source = source
    self._output_dir = output_dir
    self._every_n_steps = every_n_steps
    self._fetches = None
    self._global_step = None
    self._writer = None
    self._skips = None
    self._step = 0
    self.latest: Dict[str, Any] = {}

  def begin(self):
    self._fetches = state_tensors(self._source)
    self._skips = _skip_log(self._source)
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._output_dir is not None:
      self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)

  def after_create_session(self, session, coord):
    del coord
    self._step = (0 if self._global_step is None else
                  int(session.run(self._global_step)))

  def before_run(self, run_context):
    # A run that fetches a step of this library's wrapper reads the skip
    # count too, ordered after that step, at no cost of a run of its own.
    record = _record_of(self._source) if self._skips is not None else None
    counted = (None if record is None else
               record.skipped_after(run_context.original_args.fetches))
    return None if counted is None else tf.compat.v1.train.SessionRunArgs(
        counted)

  def after_run(self, run_context, run_values):
    session = run_context.session
    skipped = run_values.results
    if self._step % self._every_n_steps == 0:
      # A run of its own, after the train op has finished: fetched with it,
      # the variables could be read before or after its update.
      fetched = session.run(self._fetches)
      self._record(fetched, self._step)
      skipped = fetched[SKIPPED_STEPS]
    if self._skips is not None and skipped is not None:
      line = self._skips.follow(int(skipped), session)
      if line is not None and self._writer is not None:
        self._writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=SKIP_REPORT_TAG,
                                       metadata=_TEXT_METADATA,
                                       tensor=tf.make_tensor_proto(line))
        ]), self._step)
    self._step += 1

  def end(self, session):
    del session
    if self._writer is not None:
      self._writer.flush()

  def _record(self, fetched: Dict[str, Any], step: int) -> None:
    values = _to_python(fetched)
    self.latest = dict(values, step=step)
    logging.info('step %d: %s', step, ', '.join(
        f'{key.replace("_", " ")} {value:g}' for key, value in values.items()))
    if self._writer is not None:
      summary = tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag=TAGS[key], simple_value=value)
          for key, value in values.items()
      ])
      self._writer.add_summary(summary, step)


def _to_python(values: Dict[str, Any]) -> Dict[str, Any]:
  """The scale as a float and the counters as ints."""
  return {key: float(value) if key == SCALE else int(value)
          for key, value in values.items()}


def _is_positive_int(value: Any) -> bool:
  return (isinstance(value, int) and not isinstance(value, bool) and
          value >= 1)
