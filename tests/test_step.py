"""Specification of tf_loss_scale/step.py: the one step every front end runs.

Each test drives `apply_step` directly with a small apply function and a
stateful or stateless state, so what is checked is the step itself: which
gradients are unscaled, what the verdict is about, that the state moves only
after the side taken has completed, and that a skipped step applies nothing
on any replica.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import step

import versions

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
                           _sgd_apply([a, b]), scaled=[True, False]).applied

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
  outcome = step.apply_step([tf.constant([NAN])], step.LossScaleState(scale),
                            _sgd_apply([var]))
  assert not bool(outcome.applied)
  assert var.numpy().tolist() == [1.0]
  assert float(scale()) == 2.0


@pytest.mark.parametrize('sparse', [False, True])
def test_applied_sums_are_read_as_their_variables_hold_them(sparse):
  # 80000 is finite in float32 but inf in a float16 variable: skipped. The
  # same gradient for a float32 variable, or with no dtypes given, applies.
  scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0)
  grad = tf.constant([8e4, 1.0])
  if sparse:
    grad = tf.IndexedSlices(grad, tf.constant([0, 1]), tf.constant([2]))
  applied = []
  for held_as in (['float16'], [tf.float32], None):
    outcome = step.apply_step([grad], step.LossScaleState(scale),
                              lambda grads: None, reduces=False,
                              held_as=held_as)
    applied.append(bool(outcome.applied))
  assert applied == [False, True, True]
  assert float(scale()) == 2.0  # Halved once, by the float16 one.


def test_apply_step_with_a_fixed_scale_applies_every_step():
  var = tf.Variable([1.0])
  outcome = step.apply_step(
      [tf.constant([INF])], step.LossScaleState(tf_loss_scale.FixedLossScale(2)),
      _sgd_apply([var]), scaled=[True])
  assert outcome.applied is True and outcome.op is None
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
                                  _sgd_apply([var]), scaled=[True]).applied)
             for _ in range(4)]
  assert applied == [True, False, True, False]
  assert var.numpy().tolist() == [-2.0]  # two steps of 2 / 2


def test_apply_step_runs_on_skip_once_per_skipped_step_with_its_gradients():
  skips = tf.Variable(0)
  seen = []
  var = tf.Variable([1.0])
  state = step.LossScaleState(tf_loss_scale.DynamicLossScale())

  def on_skip(grads):
    seen.append(float(grads[0][0]))
    return skips.assign_add(1)

  for grad in (1.0, INF, 2.0, -INF):
    step.apply_step([tf.constant([grad])], state, _sgd_apply([var]),
                    on_skip=on_skip)
  assert int(skips) == 2
  assert seen == [INF, -INF]
  assert var.numpy().tolist() == [-2.0]


def test_a_step_needs_one_scaled_flag_per_gradient():
  var = tf.Variable([1.0])
  state = step.LossScaleState(tf_loss_scale.DynamicLossScale())
  with pytest.raises(ValueError, match='2 gradients but 1 scaled flags'):
    step.apply_step([tf.constant([1.0]), None], state, _sgd_apply([var]),
                    scaled=[True], names=['a', 'b'])
  assert var.numpy().tolist() == [1.0]


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
                             reduces=False).applied
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


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
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


def test_apply_step_in_a_tf1_graph_runs_the_chosen_side():
  with tf.Graph().as_default():
    scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0)
    var = tf.compat.v1.Variable([1.0], use_resource=True)
    grad = tf.compat.v1.placeholder(tf.float32, [1])
    train_op = step.apply_step(
        [grad], step.LossScaleState(scale), _sgd_apply([var]),
        scaled=[True]).op
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      history = []
      for value in (8.0, INF, 4.0):
        sess.run(train_op, {grad: [value]})
        history.append((sess.run(var).tolist(), float(sess.run(scale()))))
  assert history == [([-1.0], 4.0), ([-1.0], 2.0), ([-3.0], 2.0)]


# --- the transaction: the state moves only after the side taken --------------


def _failing_apply(grads):
  del grads
  return tf.debugging.assert_equal(1, 0, message='the apply failed')


@pytest.mark.parametrize('in_function', [False, True])
def test_an_apply_that_fails_leaves_the_dynamic_state_and_its_record(
    in_function):
  scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0,
                                         increment_period=1)
  run = lambda apply_fn: step.apply_step(
      [tf.constant([1.0])], step.LossScaleState(scale), apply_fn)
  if in_function:
    run = tf.function(run)
  step.apply_step([tf.constant([INF])], step.LossScaleState(scale),
                  _sgd_apply([tf.Variable([0.0])]))
  with pytest.raises(tf.errors.InvalidArgumentError, match='apply failed'):
    run(_failing_apply)
  assert (float(scale()), int(scale.good_steps), int(scale.skipped_steps),
          bool(scale.last_step_skipped)) == (2.0, 0, 1, True)


def test_the_apply_sees_the_scale_of_before_the_step_in_a_function():
  scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0,
                                         increment_period=1)
  seen = tf.Variable(0.0)

  @tf.function
  def train_step():
    step.apply_step([tf.constant([1.0])], step.LossScaleState(scale),
                    lambda grads: seen.assign(scale()))

  train_step()
  assert (float(seen), float(scale())) == (4.0, 8.0)


def test_an_apply_that_fails_in_a_tf1_session_leaves_the_state():
  with tf.Graph().as_default():
    scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0,
                                           increment_period=1)
    fail = tf.compat.v1.placeholder(tf.bool, [])
    train_op = step.apply_step(
        [tf.constant([1.0])], step.LossScaleState(scale),
        lambda grads: tf.debugging.Assert(tf.logical_not(fail), ['failed'])).op
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for attempt in range(5):
        with pytest.raises(tf.errors.InvalidArgumentError, match='failed'):
          session.run(train_op, {fail: True})
        assert session.run(scale()) == 4.0, f'attempt {attempt}'
      session.run(train_op, {fail: False})
      assert session.run(scale()) == 8.0


# --- one computation, stateful or stateless by its callbacks ----------------


class _ValuesState(step.ScaleState):
  """A stateless state: the scale and counter given, the new ones returned."""

  def __init__(self, scale, good_steps):
    self._scale, self._good_steps = scale, good_steps

  def scale(self):
    return self._scale

  def advance(self, verdict, after):
    del after  # Nothing is written.
    return tf_loss_scale.loss_scale.next_dynamic_state(
        self._scale, self._good_steps, verdict, 2, 2.0)


@pytest.mark.parametrize('in_function', [False, True])
def test_a_stateless_state_gets_the_new_state_as_values(in_function):
  scratch = tf.Variable([10.0])

  def run(grad, scale, good_steps):
    scratch.assign([10.0])
    outcome = step.apply_step(
        [grad], _ValuesState(tf.constant(scale),
                             tf.constant(good_steps, tf.int64)),
        _sgd_apply([scratch]), scaled=[True])
    with tf.control_dependencies(step.graph_elements(outcome.applied)):
      return outcome.applied, outcome.state, tf.identity(scratch)

  run = tf.function(run) if in_function else run
  applied, (scale, good), value = run(tf.constant([8.0]), 4.0, 1)
  assert (bool(applied), float(scale), int(good)) == (True, 8.0, 0)
  assert value.numpy().tolist() == [8.0]
  applied, (scale, good), value = run(tf.constant([INF]), 4.0, 1)
  assert (bool(applied), float(scale), int(good)) == (False, 2.0, 0)
  assert value.numpy().tolist() == [10.0]


# --- one op for every replica in a TF1 graph ---------------------------------


def test_in_a_tf1_graph_every_replica_returns_the_same_named_op(
    mirrored_strategy):
  with tf.Graph().as_default():
    with mirrored_strategy.scope():
      scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=4.0)
      var = tf.compat.v1.Variable([1.0], use_resource=True)
    train_op = mirrored_strategy.run(lambda: step.apply_step(
        [tf.constant([4.0])], step.LossScaleState(scale), _sgd_apply([var]),
        scaled=[True], reduces=False, name='the_step').op)
    assert isinstance(train_op, tf.Operation), type(train_op)
    assert train_op.name == 'the_step'
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      # Each replica's 4 / 4 = 1, summed over the two replicas.
      assert session.run(var).tolist() == [-1.0]
