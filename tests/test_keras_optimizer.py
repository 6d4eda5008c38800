"""Tests of `tf_loss_scale.keras.LossScaleOptimizer`, the Keras 3 form.

The reference is `keras.optimizers.LossScaleOptimizer` (Keras 3.15): fed the
same gradients, both must produce the same weights, slots and loss scale at
every step, wherever our floor at 1 does not apply.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale.keras import LossScaleOptimizer

INF = float('inf')
NAN = float('nan')


def _variables():
  return [keras.Variable(np.array([1.0, 2.0, 3.0, 4.0], np.float32), name='a'),
          keras.Variable(np.array([[0.5, -0.5]], np.float32), name='b')]


def _grads(step, kind):
  """The step's gradients (before scaling): finite, or with one inf/NaN."""
  a = np.array([1.0, -2.0, 0.5, 3.0], np.float32) * (step + 1) / 4
  b = np.array([[0.25, -1.0]], np.float32) / (step + 1)
  if kind == 'inf':
    a[2] = INF
  elif kind == 'nan':
    b[0, 1] = NAN
  return [a, b]


# Finite steps with growth every 2 steps, interleaved with inf and NaN steps;
# the scale never approaches 1, so both rules agree.
SEQUENCE = ['ok', 'ok', 'ok', 'inf', 'ok', 'nan', 'ok', 'ok', 'ok', 'inf',
            'ok', 'ok']


def _assert_same_state(step, ours, reference, our_vars, ref_vars):
  for i, (mine, theirs) in enumerate(zip(our_vars, ref_vars)):
    np.testing.assert_allclose(
        mine.numpy(), theirs.numpy(), rtol=1e-6,
        err_msg=f'step {step}: model variable {i} differs')
  for mine, theirs in zip(ours.inner_optimizer.variables,
                          reference.inner_optimizer.variables):
    np.testing.assert_allclose(
        mine.numpy(), theirs.numpy(), rtol=1e-6,
        err_msg=f'step {step}: inner optimizer variable {mine.path} differs')
  assert float(ours.loss_scale()) == float(reference.dynamic_scale.numpy()), (
      f'step {step}: loss scale {float(ours.loss_scale())} vs reference '
      f'{float(reference.dynamic_scale.numpy())}')


@pytest.mark.parametrize('use_function', [False, True])
@pytest.mark.parametrize('inner', ['sgd_momentum', 'adam'])
def test_apply_matches_keras_reference_at_every_step(use_function, inner):
  make_inner = {
      'sgd_momentum': lambda: keras.optimizers.SGD(0.1, momentum=0.9),
      'adam': lambda: keras.optimizers.Adam(0.01),
  }[inner]
  ours = LossScaleOptimizer(make_inner(), initial_scale=64.0,
                            dynamic_growth_steps=2)
  reference = keras.optimizers.LossScaleOptimizer(
      make_inner(), initial_scale=64.0, dynamic_growth_steps=2)
  our_vars, ref_vars = _variables(), _variables()
  ours.build(our_vars)
  reference.build(ref_vars)

  def make_step(opt, variables):
    # Variables are captured: tf.function would trace arguments as tensors.
    def step(grads):
      scale = opt.dynamic_scale
      opt.apply([g * scale for g in grads], variables)
    return tf.function(step) if use_function else step

  our_step, ref_step = make_step(ours, our_vars), make_step(reference, ref_vars)
  for i, kind in enumerate(SEQUENCE):
    grads = [tf.constant(g) for g in _grads(i, kind)]
    our_step(grads)
    ref_step(grads)
    _assert_same_state(i, ours, reference, our_vars, ref_vars)
  assert int(ours.iterations) == int(reference.inner_optimizer.iterations) == 9


def test_documented_example_sgd_step():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0)
  var = keras.Variable(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
  opt.apply([tf.constant([1.0, 6.0, 7.0, 2.0]) * 8.0], [var])
  np.testing.assert_array_equal(var.numpy(), [0.5, -1.0, -0.5, 3.0])


def test_documented_example_four_skipped_steps_scale_loss_to_25():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=400.0)
  var = keras.Variable([1.0])
  for _ in range(4):
    opt.apply([tf.constant([INF])], [var])
  assert float(opt.scale_loss(tf.constant(1.0))) == 25.0
  assert var.numpy().tolist() == [1.0]
  assert int(opt.iterations) == 0


