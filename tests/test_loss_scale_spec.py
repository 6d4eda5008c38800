"""TensorFlow's own test file for its loss scales, as a specification.

Every case of TensorFlow's `tensorflow/python/training/experimental/
loss_scale_test.py` is restated here in our words and run against this
library: in a TF1 graph, eagerly and in a `tf.function`, without a strategy
and under a two-replica MirroredStrategy where only replica 0 sees the
non-finite gradient. Where TensorFlow's file only runs the update op, the
values it returns are compared with those of TensorFlow's own classes.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import loss_scale_runs
import tf_loss_scale

FLOAT32_MAX = float(np.finfo(np.float32).max)
TF_V1 = tf.compat.v1.mixed_precision
MODES = loss_scale_runs.MODES
STRATEGIES = ('none', 'mirrored')


@pytest.fixture(params=STRATEGIES)
def strategy(request):
  if request.param == 'none':
    return None
  return request.getfixturevalue('mirrored_strategy')


# --- FixedLossScale -------------------------------------------------------------


@pytest.mark.parametrize('mode', MODES)
def test_fixed_update_runs_and_answers_the_python_true(mode):
  records = loss_scale_runs.run(lambda: tf_loss_scale.FixedLossScale(1000),
                                [True, False], mode)
  for step, record in enumerate(records):
    # A bool, not a tensor, so that callers need not build a conditional.
    assert record['should_apply'] is True, f'step {step}'
    assert record['update_op'] is None, f'step {step}: nothing to evaluate'
    assert record.value('loss_scale') == 1000.0, f'step {step}'


@pytest.mark.parametrize('mode', ['graph', 'function'])
def test_fixed_update_op_is_a_no_op_like_tensorflows(mode):
  kinds = [_update_kind(make, mode)
           for make in (tf_loss_scale.FixedLossScale, TF_V1.FixedLossScale)]
  assert kinds[0] == kinds[1] == (tf.Operation, 'NoOp', True)


def _update_kind(make, mode):
  """The type of a fixed scale's update op, its op type and its verdict."""
  kinds = []

  def update():
    # Read in the graph that holds the op: TensorFlow 2.12 frees a
    # function's graph, and its ops, once traced.
    op, should_apply = make(8).update([tf.constant(np.nan)])
    kinds.append((type(op), op.type, should_apply))

  if mode == 'graph':
    with tf.Graph().as_default():
      update()
  else:
    tf.function(update)()
  return kinds[0]


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_fixed_from_the_config_of_get(mode):
  with _graph_if(mode):
    config = tf_loss_scale.get(123).get_config()
    scale = tf_loss_scale.FixedLossScale.from_config(config)()
    assert isinstance(scale, tf.Tensor)
    assert _evaluate(scale) == 123.0


def test_fixed_repr():
  assert repr(tf_loss_scale.FixedLossScale(123)) == 'FixedLossScale(123.0)'


def _graph_if(mode):
  return tf.Graph().as_default() if mode == 'graph' else contextlib.nullcontext()


def _scope_if(strategy):
  return strategy.scope() if strategy else contextlib.nullcontext()


def _evaluate(tensor):
  """The tensor's value: run in a new session in a graph, read eagerly."""
  if tf.executing_eagerly():
    return tensor.numpy()
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    return session.run(tensor)


# --- DynamicLossScale: trajectories ---------------------------------------------

# (initial_loss_scale, increment_period, multiplier, verdicts, scales after
# each step), as in TensorFlow's file; its defaults there are 1, 2 and 2.
TRAJECTORIES = {
    'grows': (1, 2, 2, [True] * 6, [1, 2, 2, 4, 4, 8]),
    'grows-until-float32-max': (
        FLOAT32_MAX / 4, 2, 2, [True] * 6,
        [FLOAT32_MAX / 4, FLOAT32_MAX / 2, FLOAT32_MAX / 2, FLOAT32_MAX,
         FLOAT32_MAX, FLOAT32_MAX]),
    'shrinks-every-step': (1024, 2, 2, [False] * 6,
                           [512, 256, 128, 64, 32, 16]),
    'shrinks-down-to-one': (16, 2, 2, [False] * 6, [8, 4, 2, 1, 1, 1]),
    'nan-clears-the-good-steps': (1, 2, 2, [True, True, True, False, True],
                                  [1, 2, 2, 1, 1]),
    'period-one': (1, 1, 2, [True] * 3 + [False, True, True],
                   [2, 4, 8, 4, 8, 16]),
    'alternating-period-one': (1, 1, 2, [True, False] * 4 + [True],
                               [2, 1, 2, 1, 2, 1, 2, 1, 2]),
    'alternating-period-two': (32, 2, 2, [True, False] * 3 + [True],
                               [32, 16, 16, 8, 8, 4, 4]),
    'multiplier-three': (4, 2, 3, [True, True, False, True, True],
                         [4, 12, 4, 4, 12]),
    'random-mix': (4, 2, 2, [False, True, True, True, False, True, False,
                             True, True, True, False],
                   [2, 2, 4, 4, 2, 2, 1, 1, 2, 2, 1]),
}


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('name', list(TRAJECTORIES))
def test_dynamic_trajectory(name, mode, strategy):
  initial, period, multiplier, verdicts, expected = TRAJECTORIES[name]
  records = loss_scale_runs.run(
      lambda: tf_loss_scale.DynamicLossScale(initial, period, multiplier),
      verdicts, mode, strategy)
  for step, (record, verdict) in enumerate(zip(records, verdicts)):
    assert record['should_apply'] == verdict, f'step {step}: verdict'
  assert loss_scale_runs.trajectory(records, 'loss_scale') == expected


