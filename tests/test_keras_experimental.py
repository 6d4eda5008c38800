"""Tests of `tf_loss_scale.keras.experimental.LossScaleOptimizer`.

The reference is TF 2.3's `tf.keras.mixed_precision.experimental.
LossScaleOptimizer`, which is not installable next to TF 2.21: its behaviour
is written out below as hand-computed values, and where its semantics meet
Keras 3's `keras.optimizers.LossScaleOptimizer` (weights, slots and scale
of a step sequence) that class is the oracle.
"""

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import keras_families
from keras_families import value
import tf_loss_scale
from tf_loss_scale.keras.experimental import LossScaleOptimizer

keras = keras_families.keras3()

INF = float('inf')
NAN = float('nan')


def _dynamic(initial, period=2000):
  return tf_loss_scale.DynamicLossScale(initial_loss_scale=initial,
                                        increment_period=period)


# ---- construction ---------------------------------------------------------


@pytest.mark.parametrize('optimizer', [
    'sgd', tf.compat.v1.train.GradientDescentOptimizer(0.1), None])
def test_non_keras_optimizers_are_a_type_error_naming_the_type(optimizer):
  with pytest.raises(TypeError, match=type(optimizer).__name__):
    LossScaleOptimizer(optimizer, 'dynamic')


def test_wrapping_twice_is_refused():
  inner = keras.optimizers.SGD()
  outer = LossScaleOptimizer(inner, 'dynamic')
  with pytest.raises(ValueError, match='already a loss scale optimizer'):
    LossScaleOptimizer(outer, 'dynamic')
  with pytest.raises(ValueError, match='already wrapped'):
    LossScaleOptimizer(inner, 'dynamic')


@pytest.mark.parametrize('loss_scale', [None, 'static', [2.0], True])
def test_bad_loss_scales_are_a_value_error(loss_scale):
  with pytest.raises(ValueError):
    LossScaleOptimizer(keras.optimizers.SGD(), loss_scale)


def test_loss_scale_forms():
  dynamic = LossScaleOptimizer(keras.optimizers.SGD(), 'dynamic').loss_scale
  assert isinstance(dynamic, tf_loss_scale.DynamicLossScale)
  assert dynamic.get_config() == {'initial_loss_scale': 32768.0,
                                  'increment_period': 2000, 'multiplier': 2.0}
  fixed = LossScaleOptimizer(keras.optimizers.SGD(), 128).loss_scale
  assert isinstance(fixed, tf_loss_scale.FixedLossScale)
  assert float(fixed()) == 128.0
  given = _dynamic(4.0)
  assert LossScaleOptimizer(keras.optimizers.SGD(), given).loss_scale is given
  from_dict = LossScaleOptimizer(
      keras.optimizers.SGD(),
      {'class_name': 'FixedLossScale', 'config': {'loss_scale_value': 3.0}})
  assert float(from_dict.loss_scale()) == 3.0


# ---- scaling --------------------------------------------------------------


def test_get_scaled_loss_tensor_and_callable():
  opt = LossScaleOptimizer(keras.optimizers.SGD(), 8)
  scaled = opt.get_scaled_loss(tf.constant(1.25, tf.float16))
  assert scaled.dtype == tf.float16 and float(scaled) == 10.0
  scaled_fn = opt.get_scaled_loss(lambda: tf.constant(0.5))
  assert callable(scaled_fn) and float(scaled_fn()) == 4.0


def test_get_unscaled_gradients_keeps_none_dtype_and_sparsity():
  opt = LossScaleOptimizer(keras.optimizers.SGD(), 4)
  sparse = tf.IndexedSlices(tf.constant([[8.0, 4.0]]), tf.constant([1]),
                            tf.constant([3, 2]))
  grads = [tf.constant([2.0, 6.0], tf.float16), None, sparse]
  unscaled = opt.get_unscaled_gradients(grads)
  assert isinstance(unscaled, list) and unscaled is not grads
  assert len(unscaled) == 3 and unscaled[1] is None
  assert unscaled[0].dtype == tf.float16
  assert unscaled[0].numpy().tolist() == [0.5, 1.5]
  assert isinstance(unscaled[2], tf.IndexedSlices)
  assert unscaled[2].values.numpy().tolist() == [[2.0, 1.0]]
  assert unscaled[2].indices.numpy().tolist() == [1]


