"""Specification of tf_loss_scale/step.py: the one step every front end runs.

Each test drives `apply_step` or `stateless_step` directly with a small
apply function, so what is checked is the step itself: which gradients are
unscaled, what the verdict is about, how the state moves, and that a skipped
step applies nothing on any replica.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import step

INF, NAN = np.inf, np.nan


def _sgd_apply(variables, learning_rate=1.0):
  """An apply function that subtracts `learning_rate * grad` (None skipped)."""

  def apply_fn(grads):
    return tf.group([v.assign_sub(learning_rate * g)
                     for g, v in zip(grads, variables) if g is not None])

  return apply_fn


@pytest.mark.parametrize('in_function', [False, True])
def test_apply_step_unscales_marked_gradients_and_advances(in_function):
  scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0,
                                         increment_period=2)
  a, b = tf.Variable([1.0, 1.0]), tf.Variable([5.0])

  def run(grads):
    return step.apply_step(grads, step.LossScaleState(scale),
                           _sgd_apply([a, b]), scaled=[True, False])[1]

  run = tf.function(run) if in_function else run
  # a's gradient is of the scaled loss (8 / 4 = 2); b's is taken as it is.
  assert bool(run([tf.constant([8.0, 4.0]), tf.constant([3.0])]))
  np.testing.assert_array_equal(a.numpy(), [-1.0, 0.0])
  np.testing.assert_array_equal(b.numpy(), [2.0])
  assert (float(scale()), int(scale.good_steps)) == (4.0, 1)
  assert not bool(run([tf.constant([INF, 4.0]), tf.constant([3.0])]))
  np.testing.assert_array_equal(a.numpy(), [-1.0, 0.0])
  np.testing.assert_array_equal(b.numpy(), [2.0])
  assert (float(scale()), int(scale.good_steps)) == (2.0, 0)


def test_apply_step_skips_on_nan_in_an_unscaled_gradient():
  scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0)
  var = tf.Variable([1.0])
  _, applied = step.apply_step([tf.constant([NAN])],
                               step.LossScaleState(scale), _sgd_apply([var]))
  assert not bool(applied)
  assert var.numpy().tolist() == [1.0]
  assert float(scale()) == 2.0


def test_apply_step_with_a_fixed_scale_applies_every_step():
  var = tf.Variable([1.0])
  _, applied = step.apply_step(
      [tf.constant([INF])], step.LossScaleState(tf_loss_scale.FixedLossScale(2)),
      _sgd_apply([var]), scaled=[True])
  assert applied is True
  assert var.numpy().tolist() == [-INF]


class _SkipsOddSteps(tf_loss_scale.LossScale):
  """A user's LossScale with its own verdict: it skips every other step."""

  def __init__(self):
    super().__init__()
    self.calls = tf.Variable(0)

  def __call__(self):
    return tf.constant(2.0)

  def update(self, grads):
    del grads
    self.calls.assign_add(1)
    return None, tf.equal(self.calls % 2, 1)

  def get_config(self):
    return {}


def test_apply_step_lets_a_user_loss_scale_decide_through_update():
  var = tf.Variable([0.0])
  state = step.LossScaleState(_SkipsOddSteps())
  applied = [bool(step.apply_step([tf.constant([2.0])], state,
                                  _sgd_apply([var]), scaled=[True])[1])
             for _ in range(4)]
  assert applied == [True, False, True, False]
  assert var.numpy().tolist() == [-2.0]  # two steps of 2 / 2


def test_apply_step_runs_on_skip_once_per_skipped_step():
  skips = tf.Variable(0)
  var = tf.Variable([1.0])
  state = step.LossScaleState(tf_loss_scale.DynamicLossScale())
  for grad in (1.0, INF, 2.0, NAN):
    step.apply_step([tf.constant([grad])], state, _sgd_apply([var]),
                    on_skip=lambda: skips.assign_add(1))
  assert int(skips) == 2
  assert var.numpy().tolist() == [-2.0]


def test_unscale_where_needs_one_flag_per_gradient():
  with pytest.raises(ValueError, match='2 gradients but 1 scaled flags'):
    step.unscale_where([tf.constant(1.0), None], [True], tf.constant(2.0))


# --- under MirroredStrategy (two replicas) ------------------------------------


