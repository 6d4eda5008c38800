"""Specification of the gradient kernels: tf_loss_scale/gradients.py."""

import numpy as np
import pytest
import tensorflow as tf

from tf_loss_scale import gradients

INF, NAN = np.inf, np.nan


def _in_mode(mode, fn):
  """Runs `fn()` eagerly, in a tf.function (XLA-compiled for 'jit') or in a
  TF1 session; numpy out."""
  if mode == 'eager':
    return tf.nest.map_structure(lambda t: t.numpy(), fn())
  if mode in ('function', 'jit'):
    compiled = tf.function(fn, jit_compile=(mode == 'jit'))
    return tf.nest.map_structure(lambda t: t.numpy(), compiled())
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    return session.run(fn())


# --- scale_loss ---------------------------------------------------------------


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16, tf.float32,
                                   tf.float64])
def test_scale_loss_multiplies_in_the_losss_dtype(dtype):
  scaled = gradients.scale_loss(tf.constant(1.5, dtype), tf.constant(8.0))
  assert scaled.dtype == dtype
  assert float(scaled) == 12.0


def test_scale_loss_of_a_float16_loss_overflows_like_float16():
  scaled = gradients.scale_loss(tf.constant(4.0, tf.float16),
                                tf.constant(2.0**15))
  assert scaled.dtype == tf.float16
  assert np.isinf(scaled.numpy())


def test_scale_loss_wraps_a_callable_without_calling_it():
  calls = []

  def loss():
    calls.append(1)
    return tf.constant([1.0, -2.0])

  scaled = gradients.scale_loss(loss, tf.constant(4.0))
  assert callable(scaled) and not calls
  np.testing.assert_array_equal(scaled().numpy(), [4.0, -8.0])
  np.testing.assert_array_equal(scaled().numpy(), [4.0, -8.0])
  assert len(calls) == 2, 'the loss must be recomputed on every call'


def test_scale_loss_accepts_python_and_numpy_losses():
  assert float(gradients.scale_loss(3.0, tf.constant(2.0))) == 6.0
  np.testing.assert_array_equal(
      gradients.scale_loss(np.array([1.0, 2.0], np.float32),
                           tf.constant(2.0)).numpy(), [2.0, 4.0])


# --- unscale ------------------------------------------------------------------


@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_unscale_divides_a_nested_structure_keeping_none(mode):

  def unscaled():
    grads = {
        'a': tf.constant([8.0, -4.0]),
        'b': [None, (tf.constant(2.0, tf.float64),)],
    }
    out = gradients.unscale(grads, tf.constant(4.0))
    assert out['b'][0] is None
    assert out['b'][1][0].dtype == tf.float64
    return {'a': out['a'], 'b1': out['b'][1][0]}

  result = _in_mode(mode, unscaled)
  np.testing.assert_array_equal(result['a'], [2.0, -1.0])
  assert result['b1'] == 0.5


def test_unscale_accepts_a_bare_tensor_and_a_bare_none():
  assert float(gradients.unscale(tf.constant(6.0), tf.constant(3.0))) == 2.0
  assert gradients.unscale(None, tf.constant(3.0)) is None
  assert gradients.unscale([], tf.constant(3.0)) == []


@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_unscale_keeps_indexed_slices_sparse(mode):
  structure = {}

  def unscaled():
    grad = tf.IndexedSlices(tf.constant([[4.0, 8.0], [-16.0, 2.0]]),
                            tf.constant([3, 0]), tf.constant([5, 2]))
    out = gradients.unscale([grad], tf.constant(4.0))[0]
    structure['type'] = type(out)
    return {'values': out.values, 'indices': out.indices,
            'dense_shape': out.dense_shape}

  result = _in_mode(mode, unscaled)
  assert structure['type'] is tf.IndexedSlices
  np.testing.assert_array_equal(result['values'], [[1.0, 2.0], [-4.0, 0.5]])
  np.testing.assert_array_equal(result['indices'], [3, 0])
  np.testing.assert_array_equal(result['dense_shape'], [5, 2])


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16])
def test_unscale_keeps_half_precision(dtype):
  grad = tf.constant([1.5 * 2**15, 2.0**15], dtype)
  sparse = tf.IndexedSlices(tf.constant([[2.0**14]], dtype), tf.constant([1]))
  dense, sparse = gradients.unscale([grad, sparse], tf.constant(2.0**15))
  assert dense.dtype == dtype and sparse.values.dtype == dtype
  np.testing.assert_array_equal(dense.numpy().astype(np.float32), [1.5, 1.0])
  np.testing.assert_array_equal(sparse.values.numpy().astype(np.float32),
                                [[0.5]])