def test_documented_example_eight_finite_steps_grow_to_32():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=2.0,
                           dynamic_growth_steps=2)
  var = keras.Variable([1.0])
  scales = []
  for _ in range(8):
    opt.apply([tf.constant([1.0])], [var])
    scales.append(float(opt.loss_scale()))
  assert scales == [2.0, 4.0, 4.0, 8.0, 8.0, 16.0, 16.0, 32.0]


def test_scale_never_falls_below_one_unlike_keras():
  ours = LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0)
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.1), initial_scale=2.0)
  for opt in (ours, reference):
    var = keras.Variable([1.0])
    for _ in range(3):
      opt.apply([tf.constant([NAN])], [var])
  assert float(ours.loss_scale()) == 1.0
  assert float(reference.dynamic_scale.numpy()) == 0.25


def test_scale_never_grows_to_inf_unlike_keras():
  big = float(np.float32(2.0**127))
  ours = LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=big,
                            dynamic_growth_steps=1)
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.0), initial_scale=big, dynamic_growth_steps=1)
  for opt in (ours, reference):
    var = keras.Variable([1.0])
    opt.apply([tf.constant([0.0])], [var])
  assert float(ours.loss_scale()) == big
  assert float(reference.dynamic_scale.numpy()) == INF


def test_custom_loop_with_tape_matches_reference_eager_and_function():
  data = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
  targets = np.array([[1.0], [0.0]], np.float32)
  results = {}
  for name, make in [
      ('ours', lambda: LossScaleOptimizer(keras.optimizers.Adam(0.05),
                                          initial_scale=16.0,
                                          dynamic_growth_steps=3)),
      ('reference', lambda: keras.optimizers.LossScaleOptimizer(
          keras.optimizers.Adam(0.05), initial_scale=16.0,
          dynamic_growth_steps=3))]:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = make()

    def train_step(x, y, poison, model=model, opt=opt):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y)) * poison
        scaled = opt.scale_loss(loss)
      grads = tape.gradient(scaled, model.trainable_variables)
      opt.apply(grads, model.trainable_variables)

    compiled = tf.function(train_step)
    trajectory = []
    for step in range(8):
      poison = tf.constant(INF if step in (2, 5) else 1.0)
      (compiled if step % 2 else train_step)(data, targets, poison)
      trajectory.append(
          ([w.numpy().copy() for w in model.trainable_variables],
           float(opt.loss_scale() if name == 'ours' else
                 opt.dynamic_scale.numpy())))
    results[name] = trajectory
  for step, ((w_ours, s_ours), (w_ref, s_ref)) in enumerate(
      zip(results['ours'], results['reference'])):
    assert s_ours == s_ref, f'step {step}: scale {s_ours} vs {s_ref}'
    for i, (a, b) in enumerate(zip(w_ours, w_ref)):
      np.testing.assert_allclose(a, b, rtol=1e-6,
                                 err_msg=f'step {step}: weight {i} differs')


def _fit_trajectory(make_optimizer, policy):
  """Fits a tiny model batch by batch; returns per-batch weights and scales."""
  keras.mixed_precision.set_global_policy(policy)
  try:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation='relu'),
        keras.layers.Dense(1)
    ])
    opt = make_optimizer()
    model.compile(optimizer=opt, loss='mse')
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 3)).astype(np.float32)
    y = rng.normal(size=(24, 1)).astype(np.float32)
    # Batch 2 (rows 8-11) overflows float16 in the forward pass.
    x[9] = 6e4
    trajectory = []

    class Record(keras.callbacks.Callback):

      def on_train_batch_end(self, batch, logs=None):
        scale = model.optimizer.dynamic_scale
        trajectory.append(([w.numpy().copy() for w in model.trainable_weights],
                           float(tf.convert_to_tensor(scale))))

    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[Record()])
    return model, trajectory
  finally:
    keras.mixed_precision.set_global_policy('float32')


