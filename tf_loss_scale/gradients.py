"""Pure tensor functions on losses and nested gradients.

Nothing here holds state: these are the kernels every front end shares to
scale a loss, unscale its gradients and decide whether they are all finite.
A gradient may be a dense tensor, a `tf.IndexedSlices` (kept sparse) or `None`
(kept as `None` and otherwise ignored).
"""

from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
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
    return None if grad is None else unscale_values(grad)

  return tf.nest.map_structure(unscale_one, grads)


def all_finite(grads: Any) -> tf.Tensor:
  """Tells whether every value of every gradient is finite.

  The answer is exact (large finite values never count as overflow) and is
  computed without a branch on most steps, but how depends on where:
  - In a computation XLA compiles (`execution.in_xla_computation`), every
    value is tested with `IsFinite`: XLA has no kernel for the debug op
    below, and fuses this test into the ops that produce the gradients.
  - Elsewhere (a TF1 graph, eagerly, a `tf.function`), where every op runs
    on its own and nothing fuses, each float16/32/64 gradient gets one
    `DebugNumericSummaryV2` op in its CURT_HEALTH mode: one read of the
    gradient, no temporary the size of the gradient, and a flag that is 1
    when any value is inf or NaN. The flags are added up once. Fewer ops per
    gradient is what matters with many small variables, and the one read
    what matters with large ones (see docs/benchmarks.md). Small gradients
    of one dtype and shape (`_GROUPED_SIZE` values at most, as many layers
    have) are first added up by one `AddN`, and only the sum is read: a sum
    holds an inf or a NaN whenever one of its terms does. It can also
    overflow from finite terms; so when some sum or gradient is flagged, the
    gradients are read again one by one, on that step only
    (`execution.computed_unless`), and that second reading decides.
  bfloat16 gradients are always tested with `IsFinite` (the debug op has no
  GPU kernel for them).

  Args:
    grads: A gradient or a nested structure of gradients; `None` entries are
      ignored and `tf.IndexedSlices` are read through their values.

  Returns:
    A scalar bool tensor, True when there are no gradients at all.
  """
  values = dense_values(grads)
  if not values:
    return tf.constant(True)
  if execution.in_xla_computation():
    return _every_value_finite(values)
  summed = _summed_by_shape(values)
  if len(summed) == len(values):
    return _each_finite(values)
  flagged_none = _each_finite(summed)
  return execution.computed_unless(
      flagged_none, lambda: _each_finite(values), otherwise=flagged_none)


def dense_values(grads: Any) -> List[tf.Tensor]:
  """Flattens a nested structure of gradients into their value tensors.

  Args:
    grads: A gradient or a nested structure of gradients.

  Returns:
    A list of tensors: dense gradients as tensors (a Python number, which
    `tf.cond` returns for a constant branch, becomes one), the `values` of
    `tf.IndexedSlices`, and nothing for `None`.
  """
  return [
      g.values if isinstance(g, tf.IndexedSlices) else tf.convert_to_tensor(g)
      for g in tf.nest.flatten(grads)
      if g is not None
  ]


def gradient_dtypes(grads: Any) -> Tuple[tf.DType, ...]:
  """The dtypes of the gradients' values, each once, in a fixed order.

  Args:
    grads: A gradient or a nested structure of gradients.

  Returns:
    A tuple of dtypes sorted by name: the order of `largest_magnitudes`.
  """
  return tuple(sorted({v.dtype for v in dense_values(grads)},
                      key=lambda dtype: dtype.name))