@pytest.mark.parametrize('scale', [2.0**25, 2.0**28, 3.0**10, 1.5**30])
def test_unscale_float16_is_correctly_rounded_even_for_large_scales(scale):
  # A float16 reciprocal of these scales is zero or subnormal; the unscaled
  # gradients must still be float16(scaled / scale), not zero or off by ulps.
  scaled = np.array([60000.0, 1000.0, -3000.0, 40000.0], np.float16)
  expected = (scaled.astype(np.float64) / scale).astype(np.float16)
  assert np.all(expected != 0)
  unscaled = gradients.unscale(tf.constant(scaled), tf.constant(scale))
  assert unscaled.dtype == tf.float16
  np.testing.assert_array_equal(unscaled.numpy(), expected)


def test_unscale_keeps_each_dtype_in_a_mixed_structure():
  grads = [tf.constant(2.0, tf.float16), tf.constant(2.0, tf.float32),
           tf.constant(2.0, tf.float64), tf.constant(2.0, tf.bfloat16)]
  out = gradients.unscale(grads, tf.constant(2.0))
  assert [g.dtype for g in out] == [g.dtype for g in grads]
  assert [float(g) for g in out] == [1.0] * 4


def test_unscale_by_division_widens_half_precision_as_keras_3_does():
  # Keras 3 divides in the wider of the gradient's dtype and float32.
  grads = [tf.constant([5.0], tf.float16), tf.constant([5.0], tf.bfloat16),
           tf.constant([5.0], tf.float32), tf.constant([5.0], tf.float64),
           tf.IndexedSlices(tf.constant([[5.0]], tf.float16), tf.constant([1]))]
  out = gradients.unscale(grads, tf.constant(3.0), divide=True)
  assert [g.dtype for g in out] == [tf.float32] * 3 + [tf.float64, tf.float32]
  assert [g.numpy().ravel()[0] for g in out[:3]] == [np.float32(5 / 3)] * 3
  assert out[3].numpy()[0] == 5 / np.float64(np.float32(3.0))
  assert isinstance(out[4], tf.IndexedSlices)
  # By default: times the float32 reciprocal, one ulp off here.
  assert gradients.unscale(grads[2], tf.constant(3.0)).numpy()[0] == (
      np.float32(5) * (np.float32(1) / np.float32(3)))
  assert np.float32(5 / 3) != np.float32(5) * (np.float32(1) / np.float32(3))


def test_unscale_accepts_a_float16_scale():
  out = gradients.unscale([tf.constant(6.0)], tf.constant(3.0, tf.float16))
  assert out[0].dtype == tf.float32
  assert float(out[0]) == pytest.approx(2.0, rel=1e-7)


# --- read -----------------------------------------------------------------------

F16_MAX, BF16_MAX = 65504.0, float(tf.bfloat16.max)
F32_MAX, F64_MAX = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)
MODES = ['eager', 'function', 'jit', 'graph']


def _tf_dtype(dtype):
  return tf.bfloat16 if dtype == 'bfloat16' else tf.as_dtype(dtype)


def _counted(mode, counts):
  """What `read` reports for `counts` NaNs or infs: under XLA, 1 for some."""
  return [min(c, 1) for c in counts] if mode == 'jit' else list(counts)


@pytest.mark.parametrize('values,dtype', [
    ([3e38, 3e38], np.float32),    # the sum overflows, values don't
    ([-3.4e38, -3.4e38], np.float32),
    ([60000.0, 60000.0], np.float16),
    ([3e38, 3e38], 'bfloat16'),
    ([1e300, 1e300], np.float64),   # beyond float32, still finite
    ([0.0, -1.0, 2.5], np.float32),
    ([INF], np.float32),
    ([NAN], np.float32),
    ([INF, -INF, NAN, 1.0, NAN], np.float32),
    ([1.0, NAN], np.float16),
    ([INF, -INF], np.float16),
    ([NAN, 1.0, -INF], 'bfloat16'),
    ([1.0, INF, NAN, NAN], np.float64),
])
@pytest.mark.parametrize('mode', MODES)
def test_read_counts_the_nans_and_the_infs_of_each_gradient(values, dtype,
                                                            mode):
  tf_dtype = _tf_dtype(dtype)

  def table():
    return gradients.read([tf.cast(tf.constant(values, tf.float64), tf_dtype)])

  result = _in_mode(mode, table)
  assert result.dtype == np.float64
  assert result.tolist() == [_counted(mode, [np.isnan(values).sum(),
                                             np.isinf(values).sum()])], mode