# ---- the step (TF 2.3 semantics) -----------------------------------------


@pytest.mark.parametrize('use_function', [False, True])
def test_apply_gradients_trajectory_written_out(use_function):
  # SGD(0.5, momentum 0.5) on v = [1, 2]; gradient g = [1, -1] unless inf.
  # Dynamic scale 8, period 2. A skipped step changes no variable or slot,
  # halves the scale and still counts in iterations (TF 2.3).
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                           _dynamic(8.0, period=2))
  var = keras.Variable([1.0, 2.0])

  def step(bad):
    grad = tf.where(bad, tf.constant([INF, 1.0]), tf.constant([1.0, -1.0]))
    opt.apply_gradients([(grad, var)])

  if use_function:
    step = tf.function(step)
  expected = [
      # (bad, weights, momentum slot, scale, iterations)
      (False, [0.5, 2.5], [-0.5, 0.5], 8.0, 1),
      (True, [0.5, 2.5], [-0.5, 0.5], 4.0, 2),
      (False, [-0.25, 3.25], [-0.75, 0.75], 4.0, 3),
      (False, [-1.125, 4.125], [-0.875, 0.875], 8.0, 4),
      (True, [-1.125, 4.125], [-0.875, 0.875], 4.0, 5),
  ]
  for i, (bad, weights, slot, scale, iterations) in enumerate(expected):
    step(tf.constant(bad))
    np.testing.assert_allclose(var.numpy(), weights,
                               err_msg=f'step {i}: weights')
    np.testing.assert_allclose(opt.get_slot(var, 'momentum').numpy(), slot,
                               err_msg=f'step {i}: momentum slot')
    assert float(opt.loss_scale()) == scale, f'step {i}: scale'
    assert int(value(opt.iterations)) == iterations, f'step {i}: iterations'


def test_matches_keras_reference_weights_slots_and_scale():
  # RMSprop does not read `iterations`, the one place the two differ (an
  # Adam step after a skipped step sees a different bias correction).
  ours = LossScaleOptimizer(keras.optimizers.RMSprop(0.01, momentum=0.5),
                            _dynamic(32.0, 2))
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.RMSprop(0.01, momentum=0.5), initial_scale=32.0,
      dynamic_growth_steps=2)
  our_var = keras.Variable([1.0, -1.0, 0.5])
  ref_var = keras.Variable([1.0, -1.0, 0.5])
  reference.build([ref_var])
  rng = np.random.default_rng(5)
  for step in range(10):
    grad = rng.normal(size=3).astype(np.float32)
    if step in (3, 6):
      grad[step % 3] = INF if step == 3 else NAN
    ours.apply_gradients([(tf.constant(grad), our_var)])
    reference.apply([tf.constant(grad) * reference.dynamic_scale], [ref_var])
    np.testing.assert_allclose(our_var.numpy(), ref_var.numpy(), rtol=1e-6,
                               err_msg=f'step {step}: weights')
    for name in ('momentum', 'velocity'):
      ref_slot = next(v for v in reference.inner_optimizer.variables
                      if v.name.endswith(name))
      np.testing.assert_allclose(ours.get_slot(our_var, name).numpy(),
                                 ref_slot.numpy(), rtol=1e-6,
                                 err_msg=f'step {step}: slot {name}')
    assert float(ours.loss_scale()) == float(reference.dynamic_scale.numpy()), (
        f'step {step}: scale')
  # Documented difference: TF 2.3 counts skipped steps; Keras 3 applies
  # only the finite ones to its inner optimizer.
  assert int(value(ours.iterations)) == 10
  assert int(value(reference.inner_optimizer.iterations)) == 8


def test_fixed_loss_scale_never_skips():
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), 128)
  var = keras.Variable([1.0])
  opt.apply_gradients([(tf.constant([INF]), var)])
  assert var.numpy().tolist() == [-INF]
  assert float(opt.loss_scale()) == 128.0 and int(value(opt.iterations)) == 1