def largest_magnitudes(grads: Any) -> tf.Tensor:
  """The largest magnitude among the gradients of each dtype.

  Where TensorFlow runs each op as a kernel of its own (eagerly, in a
  `tf.function`, in a TF1 graph), each gradient is read by two reductions
  and nothing else, with no temporary the size of the gradient: its largest
  and its smallest value, which TensorFlow's `Max` and `Min` compute
  propagating NaN, on CPU and GPU alike (`|g|` would be written out whole
  before being read again). Under XLA, which fuses `|g|` into one reduction
  but computes floating point maxima without propagating NaN, each gradient
  is read once, for the largest bit pattern of `|g|` read as an integer of
  the same width.
  Either way the extremes are compared as such bit patterns: for values
  whose sign is cleared, the integer order of IEEE bit patterns is the order
  of magnitudes, inf and NaN have the largest patterns (every NaN above
  inf), and an integer maximum cannot lose a NaN. Gradients whose size is
  known and small (`_GROUPED_SIZE` values at most) are reduced together, as
  one flat concatenation per dtype: copying a few thousand values costs
  less than the kernels of a reduction of their own, which is what a step
  with many small variables (biases, norms) pays for on every replica.
  Larger gradients, and those of unknown size, are reduced one by one.

  Args:
    grads: A gradient or a nested structure of gradients of float16,
      bfloat16, float32 or float64; `None` entries are ignored and
      `tf.IndexedSlices` are read through their values.

  Returns:
    A float64 vector with one entry per dtype of `gradient_dtypes(grads)`:
    the largest `|value|` of that dtype's gradients (0 for empty ones), or
    inf when any of them holds an inf or a NaN. Exact: every float16,
    bfloat16 and float32 value is a float64 value.

  Raises:
    TypeError: If a gradient is not of a floating point dtype listed above.
  """
  by_dtype = {}
  for values in dense_values(grads):
    if values.dtype not in _BITS_OF:
      raise TypeError(
          f'Gradients must be float16, bfloat16, float32 or float64 to be '
          f'checked for overflow, but got a gradient of dtype '
          f'{values.dtype.name}.')
    by_dtype.setdefault(values.dtype, []).append(values)
  if not by_dtype:
    return tf.zeros([0], tf.float64)
  return tf.stack([_magnitude_of(dtype, _read_together(by_dtype[dtype]))
                   for dtype in gradient_dtypes(grads)])


def finite_as_magnitudes(grads: Any) -> tf.Tensor:
  """`largest_magnitudes` for gradients whose finite values are known small.

  Where every finite value is known to be far below its dtype's largest
  value, only whether some value is not finite matters to a bound of sums,
  and that is read by `all_finite`: one `DebugNumericSummaryV2` kernel per
  gradient, where `largest_magnitudes` needs a `Max` and a `Min`.

  Args:
    grads: A gradient or a nested structure of gradients, as for
      `largest_magnitudes`.

  Returns:
    A float64 vector shaped like `largest_magnitudes(grads)`: zeros when
    every value is finite, infs otherwise.
  """
  count = len(gradient_dtypes(grads))
  return tf.where(all_finite(grads), tf.zeros([count], tf.float64),
                  tf.fill([count], tf.constant(np.inf, tf.float64)))


