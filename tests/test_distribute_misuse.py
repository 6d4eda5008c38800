"""Wrong use of `MixedPrecisionLossScaleOptimizer` under a strategy.

Each misuse is an error that says what to do, raised before any op of the
step exists, so a refused step changes no variable, slot or loss scale.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import distribute

_OUTSIDE_SCOPE = ('apply_gradients\\(\\): the variables .* were created '
                  'outside the scope of the MirroredStrategy in use.*'
                  'inside `with strategy.scope\\(\\):`')


def _wrapped(loss_scale=None):
  return tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(0.5, 0.9),
      loss_scale or tf_loss_scale.DynamicLossScale(initial_loss_scale=8))


def _train_step(strategy, optimizer, variable, in_function):
  def replica_step():
    grads_and_vars = optimizer.compute_gradients(
        lambda: tf.reduce_sum(variable * variable), [variable])
    optimizer.apply_gradients(grads_and_vars)
  run = lambda: strategy.run(replica_step)
  if in_function:
    tf.function(run)()
  else:
    run()


def _state(optimizer, variable):
  """Every value a step could change, as numpy."""
  values = [variable] + optimizer.variables()
  return [np.asarray(v.numpy()) for v in values]


def _assert_unchanged(before, after):
  assert len(before) == len(after), (before, after)
  for index, (old, new) in enumerate(zip(before, after)):
    np.testing.assert_array_equal(old, new, err_msg=f'value {index} changed')


@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'tf_function'])
def test_optimizer_created_outside_the_scope_is_refused_and_nothing_changes(
    mirrored_strategy, in_function):
  optimizer = _wrapped()
  with mirrored_strategy.scope():
    variable = tf.Variable([1.0, 2.0])
  before = _state(optimizer, variable)
  with pytest.raises(ValueError, match=_OUTSIDE_SCOPE) as error:
    _train_step(mirrored_strategy, optimizer, variable, in_function)
  assert "'current_loss_scale:0'" in str(error.value)
  assert "'good_steps:0'" in str(error.value)
  _assert_unchanged(before, _state(optimizer, variable))


def test_loss_scale_created_outside_the_scope_is_refused(mirrored_strategy):
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=8)
  with mirrored_strategy.scope():
    variable = tf.Variable([1.0, 2.0])
    optimizer = _wrapped(loss_scale)
  before = _state(optimizer, variable)
  with pytest.raises(ValueError, match=_OUTSIDE_SCOPE):
    _train_step(mirrored_strategy, optimizer, variable, in_function=True)
  _assert_unchanged(before, _state(optimizer, variable))
  assert float(loss_scale()) == 8.0


def test_state_created_in_the_scope_trains(mirrored_strategy):
  with mirrored_strategy.scope():
    variable = tf.Variable([1.0, 2.0])
    optimizer = _wrapped()
  _train_step(mirrored_strategy, optimizer, variable, in_function=True)
  # Gradient 2 * v on each replica, summed over two: v - 0.5 * 4 * v.
  np.testing.assert_array_equal(variable.numpy(), [-1.0, -2.0])
  assert int(optimizer.loss_scale.good_steps.numpy()) == 1


def test_tf1_graph_with_an_optimizer_from_outside_the_scope_is_refused(
    mirrored_strategy):
  with tf.Graph().as_default():
    optimizer = _wrapped()
    with mirrored_strategy.scope():
      variable = tf.Variable([1.0, 2.0])
      with pytest.raises(ValueError, match=_OUTSIDE_SCOPE):
        _train_step(mirrored_strategy, optimizer, variable, in_function=False)


# --- distribute.check_state_in_strategy_scope ---------------------------------


def test_check_state_in_strategy_scope_without_a_strategy_checks_nothing():
  distribute.check_state_in_strategy_scope('here', [tf.Variable(1.0)])


def test_check_state_in_strategy_scope_accepts_variables_of_the_scope(
    mirrored_strategy):
  with mirrored_strategy.scope():
    variables = [tf.Variable(1.0), tf.Variable([2.0])]
    distribute.check_state_in_strategy_scope('here', variables)
  distribute.check_state_in_strategy_scope('here', variables,
                                           mirrored_strategy)


def test_check_state_in_strategy_scope_names_the_outside_variables(
    mirrored_strategy):
  outside = tf.Variable(1.0, name='made_outside')
  with mirrored_strategy.scope():
    inside = tf.Variable(1.0, name='made_inside')
    with pytest.raises(ValueError) as error:
      distribute.check_state_in_strategy_scope('step()', [inside, outside])
  message = str(error.value)
  assert message.startswith("step(): the variables ['made_outside:0'] were "
                            'created outside the scope of the '
                            'MirroredStrategy in use'), message


def test_check_state_in_strategy_scope_refuses_tpu_strategy():
  # No TPU here: an uninitialised instance stands in for one. The check must
  # refuse it by type alone, before touching any of its state.
  tpu_strategy = tf.distribute.TPUStrategy.__new__(tf.distribute.TPUStrategy)
  with pytest.raises(ValueError,
                     match="^step\\(\\): .* under TPUStrategy.*bfloat16.*"
                     "'mixed_bfloat16'"):
    distribute.check_state_in_strategy_scope('step()', [], tpu_strategy)
