"""Pure tensor functions on losses and nested gradients.

Nothing here holds state: these are the kernels every front end shares to
scale a loss, unscale its gradients and read them, once per step, for the
infinities and NaNs they hold.
A gradient may be a dense tensor, a `tf.IndexedSlices` (kept sparse) or `None`
(kept as `None` and otherwise ignored).
"""

from typing import Any, Callable, List, Optional, Union

import tensorflow as tf

from tf_loss_scale import execution

Loss = Union[tf.Tensor, Callable[[], tf.Tensor]]


def scale_loss(loss: Loss, scale: tf.Tensor) -> Loss:
  """Multiplies a loss by the loss scale.

  Args:
    loss: A floating point tensor, or a zero-argument callable returning one.
    scale: The loss scale, a scalar tensor. It is cast to the loss's dtype, so
      float16 and bfloat16 losses are scaled in their own precision.

  Returns:
    `loss * scale` in the loss's dtype; for a callable loss, a new
    zero-argument callable that returns the scaled loss when called.
  """
  if callable(loss):
    return lambda: _times(loss(), scale)
  return _times(loss, scale)


def unscale(grads: Any, scale: tf.Tensor, divide: bool = False) -> Any:
  """Divides every gradient in a nested structure by the loss scale.

  Rounded as each front end's peer rounds. By default, as TensorFlow's v1
  wrapper and tf_keras's classes: times the float32 reciprocal of the scale,
  in float32 for float16 and bfloat16 gradients (a half precision reciprocal
  is inexact, and zero in float16 past 2**24), in the gradient's dtype.
  `divide=True`, as Keras 3's class: divided by the scale in float32 or the
  gradient's dtype if wider, so half precision ones come back in float32.
  `None` stays `None`; `tf.IndexedSlices` stay sparse.

  Args:
    grads: A gradient or a nested structure (list, tuple, dict) of gradients.
    scale: The loss scale the gradients were computed with, a scalar tensor.
    divide: Whether to divide, as Keras 3's class does.

  Returns:
    A structure like `grads` holding the unscaled gradients.
  """
  reciprocal = None if divide else 1.0 / tf.cast(scale, tf.float32)

  def unscale_values(values: tf.Tensor) -> tf.Tensor:
    wide = tf.float32 if values.dtype.size < 4 else values.dtype
    if divide:
      return tf.cast(values, wide) / tf.cast(scale, wide)
    return tf.cast(tf.cast(values, wide) * tf.cast(reciprocal, wide),
                   values.dtype)

  def unscale_one(grad):
    if isinstance(grad, tf.IndexedSlices):
      return tf.IndexedSlices(unscale_values(grad.values), grad.indices,
                              grad.dense_shape)
    # NumPy arrays and Python numbers have no TensorFlow dtype yet.
    return None if grad is None else unscale_values(tf.convert_to_tensor(grad))

  return tf.nest.map_structure(unscale_one, grads)