def non_finite_kinds(grads: List[Any]) -> Tuple[tf.Tensor, tf.Tensor]:
  """Which gradients hold a NaN, and which an inf, for computations XLA runs.

  The form for a step XLA compiles, which turns the step's branch into
  selects, so that reading the gradients again only on a skipped step would
  read them on every step: here the verdict is taken from these flags. Each
  gradient is read once, in one fusion with the ops that produce it: every
  value gets an integer code (a power of 2 for a NaN, 1 for an inf, 0
  otherwise) and the codes are summed. A NaN's code is above the most infs
  a sum can count, so a sum's low bits count the infs and its high bits the
  NaNs. Gradients of `_WINDOWED_SIZE` values or more are summed in windows
  of `_WINDOW` values, a row reduction that XLA:CPU runs on all threads
  where a whole reduction runs on one; smaller gradients in one sum each,
  and those sums are compared together, so that a gradient costs what an
  `is_finite` reduction of its own would. Gradients of unknown size get two
  predicate reductions. (Elsewhere this is many kernels per gradient.)

  Args:
    grads: A list of gradients; `None` entries are False in both results,
      `tf.IndexedSlices` are read through their values.

  Returns:
    Two bool vectors with one entry per gradient: holds a NaN, holds an inf
    (of either sign); a gradient holding both is True in both.
  """
  if not grads:
    return tf.zeros([0], tf.bool), tf.zeros([0], tf.bool)
  whole = _Coder(_WINDOWED_SIZE, tf.int32)
  windowed = _Coder(2 * _WINDOW, tf.int16)
  sums, summed = [], []
  nan, inf, flagged = [], [], []
  for i, grad in enumerate(grads):
    values = None if grad is None else dense_values(grad)[0]
    size = None if values is None else values.shape.num_elements()
    if size is not None and size < _WINDOWED_SIZE:
      sums.append(whole.total(values))
      summed.append(i)
      continue
    flagged.append(i)
    if values is None:
      nan.append(tf.constant(False))
      inf.append(tf.constant(False))
    elif size is None:
      nan.append(tf.reduce_any(tf.math.is_nan(values)))
      inf.append(tf.reduce_any(tf.math.is_inf(values)))
    else:
      codes = windowed.codes(values)
      if size % _WINDOW:
        codes = tf.pad(codes, [[0, -size % _WINDOW]])
      window_sums = tf.reduce_sum(tf.reshape(codes, [-1, _WINDOW]), axis=1)
      nan.append(tf.reduce_any(windowed.has_nan(window_sums)))
      inf.append(tf.reduce_any(windowed.has_inf(window_sums)))
  # The small gradients' flags come as one vector, the others' one by one: a
  # gather puts them in the order of `grads`.
  nan_parts, inf_parts = [], []
  if sums:
    sums = tf.stack(sums)
    nan_parts.append(whole.has_nan(sums))
    inf_parts.append(whole.has_inf(sums))
  if flagged:
    nan_parts.append(tf.stack(nan))
    inf_parts.append(tf.stack(inf))
  order = tf.constant(np.argsort(summed + flagged).astype(np.int32))
  return tuple(tf.gather(tf.concat(parts, 0), order)
               for parts in (nan_parts, inf_parts))


# Gradients of at least this many values have their codes summed in windows
# of `_WINDOW` values (see `non_finite_kinds`): 32 ran fastest on XLA:CPU,
# against 16 and 64. A whole sum of a smaller gradient's codes, a NaN coded
# `_WINDOWED_SIZE`, fits an int32; a window's, a NaN coded 64, an int16.
_WINDOWED_SIZE = 1 << 12
_WINDOW = 32


class _Coder:
  """Codes values for `non_finite_kinds`, and reads sums of codes.

  Its constants are made once, in the graph being traced, for all the
  gradients it codes.
  """

  def __init__(self, nan_code: int, dtype: tf.DType):
    self._nan = tf.constant(nan_code, dtype)
    self._inf = tf.constant(1, dtype)
    self._finite = tf.constant(0, dtype)
    self._inf_bits = tf.constant(nan_code - 1, dtype)
    self._flat = tf.constant([-1])
    self._first = tf.constant(0)

  def codes(self, values: tf.Tensor) -> tf.Tensor:
    """The code of each value of `values`, flattened."""
    flat = tf.reshape(values, self._flat)
    return tf.where(tf.math.is_nan(flat), self._nan,
                    tf.where(tf.math.is_inf(flat), self._inf, self._finite))

  def total(self, values: tf.Tensor) -> tf.Tensor:
    """The sum of the codes of `values`."""
    return tf.reduce_sum(self.codes(values), axis=self._first)

  def has_nan(self, sums: tf.Tensor) -> tf.Tensor:
    """Whether each of `sums` (of codes) counts a NaN."""
    return sums >= self._nan

  def has_inf(self, sums: tf.Tensor) -> tf.Tensor:
    """Whether each of `sums` (of codes) counts an inf."""
    return tf.bitwise.bitwise_and(sums, self._inf_bits) > 0