def test_minimize_with_callable_and_with_tape():
  for use_tape in (False, True):
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.25), _dynamic(1024.0))
    var = keras.Variable([3.0])
    loss_fn = lambda v=var: tf.reduce_sum(v * v)
    if use_tape:
      with tf.GradientTape() as tape:
        loss = loss_fn()
      opt.minimize(loss, [var], tape=tape)
    else:
      opt.minimize(loss_fn, lambda: [var])  # pylint: disable=cell-var-from-loop
    # gradient 2 * 3 = 6; 3 - 0.25 * 6 = 1.5
    assert var.numpy().tolist() == [1.5], f'use_tape={use_tape}'
  with pytest.raises(ValueError, match='tape'):
    opt.minimize(tf.constant(1.0), [var])


# ---- delegation ------------------------------------------------------------


def test_learning_rate_lr_and_schedules_are_the_inner_optimizers():
  inner = keras.optimizers.SGD(0.5)
  opt = LossScaleOptimizer(inner, 'dynamic')
  assert float(value(opt.learning_rate)) == float(value(opt.lr)) == 0.5
  opt.lr = 0.25
  assert float(value(inner.learning_rate)) == 0.25
  opt.learning_rate = 0.125
  assert float(value(opt.lr)) == 0.125
  scheduled = LossScaleOptimizer(
      keras.optimizers.SGD(
          keras.optimizers.schedules.PiecewiseConstantDecay([0], [1.0, 0.5])),
      1)
  var = keras.Variable([0.0])
  assert float(value(scheduled.lr)) == 1.0
  scheduled.apply_gradients([(tf.constant([1.0]), var)])
  assert float(value(scheduled.learning_rate)) == 0.5


def test_iterations_can_be_read_and_set():
  inner = keras.optimizers.SGD(0.5)
  opt = LossScaleOptimizer(inner, 'dynamic')
  # TF 2.3's: a tf.Variable (of Keras 3's, its own), which int() reads.
  assert isinstance(opt.iterations, tf.Variable)
  inner.iterations.assign(3)
  assert int(opt.iterations) == 3
  opt.iterations = 7
  assert int(value(inner.iterations)) == 7


def test_hyperparameters_are_read_and_written_on_the_inner_optimizer():
  # Before: beta_1 reached the inner optimizer but weight_decay and use_ema
  # read and wrote the wrapper's own unused copies.
  inner = keras.optimizers.AdamW(beta_1=0.8, weight_decay=0.5)
  opt = LossScaleOptimizer(inner, 'dynamic')
  assert opt.beta_1 == 0.8 and opt.weight_decay == 0.5
  assert opt.use_ema is False and opt.epsilon == inner.epsilon
  opt.beta_1 = 0.7
  opt.weight_decay = 0.0
  opt.use_ema = True
  assert inner.beta_1 == 0.7 and inner.weight_decay == 0.0 and inner.use_ema
  for name in ('beta_1', 'weight_decay', 'use_ema'):
    assert name not in vars(opt), name
  with pytest.raises(AttributeError, match='no_such_thing'):
    _ = opt.no_such_thing


def test_weight_decay_turned_off_through_the_wrapper_is_off():
  inner = keras.optimizers.AdamW(learning_rate=0.1, weight_decay=0.5)
  opt = LossScaleOptimizer(inner, 1)
  opt.weight_decay = 0.0
  var = keras.Variable([2.0])
  opt.apply_gradients([(tf.constant([0.0]), var)])
  # A zero gradient and no weight decay: the variable does not move.
  assert var.numpy().tolist() == [2.0]


def test_attributes_that_are_not_hyperparameters_are_not_exposed():
  inner = keras.optimizers.SGD(0.1)
  inner.my_attribute = 123
  opt = LossScaleOptimizer(inner, 'dynamic')
  with pytest.raises(AttributeError, match="'LossScaleOptimizer' object has "
                     "no attribute 'my_attribute'"):
    _ = opt.my_attribute
  with pytest.raises(AttributeError):
    opt.not_an_attr += 3