@pytest.mark.parametrize('mode', ['graph', 'function'])
@pytest.mark.parametrize('name', ['random-mix', 'grows-until-float32-max',
                                  'alternating-period-one'])
def test_dynamic_update_op_evaluates_to_what_tensorflows_does(name, mode):
  # TensorFlow's update op is a bool tensor (its test passes it through
  # tf.identity); its value is True on the finite steps that complete an
  # increment period, even when the scale cannot grow any more.
  initial, period, multiplier, verdicts, _ = TRAJECTORIES[name]
  values = {}
  for implementation in (tf_loss_scale, TF_V1):
    records = loss_scale_runs.run(
        lambda i=implementation: i.DynamicLossScale(initial, period,
                                                    multiplier),
        verdicts, mode)
    values[implementation.__name__] = [r['update_op'] for r in records]
  assert all(isinstance(v, bool) for v in values['tf_loss_scale'])
  assert values['tf_loss_scale'] == values[TF_V1.__name__]


def test_dynamic_update_op_types_match_tensorflows_in_a_graph():
  found = []
  for implementation in (tf_loss_scale, TF_V1):
    with tf.Graph().as_default():
      update_op, should_apply = implementation.DynamicLossScale().update(
          [tf.constant(1.0)])
      found.append((type(update_op).__name__, update_op.dtype, update_op.shape,
                    should_apply.dtype, should_apply.shape))
  assert found[0] == found[1], found


@pytest.mark.parametrize('mode', MODES)
def test_dynamic_single_tensor_gradient(mode, strategy):
  with _graph_if(mode), _scope_if(strategy):
    loss_scale = tf_loss_scale.DynamicLossScale()
    update = lambda: loss_scale.update(tf.constant(4.0))[1]
    should_apply = (tf.function(update) if mode == 'function' else update)()
    assert _evaluate(should_apply)


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_dynamic_from_config(mode):
  with _graph_if(mode):
    config = tf_loss_scale.DynamicLossScale(
        initial_loss_scale=1, increment_period=2, multiplier=3).get_config()
    restored = tf_loss_scale.DynamicLossScale.from_config(config)
    assert (restored.increment_period, restored.multiplier) == (2, 3.0)
    assert _evaluate(restored()) == 1.0


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_dynamic_update_with_only_none_gradients(mode):
  with _graph_if(mode):
    loss_scale = tf_loss_scale.DynamicLossScale(8, increment_period=1)
    update_op, should_apply = loss_scale.update([None])
    if mode == 'graph':
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(update_op)
        assert session.run([should_apply, loss_scale()]) == [True, 16.0]
    else:
      assert bool(should_apply) and float(loss_scale()) == 16.0


def test_get_dynamic_has_the_default_arguments():
  made, default = tf_loss_scale.get('dynamic'), tf_loss_scale.DynamicLossScale()
  assert (made.initial_loss_scale, made.increment_period, made.multiplier) == (
      default.initial_loss_scale, default.increment_period,
      default.multiplier) == (32768.0, 2000, 2.0)


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_dynamic_call_returns_a_tensor(mode):
  with _graph_if(mode):
    assert isinstance(tf_loss_scale.DynamicLossScale()(), tf.Tensor)
    assert isinstance(tf_loss_scale.FixedLossScale(123)(), tf.Tensor)


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_dynamic_repr(mode, strategy):
  with _graph_if(mode), _scope_if(strategy):
    text = repr(tf_loss_scale.DynamicLossScale(
          initial_loss_scale=1, increment_period=2, multiplier=3))
  if mode == 'eager':
    assert text == ('DynamicLossScale(current_loss_scale=1.0, '
                    'num_good_steps=0, initial_loss_scale=1.0, '
                    'increment_period=2, multiplier=3.0)')
  else:
    assert text == ('DynamicLossScale(initial_loss_scale=1.0, '
                    'increment_period=2, multiplier=3.0)')