@pytest.mark.parametrize('mode', MODES)
def test_read_has_a_row_per_gradient_in_their_order(mode):
  # Float16/32/64 gradients and the others (bfloat16, or all under XLA) are
  # read apart: the rows still come in the order of the gradients.
  def table():
    return gradients.read({
        'a': [tf.constant([1.0, INF]), None,
              tf.constant([NAN, -INF, NAN], tf.float16)],
        'b': tf.constant([[3e38, -3e38]]),
        'c': tf.constant([NAN], tf.bfloat16),
        'd': tf.IndexedSlices(tf.constant([[-INF]]), tf.constant([1]),
                              tf.constant([4, 1])),
        'e': [tf.zeros([0]), tf.constant(NAN, tf.float64), 2.0],
    })

  nan, inf = np.transpose(_in_mode(mode, table)).tolist()
  assert nan == _counted(mode, [0, 0, 2, 0, 1, 0, 0, 1, 0])
  assert inf == _counted(mode, [1, 0, 1, 0, 0, 1, 0, 0, 0])


@pytest.mark.parametrize('grads', [[], [None], None, {'a': None, 'b': []}])
def test_read_of_no_gradients(grads):
  rows = len(tf.nest.flatten(grads))
  assert gradients.read(grads).numpy().tolist() == [[0.0, 0.0]] * rows
  assert gradients.read(grads, magnitudes=True).shape == (rows, 3)


@pytest.mark.parametrize('values,dtype,expected', [
    ([0.0, -0.0], np.float32, 0.0),
    ([1.5, -2.25, 0.5], np.float32, 2.25),
    ([-F32_MAX, 1.0], np.float32, F32_MAX),
    ([F32_MAX, INF], np.float32, INF),
    ([-INF, 1.0], np.float32, INF),
    ([-F16_MAX, 2.0], np.float16, F16_MAX),
    ([-INF], np.float16, INF),
    ([-2.0**127, 1.0], 'bfloat16', 2.0**127),
    ([BF16_MAX], 'bfloat16', BF16_MAX),
    ([INF], 'bfloat16', INF),
    ([F64_MAX, -1e300], np.float64, F64_MAX),
    ([-INF], np.float64, INF),
    ([], np.float32, 0.0),
    ([], np.float16, 0.0),
])
@pytest.mark.parametrize('mode', MODES)
def test_read_magnitudes_are_exact(values, dtype, expected, mode):
  tf_dtype = _tf_dtype(dtype)

  def table():
    return gradients.read([
        tf.cast(tf.constant(values, tf.float64, shape=[len(values)]),
                tf_dtype), None], magnitudes=True)

  result = _in_mode(mode, table)
  assert result[:, 2].tolist() == [expected, 0.0], (
      f'{mode}: {tf_dtype.name} {values}')


def test_read_refuses_a_non_float_gradient():
  with pytest.raises(TypeError, match='floating point dtype.*int32'):
    gradients.read([tf.constant([1, 2])])


