"""Specification of the core loss scales: tf_loss_scale/loss_scale.py.

Pinned trajectories are written out by hand; everything else is compared with
TensorFlow's own `tf.compat.v1.mixed_precision` loss scales as the oracle.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import loss_scale as loss_scale_lib

FLOAT32_MAX = float(np.finfo(np.float32).max)
MODES = ('graph', 'eager', 'function')
TFDynamicLossScale = tf.compat.v1.mixed_precision.DynamicLossScale
TFFixedLossScale = tf.compat.v1.mixed_precision.FixedLossScale


def _step_grads(dense, sparse):
  """One step's gradients: a dense tensor, a None and sparse slices."""
  return {
      'dense': dense,
      'unused': None,
      'sparse': [tf.IndexedSlices(sparse, tf.constant([0, 2]),
                                  tf.constant([4, 3]))],
  }


def _finite_steps(values):
  """Dense/sparse gradient values for steps that are finite or not."""
  steps = []
  for finite in values:
    value = 1.0 if finite else np.inf
    steps.append((np.array([value, 2.0, 3.0], np.float32),
                  np.full([2, 3], 0.5, np.float32)))
  return steps


def run_updates(make_loss_scale, steps, mode):
  """Feeds each step's gradients to `update` in the given execution mode.

  Args:
    make_loss_scale: Zero-argument factory of the loss scale under test.
    steps: A list of `(dense [3], sparse values [2, 3])` numpy arrays.
    mode: 'graph' (tf.compat.v1.Session), 'eager' or 'function'.

  Returns:
    `(scales, should_apply)`: the scale after each step and each step's
    should-apply verdict, as Python lists.
  """
  scales, verdicts = [], []
  if mode == 'graph':
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      loss_scale = make_loss_scale()
      dense = tf.compat.v1.placeholder(tf.float32, [3])
      sparse = tf.compat.v1.placeholder(tf.float32, [2, 3])
      update_op, should_apply = loss_scale.update(_step_grads(dense, sparse))
      scale = loss_scale()
      session.run(tf.compat.v1.global_variables_initializer())
      # A fixed scale's verdict is the Python True, nothing to fetch.
      fetches = {'update': update_op}
      if isinstance(should_apply, tf.Tensor):
        fetches['verdict'] = should_apply
      for dense_value, sparse_value in steps:
        fetched = session.run(fetches, {dense: dense_value,
                                        sparse: sparse_value})
        verdicts.append(bool(fetched.get('verdict', should_apply)))
        scales.append(float(session.run(scale)))
    return scales, verdicts
  loss_scale = make_loss_scale()
  update = lambda d, s: loss_scale.update(_step_grads(d, s))[1]
  if mode == 'function':
    update = tf.function(update, input_signature=[
        tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 3], tf.float32)])
  for dense_value, sparse_value in steps:
    verdict = update(tf.constant(dense_value), tf.constant(sparse_value))
    verdicts.append(bool(verdict))
    scales.append(float(loss_scale()))
  return scales, verdicts


# --- The abstract base -------------------------------------------------------


def test_loss_scale_base_class_is_abstract():
  with pytest.raises(TypeError):
    tf_loss_scale.LossScale()


def test_custom_subclass_is_accepted_by_get_but_not_serialize():

  class Halving(tf_loss_scale.LossScale):

    def __call__(self):
      return tf.constant(0.5)

    def update(self, grads):
      return None, True

    def get_config(self):
      return {}

  custom = Halving()
  assert tf_loss_scale.get(custom) is custom
  assert isinstance(Halving.from_config({}), Halving)
  with pytest.raises(TypeError, match='Halving'):
    tf_loss_scale.serialize(custom)


# --- FixedLossScale ----------------------------------------------------------


@pytest.mark.parametrize('value', [1, 128, 2.5, np.float32(1024), FLOAT32_MAX])
def test_fixed_loss_scale_returns_a_float32_scalar(value):
  loss_scale = tf_loss_scale.FixedLossScale(value)
  scale = loss_scale()
  assert isinstance(scale, tf.Tensor)
  assert scale.dtype == tf.float32 and scale.shape == ()
  assert float(scale) == float(np.float32(value))
  assert loss_scale.loss_scale_value == float(value)