def read(grads: Any, magnitudes: Union[bool, tf.Tensor] = False) -> tf.Tensor:
  """Reads each gradient once for the kinds of values it holds.

  A step's verdict, the bound on its sums across replicas and its skip
  report all come from this table. How a gradient is read depends on where:
  - In a computation XLA compiles (`execution.in_xla_computation`), in one
    pass that XLA fuses with the ops that produce the gradient: each value
    gets a code (64 for a NaN, 1 for an inf, else 0) and the codes are
    summed over windows of 32 values, a row reduction that XLA:CPU spreads
    over its threads where a whole reduction runs on one.
  - Elsewhere (a TF1 graph, eagerly, a `tf.function`), where every op runs
    on its own, a float16/32/64 gradient is read by one
    `DebugNumericSummaryV2` kernel in its CURT_HEALTH mode, the fastest
    (one read, no temporary the size of the gradient), which tells only
    whether it holds an inf or a NaN (small ones of one shape are first
    added up, and their sum is read). On a step where some gradient does,
    and only then (`execution.computed_unless`), each is read again, by
    the same op in its CONCISE_HEALTH mode, for its counts of each. Other
    dtypes (bfloat16, which the op has no GPU kernel for) are read as
    under XLA.

  Args:
    grads: A gradient or a nested structure of gradients of floating point
      dtypes; a `None` entry gets a row of zeros, a `tf.IndexedSlices` is
      read through its values.
    magnitudes: Whether to read each gradient's largest magnitude too: a
      Python bool, or a bool scalar tensor, for magnitudes needed on some
      steps only, which are then read on those steps only (under XLA, which
      has no such gating, on every step).

  Returns:
    A float64 matrix with a row per entry of `tf.nest.flatten(grads)`: how
    many of its values are NaN, how many are inf of either sign (or 1 for
    some and 0 for none, where read in windows), and with `magnitudes` its
    largest `|value|` (0 when empty or not read; NaN or inf when a value is).

  Raises:
    TypeError: If a gradient is not of a floating point dtype.
  """
  values = [None if g is None else dense_values(g)[0]
            for g in tf.nest.flatten(grads)]
  for v in values:
    if v is not None and not v.dtype.is_floating:
      raise TypeError(
          f'Gradients must be of a floating point dtype to be checked for '
          f'overflow, but got a gradient of dtype {v.dtype.name}.')
  xla = execution.in_xla_computation()
  summarized = [i for i, v in enumerate(values) if v is not None and
                not xla and v.dtype in _SUMMARIZED_DTYPES]
  tested = [i for i, v in enumerate(values)
            if v is not None and i not in summarized]
  blocks = []
  if summarized:
    blocks.append(_counted([values[i] for i in summarized]))
  if tested:
    blocks.append(_kinds_in_one_pass([values[i] for i in tested]))
  rows = summarized + tested
  if len(rows) < len(values):
    blocks.append(tf.zeros([1, 2], tf.float64))  # The row of a `None`.
  table = (tf.zeros([0, 2], tf.float64) if not blocks else blocks[0]
           if len(blocks) == 1 else tf.concat(blocks, axis=0))
  if rows != list(range(len(values))):
    table = tf.gather(table, [rows.index(i) if i in rows else len(rows)
                              for i in range(len(values))])
  if magnitudes is False:
    return table
  largest = lambda: _largest(values)
  if isinstance(magnitudes, tf.Tensor) and not xla:
    largest = execution.computed_unless(
        tf.logical_not(magnitudes), largest,
        otherwise=tf.zeros([len(values)], tf.float64))
  else:
    largest = largest()
  return tf.concat([table, tf.expand_dims(largest, 1)], axis=1)


def dense_values(grads: Any) -> List[tf.Tensor]:
  """The value tensors of nested gradients, as a list; nothing for `None`.

  A dense gradient as a tensor (a Python number, which `tf.cond` returns for
  a constant branch, becomes one), a `tf.IndexedSlices` as its `values`.
  """
  return [
      g.values if isinstance(g, tf.IndexedSlices) else tf.convert_to_tensor(g)
      for g in tf.nest.flatten(grads)
      if g is not None
  ]


# DebugNumericSummaryV2's modes (TensorDebugMode in TensorFlow's
# debug_event.proto): CURT_HEALTH returns [tensor id, 1.0 if any value is inf
# or NaN]; CONCISE_HEALTH [tensor id, element count, -inf count, +inf count,
# NaN count], which this matrix maps to `read`'s two columns.
_CURT_HEALTH, _CONCISE_HEALTH = 2, 3
_NAN_AND_INF = [[0, 0], [0, 0], [0, 1], [0, 1], [1, 0]]
# The dtypes the op has CPU and GPU kernels for.
_SUMMARIZED_DTYPES = (tf.float16, tf.float32, tf.float64)
# Gradients of at most this many values are added up before the first
# reading (see `_counted`): 64 KiB of float32.
_SUMMED_SIZE = 1 << 14
# Gradients of fewer values have their codes summed whole (see
# `_kinds_in_one_pass`): a sum of codes of NaNs (this value each) fits an
# int32.
_WINDOWED = 1 << 12


