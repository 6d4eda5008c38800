"""The step is a transaction, on every front end.

Verdict, then apply or skip, then the loss scale's new state: an apply that
fails leaves the scale, its good-step counter and the monitoring record
(`skipped_steps`, `last_step_skipped`) as they were, eagerly, in a
`tf.function` (where the failure happens when the apply op runs) and in a
TF1 graph. Keras's own LossScaleOptimizer, which applies before it moves its
scale, is the reference for the Keras 3 form.

Every front end runs the same three steps: a finite one (the scale grows
from 4 to 8, `dynamic_growth_steps=1`), an overflow (skipped, back to 4),
then a finite step whose apply fails. A scale moved before the apply would
read 8 after the failure and `last_step_skipped` would read False.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import front_ends
import versions
import tf_loss_scale

INF = float('inf')
_AFTER_TWO_STEPS = {'scale': 4.0, 'good_steps': 0, 'skipped_steps': 1,
                    'last_step_skipped': True}


def _two_steps(front_end):
  opt = front_end.wrap(front_end.inner(1.0), 4.0, 1)
  var = front_end.variable([1.0, 2.0], np.float32)
  front_end.apply(opt, [tf.constant([1.0, 1.0])], [var])
  front_end.apply(opt, [tf.constant([INF, 1.0])], [var])
  assert front_end.state(opt) == _AFTER_TWO_STEPS
  return opt, var


@pytest.mark.parametrize('front_end', front_ends.ALL)
def test_an_apply_that_raises_eagerly_leaves_the_scale_and_record(front_end):
  opt, var = _two_steps(front_end)
  before = var.numpy().copy()
  with pytest.raises(tf.errors.InvalidArgumentError):
    # A gradient of the wrong shape: the inner optimizer's update raises.
    front_end.apply(opt, [tf.constant([1.0, 1.0, 1.0])], [var])
  assert front_end.state(opt) == _AFTER_TWO_STEPS
  np.testing.assert_array_equal(var.numpy(), before)


@pytest.mark.parametrize('front_end', front_ends.params(
    front_ends.KERAS3, front_ends.EXPERIMENTAL_KERAS3,
    front_ends.EXPERIMENTAL_KERAS2))
def test_an_apply_that_fails_in_a_tf_function_leaves_the_scale_and_record(
    front_end):
  # The gradient's shape is known only when the function runs, so the
  # inner optimizer's update op fails then, after the verdict: the state's
  # assignment must wait for the update (they touch different resources).
  opt, var = _two_steps(front_end)
  step = tf.function(lambda grad: front_end.apply(opt, [grad], [var]),
                     input_signature=[tf.TensorSpec([None], tf.float32)])
  with pytest.raises(tf.errors.InvalidArgumentError):
    step(tf.constant([1.0, 1.0, 1.0]))
  assert front_end.state(opt) == _AFTER_TWO_STEPS
  step(tf.constant([1.0, 1.0]))  # The same function, a good step: applied.
  assert front_end.state(opt)['scale'] == 8.0


@versions.KERAS_3.mark
def test_keras3_form_keeps_its_scale_on_a_failed_apply_as_keras_does():
  results = {}
  for name, make in (('ours', front_ends.KERAS3.wrap),
                     ('keras', lambda inner, initial, period: (
                         keras.optimizers.LossScaleOptimizer(
                             inner, initial_scale=initial,
                             dynamic_growth_steps=period)))):
    opt = make(keras.optimizers.SGD(1.0), 4.0, 1)
    var = keras.Variable(np.array([1.0, 2.0], np.float32))
    opt.apply([tf.constant([4.0, 4.0])], [var])
    never_seen = keras.Variable(np.array([5.0], np.float32))
    with pytest.raises(ValueError):
      # The inner optimizer was built for `var` only.
      opt.apply([tf.constant([8.0])], [never_seen])
    results[name] = (float(opt.dynamic_scale.numpy()),
                     int(opt.step_counter.numpy()),
                     var.numpy().tolist(), never_seen.numpy().tolist())
  assert results['ours'] == results['keras'] == (8.0, 0, [0.0, 1.0], [5.0])


def test_v1_apply_that_fails_in_a_tf1_session_leaves_the_scale_and_record():
  with tf.Graph().as_default():
    opt = front_ends.V1.wrap(front_ends.V1.inner(1.0), 4.0, 1)
    var = tf.compat.v1.Variable([1.0, 2.0], use_resource=True)
    grad = tf.compat.v1.placeholder(tf.float32, [None])
    train_op = opt.apply_gradients([(grad, var)])
    loss_scale = opt.loss_scale
    state = [loss_scale(), loss_scale.good_steps, loss_scale.skipped_steps,
             loss_scale.last_step_skipped]
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      session.run(train_op, {grad: [1.0, 1.0]})
      session.run(train_op, {grad: [INF, 1.0]})
      for attempt in range(5):
        with pytest.raises(tf.errors.InvalidArgumentError):
          session.run(train_op, {grad: [1.0, 1.0, 1.0]})
        assert session.run(state) == [4.0, 0, 1, True], f'attempt {attempt}'
      assert session.run(var).tolist() == [0.0, 1.0]


class _UpdatesBeforeDeciding(tf_loss_scale.LossScale):
  """A user's LossScale: its `update` counts the steps it has decided."""

  def __init__(self):
    super().__init__()
    self.decided = tf.Variable(0)

  def __call__(self):
    return tf.constant(1.0)

  def update(self, grads):
    del grads
    self.decided.assign_add(1)
    return None, tf.constant(True)

  def get_config(self):
    return {}


def test_a_user_loss_scale_decides_and_moves_its_own_state_before_the_apply():
  # The documented limit of the transaction: a user's `update` is its
  # verdict and its state change at once, so it has run when the apply
  # fails; the step itself still changes nothing else.
  user_scale = _UpdatesBeforeDeciding()
  opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(1.0), user_scale)
  var = tf.Variable([1.0, 2.0])
  with pytest.raises(tf.errors.InvalidArgumentError):
    opt.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), var)])
  assert int(user_scale.decided) == 1
  assert var.numpy().tolist() == [1.0, 2.0]