def test_fixed_loss_scale_update_eagerly_returns_none_and_python_true():
  update_op, should_apply = tf_loss_scale.FixedLossScale(8).update(
      [tf.constant([np.inf, np.nan])])
  assert update_op is None
  assert should_apply is True


def test_fixed_loss_scale_update_in_a_graph_returns_an_op_and_python_true():
  with tf.Graph().as_default():
    update_op, should_apply = tf_loss_scale.FixedLossScale(8).update(
        tf.constant(np.inf))
    assert isinstance(update_op, tf.Operation)
    assert should_apply is True


@pytest.mark.parametrize('mode', MODES)
def test_fixed_loss_scale_never_changes_and_never_skips(mode):
  steps = _finite_steps([True, False, True, False])
  scales, verdicts = run_updates(lambda: tf_loss_scale.FixedLossScale(64),
                                 steps, mode)
  assert scales == [64.0] * 4
  assert verdicts == [True] * 4


def test_fixed_loss_scale_repr_and_config_match_tensorflow():
  ours = tf_loss_scale.FixedLossScale(128)
  theirs = TFFixedLossScale(128)
  assert repr(ours) == repr(theirs) == 'FixedLossScale(128.0)'
  assert ours.get_config() == theirs.get_config() == {
      'loss_scale_value': 128.0}
  restored = tf_loss_scale.FixedLossScale.from_config(ours.get_config())
  assert isinstance(restored, tf_loss_scale.FixedLossScale)
  assert restored.loss_scale_value == 128.0


def test_fixed_loss_scale_value_is_read_only():
  loss_scale = tf_loss_scale.FixedLossScale(4)
  with pytest.raises(AttributeError):
    loss_scale.loss_scale_value = 8


@pytest.mark.parametrize('value,error,pattern', [
    (0.5, ValueError, r'loss_scale_value.*0\.5'),
    (0, ValueError, r'loss_scale_value.*\b0\b'),
    (-4, ValueError, r'loss_scale_value.*-4'),
    (float('nan'), ValueError, r'loss_scale_value.*nan'),
    (float('inf'), ValueError, r'loss_scale_value.*inf'),
    (1e39, ValueError, r'loss_scale_value.*1e\+39'),
    ('128', TypeError, r"loss_scale_value.*'128'"),
    (None, TypeError, r'loss_scale_value.*None'),
    (True, TypeError, r'loss_scale_value.*True'),
    (tf.constant(8.0), TypeError, r'loss_scale_value.*EagerTensor'),
])
def test_fixed_loss_scale_rejects_bad_values(value, error, pattern):
  with pytest.raises(error, match=pattern):
    tf_loss_scale.FixedLossScale(value)


# --- DynamicLossScale: the pinned rule ----------------------------------------


@pytest.mark.parametrize('mode', MODES)
def test_dynamic_doubles_every_increment_period_finite_steps(mode):
  scales, verdicts = run_updates(
      lambda: tf_loss_scale.DynamicLossScale(1, increment_period=2),
      _finite_steps([True] * 6), mode)
  assert scales == [1, 2, 2, 4, 4, 8]
  assert verdicts == [True] * 6


@pytest.mark.parametrize('mode', MODES)
def test_dynamic_halves_on_each_non_finite_step_down_to_one(mode):
  scales, verdicts = run_updates(
      lambda: tf_loss_scale.DynamicLossScale(16),
      _finite_steps([False] * 6), mode)
  assert scales == [8, 4, 2, 1, 1, 1]
  assert verdicts == [False] * 6


@pytest.mark.parametrize('mode', MODES)
def test_dynamic_non_finite_step_resets_the_good_step_count(mode):
  scales, verdicts = run_updates(
      lambda: tf_loss_scale.DynamicLossScale(4, 2, multiplier=3),
      _finite_steps([True, True, False, True, True]), mode)
  assert scales == [4, 12, 4, 4, 12]
  assert verdicts == [True, True, False, True, True]


@pytest.mark.parametrize('mode', MODES)
def test_dynamic_saturates_at_float32_max(mode):
  scales, _ = run_updates(
      lambda: tf_loss_scale.DynamicLossScale(FLOAT32_MAX / 4, 1),
      _finite_steps([True] * 6), mode)
  assert scales == [FLOAT32_MAX / 2] + [FLOAT32_MAX] * 5
  assert all(math.isfinite(s) for s in scales)