@pytest.mark.parametrize('policy', ['float32', 'mixed_float16'])
def test_fit_matches_keras_reference_at_every_batch(policy):
  _, ours = _fit_trajectory(
      lambda: LossScaleOptimizer(keras.optimizers.SGD(0.01, momentum=0.5),
                                 initial_scale=1024.0, dynamic_growth_steps=4),
      policy)
  _, reference = _fit_trajectory(
      lambda: keras.optimizers.LossScaleOptimizer(
          keras.optimizers.SGD(0.01, momentum=0.5), initial_scale=1024.0,
          dynamic_growth_steps=4), policy)
  assert len(ours) == len(reference) == 12
  for step, ((w_ours, s_ours), (w_ref, s_ref)) in enumerate(
      zip(ours, reference)):
    assert s_ours == s_ref, f'batch {step}: scale {s_ours} vs {s_ref}'
    for i, (a, b) in enumerate(zip(w_ours, w_ref)):
      np.testing.assert_allclose(a, b, rtol=1e-5,
                                 err_msg=f'batch {step}: weight {i} differs')
  if policy == 'mixed_float16':
    # The overflowing batches were skipped: the scale halved twice.
    assert ours[2][1] == 512.0 and ours[1][0][0].tolist() == ours[2][0][
        0].tolist()


def test_compile_under_mixed_float16_keeps_ours_and_scales_loss_once():
  keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(1, use_bias=False, kernel_initializer='ones')
    ])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0)
    model.compile(optimizer=opt, loss='mse')
    assert model.optimizer is opt
    model.fit(np.array([[1.0, 2.0]], np.float32),
              np.array([[0.0]], np.float32), batch_size=1, verbose=0)
  finally:
    keras.mixed_precision.set_global_policy('float32')
  # prediction 3, loss 9, gradient 2 * 3 * [1, 2] = [6, 12]; one SGD step.
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(),
                             [0.4, -0.2], rtol=1e-6)


def test_scale_loss_keeps_float16_and_before_build_uses_initial_scale():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=8.0)
  scaled = opt.scale_loss(tf.constant(1.5, tf.float16))
  assert scaled.dtype == tf.float16 and float(scaled) == 12.0
  assert float(opt.get_scaled_loss(lambda: tf.constant(2.0))()) == 16.0
  unscaled = opt.get_unscaled_gradients([tf.constant([8.0]), None])
  assert unscaled[1] is None and unscaled[0].numpy().tolist() == [1.0]


def test_check_finite():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1))
  assert bool(opt.check_finite([tf.constant([1.0]), None]))
  assert not bool(opt.check_finite([tf.constant([1.0]), tf.constant([NAN])]))


def test_iterations_learning_rate_and_variables_are_the_inner_optimizers():
  inner = keras.optimizers.SGD(0.25)
  opt = LossScaleOptimizer(inner, initial_scale=4.0)
  var = keras.Variable([1.0])
  opt.apply([tf.constant([4.0])], [var])
  opt.apply([tf.constant([INF])], [var])
  assert opt.iterations is inner.iterations and int(opt.iterations) == 1
  assert float(opt.learning_rate) == 0.25
  opt.learning_rate = 0.5
  assert float(inner.learning_rate) == 0.5
  assert opt.variables == [opt.dynamic_scale, opt.step_counter
                          ] + inner.variables
  assert opt.inner_optimizer is inner


def test_learning_rate_schedule_follows_inner_iterations():
  # Rate 1.0 at iteration 0, then 0.1: the skipped step does not count.
  schedule = keras.optimizers.schedules.PiecewiseConstantDecay([0], [1.0, 0.1])
  opt = LossScaleOptimizer(keras.optimizers.SGD(schedule), initial_scale=1.0)
  var = keras.Variable([0.0])
  opt.apply([tf.constant([1.0])], [var])
  opt.apply([tf.constant([INF])], [var])
  np.testing.assert_allclose(var.numpy(), [-1.0])
  opt.apply([tf.constant([1.0])], [var])
  np.testing.assert_allclose(var.numpy(), [-1.1])