def kinds_by_gradient(values: List[Optional[tf.Tensor]]) -> tf.Tensor:
  """What kind of values each gradient holds, for the skip report.

  Meant for a step's skip side, which reads every gradient once more. The
  small gradients of a dtype (of known size, `_GROUPED_SIZE` values at most)
  are read together, as one concatenation, and answered per gradient by
  segment reductions: a few ops per dtype instead of a dozen per gradient,
  which a traced step would hold in memory for every variable. Larger
  gradients are read one by one, and so is every gradient under XLA.

  Args:
    values: Gradient values: dense tensors, or `None` (and tensors that are
      not floating point), which get a row of zeros.

  Returns:
    A float64 matrix with a row per entry of `values`: [1.0 if it holds a
    NaN, 1.0 if it holds an inf, its largest finite magnitude (0 if none)].
  """
  groups = {}
  for i, v in enumerate(values):
    if v is not None and v.dtype.is_floating:
      together = _is_small(v) and not execution.in_xla_computation()
      groups.setdefault((v.dtype.name, together), []).append(i)
  blocks, row_of = [], {}
  for (_, together), members in sorted(groups.items()):
    tensors = [values[i] for i in members]
    for i in members:
      row_of[i] = len(row_of)
    blocks.append(_kinds_together(tensors) if together else
                  tf.stack([_kinds_of(v) for v in tensors]))
  # One more row, of zeros, for the entries without a gradient to read.
  blocks.append(tf.zeros([1, 3], tf.float64))
  table = blocks[0] if len(blocks) == 1 else tf.concat(blocks, axis=0)
  rows = [row_of.get(i, len(row_of)) for i in range(len(values))]
  return tf.gather(table, tf.constant(rows, tf.int32, shape=[len(rows)]))


def _kinds_of(values: tf.Tensor) -> tf.Tensor:
  # `kinds_by_gradient`'s row of one gradient.
  largest = tf.reduce_max(tf.where(tf.math.is_finite(values), tf.abs(values),
                                   tf.zeros([], values.dtype)))
  return tf.stack([
      tf.cast(tf.reduce_any(tf.math.is_nan(values)), tf.float64),
      tf.cast(tf.reduce_any(tf.math.is_inf(values)), tf.float64),
      tf.maximum(tf.cast(largest, tf.float64), 0.0)])


def _kinds_together(values: List[tf.Tensor]) -> tf.Tensor:
  # `kinds_by_gradient`'s rows of gradients of one dtype and known sizes.
  sizes = [v.shape.num_elements() for v in values]
  flat = _concatenated(values)
  segments = tf.repeat(tf.range(len(values)), sizes)
  count = len(values)

  def any_per_gradient(found: tf.Tensor) -> tf.Tensor:
    # A gradient without values is in no segment: its maximum is the
    # lowest int32, which is not above 0 either.
    return tf.cast(tf.math.unsorted_segment_max(
        tf.cast(found, tf.int32), segments, count) > 0, tf.float64)

  # float16 and bfloat16 magnitudes are exact in float32.
  wide = flat if flat.dtype == tf.float64 else tf.cast(flat, tf.float32)
  largest = tf.math.unsorted_segment_max(
      tf.where(tf.math.is_finite(wide), tf.abs(wide), tf.zeros([], wide.dtype)),
      segments, count)
  return tf.stack([
      any_per_gradient(tf.math.is_nan(flat)),
      any_per_gradient(tf.math.is_inf(flat)),
      tf.maximum(tf.cast(largest, tf.float64), 0.0)], axis=1)


# A signed integer of each floating dtype's width: |x| has its sign bit
# clear, so its bit pattern is a non-negative integer of that type.
_BITS_OF = {tf.float16: tf.int16, tf.bfloat16: tf.int16,
            tf.float32: tf.int32, tf.float64: tf.int64}


# Gradients of at most this many values are reduced together (see
# `largest_magnitudes`): 64 KiB of float32, about what a CPU core copies in
# the time a reduction kernel of its own takes to launch.
_GROUPED_SIZE = 1 << 14


def _read_together(values: List[tf.Tensor]) -> List[tf.Tensor]:
  # The tensors to reduce for `values` (all of one dtype): the small ones as
  # one flat concatenation, the others as they are.
  small = [v for v in values if _is_small(v)]
  if len(small) < 2:
    return values
  return ([_concatenated(small)] +
          [v for v in values if not _is_small(v)])


def _concatenated(values: List[tf.Tensor]) -> tf.Tensor:
  # `values` flattened into one vector; their reshapes share one shape.
  flat_shape = tf.constant([-1])
  return tf.concat([tf.reshape(v, flat_shape) for v in values], axis=0)