def test_dynamic_recovers_from_float32_max_on_overflow():
  scales, _ = run_updates(
      lambda: tf_loss_scale.DynamicLossScale(FLOAT32_MAX, 1),
      _finite_steps([True, False, True]), 'eager')
  assert scales == [FLOAT32_MAX, FLOAT32_MAX / 2, FLOAT32_MAX]


def test_dynamic_defaults():
  loss_scale = tf_loss_scale.DynamicLossScale()
  scale = loss_scale()
  assert isinstance(scale, tf.Tensor)
  assert scale.dtype == tf.float32 and scale.shape == ()
  assert loss_scale.initial_loss_scale == 2.0**15
  assert loss_scale.increment_period == 2000
  assert loss_scale.multiplier == 2.0
  assert float(loss_scale()) == 32768.0
  assert int(loss_scale.good_steps.numpy()) == 0


@pytest.mark.parametrize('grads', [
    tf.constant(np.nan),
    [tf.constant(1.0), (tf.constant([2.0, np.inf]),)],
    {'a': None, 'b': {'c': tf.constant([[-np.inf]])}},
    [tf.IndexedSlices(tf.constant([[1.0], [np.nan]]), tf.constant([0, 1]))],
], ids=['bare-tensor', 'nested-list', 'nested-dict', 'indexed-slices'])
def test_dynamic_update_sees_non_finite_values_in_any_structure(grads):
  loss_scale = tf_loss_scale.DynamicLossScale(8)
  update_op, should_apply = loss_scale.update(grads)
  assert update_op is None
  assert should_apply.dtype == tf.bool and not bool(should_apply)
  assert float(loss_scale()) == 4.0


@pytest.mark.parametrize('grads', [
    tf.constant(3.0),
    [None, tf.constant([1.0, -2.0]), None],
    [None],
    [],
    [tf.IndexedSlices(tf.constant([[1.0], [2.0]]), tf.constant([0, 1]))],
], ids=['bare-tensor', 'nones-ignored', 'only-none', 'empty', 'indexed-slices'])
def test_dynamic_update_counts_finite_structures_as_good(grads):
  loss_scale = tf_loss_scale.DynamicLossScale(8, increment_period=1)
  _, should_apply = loss_scale.update(grads)
  assert bool(should_apply)
  assert float(loss_scale()) == 16.0


def test_dynamic_update_in_a_graph_returns_a_bool_tensor_that_updates():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    loss_scale = tf_loss_scale.DynamicLossScale(8)
    update_op, should_apply = loss_scale.update([tf.constant(np.inf)])
    for tensor in (update_op, should_apply):
      assert isinstance(tensor, tf.Tensor)
      assert tensor.dtype == tf.bool and tensor.shape == ()
    session.run(tf.compat.v1.global_variables_initializer())
    assert float(session.run(loss_scale())) == 8.0, 'updated before running'
    assert session.run(tf.identity(update_op)) is np.False_
    assert float(session.run(loss_scale())) == 4.0


def test_dynamic_update_in_a_function_returns_a_bool_tensor():
  loss_scale = tf_loss_scale.DynamicLossScale(8, increment_period=1)
  results = []

  @tf.function
  def step(grad):
    update_op, should_apply = loss_scale.update([grad])
    results.append((update_op, should_apply))
    return update_op, should_apply

  # The update op's value: the step was finite and completed its period.
  assert [bool(t) for t in step(tf.constant(np.inf))] == [False, False]
  assert float(loss_scale()) == 4.0
  assert [bool(t) for t in step(tf.constant(1.0))] == [True, True]
  assert float(loss_scale()) == 8.0
  # The first call traces twice: the first trace creates the skip report's
  # flags, as a function that creates variables does.
  update_op, should_apply = results[-1]
  assert update_op.dtype == should_apply.dtype == tf.bool


