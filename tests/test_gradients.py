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


# --- all_finite ---------------------------------------------------------------


@pytest.mark.parametrize('values,dtype,expected', [
    ([3e38, 3e38], np.float32, True),    # the sum overflows, values don't
    ([3e38, 3e38, -3e38, -3e38, 1.0], np.float32, True),
    ([-3.4e38, -3.4e38], np.float32, True),
    ([60000.0, 60000.0], np.float16, True),     # float16 sum overflows
    ([65504.0] * 8, np.float16, True),
    ([3e38, 3e38], 'bfloat16', True),
    ([1e300, 1e300], np.float64, True),         # beyond float32, still finite
    ([0.0, -1.0, 2.5], np.float32, True),
    ([INF], np.float32, False),
    ([NAN], np.float32, False),
    ([INF, -INF], np.float32, False),
    ([1.0, -INF, 2.0], np.float32, False),
    ([1.0, NAN], np.float16, False),
    ([INF], np.float16, False),
    ([NAN, 1.0], 'bfloat16', False),
    ([1.0, INF], np.float64, False),
])
@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_all_finite_is_exact(values, dtype, expected, mode):
  tf_dtype = tf.bfloat16 if dtype == 'bfloat16' else tf.as_dtype(dtype)

  def verdict():
    return gradients.all_finite(
        [tf.cast(tf.constant(values, tf.float64), tf_dtype)])

  assert bool(_in_mode(mode, verdict)) is expected


@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_all_finite_combines_many_gradients(mode):

  def verdicts():
    big = tf.constant([3e38, 3e38])
    small = tf.constant([1.0, 2.0], tf.float16)
    bad = tf.constant([[1.0, NAN]])
    sparse_bad = tf.IndexedSlices(tf.constant([[INF]]), tf.constant([0]))
    sparse_ok = tf.IndexedSlices(tf.constant([[3e38], [3e38]]),
                                 tf.constant([0, 1]))
    return [
        gradients.all_finite([big, None, small, sparse_ok]),
        gradients.all_finite({'x': [big, small], 'y': bad}),
        gradients.all_finite((small, sparse_bad)),
        gradients.all_finite(sparse_bad),
        gradients.all_finite(big),
    ]

  assert [bool(v) for v in _in_mode(mode, verdicts)] == [
      True, False, False, False, True]


@pytest.mark.parametrize('bfloat16_value,float32_value,expected', [
    (3e38, 3e38, True),
    (INF, 1.0, False),
    (1.0, NAN, False),
])
@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_all_finite_mixes_bfloat16_with_other_dtypes(bfloat16_value,
                                                     float32_value, expected,
                                                     mode):
  # bfloat16 takes a different test from float16/32/64 in a TF1 graph.

  def verdict():
    return gradients.all_finite([
        tf.constant([bfloat16_value, 1.0], tf.bfloat16),
        tf.constant([float32_value, 2.0]),
        tf.constant([1.0], tf.float16),
    ])

  assert bool(_in_mode(mode, verdict)) is expected


def test_all_finite_in_a_tf1_graph_is_one_op_per_gradient_and_no_branch():
  # Gradients of unknown size are not added up first: one read each.
  with tf.Graph().as_default() as graph:
    grads = [tf.compat.v1.placeholder(tf.float32, [None]) for _ in range(5)]
    before = {op.name for op in graph.get_operations()}
    gradients.all_finite(grads)
    added = [op.type for op in graph.get_operations() if op.name not in before]
  assert not {'If', 'StatelessIf', 'Switch', 'Merge'} & set(added), added
  assert added.count('DebugNumericSummaryV2') == 5
  # Besides the per-gradient summaries: one sum, one slice, one comparison
  # and their constant operands.
  assert len(added) <= 5 + 8, added