def _is_small(values: tf.Tensor) -> bool:
  size = values.shape.num_elements()
  return size is not None and size <= _GROUPED_SIZE


def _largest_patterns(values: List[tf.Tensor]) -> List[tf.Tensor]:
  # Scalars whose maximum is the largest bit pattern of `|v|` over `values`
  # (of one dtype); none for gradients known to be empty.
  bits = _BITS_OF[values[0].dtype]
  if execution.in_xla_computation():
    return [tf.reduce_max(tf.bitcast(tf.abs(v), bits)) for v in values]
  extremes = [e for v in values for e in _extremes(v)]
  if not extremes:
    return []
  return [tf.reduce_max(tf.bitcast(tf.abs(tf.stack(extremes)), bits))]


def _extremes(values: tf.Tensor) -> List[tf.Tensor]:
  # The largest and smallest of `values` (NaN when any is NaN), or zeros
  # for an empty tensor, whose reductions give the dtype's extremes.
  size = values.shape.num_elements()
  if size == 0:
    return []
  extremes = [tf.reduce_max(values), tf.reduce_min(values)]
  if size is None:
    nonempty = tf.size(values) > 0
    extremes = [tf.where(nonempty, e, tf.zeros([], e.dtype))
                for e in extremes]
  return extremes


def _magnitude_of(dtype: tf.DType, values: List[tf.Tensor]) -> tf.Tensor:
  # The largest `|v|` over `values` (of `dtype`), as a float64 scalar.
  patterns = _largest_patterns(values)
  if not patterns:
    return tf.zeros([], tf.float64)
  largest = (patterns[0] if len(patterns) == 1 else
             tf.reduce_max(tf.stack(patterns)))
  # An empty gradient's maximum under XLA is the integer type's lowest value.
  largest = tf.maximum(largest, tf.zeros([], largest.dtype))
  inf_pattern = tf.bitcast(tf.constant(float('inf'), dtype), largest.dtype)
  return tf.where(largest < inf_pattern,
                  tf.cast(tf.bitcast(largest, dtype), tf.float64),
                  tf.constant(float('inf'), tf.float64))


# DebugNumericSummaryV2's CURT_HEALTH mode (TensorDebugMode in TensorFlow's
# debug_event.proto) returns [tensor id, 1.0 if any value is inf or NaN].
_CURT_HEALTH = 2
# The dtypes the op has CPU and GPU kernels for.
_SUMMARIZED_DTYPES = (tf.float16, tf.float32, tf.float64)


def _none_flagged(values: List[tf.Tensor]) -> tf.Tensor:
  summaries = [
      tf.raw_ops.DebugNumericSummaryV2(input=v, tensor_debug_mode=_CURT_HEALTH)
      for v in values
  ]
  return tf.equal(tf.add_n(summaries)[1], 0.0)


def _each_finite(values: List[tf.Tensor]) -> tf.Tensor:
  # `all_finite` of `values`, outside XLA, read one by one.
  summarized = [v for v in values if v.dtype in _SUMMARIZED_DTYPES]
  others = [v for v in values if v.dtype not in _SUMMARIZED_DTYPES]
  verdicts = [_none_flagged(summarized)] if summarized else []
  if others:
    verdicts.append(_every_value_finite(others))
  return verdicts[0] if len(verdicts) == 1 else tf.logical_and(*verdicts)


def _summed_by_shape(values: List[tf.Tensor]) -> List[tf.Tensor]:
  # `values` with the small ones of each summarized dtype and static shape
  # replaced by their sum; the others, and groups of one, as they are.
  groups = {}
  for v in values:
    key = ((v.dtype, tuple(v.shape.as_list()))
           if v.dtype in _SUMMARIZED_DTYPES and _is_small(v) else id(v))
    groups.setdefault(key, []).append(v)
  return [members[0] if len(members) == 1 else tf.add_n(members)
          for members in groups.values()]


def _every_value_finite(values: List[tf.Tensor]) -> tf.Tensor:
  return tf.reduce_all(
      tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in values]))


def _times(loss: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
  loss = tf.convert_to_tensor(loss)
  return loss * tf.cast(scale, loss.dtype)