def test_assign_next_state_applies_a_given_verdict():
  loss_scale = tf_loss_scale.DynamicLossScale(8, increment_period=2)
  assert loss_scale.assign_next_state(tf.constant(True)) is None
  assert (float(loss_scale()), int(loss_scale.good_steps.numpy())) == (8, 1)
  loss_scale.assign_next_state(tf.constant(True))
  assert (float(loss_scale()), int(loss_scale.good_steps.numpy())) == (16, 0)
  loss_scale.assign_next_state(tf.constant(False))
  assert (float(loss_scale()), int(loss_scale.good_steps.numpy())) == (8, 0)


@pytest.mark.parametrize('state,finite,expected', [
    ((8.0, 0), True, (8.0, 1)),
    ((8.0, 2), True, (24.0, 0)),
    ((8.0, 5), True, (24.0, 0)),   # a counter past the period still grows
    ((8.0, 2), False, (8.0 / 3, 0)),
    ((2.0, 1), False, (1.0, 0)),   # never below one
    ((0.5, 0), False, (1.0, 0)),   # a scale below one is lifted to one
    ((FLOAT32_MAX, 2), True, (FLOAT32_MAX, 0)),  # no overflow to inf
])
def test_next_dynamic_state_is_the_written_rule(state, finite, expected):
  scale, good_steps = loss_scale_lib.next_dynamic_state(
      tf.constant(state[0], tf.float32), tf.constant(state[1], tf.int64),
      tf.constant(finite), increment_period=3, multiplier=3.0)
  assert scale.dtype == tf.float32 and good_steps.dtype == tf.int64
  assert float(scale) == pytest.approx(expected[0], rel=1e-7)
  assert int(good_steps) == expected[1]


# --- DynamicLossScale against TensorFlow's, step by step ----------------------


def _random_steps(seed, count):
  """Random gradients; about a third of the steps hold an inf or a NaN."""
  rng = np.random.default_rng(seed)
  steps = []
  for _ in range(count):
    dense = rng.normal(size=3).astype(np.float32)
    sparse = rng.normal(size=(2, 3)).astype(np.float32)
    if rng.random() < 0.35:
      target = dense if rng.random() < 0.5 else sparse.reshape(-1)
      target[rng.integers(target.size)] = rng.choice([np.inf, -np.inf, np.nan])
    steps.append((dense, sparse))
  return steps


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('seed,arguments', [
    (0, dict(initial_loss_scale=2.0**10, increment_period=2, multiplier=2.0)),
    (1, dict(initial_loss_scale=3.0, increment_period=1, multiplier=1.5)),
    (2, dict(initial_loss_scale=FLOAT32_MAX / 8, increment_period=1)),
])
def test_dynamic_matches_tensorflow_step_by_step(mode, seed, arguments):
  steps = _random_steps(seed, 16)
  ours = run_updates(lambda: tf_loss_scale.DynamicLossScale(**arguments),
                     steps, mode)
  theirs = run_updates(lambda: TFDynamicLossScale(**arguments), steps, mode)
  for step in range(len(steps)):
    assert ours[1][step] == theirs[1][step], (
        f'step {step}: should_apply ours={ours[1][step]} '
        f'tensorflow={theirs[1][step]}')
    assert ours[0][step] == theirs[0][step], (
        f'step {step}: loss scale ours={ours[0][step]} '
        f'tensorflow={theirs[0][step]}')
  assert not all(ours[1]) and any(ours[1]), 'the sequence must mix verdicts'


# --- Variables ----------------------------------------------------------------


def _check_state_variables(loss_scale):
  scale, good_steps = loss_scale.current_loss_scale, loss_scale.good_steps
  assert scale.name == 'current_loss_scale:0'
  assert good_steps.name == 'good_steps:0'
  assert scale.dtype == tf.float32 and good_steps.dtype == tf.int64
  for variable in (scale, good_steps):
    assert not variable.trainable
    assert variable.synchronization == tf.VariableSynchronization.AUTO
    assert variable.aggregation == tf.VariableAggregation.NONE
  assert list(loss_scale.variables) == [scale, good_steps]
  assert not loss_scale.trainable_variables


def test_dynamic_state_variables_eagerly():
  loss_scale = tf_loss_scale.DynamicLossScale(8)
  _check_state_variables(loss_scale)
  assert float(loss_scale.current_loss_scale.numpy()) == 8.0