@pytest.mark.parametrize('rows,dtype,expected', [
    ([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32, True),
    # Finite, though their sum is not: the gradients are read again.
    ([[3e38, 1.0], [3e38, 1.0], [1.0, 1.0]], np.float32, True),
    ([[-3e38, 1.0], [-3e38, 1.0], [1.0, INF]], np.float32, False),
    # An inf and a -inf add up to a NaN: still seen.
    ([[INF, 1.0], [-INF, 1.0], [1.0, 1.0]], np.float32, False),
    ([[1.0, 1.0], [1.0, NAN], [1.0, 1.0]], np.float32, False),
    ([[60000.0, 1.0], [60000.0, 1.0]], np.float16, True),
    ([[60000.0, 1.0], [1.0, -INF]], np.float16, False),
    ([[1e308, 1.0], [1e308, 1.0]], np.float64, True),
])
@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_all_finite_of_small_gradients_of_one_shape_is_exact(rows, dtype,
                                                             expected, mode):
  # A large gradient and one of another shape ride along, both finite.
  def verdict():
    return gradients.all_finite(
        [tf.constant(row, dtype) for row in rows] +
        [tf.zeros([gradients._GROUPED_SIZE + 1], dtype), tf.ones([3], dtype)])

  assert bool(_in_mode(mode, verdict)) is expected, f'{mode}: {rows}'


def _debug_summaries_run(feed_rows):
  # Runs all_finite of four float32 gradients of shape [2] in a TF1 session,
  # traced: its verdict and how many DebugNumericSummaryV2 kernels ran.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    grads = [tf.compat.v1.placeholder(tf.float32, [2]) for _ in feed_rows]
    verdict = gradients.all_finite(grads)
    metadata = tf.compat.v1.RunMetadata()
    value = session.run(verdict, dict(zip(grads, feed_rows)),
                         options=tf.compat.v1.RunOptions(
                             trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                         run_metadata=metadata)
  ran = [node.timeline_label for device in metadata.step_stats.dev_stats
         for node in device.node_stats]
  return value, sum(' = DebugNumericSummaryV2(' in label for label in ran)


def test_all_finite_reads_the_sum_and_each_gradient_only_when_flagged():
  assert _debug_summaries_run([[1.0, 2.0]] * 4) == (True, 1)
  assert _debug_summaries_run([[1.0, 2.0]] * 3 + [[NAN, 2.0]]) == (False, 5)
  # Finite gradients whose sum overflows: read one by one, and applied.
  assert _debug_summaries_run([[3e38, 2.0]] * 4) == (True, 5)


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_non_finite_kinds_tells_nan_from_inf_per_gradient(mode):
  def kinds():
    return gradients.non_finite_kinds([
        tf.constant([1.0, INF]), None, tf.constant([NAN, -INF], tf.float16),
        tf.constant([[3e38, -3e38]]), tf.constant([NAN], tf.bfloat16),
        tf.IndexedSlices(tf.constant([[-INF]]), tf.constant([1]),
                         tf.constant([4, 1])),
        tf.zeros([0]), tf.constant(NAN, tf.float64)])

  nan, inf = _in_mode(mode, kinds)
  assert nan.tolist() == [False, False, True, False, True, False, False, True]
  assert inf.tolist() == [True, False, True, False, False, True, False, False]


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
@pytest.mark.parametrize('size', [
    gradients._WINDOWED_SIZE - 1, gradients._WINDOWED_SIZE + 5 * 32 + 7])
def test_non_finite_kinds_counts_every_value_exactly(mode, size):
  # Values are coded and summed, the smaller gradient's in one sum, the
  # larger's in windows of 32: infs filling a window or the whole gradient,
  # NaNs alike, both in one window, and the padded last window must all be
  # told apart.
  cases = {
      'finite': ([], [], False, False),
      'window of infs': (range(32, 64), [], False, True),
      'window of NaNs': ([], range(64, 96), True, False),
      'both in a window': ([1, 3, 31], [2], True, True),
      'both, in two windows': ([40], [4000], True, True),
      'inf in the padded window': ([size - 1], [], False, True),
      'NaN in the padded window': ([], [size - 7], True, False),
      'every value both ways': (range(0, size, 2), range(1, size, 2), True,
                                True),
      'every value an inf': (range(size), [], False, True),
      'every value a NaN': ([], range(size), True, False),
      'one NaN, every other value an inf': (range(1, size), [0], True, True),
  }

  def kinds():
    grads = []
    for infs, nans, _, _ in cases.values():
      values = np.full(size, 0.5)
      values[list(infs)] = -INF
      values[list(nans)] = NAN
      grads.append(tf.constant(values, tf.float32))
    return gradients.non_finite_kinds(grads)

  nan, inf = _in_mode(mode, kinds)
  for (name, (_, _, want_nan, want_inf)), got_nan, got_inf in zip(
      cases.items(), nan.tolist(), inf.tolist()):
    assert (got_nan, got_inf) == (want_nan, want_inf), (
        f'{mode}, {size} values: {name}')


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_non_finite_kinds_keeps_the_order_of_gradients_of_every_size(mode):
  # Small gradients are answered together, others one by one: the flags
  # still come in the order of the gradients.
  large = gradients._WINDOWED_SIZE

  def gradient(size, at, value, dtype=tf.float32):
    values = np.zeros(size)
    values[at] = value
    return tf.constant(values, dtype)

  def kinds():
    return gradients.non_finite_kinds([
        None, gradient(large, 7, INF), gradient(3, 1, NAN),
        gradient(10, 0, 1.0), gradient(large + 1, large, NAN, tf.float16),
        gradient(5, 4, -INF, tf.bfloat16), gradient(large, 0, 2.0),
        gradient(2, [0, 1], [NAN, INF])])

  nan, inf = _in_mode(mode, kinds)
  assert nan.tolist() == [False, False, True, False, True, False, False, True]
  assert inf.tolist() == [False, True, False, False, False, True, False, True]


def test_non_finite_kinds_of_a_gradient_of_unknown_size():
  spec = tf.TensorSpec([None], tf.float32)
  fn = tf.function(lambda g: gradients.non_finite_kinds([g]),
                   input_signature=[spec], jit_compile=True)
  nan, inf = fn(tf.constant([1.0, NAN, -INF]))
  assert (nan.numpy().tolist(), inf.numpy().tolist()) == ([True], [True])
  nan, inf = fn(tf.constant([1.0, 2.0]))
  assert (nan.numpy().tolist(), inf.numpy().tolist()) == ([False], [False])


@pytest.mark.parametrize('grads', [[], [None], None, {'a': None, 'b': []}])
def test_all_finite_of_no_gradients_is_true(grads):
  verdict = gradients.all_finite(grads)
  assert verdict.dtype == tf.bool and verdict.shape == ()
  assert bool(verdict)


def test_all_finite_returns_a_scalar_bool_tensor():
  verdict = gradients.all_finite([tf.ones([3, 4]), tf.ones([2])])
  assert isinstance(verdict, tf.Tensor)
  assert verdict.dtype == tf.bool and verdict.shape == ()


def test_all_finite_on_empty_and_scalar_tensors():
  assert bool(gradients.all_finite([tf.zeros([0]), tf.constant(1.0)]))
  assert not bool(gradients.all_finite([tf.zeros([0]), tf.constant(NAN)]))


def test_all_finite_in_a_function_retraces_nothing_per_value():
  fn = tf.function(gradients.all_finite)
  spec = tf.TensorSpec([2], tf.float32)
  concrete = fn.get_concrete_function([spec])
  assert bool(concrete([tf.constant([3e38, 3e38])]))
  assert not bool(concrete([tf.constant([3e38, INF])]))
  assert not bool(concrete([tf.constant([NAN, 0.0])]))


# --- largest_magnitudes ---------------------------------------------------------

F16_MAX, BF16_MAX = 65504.0, float(tf.bfloat16.max)
F32_MAX, F64_MAX = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)


@pytest.mark.parametrize('values,dtype,expected', [
    ([0.0, -0.0], np.float32, 0.0),
    ([1.5, -2.25, 0.5], np.float32, 2.25),
    ([-F32_MAX, 1.0], np.float32, F32_MAX),
    ([F32_MAX, INF], np.float32, INF),
    ([-INF, 1.0], np.float32, INF),
    ([NAN, 1.0], np.float32, INF),
    ([1.0, -NAN], np.float32, INF),
    ([NAN, INF, -INF], np.float32, INF),
    ([-F16_MAX, 2.0], np.float16, F16_MAX),
    ([1.0, NAN], np.float16, INF),
    ([-INF], np.float16, INF),
    ([-2.0**127, 1.0], 'bfloat16', 2.0**127),
    ([BF16_MAX], 'bfloat16', BF16_MAX),
    ([-NAN], 'bfloat16', INF),
    ([INF], 'bfloat16', INF),
    ([F64_MAX, -1e300], np.float64, F64_MAX),
    ([1.0, NAN], np.float64, INF),
    ([-INF], np.float64, INF),
])
@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_largest_magnitudes_is_exact_on_every_special_value(values, dtype,
                                                            expected, mode):
  tf_dtype = tf.bfloat16 if dtype == 'bfloat16' else tf.as_dtype(dtype)

  def largest():
    return gradients.largest_magnitudes(
        [tf.cast(tf.constant(values, tf.float64), tf_dtype)])

  result = _in_mode(mode, largest)
  assert result.dtype == np.float64 and result.shape == (1,)
  assert result[0] == expected, (
      f'{mode}: {tf_dtype.name} {values} gave {result[0]!r}, '
      f'expected {expected!r}')


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_largest_magnitudes_has_one_entry_per_dtype_in_name_order(mode):

  def largest():
    return gradients.largest_magnitudes({
        'w': tf.constant([[1.0, -7.0]]),
        'b': None,
        'half': tf.constant([3.0], tf.float16),
        'sparse': tf.IndexedSlices(tf.constant([[-9.0], [2.0]]),
                                   tf.constant([0, 3]), tf.constant([5, 1])),
        'half_bad': tf.constant([1.0, INF], tf.float16),
        'empty': tf.zeros([0], tf.float64),
    })

  np.testing.assert_array_equal(_in_mode(mode, largest), [INF, 9.0, 0.0])


def test_gradient_dtypes_is_the_order_of_largest_magnitudes():
  grads = [tf.constant(1.0, tf.float64), None, tf.constant(2.0),
           tf.constant(3.0, tf.bfloat16), tf.constant(4.0)]
  assert gradients.gradient_dtypes(grads) == (tf.bfloat16, tf.float32,
                                              tf.float64)
  np.testing.assert_array_equal(gradients.largest_magnitudes(grads),
                                [3.0, 4.0, 1.0])
  assert gradients.gradient_dtypes([None]) == ()
  assert gradients.largest_magnitudes([None]).shape == (0,)


def test_largest_magnitudes_refuses_a_non_float_gradient():
  with pytest.raises(TypeError, match='float16, bfloat16, float32 or float64'
                     '.*int32'):
    gradients.largest_magnitudes([tf.constant([1, 2])])


def test_largest_magnitudes_reads_each_gradient_by_its_extremes():
  # Outside XLA every op is a kernel of its own: each gradient is read by one
  # Max and one Min reduction, and by nothing that writes a temporary its
  # size (such as Abs); the extremes of each dtype are then compared once.
  with tf.Graph().as_default() as graph:
    big = [gradients._GROUPED_SIZE + 1]
    grads = [tf.compat.v1.placeholder(tf.float32, big) for _ in range(4)]
    grads.append(tf.compat.v1.placeholder(tf.float16, [7]))
    before = {op.name for op in graph.get_operations()}
    gradients.largest_magnitudes(grads)
    added = [op for op in graph.get_operations() if op.name not in before]
  readers = {g.name: sorted(op.type for op in g.consumers()) for g in grads}
  assert all(types == ['Max', 'Min'] for types in readers.values()), readers
  types = [op.type for op in added]
  assert types.count('Max') == 5 + 2 and types.count('Min') == 5, types
  assert 'IsFinite' not in types and 'If' not in types, types


def test_largest_magnitudes_under_xla_reads_each_gradient_in_one_reduction():
  # XLA fuses |g| into its reduction, and its floating point maximum would
  # not propagate NaN: one integer maximum of the bit patterns per gradient.
  grads = [tf.zeros([gradients._GROUPED_SIZE + 1]) for _ in range(3)]
  fn = tf.function(lambda *g: gradients.largest_magnitudes(list(g)),
                   jit_compile=True)
  graph = fn.get_concrete_function(*grads).graph
  types = [op.type for op in graph.get_operations()]
  assert types.count('Abs') == 3 and types.count('Min') == 0, types
  assert types.count('Max') == 3 + 1, types


@pytest.mark.parametrize('dtype', [tf.float16, tf.bfloat16, tf.float32,
                                   tf.float64])
@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_largest_magnitudes_sees_a_nan_anywhere_in_a_large_gradient(mode,
                                                                    dtype):
  # Outside XLA the NaN reaches the result through TensorFlow's Max and Min
  # reductions, which run vectorized and on several threads over a large
  # tensor: a NaN at the start, at a lane boundary, mid-way or last, among
  # values of either sign, must not be lost by any of them.
  size = (1 << 16) + 5

  def largest(position, fill):
    grad = tf.fill([size], tf.constant(fill, dtype))
    grad = tf.tensor_scatter_nd_update(grad, [[position]],
                                       tf.constant([NAN], dtype))
    return gradients.largest_magnitudes([grad])

  for position in (0, 7, 8, 15, 16, size // 2, size - 1):
    for fill in (-3.0, 2.0):
      result = _in_mode(mode, lambda: largest(position, fill))
      assert result.tolist() == [INF], (
          f'{mode}: {dtype.name} NaN at {position} among {fill} gave '
          f'{result.tolist()}')


def test_largest_magnitudes_of_an_empty_gradient_of_unknown_size_is_zero():
  spec = tf.TensorSpec([None], tf.float32)
  fn = tf.function(lambda g: gradients.largest_magnitudes([g]),
                   input_signature=[spec])
  assert fn(tf.zeros([0])).numpy().tolist() == [0.0]
  assert fn(tf.constant([-3.0, 2.0])).numpy().tolist() == [3.0]
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    grads = [tf.compat.v1.placeholder(tf.float16, [None]),
             tf.compat.v1.placeholder(tf.float16, [None, 2])]
    largest = gradients.largest_magnitudes(grads)
    feed = {grads[0]: np.zeros([0]), grads[1]: np.zeros([0, 2])}
    assert session.run(largest, feed).tolist() == [0.0]
    feed[grads[1]] = [[1.0, -NAN]]
    assert session.run(largest, feed).tolist() == [INF]


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
@pytest.mark.parametrize('where,value,expected', [
    (0, -3.0, 3.0),       # in the first small gradient
    (7, 5.0, 5.0),        # in the last small gradient
    (8, -6.0, 6.0),       # in the large gradient
    (2, INF, INF),
    (5, -NAN, INF),
    (8, NAN, INF),
])
def test_largest_magnitudes_reads_small_gradients_together_exactly(
    where, value, expected, mode):
  # Eight small gradients of varied shapes (a scalar, an empty one) and one
  # larger than the group limit; every entry is at most 2 but `value`.
  shapes = [[2, 3], [], [4], [0, 5], [3, 1, 2], [7], [1], [2, 2],
            [gradients._GROUPED_SIZE + 1]]

  def largest():
    grads = []
    for i, shape in enumerate(shapes):
      grad = tf.fill(shape, tf.constant(-2.0 if i % 2 else 1.5, tf.float16))
      if i == where:
        flat = tf.reshape(grad, [-1])
        flat = tf.tensor_scatter_nd_update(
            flat, [[tf.size(flat) - 1]], tf.constant([value], tf.float16))
        grad = tf.reshape(flat, shape)
      grads.append(grad)
    return gradients.largest_magnitudes(grads)

  result = _in_mode(mode, largest)
  assert result.tolist() == [expected], (
      f'{mode}: {value} in gradient {where} gave {result.tolist()}')


def test_largest_magnitudes_concatenates_small_gradients_once_per_dtype():
  big = gradients._GROUPED_SIZE + 1
  with tf.Graph().as_default() as graph:
    small = [tf.compat.v1.placeholder(tf.float32, shape)
             for shape in ([3], [2, 2], [])]
    half = [tf.compat.v1.placeholder(tf.float16, [5]) for _ in range(2)]
    large = tf.compat.v1.placeholder(tf.float32, [big])
    unknown = tf.compat.v1.placeholder(tf.float32, [None])
    before = {op.name for op in graph.get_operations()}
    gradients.largest_magnitudes(small + half + [large, unknown])
    added = [op for op in graph.get_operations() if op.name not in before]
  types = [op.type for op in added]
  assert types.count('ConcatV2') == 2, types
  for grad in small + half:
    assert [op.type for op in grad.consumers()] == ['Reshape'], grad
  assert sorted(op.type for op in large.consumers()) == ['Max', 'Min']
  assert sorted(op.type for op in unknown.consumers()) == ['Max', 'Min',
                                                           'Size']
  # The extremes of float32's group, large and unknown gradient, then of
  # float16's group, each dtype's compared once.
  assert types.count('Min') == 3 + 1, types
  assert types.count('Max') == 3 + 1 + 1 + 1, types


# --- finite_as_magnitudes -----------------------------------------------------


@pytest.mark.parametrize('bad,expected', [
    (1.0, [0.0, 0.0]),
    (INF, [INF, INF]),
    (-INF, [INF, INF]),
    (NAN, [INF, INF]),
    (F32_MAX, [0.0, 0.0]),
])
@pytest.mark.parametrize('mode', ['eager', 'function', 'graph'])
def test_finite_as_magnitudes_is_zero_or_inf_per_dtype(bad, expected, mode):

  def markers():
    return gradients.finite_as_magnitudes([
        tf.constant([1.0, bad]), None,
        tf.constant([F16_MAX], tf.float16)])

  result = _in_mode(mode, markers)
  assert result.dtype == np.float64
  assert result.tolist() == expected, f'{mode}: a float32 gradient with {bad}'


def test_finite_as_magnitudes_of_no_gradients_is_empty():
  assert gradients.finite_as_magnitudes([None]).shape == (0,)


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
  assert bool(gradients.all_finite([1.0, 2.0]))
  assert not bool(gradients.all_finite([1.0, float('nan')]))


# --- kinds_by_gradient -----------------------------------------------------------


def _expected_kinds(arrays):
  rows = []
  for a in arrays:
    if a is None or not np.issubdtype(a.dtype, np.floating):
      rows.append([0.0, 0.0, 0.0])
      continue
    a = a.astype(np.float64)
    finite = np.abs(a[np.isfinite(a)])
    rows.append([float(np.isnan(a).any()), float(np.isinf(a).any()),
                 float(finite.max()) if finite.size else 0.0])
  return rows


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit', 'graph'])
def test_kinds_by_gradient_reads_small_and_large_gradients_alike(mode):
  big = gradients._GROUPED_SIZE + 3
  rng = np.random.default_rng(5)

  def gradient(size, dtype, specials=()):
    a = rng.uniform(-3.0, 3.0, size)
    for position, value in specials:
      a[position] = value
    if dtype == 'bfloat16':
      return a
    with np.errstate(over='ignore'):  # -70000.0 is -inf in float16
      return a.astype(np.float32).astype(dtype)
  cases = [
      (gradient(6, np.float32, [(2, np.nan), (4, -np.inf)]), tf.float32),
      (gradient(5, np.float32), tf.float32),
      (None, None),
      (gradient(0, np.float32), tf.float32),
      (gradient(7, np.float32, [(6, np.inf)]), tf.float32),
      (gradient(big, np.float32, [(big - 1, np.nan)]), tf.float32),
      (gradient(3, np.float16, [(0, -np.nan)]), tf.float16),
      (gradient(9, np.float16, [(8, -70000.0)]), tf.float16),  # -inf
      (gradient(4, np.float64, [(1, -1e300)]), tf.float64),
      (np.array([1, 2], np.int32), tf.int32),
      (gradient(5, np.float32, [(0, 3e38), (1, np.inf)]), tf.float32),
  ]
  bf16 = gradient(4, 'bfloat16', [(3, np.inf)])

  def kinds():
    values = [None if a is None else tf.constant(a, dtype)
              for a, dtype in cases]
    values.append(tf.cast(tf.constant(bf16, tf.float64), tf.bfloat16))
    return gradients.kinds_by_gradient(values)

  arrays = [a if a is None or dtype != tf.float16 else a.astype(np.float16)
            for a, dtype in cases]
  arrays.append(tf.cast(tf.cast(tf.constant(bf16), tf.bfloat16),
                        tf.float64).numpy())
  expected = _expected_kinds(arrays)
  result = _in_mode(mode, kinds)
  assert result.shape == (len(expected), 3)
  for i, (got, want) in enumerate(zip(result.tolist(), expected)):
    assert got == want, f'{mode}: gradient {i} gave {got}, expected {want}'
  assert _in_mode(mode, lambda: gradients.kinds_by_gradient([])).shape == (
      0, 3)


def test_kinds_by_gradient_adds_no_op_per_small_gradient_but_its_reshape():
  # A traced step holds its ops in memory: a skip side of a dozen ops per
  # variable was the largest part of a step's memory with many variables.
  def ops_for(count):
    with tf.Graph().as_default() as graph:
      values = [tf.compat.v1.placeholder(tf.float32, [3, 2])
                for _ in range(count)]
      before = len(graph.get_operations())
      gradients.kinds_by_gradient(values)
      return len(graph.get_operations()) - before

  assert ops_for(40) - ops_for(20) == 20