def _counted(values: List[tf.Tensor]) -> tf.Tensor:
  # `read`'s two columns for `values`, outside XLA: zeros unless the first
  # reading flags some. Small gradients of one shape are added up by one
  # `AddN` and only their sum is summarized: fewer kernels where a step
  # has many small variables. A sum holds an inf or a NaN whenever a term
  # does, and may overflow from finite terms: the counts then decide.
  by_shape = {}
  for v in values:
    small = (v.shape.is_fully_defined() and
             v.shape.num_elements() <= _SUMMED_SIZE)
    by_shape.setdefault((v.dtype, tuple(v.shape.as_list())) if small else id(v),
                        []).append(v)
  flagged = tf.add_n([tf.raw_ops.DebugNumericSummaryV2(
      input=terms[0] if len(terms) == 1 else tf.add_n(terms),
      tensor_debug_mode=_CURT_HEALTH,
      output_dtype=tf.float64) for terms in by_shape.values()])[1]
  return execution.computed_unless(
      tf.equal(flagged, 0.0), lambda: tf.matmul(tf.stack([
          tf.raw_ops.DebugNumericSummaryV2(
              input=v, tensor_debug_mode=_CONCISE_HEALTH,
              output_dtype=tf.float64) for v in values]),
                                               tf.constant(_NAN_AND_INF,
                                                           tf.float64)),
      otherwise=tf.zeros([len(values), 2], tf.float64))


def _kinds_in_one_pass(values: List[tf.Tensor]) -> tf.Tensor:
  # `read`'s two columns for `values`, each read in one pass: every value
  # gets a code, a NaN's above the most infs a sum can count, and the codes
  # are summed, those of gradients of `_WINDOWED` values or more (or of
  # unknown size) over windows of 32 values, a row reduction that XLA:CPU
  # spreads over its threads. The sums are compared together.
  nan, inf, zero = (tf.constant(c) for c in (_WINDOWED, 1, 0))
  sums = []
  for v in values:
    flat = tf.reshape(v, [-1])
    if flat.shape[0] is not None and flat.shape[0] < _WINDOWED:
      sums.append(tf.reduce_sum(tf.where(
          tf.math.is_nan(flat), nan, tf.where(tf.math.is_inf(flat), inf,
                                              zero))))
      continue
    codes = tf.where(tf.math.is_nan(flat), 64,
                     tf.where(tf.math.is_inf(flat), 1, 0))
    codes = tf.pad(codes, [[0, tf.math.floormod(-tf.size(codes), 32)]])
    windows = tf.reduce_sum(tf.reshape(codes, [-1, 32]), axis=1)
    sums.append(tf.where(tf.reduce_any(windows >= 64), nan, zero) + tf.cast(
        tf.reduce_any(tf.bitwise.bitwise_and(windows, 63) > 0), tf.int32))
  sums = tf.stack(sums)
  return tf.cast(tf.stack([
      sums >= nan, tf.bitwise.bitwise_and(sums, nan - 1) > 0], axis=1),
                 tf.float64)


def _largest(values: List[Optional[tf.Tensor]]) -> tf.Tensor:
  # The largest |v| of each of `values` (0 for None), as float64, from its
  # largest and its smallest value: two reductions, with no temporary the
  # size of the gradient that `|v|` would write, and a few ops per dtype.
  # An empty gradient's are -inf and inf.
  by_dtype = {}
  for i, v in enumerate(values):
    if v is not None:
      by_dtype.setdefault(v.dtype, []).append(i)
  parts = [tf.zeros([1], tf.float64)]  # The entry of a `None`.
  for members in by_dtype.values():
    largest = tf.maximum(tf.stack([tf.reduce_max(values[i]) for i in members]),
                         -tf.stack([tf.reduce_min(values[i]) for i in members]))
    parts.append(tf.cast(largest, tf.float64))
  order = [i for members in by_dtype.values() for i in members]
  rows = [order.index(i) + 1 if i in order else 0
          for i in range(len(values))]
  return tf.maximum(tf.gather(tf.concat(parts, 0),
                              tf.constant(rows, tf.int32, [len(rows)])), 0.0)


def _times(loss: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
  loss = tf.convert_to_tensor(loss)
  return loss * tf.cast(scale, loss.dtype)