@pytest.mark.parametrize('name,value,grad,expected', [
    ('clipvalue', 0.5, [0.25, 3.0], [-0.25, -0.5]),
    ('clipnorm', 1.0, [3.0, 4.0], [-0.6, -0.8]),
    ('global_clipnorm', 1.0, [3.0, 4.0], [-0.6, -0.8]),
])
def test_clipping_is_delegated_and_acts_on_unscaled_gradients(
    name, value, grad, expected):
  inner = keras.optimizers.SGD(1.0)
  opt = LossScaleOptimizer(inner, 1024)
  setattr(opt, name, value)
  assert getattr(opt, name) == value == getattr(inner, name)
  var = keras.Variable([0.0, 0.0])
  opt.apply_gradients([(tf.constant(grad), var)])
  np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)


def test_non_finite_step_is_skipped_not_clipped():
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0, global_clipnorm=1.0),
                           _dynamic(8.0))
  var = keras.Variable([1.0, 1.0])
  opt.apply_gradients([(tf.constant([INF, 1.0]), var)])
  assert var.numpy().tolist() == [1.0, 1.0]
  assert float(opt.loss_scale()) == 4.0


def test_slots_weights_and_variables():
  inner = keras.optimizers.Adam(0.1)
  opt = LossScaleOptimizer(inner, _dynamic(2.0))
  var = keras.Variable([1.0, 2.0], name='w')
  opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
  # TF 2.x's names for Adam's slots; Keras 3's find them too.
  assert opt.get_slot_names() == ['m', 'v']
  np.testing.assert_allclose(opt.get_slot(var, 'm').numpy(),
                             [0.1, 0.1], rtol=1e-6)
  assert opt.get_slot(var, 'momentum') is opt.get_slot(var, 'm')
  with pytest.raises(KeyError, match='nope'):
    opt.get_slot(var, 'nope')
  extra = opt.add_slot(var, 'extra', initializer='ones')
  assert opt.get_slot(var, 'extra') is extra
  assert extra.numpy().tolist() == [1.0, 1.0]
  # As TF 2.x's add_slot: a slot the variable has is returned, not made.
  assert opt.add_slot(var, 'extra') is extra
  assert opt.add_slot(var, 'm') is opt.get_slot(var, 'm')
  assert opt.get_slot_names() == ['m', 'v', 'extra']
  # As TF 2.3's: the inner optimizer's variables but its hyperparameters
  # (Keras 3 keeps the learning rate in one).
  assert opt.weights == [v for v in inner.variables
                         if v is not inner.learning_rate]
  assert opt.variables() == opt.weights
  assert opt.variables == [opt.loss_scale.current_loss_scale,
                           opt.loss_scale.good_steps] + inner.variables
  values = opt.get_weights()
  assert len(values) == len(inner.variables) - 1
  values[0] = np.array(42, np.int64)
  opt.set_weights(values)
  assert int(value(inner.iterations)) == 42


# ---- config, compile, fit, save -------------------------------------------


def test_config_is_tf23_format_and_round_trips():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.5),
                           _dynamic(64.0, 10))
  config = opt.get_config()
  assert set(config) == {'optimizer', 'loss_scale', 'optimizer_family'}
  assert config['optimizer_family'] == 'keras3'
  assert config['loss_scale'] == {
      'class_name': 'DynamicLossScale',
      'config': {'initial_loss_scale': 64.0, 'increment_period': 10,
                 'multiplier': 2.0}}
  assert config['optimizer']['class_name'] == 'SGD'
  clone = LossScaleOptimizer.from_config(config)
  assert clone.get_config() == config
  fixed = LossScaleOptimizer(keras.optimizers.SGD(0.1), 12)
  assert LossScaleOptimizer.from_config(
      fixed.get_config()).get_config() == fixed.get_config()