def _summaries_run(feed_rows):
  # Reads float32 gradients of shape [2] in a TF1 session, traced: the
  # table, and how many DebugNumericSummaryV2 kernels ran.
  with tf.Graph().as_default() as graph, tf.compat.v1.Session() as session:
    grads = [tf.compat.v1.placeholder(tf.float32, [2]) for _ in feed_rows]
    table = gradients.read(grads)
    added = [op.type for op in graph.get_operations()]
    metadata = tf.compat.v1.RunMetadata()
    value = session.run(table, dict(zip(grads, feed_rows)),
                        options=tf.compat.v1.RunOptions(
                            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                        run_metadata=metadata)
  assert not {'If', 'StatelessIf'} & set(added), added
  for grad in grads:
    assert sorted(op.type for op in grad.consumers()) == [
        'AddN', 'DebugNumericSummaryV2']
  ran = [node.timeline_label for device in metadata.step_stats.dev_stats
         for node in device.node_stats]
  return value.tolist(), sum(' = DebugNumericSummaryV2(' in label
                             for label in ran)


def test_read_in_a_tf1_graph_reads_each_gradient_once_unless_one_is_flagged():
  # Small gradients of one shape are added up and their sum summarized by
  # one kernel on most steps, with no temporary the size of a gradient
  # (such as IsNan's). Where the sum is flagged, each gradient is read
  # again for its counts, which decide: finite terms may overflow a sum.
  assert _summaries_run([[1.0, 2.0]] * 3) == ([[0.0, 0.0]] * 3, 1)
  assert _summaries_run([[1.0, 2.0], [NAN, INF], [-INF, 1.0]]) == (
      [[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], 4)
  assert _summaries_run([[3e38, 2.0]] * 3) == ([[0.0, 0.0]] * 3, 4)


def _kernels_run(magnitudes_needed):
  # Reads two float32 gradients with magnitudes gated in a TF1 session,
  # traced: the table and how many Max kernels ran.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    grads = [tf.compat.v1.placeholder(tf.float32, [2]) for _ in range(2)]
    needed = tf.compat.v1.placeholder(tf.bool, [])
    table = gradients.read(grads, magnitudes=needed)
    metadata = tf.compat.v1.RunMetadata()
    value = session.run(
        table, {grads[0]: [1.0, -3.0], grads[1]: [INF, 2.0],
                needed: magnitudes_needed},
        options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
        run_metadata=metadata)
  ran = [node.timeline_label for device in metadata.step_stats.dev_stats
         for node in device.node_stats]
  return value.tolist(), sum(' = Max(' in label for label in ran)


def test_read_gates_the_magnitudes_on_steps_that_need_them():
  assert _kernels_run(False) == ([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], 0)
  table, maxima = _kernels_run(True)
  assert table == [[0.0, 0.0, 3.0], [0.0, 1.0, INF]] and maxima >= 2


def test_read_under_xla_reads_magnitudes_whatever_the_gate():
  fn = tf.function(lambda g: gradients.read([g], magnitudes=tf.constant(False)),
                   jit_compile=True)
  assert fn(tf.constant([1.0, -5.0])).numpy().tolist() == [[0.0, 0.0, 5.0]]


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16, tf.float32,
                                   tf.float64])
@pytest.mark.parametrize('mode', MODES)
def test_read_sees_a_nan_anywhere_in_a_large_gradient(mode, dtype):
  # Kernels run vectorized and on several threads over a large tensor: a
  # NaN at the start, at a lane boundary, mid-way or last, among values of
  # either sign, must not be lost.
  size = (1 << 16) + 5

  def table(position, fill):
    grad = tf.fill([size], tf.constant(fill, dtype))
    grad = tf.tensor_scatter_nd_update(grad, [[position]],
                                       tf.constant([NAN], dtype))
    return gradients.read([grad])

  for position in (0, 7, 8, 15, 16, size // 2, size - 1):
    for fill in (-3.0, 2.0):
      result = _in_mode(mode, lambda: table(position, fill))
      assert result.tolist() == [[1.0, 0.0]], (
          f'{mode}: {dtype.name} NaN at {position} among {fill}')


def test_read_of_gradients_of_unknown_size():
  spec = tf.TensorSpec([None], tf.float32)
  for jit in (False, True):
    fn = tf.function(lambda g: gradients.read([g], magnitudes=True),
                     input_signature=[spec], jit_compile=jit)
    assert fn(tf.zeros([0])).numpy().tolist() == [[0.0, 0.0, 0.0]]
    assert fn(tf.constant([-3.0, 2.0])).numpy().tolist() == [[0.0, 0.0, 3.0]]
    assert fn(tf.constant([1.0, NAN, -INF])).numpy()[0, :2].tolist() == [
        1.0, 1.0]


# --- dense_values -------------------------------------------------------------


def test_dense_values_flattens_and_drops_none():
  dense = tf.constant([1.0])
  sparse = tf.IndexedSlices(tf.constant([[2.0]]), tf.constant([0]))
  values = gradients.dense_values({'a': [dense, None], 'b': (sparse,)})
  assert len(values) == 2
  assert values[0] is dense
  assert values[1] is sparse.values
  assert gradients.dense_values(None) == []
  assert gradients.dense_values(dense) == [dense]


def test_python_numbers_are_gradients_too():
  values = gradients.dense_values([1.0, None, 3.0])
  assert [v.numpy().item() for v in values] == [1.0, 3.0]
  assert gradients.read([1.0, float('nan')]).numpy().tolist() == [
      [0.0, 0.0], [1.0, 0.0]]

