"""TF 2.3's own tests of its LossScaleOptimizer, ported to Keras 2.

The specification is TensorFlow 2.3's
`tensorflow/python/keras/mixed_precision/experimental/
loss_scale_optimizer_test.py`. Every case that means something on Keras 2
(`tf.keras` on TensorFlow <= 2.15, `tf_keras` on 2.16+) is here, in this
project's words, run around its legacy optimizers (`optimizers.legacy`,
OptimizerV2, what TF 2.3 wrapped) in three modes: eagerly, in a
TF1 graph with a `Session` (TF 2.3's graph mode), and under a two-replica
MirroredStrategy in a `tf.function` (TF 2.3 ran its "Distribute" cases on
one CPU; two replicas are stricter). The README lists the cases that cannot
apply and why.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_families
import tf_loss_scale
from tf_loss_scale.keras import experimental

keras2 = keras_families.keras2()

LossScaleOptimizer = experimental.LossScaleOptimizer
SGD = keras2.optimizers.legacy.SGD
Adam = keras2.optimizers.legacy.Adam
MODES = ['eager', 'graph', 'mirrored']


class Runner:
  """Runs replica steps and reads values the same way in every mode."""

  def __init__(self, mode, strategy):
    self.mode = mode
    self.strategy = strategy
    self.replicas = strategy.num_replicas_in_sync
    self._session = None
    self._initialized = set()

  def scope(self):
    return self.strategy.scope()

  def run(self, step_fn):
    """Runs `step_fn` once on every replica (in the strategy's way)."""
    if self.mode == 'eager':
      return step_fn()
    if self.mode == 'mirrored':
      return tf.function(lambda: self.strategy.run(step_fn))()
    op = step_fn()
    self._initialize_new_variables()
    return self._session.run(op)

  def value(self, tensor_or_variable):
    if self.mode == 'graph':
      self._initialize_new_variables()
      return self._session.run(tf.convert_to_tensor(tensor_or_variable))
    if isinstance(tensor_or_variable, tf.distribute.DistributedValues):
      tensor_or_variable = self.strategy.experimental_local_results(
          tensor_or_variable)[0]
    return np.asarray(tf.convert_to_tensor(tensor_or_variable))

  def _initialize_new_variables(self):
    new = [v for v in tf.compat.v1.global_variables()
           if v.ref() not in self._initialized]
    self._session.run(tf.compat.v1.variables_initializer(new))
    self._initialized.update(v.ref() for v in new)


@pytest.fixture(params=MODES)
def runner(request, mirrored_strategy):
  mode = request.param
  if mode == 'mirrored':
    yield Runner(mode, mirrored_strategy)
    return
  if mode == 'eager':
    yield Runner(mode, tf.distribute.get_strategy())
    return
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    graph_runner = Runner(mode, tf.distribute.get_strategy())
    graph_runner._session = session  # pylint: disable=protected-access
    yield graph_runner


def _dynamic(initial, period, multiplier=2.0):
  return tf_loss_scale.DynamicLossScale(initial_loss_scale=initial,
                                        increment_period=period,
                                        multiplier=multiplier)


def _identity_checking_gradient(expected):
  """Identity whose backward pass asserts the gradient reaching it."""

  @tf.custom_gradient
  def identity(x):
    def backward(upstream):
      check = tf.debugging.assert_equal(
          upstream, tf.cast(expected, upstream.dtype),
          message='unexpected gradient reaching the loss')
      with tf.control_dependencies([check]):
        return tf.identity(upstream)
    return tf.identity(x), backward

  return identity


def _minimize_with_grad_check(runner, var, opt, expected):
  check = _identity_checking_gradient(expected)
  loss = lambda: check(var) / runner.replicas
  return lambda: opt.minimize(loss, var_list=[var])


# ---- scaling of the loss ----------------------------------------------------


def test_fixed_scale_multiplies_the_loss_in_minimize(runner):
  # The loss is the variable itself (gradient 1); the scale 10 multiplies
  # the gradient reaching it, divided over the replicas.
  with runner.scope():
    var = tf.Variable([5.0])
    opt = LossScaleOptimizer(SGD(2.0), 10.0)
  runner.run(_minimize_with_grad_check(runner, var, opt,
                                       10.0 / runner.replicas))
  # 5 - 2.0 * 1 = 3
  np.testing.assert_allclose(runner.value(var), [3.0])


def test_fixed_scale_multiplies_the_loss_in_get_gradients():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    var = tf.Variable([2.0])
    opt = LossScaleOptimizer(SGD(1.0), 10.0)
    grads = opt.get_gradients(_identity_checking_gradient(10.0)(var), [var])
    session.run(tf.compat.v1.global_variables_initializer())
    # The assertion in the backward pass runs with the gradients; and the
    # gradients come back unscaled.
    assert session.run(grads)[0].tolist() == [1.0]


def test_get_scaled_loss_of_tensors_and_callables():
  opt = LossScaleOptimizer(SGD(2.0), 2.0)
  for dtype in ('float32', 'float16'):
    loss = tf.constant(5.0, dtype)
    assert float(opt.get_scaled_loss(loss)) == 10.0, dtype
    assert float(opt.get_scaled_loss(lambda l=loss: l)()) == 10.0, dtype


def test_get_unscaled_gradients_keeps_none_and_dtypes():
  opt = LossScaleOptimizer(SGD(2.0), 2)
  grads = opt.get_unscaled_gradients(
      [tf.constant(3.0), None, tf.constant(-4.0, tf.float16)])
  assert grads[1] is None
  assert [float(grads[0]), float(grads[2])] == [1.5, -2.0]
  assert grads[2].dtype == tf.float16


def test_get_unscaled_sparse_gradients_stay_sparse():
  opt = LossScaleOptimizer(SGD(2.0), 2)
  sparse = tf.IndexedSlices(tf.constant([[4.0, 2.0], [8.0, 5.0]]),
                            tf.constant([1, 3]), tf.constant([5, 2]))
  (grad,) = opt.get_unscaled_gradients([sparse])
  assert isinstance(grad, tf.IndexedSlices)
  assert grad.values.numpy().tolist() == [[2.0, 1.0], [4.0, 2.5]]


# ---- the dynamic loss scale -------------------------------------------------


def test_dynamic_scale_grows_and_is_applied_to_the_loss(runner):
  with runner.scope():
    var = tf.Variable([5.0])
    expected = tf.Variable(2.0 / runner.replicas)
    opt = LossScaleOptimizer(SGD(2.0), _dynamic(2.0, 1))
  step = _minimize_with_grad_check(runner, var, opt, expected)
  runner.run(step)
  np.testing.assert_allclose(runner.value(var), [3.0])  # 5 - 2 * 1
  # Every step is finite and the period is 1: the scale doubled to 4.
  if runner.mode == 'graph':
    runner.run(lambda: expected.assign(4.0 / runner.replicas))
  else:
    expected.assign(4.0 / runner.replicas)
  runner.run(step)
  np.testing.assert_allclose(runner.value(var), [1.0])  # 3 - 2 * 1


def test_dynamic_update_doubles_on_finite_and_halves_on_nan(runner):
  with runner.scope():
    var = tf.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(SGD(1.0), _dynamic(2.0, 1))
  runner.run(lambda: opt.minimize(lambda: var * 2.0 / runner.replicas,
                                  var_list=[var]))
  np.testing.assert_allclose(runner.value(var), [-1.0, 0.0])  # gradient 2
  assert runner.value(opt.loss_scale()) == 4.0
  runner.run(lambda: opt.minimize(lambda: var * float('nan'), var_list=[var]))
  np.testing.assert_allclose(runner.value(var), [-1.0, 0.0])  # skipped
  assert runner.value(opt.loss_scale()) == 2.0


def test_dynamic_scale_with_a_float16_loss(runner):
  with runner.scope():
    var = tf.Variable([5.0])
    opt = LossScaleOptimizer(SGD(2.0), _dynamic(2.0, 1))
  runner.run(lambda: opt.minimize(
      lambda: tf.cast(var / runner.replicas, tf.float16), var_list=[var]))
  np.testing.assert_allclose(runner.value(var), [3.0])


def test_dynamic_scale_with_slots(runner):
  with runner.scope():
    var = tf.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(SGD(1.0, momentum=1.0), _dynamic(2.0, 1, 4.0))
  step = lambda: opt.minimize(lambda: var / runner.replicas, var_list=[var])
  runner.run(step)
  # Accumulator 0 + gradient 1 = 1, subtracted from the variable.
  np.testing.assert_allclose(runner.value(var), [0.0, 1.0])
  assert runner.value(opt.loss_scale()) == 8.0
  runner.run(step)
  # Accumulator 1 + 1 = 2.
  np.testing.assert_allclose(runner.value(var), [-2.0, -1.0])
  assert runner.value(opt.loss_scale()) == 32.0
  assert opt.get_slot_names() == ['momentum']


# ---- iterations, weights, learning rate, attributes -------------------------


def test_setting_iterations_sets_the_inner_optimizers():
  inner = SGD(2.0)
  opt = LossScaleOptimizer(inner, 10.0)
  opt.iterations = 7
  assert opt.iterations == 7 and inner.iterations == 7


def test_iterations_count_applied_and_skipped_steps(runner):
  with runner.scope():
    var = tf.Variable([5.0])
    opt = LossScaleOptimizer(SGD(1.0), 'dynamic')
  runner.run(lambda: opt.minimize(lambda: var * 2.0 / runner.replicas,
                                  [var]))
  assert runner.value(var).tolist() == [3.0]
  assert runner.value(opt.iterations) == 1
  runner.run(lambda: opt.minimize(lambda: var * float('nan'), [var]))
  assert runner.value(var).tolist() == [3.0]
  assert runner.value(opt.iterations) == 2


def test_weight_methods_are_the_inner_optimizers(runner):
  with runner.scope():
    var = tf.Variable([1.0])
    opt = LossScaleOptimizer(SGD(1.0), _dynamic(2.0, 1, 4.0))
  runner.run(lambda: opt.minimize(lambda: var * 2, [var]))
  assert len(opt.weights) == 1  # iterations
  assert int(runner.value(opt.weights[0])) == 1
  assert opt.get_weights()[0] == 1
  assert int(runner.value(opt.variables()[0])) == 1
  # In a TF1 graph too, as TF 2.3's, through Keras's session.
  opt.set_weights([np.array(2)])
  assert int(runner.value(opt.variables()[0])) == 2


def test_none_is_not_a_loss_scale():
  with pytest.raises(ValueError, match='loss_scale cannot be None'):
    LossScaleOptimizer(SGD(), None)


def test_getting_and_setting_the_learning_rate(runner):
  with runner.scope():
    var = tf.Variable([5.0])
    opt = LossScaleOptimizer(Adam(learning_rate=1.0), 'dynamic')
  runner.run(lambda: opt.minimize(lambda: var * 2.0, [var]))
  assert runner.value(opt.lr) == 1.0
  opt.lr = 2.0
  assert runner.value(opt.lr) == 2.0
  runner.run(lambda: opt.lr.assign(3.0))
  assert runner.value(opt.lr) == 3.0
  with pytest.raises(AttributeError):
    opt.not_an_attr += 3


def test_attributes_that_are_not_hyperparameters_are_not_exposed():
  # TF 2.3 exposed no attribute of the inner optimizer but the learning
  # rate; this library exposes its hyperparameters (the arguments in its
  # config, as TF 2.4 and the issue ask), and nothing else.
  inner = Adam(learning_rate=1.0)
  inner.my_attribute = 123
  opt = LossScaleOptimizer(inner, 10.0)
  assert float(opt.beta_1) == pytest.approx(0.9)
  assert opt.epsilon == inner.epsilon
  with pytest.raises(AttributeError,
                     match="'LossScaleOptimizer' object has no attribute "
                     "'my_attribute'"):
    _ = opt.my_attribute


def test_inner_apply_gradients_gets_plain_tensors(mirrored_strategy):
  seen = []

  class RecordingSGD(SGD):

    def apply_gradients(self, grads_and_vars, name=None,
                        experimental_aggregate_gradients=True):
      grads_and_vars = list(grads_and_vars)
      seen.extend(type(g) for g, _ in grads_and_vars)
      return super().apply_gradients(grads_and_vars, name,
                                     experimental_aggregate_gradients)

  with mirrored_strategy.scope():
    var = tf.Variable([5.0])
    opt = LossScaleOptimizer(RecordingSGD(1.0), 1)
  tf.function(lambda: mirrored_strategy.run(
      lambda: opt.minimize(lambda: var * 2.0, [var])))()
  assert seen and all(issubclass(t, tf.Tensor) for t in seen), seen


@pytest.mark.parametrize('method', ['minimize', 'apply_gradients'])
def test_one_op_runs_the_step_in_a_tf1_graph_with_two_replicas(
    mirrored_strategy, method):
  # TF 2.3's wrapper, like a bare legacy optimizer, returns the same op from
  # every replica, so that call_for_each_replica returns that op and a
  # Session can run it. Before: each replica grouped its own ops, and the
  # result was a PerReplica that Session.run cannot fetch.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    with mirrored_strategy.scope():
      var = tf.Variable([5.0])
      opt = LossScaleOptimizer(SGD(1.0), _dynamic(8.0, 1000))
    bad = tf.compat.v1.placeholder(tf.bool, ())
    # Each replica's loss is half of var * 2 (or NaN): the summed gradient
    # is 2.
    loss = lambda: var * tf.where(bad, float('nan'), 2.0) / 2.0

    def replica_step():
      if method == 'minimize':
        return opt.minimize(loss, [var])
      with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss())
      grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
      return opt.apply_gradients(zip(grads, [var]))

    op = mirrored_strategy.extended.call_for_each_replica(replica_step)
    assert isinstance(op, tf.Operation), type(op)
    session.run(tf.compat.v1.global_variables_initializer())
    expected = [
        # (bad, variable, scale, iterations)
        (False, [3.0], 8.0, 1),
        (True, [3.0], 4.0, 2),
        (False, [1.0], 4.0, 3),
    ]
    for i, (is_bad, value, scale, iterations) in enumerate(expected):
      session.run(op, {bad: is_bad})
      for replica, local in enumerate(
          mirrored_strategy.experimental_local_results(var)):
        assert session.run(local).tolist() == value, (
            f'step {i}, replica {replica}: variable')
      assert session.run(opt.loss_scale()) == scale, f'step {i}: scale'
      assert session.run(opt.iterations) == iterations, (
          f'step {i}: iterations')