def test_compile_under_mixed_float16_keeps_it_and_fit_trains_as_keras():
  # Keras 3's fit calls scale_loss(), after which apply_gradients() takes the
  # gradients of the scaled loss (tf_loss_scale/keras/shared/protocols.py).
  kernels = []
  keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    for make in (lambda inner: LossScaleOptimizer(inner, 1024),
                 lambda inner: keras.optimizers.LossScaleOptimizer(
                     inner, initial_scale=1024)):
      model = keras.Sequential([
          keras.Input((2,)),
          keras.layers.Dense(1, use_bias=False, kernel_initializer='ones')
      ])
      opt = make(keras.optimizers.SGD(0.1))
      model.compile(optimizer=opt, loss='mse')
      assert model.optimizer is opt
      model.fit(np.array([[1.0, 2.0]], np.float32),
                np.array([[0.0]], np.float32), batch_size=1, epochs=2,
                verbose=0)
      kernels.append(model.layers[0].kernel.numpy().ravel())
  finally:
    keras.mixed_precision.set_global_policy('float32')
  # [1, 1] - 0.1 * 2 * 3 * [1, 2] = [0.4, -0.2], which predicts 0: the
  # second step's gradient is 0.
  np.testing.assert_allclose(kernels[0], [0.4, -0.2], rtol=1e-6)
  np.testing.assert_array_equal(kernels[0], kernels[1])


def test_tf23_loop_is_not_changed_by_a_stray_scale_loss():
  # The latest scaling call, get_unscaled_gradients, decides: the apply
  # takes these unscaled gradients as given (not 2.994 instead of -3).
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), _dynamic(1024.0))
  var = keras.Variable([3.0])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(var * var)
    scaled_loss = opt.get_scaled_loss(loss)
    opt.scale_loss(loss)
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
  opt.apply_gradients(zip(grads, [var]))
  # gradient 2 * 3 = 6; 3 - 1.0 * 6 = -3.
  assert var.numpy().tolist() == [-3.0]


def test_saved_and_loaded_with_its_state(tmp_path):
  model = keras.Sequential([
      keras.Input((1,)),
      keras.layers.Dense(1, use_bias=False, kernel_initializer='ones')
  ])
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), _dynamic(8.0))
  model.compile(optimizer=opt, loss='mse')
  for target in (INF, 0.0):
    opt.minimize(
        lambda t=target: tf.reduce_mean(
            (model(tf.constant([[1.0]])) - t) ** 2),
        model.trainable_variables)
  # Step 0 is skipped; step 1: gradient 2 * 1 * 1 = 2, 1 - 0.2.
  np.testing.assert_allclose(model.layers[0].kernel.numpy(), [[0.8]])
  assert float(opt.loss_scale()) == 4.0 and int(value(opt.iterations)) == 2

  path = str(tmp_path / 'model.keras')
  model.save(path)
  loaded = keras.models.load_model(path)
  assert type(loaded.optimizer) is type(opt)
  assert loaded.optimizer.get_config() == opt.get_config()
  assert float(loaded.optimizer.loss_scale()) == 4.0
  assert int(value(loaded.optimizer.iterations)) == 2


def test_every_member_keras_classes_offer_is_defined_or_forwarded():
  # Before: inherited methods ran Keras's code on a wrapper that never ran
  # Keras's LossScaleOptimizer.__init__ (missing step_counter; and on Keras
  # 3.3 construction failed on a missing inner_optimizer attribute).
  opt = LossScaleOptimizer(keras.optimizers.SGD(), 'dynamic')
  ours = [c for c in type(opt).__mro__
          if c.__module__.startswith('tf_loss_scale.')]
  # Keras's variable helpers act only on the variable they are given.
  stateless = {'assign', 'assign_add', 'assign_sub'}
  inherited = []
  for keras_class in type(opt).__mro__:
    if keras_class in ours or keras_class is object:
      continue
    for name in vars(keras_class):
      if name.startswith('_') or name in stateless:
        continue
      if not any(name in vars(c) for c in ours) and (
          name not in opt._forwarded_names):  # pylint: disable=protected-access
        inherited.append(f'{keras_class.__name__}.{name}')
  assert not inherited, f'run Keras code on the wrapper: {inherited}'
  var = keras.Variable([1.0, 2.0])
  opt.assign_add(var, tf.constant([1.0, 1.0]))
  assert var.numpy().tolist() == [2.0, 3.0]
  with pytest.raises(NotImplementedError, match='stateless_apply'):
    opt.stateless_apply([], [], [])


