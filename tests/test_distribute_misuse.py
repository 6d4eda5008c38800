"""`MixedPrecisionLossScaleOptimizer` under a strategy, state made outside it.

TensorFlow's wrapper trains with a loss scale made outside the strategy's
scope: it reads and assigns the scale's variables in the cross-replica
context, one value for every replica. Ours trains it with the same values,
eagerly, in a `tf.function` and in a TF1 graph.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale


def _wrapped(loss_scale=None):
  return tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(0.5, 0.9),
      loss_scale or tf_loss_scale.DynamicLossScale(initial_loss_scale=8))


def _tensorflows():
  return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(0.5, 0.9),
      tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=8))


def _replica_step(optimizer, variable, loss=None):
  grads_and_vars = optimizer.compute_gradients(
      loss if loss is not None else lambda: tf.reduce_sum(variable * variable),
      [variable])
  return optimizer.apply_gradients(grads_and_vars)


def _train_step(strategy, optimizer, variable, in_function):
  def run():
    strategy.run(_replica_step, args=(optimizer, variable))
  if in_function:
    tf.function(run)()
  else:
    run()


def _trained_outside_the_scope(make, strategy, in_function=False,
                               graph=None):
  """Two steps of a wrapper made outside the scope: the values after each."""
  optimizer = make()
  scale = optimizer._loss_scale  # pylint: disable=protected-access
  with strategy.scope():
    variable = tf.Variable([1.0, 2.0])
  if graph is not None:
    step = strategy.group(strategy.run(lambda: _replica_step(
        optimizer, variable, tf.reduce_sum(variable * variable))))
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return [session.run([step, variable, scale()])[1:] for _ in range(2)]
  states = []
  for _ in range(2):
    _train_step(strategy, optimizer, variable, in_function)
    states.append([variable.numpy(), scale().numpy()])
  return states


def _assert_same_trajectory(ours, theirs):
  assert len(ours) == len(theirs) == 2
  for (our_value, our_scale), (their_value, their_scale) in zip(ours, theirs):
    np.testing.assert_array_equal(our_value, their_value)
    assert our_scale == their_scale
  assert not np.array_equal(ours[-1][0], [1.0, 2.0])


@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'tf_function'])
def test_optimizer_created_outside_the_scope_trains_as_tensorflows(
    mirrored_strategy, in_function):
  _assert_same_trajectory(
      _trained_outside_the_scope(_wrapped, mirrored_strategy, in_function),
      _trained_outside_the_scope(_tensorflows, mirrored_strategy,
                                 in_function))


def test_loss_scale_created_outside_the_scope_is_wrapped_in_it(
    mirrored_strategy):
  loss_scale = tf_loss_scale.DynamicLossScale(initial_loss_scale=8)
  with mirrored_strategy.scope():
    assert _wrapped(loss_scale).loss_scale is loss_scale


def test_state_created_in_the_scope_trains(mirrored_strategy):
  with mirrored_strategy.scope():
    variable = tf.Variable([1.0, 2.0])
    optimizer = _wrapped()
  _train_step(mirrored_strategy, optimizer, variable, in_function=True)
  # Gradient 2 * v on each replica, summed over two: v - 0.5 * 4 * v.
  np.testing.assert_array_equal(variable.numpy(), [-1.0, -2.0])
  assert int(optimizer.loss_scale.good_steps.numpy()) == 1


def test_tf1_graph_with_an_optimizer_from_outside_the_scope_trains_as_tensorflows(
    mirrored_strategy):
  runs = []
  for make in (_wrapped, _tensorflows):
    graph = tf.Graph()
    with graph.as_default():
      runs.append(_trained_outside_the_scope(make, mirrored_strategy,
                                             graph=graph))
  _assert_same_trajectory(*runs)