def test_dynamic_state_variables_in_a_graph_match_tensorflow_names():
  with tf.Graph().as_default():
    _check_state_variables(tf_loss_scale.DynamicLossScale(8))
    ours = sorted(v.name for v in tf.compat.v1.global_variables())
  with tf.Graph().as_default():
    TFDynamicLossScale(8)
    theirs = sorted(v.name for v in tf.compat.v1.global_variables())
  assert ours == theirs == ['current_loss_scale:0', 'good_steps:0']


def test_dynamic_properties_are_read_only():
  loss_scale = tf_loss_scale.DynamicLossScale()
  for name in ('initial_loss_scale', 'increment_period', 'multiplier'):
    with pytest.raises(AttributeError):
      setattr(loss_scale, name, 3)


# --- repr and config ----------------------------------------------------------


def test_dynamic_repr_matches_tensorflow_eagerly():
  ours = tf_loss_scale.DynamicLossScale(4, 3, 2.5)
  theirs = TFDynamicLossScale(4, 3, 2.5)
  ours.update(tf.constant(1.0))
  theirs.update(tf.constant(1.0))
  assert repr(ours) == repr(theirs) == (
      'DynamicLossScale(current_loss_scale=4.0, num_good_steps=1, '
      'initial_loss_scale=4.0, increment_period=3, multiplier=2.5)')


def test_dynamic_repr_matches_tensorflow_in_a_graph():
  with tf.Graph().as_default():
    ours = repr(tf_loss_scale.DynamicLossScale())
    theirs = repr(TFDynamicLossScale())
  assert ours == theirs == (
      'DynamicLossScale(initial_loss_scale=32768.0, increment_period=2000, '
      'multiplier=2.0)')


def test_dynamic_config_matches_tensorflow_and_round_trips():
  arguments = dict(initial_loss_scale=64, increment_period=7, multiplier=4)
  ours = tf_loss_scale.DynamicLossScale(**arguments)
  config = ours.get_config()
  assert config == TFDynamicLossScale(**arguments).get_config() == {
      'initial_loss_scale': 64.0, 'increment_period': 7, 'multiplier': 4.0}
  assert isinstance(config['increment_period'], int)
  restored = tf_loss_scale.DynamicLossScale.from_config(config)
  assert isinstance(restored, tf_loss_scale.DynamicLossScale)
  assert restored.get_config() == config
  assert float(restored()) == 64.0


def test_config_is_taken_from_the_arguments_not_the_state():
  loss_scale = tf_loss_scale.DynamicLossScale(8, increment_period=1)
  loss_scale.update(tf.constant(1.0))
  assert float(loss_scale()) == 16.0
  assert loss_scale.get_config()['initial_loss_scale'] == 8.0


@pytest.mark.parametrize('arguments,error,pattern', [
    (dict(initial_loss_scale=0), ValueError, r'initial_loss_scale.*\b0\b'),
    (dict(initial_loss_scale=-1.0), ValueError, r'initial_loss_scale.*-1\.0'),
    (dict(initial_loss_scale=float('inf')), ValueError,
     r'initial_loss_scale.*inf'),
    (dict(initial_loss_scale=float('nan')), ValueError,
     r'initial_loss_scale.*nan'),
    (dict(initial_loss_scale='big'), TypeError, r"initial_loss_scale.*'big'"),
    (dict(increment_period=0), ValueError, r'increment_period.*\b0\b'),
    (dict(increment_period=-5), ValueError, r'increment_period.*-5'),
    (dict(increment_period=2**63), ValueError,
     r'increment_period.*9223372036854775808'),
    (dict(increment_period=2.5), TypeError, r'increment_period.*2\.5'),
    (dict(increment_period='10'), TypeError, r"increment_period.*'10'"),
    (dict(increment_period=None), TypeError, r'increment_period.*None'),
    (dict(multiplier=1), ValueError, r'multiplier.*\b1\b'),
    (dict(multiplier=0.5), ValueError, r'multiplier.*0\.5'),
    (dict(multiplier=float('inf')), ValueError, r'multiplier.*inf'),
    (dict(multiplier=float('nan')), ValueError, r'multiplier.*nan'),
    (dict(multiplier=[2]), TypeError, r'multiplier.*\[2\]'),
])
def test_dynamic_rejects_bad_arguments(arguments, error, pattern):
  with pytest.raises(error, match=pattern):
    tf_loss_scale.DynamicLossScale(**arguments)