def test_object_checkpoint_saves_and_restores_slots_and_loss_scale(tmp_path):
  # tf.train.Checkpoint must not claim the inner optimizer's slots twice
  # (once through the wrapper's forwarded get_slot_names).
  def make():
    var = tf.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.1), _dynamic(8, 2))
    return var, opt, tf.train.Checkpoint(var=var, optimizer=opt)

  var, opt, checkpoint = make()
  for grad in ([1.0, 1.0], [np.inf, 1.0], [0.5, -1.0]):
    opt.apply_gradients([(tf.constant(grad), var)])
  path = checkpoint.save(str(tmp_path / 'ckpt'))

  restored_var, restored_opt, restored = make()
  restored_opt.build([restored_var])
  restored.restore(path).assert_existing_objects_matched()
  assert restored_var.numpy().tolist() == var.numpy().tolist()
  assert float(restored_opt.loss_scale()) == 4.0
  assert int(restored_opt.loss_scale.good_steps.numpy()) == 1
  assert int(restored_opt.iterations.numpy()) == 3
  for name in ('momentum', 'velocity'):
    np.testing.assert_array_equal(
        restored_opt.get_slot(restored_var, name).numpy(),
        opt.get_slot(var, name).numpy(), err_msg=name)


# ---- defects of the Keras 3 path, each pinned ------------------------------


def test_slots_of_two_variables_with_the_same_name_are_their_own():
  # Before: slots were found by rebuilt names, and two unnamed eager
  # variables (both 'Variable') got the first one's slot.
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0, momentum=0.5), 1)
  small = tf.Variable([1.0])
  large = tf.Variable([1.0, 1.0, 1.0])
  assert small.name == large.name
  opt.apply_gradients([(tf.constant([2.0]), small),
                       (tf.constant([1.0, 2.0, 3.0]), large)])
  assert opt.get_slot(small, 'momentum').numpy().tolist() == [-2.0]
  assert opt.get_slot(large, 'momentum').numpy().tolist() == [-1.0, -2.0,
                                                              -3.0]
  with pytest.raises(KeyError, match='not a variable this optimizer'):
    opt.get_slot(tf.Variable([1.0]), 'momentum')


def test_slots_are_found_by_variable_when_built_in_another_order():
  # Two variables named 'w', built in one order and stepped in the other:
  # each has its own slot, found by the variable itself.
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0, momentum=0.5), 1)
  first = keras.Variable([1.0], name='w')
  second = keras.Variable([1.0, 1.0, 1.0], name='w')
  opt.build([second, first])
  opt.apply_gradients([(tf.constant([2.0]), first),
                       (tf.constant([1.0, 2.0, 3.0]), second)])
  assert opt.get_slot(first, 'momentum').numpy().tolist() == [-2.0]
  assert opt.get_slot(second, 'momentum').numpy().tolist() == [-1.0, -2.0,
                                                               -3.0]
  assert opt.get_slot_names() == ['momentum']


@pytest.mark.parametrize('order', ['short first', 'long first'])
def test_a_slot_whose_name_two_variables_fit_is_the_longer_names(order):
  # Keras names the slots 'a_momentum' and 'a_b_momentum': the second also
  # reads as a slot 'b_momentum' of 'a'.
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0, momentum=0.5), 1)
  short = keras.Variable([1.0, 1.0], name='a')
  long = keras.Variable([1.0, 1.0], name='a_b')
  pairs = [(tf.constant([1.0, 2.0]), short), (tf.constant([3.0, 4.0]), long)]
  opt.apply_gradients(pairs if order == 'short first' else pairs[::-1])
  assert opt.get_slot(short, 'momentum').numpy().tolist() == [-1.0, -2.0]
  assert opt.get_slot(long, 'momentum').numpy().tolist() == [-3.0, -4.0]
  assert opt.get_slot_names() == ['momentum']


def test_slot_kinds_with_underscores_are_found_with_adam_values():
  # Adam with amsgrad makes 'momentum', 'velocity' and 'velocity_hat'. After
  # one step with gradient g: m = 0.1 g, v = vhat = 0.001 g**2.
  opt = LossScaleOptimizer(keras.optimizers.Adam(0.1, amsgrad=True), 1)
  var = keras.Variable([1.0, 1.0], name='w')
  opt.apply_gradients([(tf.constant([2.0, -4.0]), var)])
  assert opt.get_slot_names() == ['m', 'v', 'vhat']  # TF 2.x's names.
  np.testing.assert_allclose(opt.get_slot(var, 'momentum').numpy(),
                             [0.2, -0.4], rtol=1e-6)
  for kind in ('velocity', 'velocity_hat', 'v', 'vhat'):
    np.testing.assert_allclose(opt.get_slot(var, kind).numpy(),
                               [0.004, 0.016], rtol=1e-6, err_msg=kind)