# ---- checkpoints --------------------------------------------------------------


class _SGDWithExtraVariable(SGD):
  """An optimizer tracking a variable of its own."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.my_var = tf.Variable(0.0)
    self._track_trackable(self.my_var, 'my_var')


@pytest.mark.parametrize('save_with_ls,restore_with_ls',
                         [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize('mode', ['eager', 'mirrored'])
def test_checkpoint_with_and_without_the_wrapper(tmp_path, mirrored_strategy,
                                                 mode, save_with_ls,
                                                 restore_with_ls):
  strategy = (mirrored_strategy if mode == 'mirrored' else
              tf.distribute.get_strategy())
  replicas = strategy.num_replicas_in_sync

  def make(with_ls):
    with strategy.scope():
      var = tf.Variable([2.0])
      opt = inner = _SGDWithExtraVariable(1.0, momentum=1.0)
      if with_ls:
        opt = LossScaleOptimizer(inner, _dynamic(1.0, 2))
    return var, inner, opt

  def train(var, opt):
    def step():
      opt.minimize(lambda: var / replicas + 1.0, var_list=[var])
    if mode == 'mirrored':
      tf.function(lambda: strategy.run(step))()
    else:
      step()

  def value(x):
    return np.asarray(strategy.experimental_local_results(x)[0])

  var, inner, opt = make(save_with_ls)
  train(var, opt)
  assert value(var).tolist() == [1.0]
  if save_with_ls:
    assert float(opt.loss_scale()) == 1.0
    assert value(opt.loss_scale.good_steps) == 1
  assert value(opt.get_slot(var, 'momentum')).tolist() == [-1.0]
  assert value(opt.iterations) == 1
  inner.my_var.assign(1.0)
  path = tf.train.Checkpoint(optimizer=opt, var=var).save(
      str(tmp_path / 'ckpt'))

  var, inner, opt = make(restore_with_ls)
  checkpoint = tf.train.Checkpoint(optimizer=opt, var=var)
  status = checkpoint.restore(path)
  if save_with_ls:
    status.assert_existing_objects_matched()
  else:
    status.assert_nontrivial_match()
  assert value(var).tolist() == [1.0]
  if restore_with_ls:
    assert float(opt.loss_scale()) == 1.0
    assert value(opt.loss_scale.good_steps) == (1 if save_with_ls else 0)
  assert value(opt.iterations) == 1

  train(var, opt)  # the momentum slot is created and restored to -1 first
  assert value(var).tolist() == [-1.0]
  slot = opt.get_slot(var, 'momentum')
  assert value(slot).tolist() == [-2.0]
  assert value(opt.iterations) == 2
  assert value(inner.my_var) == 1.0

  # Restoring again, now that the slots exist.
  status = checkpoint.restore(path)
  if save_with_ls and restore_with_ls:
    status.assert_consumed()
  elif save_with_ls:
    status.assert_existing_objects_matched()
  else:
    status.assert_nontrivial_match()
  assert value(var).tolist() == [1.0]
  assert value(slot).tolist() == [-1.0]


# ---- config and serialization ----------------------------------------------


def _assert_recreated(opt):
  assert float(opt.lr) == 2.0
  assert float(opt.inner_optimizer.momentum) == 0.5
  assert float(opt.loss_scale()) == 2.0
  assert opt.loss_scale.increment_period == 3
  assert opt.loss_scale.multiplier == 4.0


def _sgd_with_dynamic_scale(inner_class=SGD):
  return LossScaleOptimizer(inner_class(2.0, momentum=0.5),
                            _dynamic(2.0, 3, 4.0))


def test_get_config_and_from_config():
  opt = _sgd_with_dynamic_scale()
  _assert_recreated(type(opt).from_config(opt.get_config()))


def test_serialization_with_a_built_in_optimizer():
  config = keras2.optimizers.serialize(_sgd_with_dynamic_scale())
  _assert_recreated(keras2.optimizers.deserialize(config))


def test_serialization_with_a_custom_optimizer():

  class MySGD(SGD):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      self.my_attribute = 123

  config = keras2.optimizers.serialize(_sgd_with_dynamic_scale(MySGD))
  opt = keras2.optimizers.deserialize(config,
                                        custom_objects={'MySGD': MySGD})
  _assert_recreated(opt)
  assert opt.inner_optimizer.my_attribute == 123


def test_unsupported_strategy_is_refused():
  strategy = tf.distribute.experimental.CentralStorageStrategy()
  with strategy.scope():
    with pytest.raises(ValueError, match='CentralStorageStrategy'):
      LossScaleOptimizer(SGD(), 1.0)
  opt = LossScaleOptimizer(SGD(), 1.0)
  with strategy.scope():
    var = tf.Variable(1.0)
    with pytest.raises(ValueError, match='CentralStorageStrategy'):
      strategy.run(lambda: opt.minimize(lambda: var * 2.0, [var]))