def test_inner_clipping_acts_on_unscaled_gradients():
  opt = LossScaleOptimizer(keras.optimizers.SGD(1.0, clipvalue=0.5),
                           initial_scale=1024.0)
  var = keras.Variable([0.0, 0.0])
  opt.apply([tf.constant([0.25, 3.0]) * 1024.0], [var])
  np.testing.assert_allclose(var.numpy(), [-0.25, -0.5])


def test_get_config_has_exactly_the_constructor_arguments_and_round_trips():
  opt = LossScaleOptimizer(keras.optimizers.Adam(0.003), initial_scale=128.0,
                           dynamic_growth_steps=7, name='lso')
  config = opt.get_config()
  assert set(config) == {'name', 'inner_optimizer', 'initial_scale',
                         'dynamic_growth_steps'}
  assert (config['name'], config['initial_scale'],
          config['dynamic_growth_steps']) == ('lso', 128.0, 7)
  clone = LossScaleOptimizer.from_config(config)
  assert clone.get_config() == config
  assert isinstance(clone.inner_optimizer, keras.optimizers.Adam)


def test_from_config_accepts_keras_reference_config():
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.2), initial_scale=32.0, dynamic_growth_steps=5)
  opt = LossScaleOptimizer.from_config(reference.get_config())
  assert (opt.initial_scale, opt.dynamic_growth_steps) == (32.0, 5)
  assert opt.get_config() == reference.get_config()


def test_save_and_load_keras_file_keeps_state(tmp_path):
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  model.compile(
      optimizer=LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                   initial_scale=64.0, dynamic_growth_steps=3),
      loss='mse')
  x = np.ones((4, 2), np.float32)
  model.fit(x, np.ones((4, 1), np.float32), batch_size=1, verbose=0)
  path = str(tmp_path / 'model.keras')
  model.save(path)
  loaded = keras.models.load_model(path)
  assert type(loaded.optimizer) is LossScaleOptimizer
  assert loaded.optimizer.get_config() == model.optimizer.get_config()
  assert float(loaded.optimizer.loss_scale()) == 128.0
  assert int(loaded.optimizer.step_counter.numpy()) == 1
  for mine, theirs in zip(loaded.optimizer.variables,
                          model.optimizer.variables):
    np.testing.assert_array_equal(np.asarray(mine.numpy()),
                                  np.asarray(theirs.numpy()))


def test_stateless_apply_returns_the_step_and_leaves_variables_alone():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                           initial_scale=4.0, dynamic_growth_steps=1)
  var = keras.Variable([1.0, 2.0])
  opt.build([var])
  before = [np.asarray(v.numpy()).copy() for v in opt.variables]
  new_model, new_optimizer = opt.stateless_apply(
      [v.numpy() for v in opt.variables], [tf.constant([4.0, 8.0])],
      [np.array([1.0, 2.0], np.float32)])
  # Unscaled gradient [1, 2]; momentum 0 -> -0.5 * [1, 2]; scale doubles.
  np.testing.assert_allclose(new_model[0].numpy(), [0.5, 1.0])
  assert float(new_optimizer[0]) == 8.0 and int(new_optimizer[1]) == 0
  assert int(new_optimizer[2]) == 1  # inner iterations
  np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
  for v, old in zip(opt.variables, before):
    np.testing.assert_array_equal(np.asarray(v.numpy()), old)
  # A non-finite step: model and inner state kept, scale halves.
  skipped_model, skipped_optimizer = opt.stateless_apply(
      new_optimizer, [tf.constant([INF, 0.0])], new_model)
  np.testing.assert_array_equal(skipped_model[0].numpy(), [0.5, 1.0])
  assert float(skipped_optimizer[0]) == 4.0
  assert int(skipped_optimizer[2]) == 1


def test_stateless_apply_needs_a_built_optimizer():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5))
  with pytest.raises(ValueError, match='build'):
    opt.stateless_apply([], [], [])