def _replica_gradient(per_replica_values, dtype=tf.float32):
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  return tf.cast(tf.gather(tf.constant(per_replica_values, tf.float32),
                           replica), dtype)


def test_reducing_step_decides_on_the_sums_and_applies_them_once(
    mirrored_strategy):
  # apply_fn applies what it is given (reduces=False): it must get the sums.
  with mirrored_strategy.scope():
    scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=1.0)
    var = tf.Variable([0.0, 0.0], dtype=tf.float16,
                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  @tf.function
  def train_step(per_replica_values):
    def replica_fn():
      grad = _replica_gradient(per_replica_values, tf.float16)
      return step.apply_step([tf.stack([grad, tf.constant(1.0, tf.float16)])],
                             step.LossScaleState(scale), _sgd_apply([var]),
                             reduces=False)[1]
    return mirrored_strategy.run(replica_fn)

  def check(applied, expected_applied, when):
    local = mirrored_strategy.experimental_local_results
    assert {bool(a) for a in local(applied)} == {expected_applied}, when
    for replica, value in enumerate(local(var)):
      np.testing.assert_array_equal(value.numpy(), [-8.0, -2.0],
                                    err_msg=f'replica {replica} {when}')

  check(train_step([3.0, 5.0]), True, 'after the sum [8, 2] was applied')
  # Each replica's float16 gradient is finite; their sum, 80000, is not.
  check(train_step([40000.0, 40000.0]), False, 'after the overflow')
  assert float(scale()) == 1.0  # the floor: halving 1 stays at 1


def test_step_with_a_reducing_keras_optimizer_skips_a_sum_overflow(
    mirrored_strategy):
  # Keras 3's apply all-reduces (reduces=True): the verdict must still cover
  # the sum it will compute.
  with mirrored_strategy.scope():
    scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=1.0)
    var = keras.Variable(np.zeros(2, np.float16), dtype='float16')
    sgd = keras.optimizers.SGD(1.0)
    sgd.build([var])

  @tf.function
  def train_step(per_replica_values):
    def replica_fn():
      grad = _replica_gradient(per_replica_values, tf.float16)
      step.apply_step([tf.stack([grad, tf.constant(1.0, tf.float16)])],
                      step.LossScaleState(scale),
                      lambda grads: sgd.apply(grads, [var]))
    mirrored_strategy.run(replica_fn)

  train_step([3.0, 5.0])
  train_step([40000.0, 40000.0])
  for replica, value in enumerate(
      mirrored_strategy.experimental_local_results(var.value)):
    np.testing.assert_array_equal(value.numpy(), [-8.0, -2.0],
                                  err_msg=f'replica {replica}')
  assert int(sgd.iterations.numpy()) == 1


# --- stateless_step ------------------------------------------------------------


def test_stateless_step_returns_values_and_the_next_state():
  def run(grad, scale, good_steps):
    return step.stateless_step(
        [grad], tf.constant(scale), tf.constant(good_steps, tf.int64),
        increment_period=2, multiplier=2.0, scaled=[True],
        apply_values=lambda grads: 10.0 - grads[0],
        unchanged_values=lambda: tf.constant([10.0]))

  finite, (scale, good), values = run(tf.constant([8.0]), 4.0, 1)
  assert (bool(finite), float(scale), int(good)) == (True, 8.0, 0)
  assert values.numpy().tolist() == [8.0]
  finite, (scale, good), values = run(tf.constant([INF]), 4.0, 1)
  assert (bool(finite), float(scale), int(good)) == (False, 2.0, 0)
  assert values.numpy().tolist() == [10.0]


def test_apply_step_in_a_tf1_graph_runs_the_chosen_side():
  with tf.Graph().as_default():
    scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0)
    var = tf.compat.v1.Variable([1.0], use_resource=True)
    grad = tf.compat.v1.placeholder(tf.float32, [1])
    update_op, applied = step.apply_step(
        [grad], step.LossScaleState(scale), _sgd_apply([var]), scaled=[True])
    train_op = tf.group(update_op, applied)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      history = []
      for value in (8.0, INF, 4.0):
        sess.run(train_op, {grad: [value]})
        history.append((sess.run(var).tolist(), float(sess.run(scale()))))
  assert history == [([-1.0], 4.0), ([-1.0], 2.0), ([-3.0], 2.0)]