def test_a_kind_of_slot_made_for_some_variables_goes_to_those():
  # Two variables named 'w'; the optimizer gives 'extra' only to matrices.

  class SomeSlots(keras.optimizers.Optimizer):

    def build(self, var_list):
      if self.built:
        return
      super().build(var_list)
      for var in var_list:
        self.add_variable_from_reference(var, 'momentum')
      for var in var_list:
        if len(var.shape) == 2:
          self.add_variable_from_reference(var, 'extra', initializer='ones')

    def update_step(self, gradient, variable, learning_rate):
      variable.assign_sub(gradient * learning_rate)

  opt = LossScaleOptimizer(SomeSlots(learning_rate=1.0), 1)
  vector = keras.Variable([1.0, 1.0], name='w')
  matrix = keras.Variable(np.ones((2, 2), np.float32), name='w')
  opt.build([vector, matrix])
  assert opt.get_slot(matrix, 'extra').shape == (2, 2)
  assert opt.get_slot(vector, 'momentum').shape == (2,)
  assert opt.get_slot(matrix, 'momentum').shape == (2, 2)
  with pytest.raises(KeyError, match="No slot 'extra'"):
    opt.get_slot(vector, 'extra')


def test_slots_of_an_inner_built_before_wrapping_are_never_anothers():
  # Before: with two variables named 'w' and the inner optimizer built in
  # the other order before it was wrapped, each got the other's slot. Slots
  # are known by variable only for an inner optimizer the wrapper builds.
  inner = keras.optimizers.SGD(1.0, momentum=0.5)
  first = keras.Variable([1.0], name='w')
  second = keras.Variable([1.0, 1.0, 1.0], name='w')
  inner.build([second, first])
  opt = LossScaleOptimizer(inner, 1)
  opt.apply_gradients([(tf.constant([2.0]), first),
                       (tf.constant([1.0, 2.0, 3.0]), second)])
  for var in (first, second):
    with pytest.raises(KeyError, match='built before it was wrapped'):
      opt.get_slot(var, 'momentum')


@pytest.mark.parametrize('option', [{'use_ema': True},
                                    {'gradient_accumulation_steps': 2}])
def test_wrapper_holds_no_model_sized_state_of_its_own(option):
  # Before: Keras's base build ran on the wrapper too and made a second,
  # never used, copy of the EMA averages or gradient accumulators.
  inner = keras.optimizers.SGD(0.5, **option)
  opt = LossScaleOptimizer(inner, _dynamic(8.0))
  var = keras.Variable(np.ones((64, 64), np.float32))
  opt.apply_gradients([(tf.ones((64, 64)), var)])
  model_sized = [v for v in inner.variables if tuple(v.shape) == (64, 64)]
  assert model_sized, 'the inner optimizer keeps per-variable state'
  assert opt.variables == list(opt.loss_scale.variables) + inner.variables
  def saved(optimizer):
    path = tf.train.Checkpoint(optimizer=optimizer).save(
        os.path.join(tempfile.mkdtemp(), 'ckpt'))
    return {name: shape for name, shape in tf.train.list_variables(path)
            if name.startswith('optimizer/')}

  by_wrapper, by_inner = saved(opt), saved(inner)
  assert sorted(set(by_wrapper) - set(by_inner)) == [
      'optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE',
      'optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE']
  own = [name for name, value in vars(opt).items()
         if isinstance(value, (tf.Variable, keras.Variable))]
  assert own == [], f'variables held by the wrapper itself: {own}'


