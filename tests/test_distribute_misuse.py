"""Wrong use of `MixedPrecisionLossScaleOptimizer` under a strategy.

Each misuse is an error that says what to do, raised before any op of the
step exists, so a refused step changes no variable, slot or loss scale.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale

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


def test_loss_scale_created_outside_the_scope_is_refused_when_wrapped(
    mirrored_strategy):
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=8)
  with mirrored_strategy.scope():
    with pytest.raises(ValueError, match=(
        'MixedPrecisionLossScaleOptimizer\\(\\): the variables '
        "\\['current_loss_scale:0', 'good_steps:0'\\] were created outside")):
      _wrapped(loss_scale)


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