def test_every_method_of_the_keras_class_is_overridden():
  keras_class = keras.optimizers.LossScaleOptimizer
  for name, member in vars(keras_class).items():
    if not callable(member) and not isinstance(member,
                                               (property, classmethod)):
      continue
    # Keras's private step helpers are reached only from the public methods
    # (see the next test).
    if name.startswith('_'):
      continue
    owner = next(c for c in LossScaleOptimizer.__mro__ if name in vars(c))
    assert owner is not keras_class, f'{name} is inherited from Keras'


def test_keras_private_step_helpers_are_never_called(monkeypatch):
  keras_class = keras.optimizers.LossScaleOptimizer
  for name in ('_stateful_handle_finite_grads', '_common_apply', '_tf_apply',
               '_stateful_handle_non_finite_grads'):
    monkeypatch.setattr(keras_class, name, _fail)
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=2.0)
  var = keras.Variable([1.0])
  opt.apply([tf.constant([2.0])], [var])
  opt.apply([tf.constant([INF])], [var])
  assert var.numpy().tolist() == [0.5]


def _fail(*args, **kwargs):
  raise AssertionError('a Keras LossScaleOptimizer helper was called')


def test_dynamic_false_points_at_the_inner_optimizer():
  with pytest.raises(ValueError, match='inner optimizer'):
    LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False)


@pytest.mark.parametrize('name,value', [('clipnorm', 1.0), ('use_ema', True),
                                        ('loss_scale_factor', 2.0)])
def test_non_default_base_arguments_point_at_the_inner_optimizer(name, value):
  with pytest.raises(ValueError, match=f'set {name} on the inner_optimizer'):
    LossScaleOptimizer(keras.optimizers.SGD(), **{name: value})


def test_default_base_arguments_are_accepted():
  opt = LossScaleOptimizer(keras.optimizers.SGD(), clipnorm=None, use_ema=False,
                           ema_momentum=0.99, dynamic=True)
  assert opt.dynamic_growth_steps == 2000 and opt.initial_scale == 32768.0


def test_unknown_arguments_are_listed():
  with pytest.raises(ValueError, match=r"\['bogus', 'extra'\]"):
    LossScaleOptimizer(keras.optimizers.SGD(), bogus=1, extra=2)


def test_bad_inner_optimizers():
  with pytest.raises(TypeError, match='GradientDescentOptimizer'):
    LossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
  with pytest.raises(ValueError, match='already a loss scale optimizer'):
    LossScaleOptimizer(LossScaleOptimizer(keras.optimizers.SGD()))
  with pytest.raises(ValueError, match='already a loss scale optimizer'):
    LossScaleOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD()))
  inner = keras.optimizers.SGD()
  first = LossScaleOptimizer(inner)
  with pytest.raises(ValueError, match='already wrapped'):
    LossScaleOptimizer(inner)
  del first
  with pytest.raises(ValueError, match='loss_scale_factor'):
    LossScaleOptimizer(keras.optimizers.SGD(loss_scale_factor=4.0))


def test_bad_scale_arguments_name_themselves():
  with pytest.raises(ValueError, match='initial_scale=-1'):
    LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=-1.0)
  with pytest.raises(ValueError, match='dynamic_growth_steps=0'):
    LossScaleOptimizer(keras.optimizers.SGD(), dynamic_growth_steps=0)
  with pytest.raises(TypeError, match="initial_scale='big'"):
    LossScaleOptimizer(keras.optimizers.SGD(), initial_scale='big')


def test_unsupported_strategy_is_refused_at_construction_and_apply():
  strategy = tf.distribute.experimental.CentralStorageStrategy()
  with strategy.scope():
    with pytest.raises(ValueError, match='CentralStorageStrategy'):
      LossScaleOptimizer(keras.optimizers.SGD())
  opt = LossScaleOptimizer(keras.optimizers.SGD())
  var = keras.Variable([1.0])
  with strategy.scope():
    with pytest.raises(ValueError, match='CentralStorageStrategy'):
      opt.apply([tf.constant([1.0])], [var])
  assert isinstance(opt.loss_scale, tf_loss_scale.DynamicLossScale)