# --- get, serialize, deserialize ---------------------------------------------


@pytest.mark.parametrize('number', [1, 8, 2.5, np.float64(512), np.int32(4)])
def test_get_turns_a_number_into_a_fixed_loss_scale(number):
  loss_scale = tf_loss_scale.get(number)
  assert isinstance(loss_scale, tf_loss_scale.FixedLossScale)
  assert loss_scale.loss_scale_value == float(number)


def test_get_turns_dynamic_into_a_default_dynamic_loss_scale():
  loss_scale = tf_loss_scale.get('dynamic')
  assert isinstance(loss_scale, tf_loss_scale.DynamicLossScale)
  assert loss_scale.get_config() == TFDynamicLossScale().get_config()


def test_get_passes_loss_scales_and_none_through():
  fixed = tf_loss_scale.FixedLossScale(2)
  dynamic = tf_loss_scale.DynamicLossScale()
  assert tf_loss_scale.get(fixed) is fixed
  assert tf_loss_scale.get(dynamic) is dynamic
  assert tf_loss_scale.get(None) is None


@pytest.mark.parametrize('identifier', [
    'Dynamic', 'dynamic ', 'fixed', '', [8], {'class_name': 'x'}, object()])
def test_get_rejects_anything_else(identifier):
  with pytest.raises(ValueError, match='identifier'):
    tf_loss_scale.get(identifier)


def test_get_rejects_tensorflows_own_loss_scales():
  with pytest.raises(ValueError, match='DynamicLossScale'):
    tf_loss_scale.get(TFDynamicLossScale())


def test_get_rejects_a_number_below_one_naming_it():
  with pytest.raises(ValueError, match=r'0\.25'):
    tf_loss_scale.get(0.25)


@pytest.mark.parametrize('loss_scale,expected', [
    (tf_loss_scale.FixedLossScale(16),
     {'class_name': 'FixedLossScale', 'config': {'loss_scale_value': 16.0}}),
    (tf_loss_scale.DynamicLossScale(4, 10, 3),
     {'class_name': 'DynamicLossScale',
      'config': {'initial_loss_scale': 4.0, 'increment_period': 10,
                 'multiplier': 3.0}}),
], ids=['fixed', 'dynamic'])
def test_serialize_and_deserialize_round_trip(loss_scale, expected):
  config = tf_loss_scale.serialize(loss_scale)
  assert config == expected
  restored = tf_loss_scale.deserialize(config)
  assert isinstance(restored, type(loss_scale))
  assert restored is not loss_scale
  assert restored.get_config() == loss_scale.get_config()
  assert float(restored()) == float(loss_scale())


@pytest.mark.parametrize('loss_scale', [
    TFDynamicLossScale(), TFFixedLossScale(2), 'dynamic', 8, None])
def test_serialize_accepts_only_this_librarys_loss_scales(loss_scale):
  with pytest.raises(TypeError, match='serialize'):
    tf_loss_scale.serialize(loss_scale)


def test_serialize_rejects_a_subclass_of_a_library_class():

  class Subclassed(tf_loss_scale.DynamicLossScale):
    pass

  with pytest.raises(TypeError, match='Subclassed'):
    tf_loss_scale.serialize(Subclassed())


@pytest.mark.parametrize('config', [
    {'class_name': 'LossScale', 'config': {}},
    {'class_name': 'Dense', 'config': {'units': 2}},
    {'class_name': 'tensorflow.DynamicLossScale', 'config': {}},
    {'class_name': 'DynamicLossScale'},
    {'class_name': 'DynamicLossScale', 'config': {}, 'extra': 1},
    [('class_name', 'DynamicLossScale'), ('config', {})],
    'DynamicLossScale',
])
def test_deserialize_rejects_other_classes_and_shapes(config):
  with pytest.raises(ValueError, match='class_name'):
    tf_loss_scale.deserialize(config)


def test_deserialize_validates_the_config_values():
  with pytest.raises(ValueError, match=r'increment_period.*\b0\b'):
    tf_loss_scale.deserialize({'class_name': 'DynamicLossScale',
                               'config': {'increment_period': 0}})