@pytest.mark.parametrize('use_function', [False, True])
def test_skipped_step_with_gradient_accumulation(use_function):
  # Before: eagerly, the first overflow assigned to Keras's computed
  # `iterations` ('EagerTensor' object has no attribute 'assign_add'); in a
  # tf.function it failed at trace time. A skipped micro-step now leaves the
  # accumulating optimizer untouched: its window is 2 finite micro-steps.
  opt = LossScaleOptimizer(
      keras.optimizers.SGD(1.0, gradient_accumulation_steps=2),
      _dynamic(8.0))
  var = keras.Variable([10.0])

  def step(grad):
    opt.apply_gradients([(grad, var)])

  if use_function:
    step = tf.function(step)
  # The bare optimizer, given only the finite micro-steps, is the reference
  # for `iterations` (Keras 3.3 counts micro-steps, later Keras windows).
  bare = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  bare_var = keras.Variable([10.0])
  expected = [
      # (gradient, variable after, scale after)
      (1.0, 10.0, 8.0),
      (INF, 10.0, 4.0),    # skipped: nothing accumulated or counted
      (3.0, 8.0, 4.0),     # window complete: 10 - 1.0 * (1 + 3) / 2
      (NAN, 8.0, 2.0),
  ]
  for i, (grad, weight, scale) in enumerate(expected):
    step(tf.constant([grad]))
    if np.isfinite(grad):
      bare.apply_gradients([(tf.constant([grad]), bare_var)])
    assert var.numpy().tolist() == [weight], f'step {i}: variable'
    assert bare_var.numpy().tolist() == [weight], f'step {i}: bare variable'
    assert float(opt.loss_scale()) == scale, f'step {i}: scale'
    assert int(value(opt.iterations)) == int(value(bare.iterations)), (
        f'step {i}: iterations')


def _trained(opt, var):
  for grad in ([1.0, 1.0], [INF, 1.0], [0.5, -1.0]):
    opt.apply_gradients([(tf.constant(grad), var)])


def test_checkpoint_of_the_wrapper_restores_into_the_bare_inner(tmp_path):
  # Before: the wrapper saved its own unused iterations and learning rate
  # (0.0) where the bare optimizer looks for its own: restoring gave
  # learning rate 0, iterations 0 and zero slots.
  var = tf.Variable([1.0, 2.0])
  opt = LossScaleOptimizer(keras.optimizers.Adam(0.25), _dynamic(8.0, 2))
  _trained(opt, var)
  path = tf.train.Checkpoint(var=var, optimizer=opt).save(
      str(tmp_path / 'ckpt'))

  bare_var = tf.Variable([0.0, 0.0])
  bare = keras.optimizers.Adam(0.5)
  bare.build([bare_var])
  tf.train.Checkpoint(var=bare_var, optimizer=bare).restore(
      path).assert_existing_objects_matched()
  assert bare_var.numpy().tolist() == var.numpy().tolist()
  assert float(value(bare.learning_rate)) == 0.25
  assert int(value(bare.iterations)) == 3
  for name in ('momentum', 'velocity'):
    np.testing.assert_array_equal(
        next(v for v in bare.variables if v.name.endswith(name)).numpy(),
        opt.get_slot(var, name).numpy(), err_msg=name)


def test_checkpoint_of_the_bare_inner_restores_into_the_wrapper(tmp_path):
  # Before: iterations and slots were not restored, while
  # assert_nontrivial_match passed.
  var = tf.Variable([1.0, 2.0])
  bare = keras.optimizers.Adam(0.25)
  for grad in ([1.0, 1.0], [0.5, -1.0]):
    bare.apply_gradients([(tf.constant(grad), var)])
  path = tf.train.Checkpoint(var=var, optimizer=bare).save(
      str(tmp_path / 'ckpt'))

  new_var = tf.Variable([0.0, 0.0])
  opt = LossScaleOptimizer(keras.optimizers.Adam(0.5), _dynamic(8.0, 2))
  opt.build([new_var])
  # The loss scale has nothing to restore from, so (as in TF 2.3) the match
  # is nontrivial rather than complete.
  tf.train.Checkpoint(var=new_var, optimizer=opt).restore(
      path).assert_nontrivial_match()
  assert float(value(opt.learning_rate)) == 0.25
  assert int(value(opt.iterations)) == 2
  assert float(opt.loss_scale()) == 8.0  # not in the checkpoint: initial
  for name in ('momentum', 'velocity'):
    np.testing.assert_array_equal(
        opt.get_slot(new_var, name).numpy(),
        next(v for v in bare.variables if v.name.endswith(name)).numpy(),
        err_msg=name)
