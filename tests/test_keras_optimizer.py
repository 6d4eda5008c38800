"""Tests of `tf_loss_scale.keras.LossScaleOptimizer`, the Keras 3 form.

The reference is `keras.optimizers.LossScaleOptimizer` of the installed Keras
(3.3.3 to 3.15): fed the same gradients, both must produce the same weights,
slots and loss scale at every step, wherever our floor at 1 does not apply.
Where Keras's class changed between releases, ours follows the installed one
(`iterations`, `get_config`, messages), except that it refuses base optimizer
arguments and clears the inner `loss_scale_factor` on every release.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
import versions

versions.KERAS_3.require()

from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top,g-bad-import-order

INF = float('inf')
NAN = float('nan')

# Keras 3.9 made the class's `iterations` its inner optimizer's (before, a
# counter of its own that never advanced).
_ITERATIONS_ARE_THE_INNER_OPTIMIZERS = versions.keras_at_least(3, 9)


def _count(variable):
  # Keras 3.3's variables have no __int__.
  return int(np.asarray(variable.numpy()))


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
  assert float(ours.dynamic_scale.numpy()) == float(reference.dynamic_scale.numpy()), (
      f'step {step}: loss scale {float(ours.dynamic_scale.numpy())} vs reference '
      f'{float(reference.dynamic_scale.numpy())}')


def _run_against_reference(ours, reference, our_vars, ref_vars, use_function):
  """Feeds both optimizers SEQUENCE's gradients, checking state each step."""

  def make_step(opt, variables):
    # Variables are captured: tf.function would trace arguments as tensors.
    def step(grads):
      opt.apply([g * opt.dynamic_scale for g in grads], variables)
    return tf.function(step) if use_function else step

  our_step, ref_step = make_step(ours, our_vars), make_step(reference, ref_vars)
  for i, kind in enumerate(SEQUENCE):
    grads = [tf.constant(g) for g in _grads(i, kind)]
    our_step(grads)
    ref_step(grads)
    _assert_same_state(f'{i} ({kind})', ours, reference, our_vars, ref_vars)


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

  _run_against_reference(ours, reference, our_vars, ref_vars, use_function)
  assert _count(ours.inner_optimizer.iterations) == _count(
      reference.inner_optimizer.iterations) == 9
  assert _count(ours.iterations) == _count(reference.iterations)


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
  assert _count(opt.iterations) == 0


def test_documented_example_eight_finite_steps_grow_to_32():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=2.0,
                           dynamic_growth_steps=2)
  var = keras.Variable([1.0])
  scales = []
  for _ in range(8):
    opt.apply([tf.constant([1.0])], [var])
    scales.append(float(opt.dynamic_scale.numpy()))
  assert scales == [2.0, 4.0, 4.0, 8.0, 8.0, 16.0, 16.0, 32.0]


def test_scale_never_falls_below_one_unlike_keras():
  ours = LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0)
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.1), initial_scale=2.0)
  for opt in (ours, reference):
    var = keras.Variable([1.0])
    for _ in range(3):
      opt.apply([tf.constant([NAN])], [var])
  assert float(ours.dynamic_scale.numpy()) == 1.0
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
  assert float(ours.dynamic_scale.numpy()) == big
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
           float(opt.dynamic_scale.numpy())))
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
  assert float(opt.scale_loss(lambda: tf.constant(2.0))()) == 16.0
  opt.build([keras.Variable([1.0])])
  opt.dynamic_scale.assign(4.0)
  assert float(opt.scale_loss(tf.constant(2.0))) == 8.0


def _scaled_losses(cls, built, loss_fn=False):
  """`scale_loss` of 3 in each dtype, eagerly and traced (or, with `loss_fn`,
  of a callable): (dtype, scaled dtype, value)."""
  opt = cls(keras.optimizers.SGD(0.1))
  if built:
    opt.build([keras.Variable([1.0])])
  traced = tf.function(opt.scale_loss)
  out = []
  for dtype in ('float16', 'bfloat16', 'float32', 'float64', 'int32'):
    loss = tf.constant(3, dtype)
    for scaled in ([opt.scale_loss(lambda: loss)()] if loss_fn else
                   [opt.scale_loss(loss), traced(loss)]):
      out.append((dtype, scaled.dtype.name, float(scaled)))
  return out


@pytest.mark.parametrize('built', [False, True], ids=['unbuilt', 'built'])
def test_scale_loss_returns_what_keras_class_returns_dtype_included(built):
  # Keras 3.3's class keeps a float64 loss float64 and refuses an integer
  # one; the dtypes here are those of the Keras releases from 3.12 on.
  versions.keras_at_least(3, 12).require()
  # Keras multiplies by its float32 variable once built (a float16 loss of
  # 3 becomes float32 98304) and by the Python `initial_scale` before (the
  # float16 product overflows to inf).
  from tf_loss_scale.keras.mixed_precision import shared_name  # pylint: disable=g-import-not-at-top
  keras_class = keras.optimizers.LossScaleOptimizer
  theirs = _scaled_losses(keras_class, built)
  assert theirs[0] == ('float16', 'float32' if built else 'float16',
                       98304.0 if built else float('inf'))
  for cls in (LossScaleOptimizer,
              tf_loss_scale.keras.mixed_precision.LossScaleOptimizer,
              shared_name.LossScaleOptimizer):
    assert _scaled_losses(cls, built) == theirs, cls
    # Keras's class takes no callable: a callable's are the tensor's.
    assert _scaled_losses(cls, built, loss_fn=True) == theirs[0::2], cls


def test_check_finite():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1))
  assert bool(opt.check_finite([tf.constant([1.0]), None]))
  assert not bool(opt.check_finite([tf.constant([1.0]), tf.constant([NAN])]))


def test_variables_are_keras_variables_in_keras_layout():
  inner = keras.optimizers.SGD(0.25, momentum=0.5, name='inner')
  ours = LossScaleOptimizer(inner, initial_scale=4.0, name='lso')
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.25, momentum=0.5, name='inner'),
      initial_scale=4.0, name='lso')
  for opt in (ours, reference):
    opt.build([keras.Variable([1.0], name='w')])
  assert [type(v) for v in ours.variables] == [
      type(v) for v in reference.variables]
  assert [v.path for v in ours.variables] == [
      v.path for v in reference.variables]
  assert [v.path for v in ours.variables][:4] == [
      'lso/iteration', 'lso/learning_rate', 'lso/step_counter',
      'lso/dynamic_scale']
  assert ours.variables[4:] == inner.variables
  assert [v.dtype for v in ours.variables] == [
      v.dtype for v in reference.variables]


@_ITERATIONS_ARE_THE_INNER_OPTIMIZERS.mark
def test_iterations_and_learning_rate_are_the_inner_optimizers():
  inner = keras.optimizers.SGD(0.25)
  opt = LossScaleOptimizer(inner, initial_scale=4.0)
  var = keras.Variable([1.0])
  opt.apply([tf.constant([4.0])], [var])
  opt.apply([tf.constant([INF])], [var])
  assert opt.iterations is inner.iterations and _count(opt.iterations) == 1
  assert float(opt.learning_rate) == 0.25
  opt.learning_rate = 0.5
  assert float(inner.learning_rate) == 0.5
  assert opt.inner_optimizer is inner


def test_skipped_steps_and_last_step_skipped_count_outside_the_layout():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=4.0)
  assert int(opt.skipped_steps) == 0 and not bool(opt.last_step_skipped)
  var = keras.Variable([1.0])
  applied = tf.function(lambda g: opt.apply([g], [var]))
  history = []
  for grad in (1.0, INF, NAN, 2.0):
    applied(tf.constant([grad]))
    history.append((int(opt.skipped_steps), bool(opt.last_step_skipped)))
  assert history == [(0, False), (1, True), (2, True), (2, False)]
  assert len(opt.variables) == 4 + 2  # Keras's own four, then SGD's two
  checkpoint_keys = {name for name, _ in tf.train.list_variables(
      tf.train.Checkpoint(optimizer=opt).write(
          str(_tmp_dir() / 'skips')))}
  assert not any('skip' in key for key in checkpoint_keys), checkpoint_keys


def _tmp_dir():
  import pathlib  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  return pathlib.Path(tempfile.mkdtemp())


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


@pytest.mark.parametrize('clipping,expected', [
    ({'clipnorm': 1.0}, -0.70703125),
    ({'global_clipnorm': 1.0}, -0.70703125),
    ({'clipvalue': 1.0}, -1.0),
    ({}, -300.0),
])
def test_float16_variables_are_clipped_in_float32_as_keras_does(clipping,
                                                                 expected):
  # Unscaled, each gradient is 300: its square overflows float16, not
  # float32, in which Keras's class hands float16 gradients to the inner
  # optimizer. The norm is 300 * sqrt(2); float16(-1 / sqrt(2)) = -0.70703125.
  weights = {}
  for cls in (LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    opt = cls(keras.optimizers.SGD(1.0, **clipping), initial_scale=2.0)
    var = keras.Variable(np.zeros(2, np.float16), dtype='float16')
    opt.apply([tf.constant([600.0, 600.0], tf.float16)], [var])
    weights[cls] = var.numpy().tolist()
  assert weights[LossScaleOptimizer] == [expected, expected]
  assert weights[keras.optimizers.LossScaleOptimizer] == [expected, expected]


@pytest.mark.parametrize('scale,scaled,unscaled', [
    # float32(5) / float32(3) = 1.6666666; times float32(1 / 3), 1.6666667.
    (3.0, 5.0, 1.6666666),
    (1000.0, 5.0, 0.005),            # times the reciprocal, 0.0050000004
    (2.0**15 + 1, 515.0, 0.015716074),  # times the reciprocal, 0.015716072
])
def test_gradients_are_divided_by_the_scale_as_keras_does(scale, scaled,
                                                          unscaled):
  for cls in (LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    opt = cls(keras.optimizers.SGD(1.0), initial_scale=scale)
    var = keras.Variable([0.0])
    opt.apply([tf.constant([scaled])], [var])
    assert var.numpy().tolist() == [-np.float32(unscaled)], cls


def _scaled_step(opt, var, factor):
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(tf.reduce_sum(var * factor))
  opt.apply(tape.gradient(loss, [var]), [var])


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit_compile'])
def test_a_gradient_that_overflows_once_scaled_is_skipped_as_keras_does(mode):
  # The scaled gradient 2e34 * 32768 overflows. Were it multiplied by the
  # scale's reciprocal, Grappler would fold the scale and its reciprocal
  # into one factor of 1 in a tf.function: the gradient there would be
  # finite and the step applied, where the eager step and Keras's class in
  # every mode skip it.
  results = {}
  for cls in (LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    opt = cls(keras.optimizers.SGD(1.0))
    var = keras.Variable(np.ones(4, np.float32))
    step = functools.partial(_scaled_step, opt, var,
                             tf.constant(np.full(4, 2e34, np.float32)))
    if mode != 'eager':
      step = tf.function(step, jit_compile=mode == 'jit_compile')
    step()
    results[cls] = (float(opt.dynamic_scale.numpy()),
                    int(opt.iterations.numpy()), var.numpy().tolist())
  assert results[LossScaleOptimizer] == (16384.0, 0, [1.0] * 4)
  assert results[keras.optimizers.LossScaleOptimizer] == (16384.0, 0,
                                                          [1.0] * 4)


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit_compile'])
@pytest.mark.parametrize('scale', [3.0, 1000.0, 2.0**15 + 1, 2.0**15])
def test_any_scale_trains_bit_for_bit_as_keras_class_does(scale, mode):
  rng = np.random.default_rng(7)
  # Many values, so that dividing and multiplying by the reciprocal round
  # differently for some of them at every scale but the power of two.
  start = rng.uniform(-1, 1, 500).astype(np.float32)
  grads = rng.uniform(-4, 4, (len(SEQUENCE), 500)).astype(np.float32)
  for i, kind in enumerate(SEQUENCE):
    grads[i, 3] = {'inf': INF, 'nan': NAN}.get(kind, grads[i, 3])
  optimizers = [
      cls(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=scale,
          dynamic_growth_steps=3)
      for cls in (LossScaleOptimizer, keras.optimizers.LossScaleOptimizer)]
  variables = [[keras.Variable(start)], [keras.Variable(start)]]

  def make_step(opt, model):
    opt.build(model)
    # The optimizer and variables are captured, not traced as arguments.
    step = lambda grad: opt.apply([grad * opt.dynamic_scale], model)
    return step if mode == 'eager' else tf.function(
        step, jit_compile=mode == 'jit_compile')

  steps = [make_step(*pair) for pair in zip(optimizers, variables)]
  for i, grad in enumerate(grads):
    for step in steps:
      step(tf.constant(grad))
    for mine, theirs in zip(variables[0] + optimizers[0].variables,
                            variables[1] + optimizers[1].variables):
      np.testing.assert_array_equal(mine.numpy(), theirs.numpy(),
                                    err_msg=f'step {i}: {mine.path}')


# Inner optimizer features, step for step against Keras's class, with inf and
# NaN steps among the finite ones.
_FEATURES = {
    'gradient_accumulation_steps': lambda: keras.optimizers.SGD(
        0.1, momentum=0.5, gradient_accumulation_steps=3),
    'use_ema': lambda: keras.optimizers.Adam(
        0.05, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3),
    'weight_decay': lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
    'global_clipnorm': lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.3),
    'loss_scale_factor': lambda: keras.optimizers.SGD(
        0.1, loss_scale_factor=16.0),
}
# Keras's class clears the inner factor from 3.10 on; before, it divides the
# gradients by it a second time (ours clears it on every release:
# test_inner_loss_scale_factor_is_accepted_and_cleared_as_keras_does).
_SAME_AS_KERAS = {'loss_scale_factor': versions.keras_at_least(3, 10)}


@pytest.mark.parametrize('use_function', [False, True])
@pytest.mark.parametrize('feature', [
    pytest.param(name, marks=_SAME_AS_KERAS[name].mark)
    if name in _SAME_AS_KERAS else name for name in sorted(_FEATURES)])
def test_inner_features_match_keras_class_step_for_step(feature, use_function):
  ours = LossScaleOptimizer(_FEATURES[feature](), initial_scale=64.0,
                            dynamic_growth_steps=2)
  reference = keras.optimizers.LossScaleOptimizer(
      _FEATURES[feature](), initial_scale=64.0, dynamic_growth_steps=2)
  assert ours.inner_optimizer.loss_scale_factor is None
  our_vars, ref_vars = _variables(), _variables()
  ours.build(our_vars)
  reference.build(ref_vars)

  _run_against_reference(ours, reference, our_vars, ref_vars, use_function)
  ours.finalize_variable_values(our_vars)
  reference.finalize_variable_values(ref_vars)
  _assert_same_state('after finalize', ours, reference, our_vars, ref_vars)


def test_get_config_equals_keras_class_config_and_round_trips():
  opt = LossScaleOptimizer(keras.optimizers.Adam(0.003, name='adam'),
                           initial_scale=128.0, dynamic_growth_steps=7,
                           name='lso')
  config = opt.get_config()
  assert config == keras.optimizers.LossScaleOptimizer(
      keras.optimizers.Adam(0.003, name='adam'), initial_scale=128.0,
      dynamic_growth_steps=7, name='lso').get_config()
  # Before Keras 3.12 the class's config also lists the base optimizer's
  # arguments, at their defaults.
  if versions.keras_at_least(3, 12):
    assert set(config) == {'name', 'inner_optimizer', 'initial_scale',
                           'dynamic_growth_steps'}
  assert (config['name'], config['initial_scale'],
          config['dynamic_growth_steps']) == ('lso', 128.0, 7)
  clone = LossScaleOptimizer.from_config(config)
  assert clone.get_config() == config
  assert isinstance(clone.inner_optimizer, keras.optimizers.Adam)
  assert 'inner_optimizer' in config  # from_config did not edit the dict


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
  assert float(loaded.optimizer.dynamic_scale.numpy()) == 128.0
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
  # Layout: iteration, learning_rate, step_counter, dynamic_scale, then SGD's
  # iteration, learning_rate, momentum.
  before = [np.asarray(v.numpy()).copy() for v in opt.variables]
  new_model, new_optimizer = opt.stateless_apply(
      [v.value for v in opt.variables], [tf.constant([4.0, 8.0])],
      [var.value])
  # Unscaled gradient [1, 2]; momentum 0 -> -0.5 * [1, 2]; scale doubles.
  np.testing.assert_allclose(new_model[0].numpy(), [0.5, 1.0])
  assert float(new_optimizer[3]) == 8.0 and int(new_optimizer[2]) == 0
  assert int(new_optimizer[4]) == 1  # inner iterations
  np.testing.assert_allclose(new_optimizer[6].numpy(), [-0.5, -1.0])
  np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
  for v, old in zip(opt.variables, before):
    np.testing.assert_array_equal(np.asarray(v.numpy()), old)
  # A non-finite step: model and inner state kept, scale halves.
  skipped_model, skipped_optimizer = opt.stateless_apply(
      new_optimizer, [tf.constant([INF, 0.0])], new_model)
  np.testing.assert_array_equal(skipped_model[0].numpy(), [0.5, 1.0])
  assert float(skipped_optimizer[3]) == 4.0
  assert int(skipped_optimizer[4]) == 1
  np.testing.assert_allclose(skipped_optimizer[6].numpy(), [-0.5, -1.0])


class _StatefulAndStateless:
  """Two equal optimizers: one applied, one stepped by stateless_apply."""

  def __init__(self, make_inner):
    self.stateful = LossScaleOptimizer(make_inner(), initial_scale=8.0,
                                       dynamic_growth_steps=2)
    self.stateless = LossScaleOptimizer(make_inner(), initial_scale=8.0,
                                        dynamic_growth_steps=2)
    self.variables, self.free_variables = _variables(), _variables()
    self.stateful.build(self.variables)
    self.stateless.build(self.free_variables)
    self.model_values = [v.value for v in self.free_variables]
    self.optimizer_values = [v.value for v in self.stateless.variables]

  def step(self, grads, stateless_apply, when):
    """Applies unscaled `grads` both ways; the results must be equal."""
    self.stateful.apply([g * self.stateful.dynamic_scale for g in grads],
                        self.variables)
    self.model_values, self.optimizer_values = stateless_apply(
        self.optimizer_values, [g * self.optimizer_values[3] for g in grads],
        self.model_values)
    for j, (mine, theirs) in enumerate(zip(self.variables,
                                           self.model_values)):
      np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6,
                                 err_msg=f'{when}: model variable {j}')
    for v, value in zip(self.stateful.variables, self.optimizer_values):
      np.testing.assert_allclose(np.asarray(v.numpy()), np.asarray(value),
                                 rtol=1e-6, err_msg=f'{when}: {v.path}')


def test_stateless_apply_in_a_function_matches_apply_step_for_step():
  pair = _StatefulAndStateless(lambda: keras.optimizers.Adam(0.05))
  pure_step = tf.function(pair.stateless.stateless_apply)
  for i, kind in enumerate(SEQUENCE):
    pair.step([tf.constant(g) for g in _grads(i, kind)], pure_step,
              f'step {i}')
  for v in pair.free_variables:  # never assigned
    np.testing.assert_array_equal(v.numpy(), _variables()[0].numpy()
                                  if v.shape == (4,) else
                                  _variables()[1].numpy())


# Settings changed on the inner optimizer before each step (the same on the
# stateful and the stateless optimizer): each must be honoured at once.
_SETTING_CHANGES = [
    {},
    {'clipvalue': 0.1},
    {'momentum': 0.9},
    {'weight_decay': 0.2},
    {'clipvalue': None, 'learning_rate': 0.05},
    {'momentum': 0.0, 'weight_decay': None},
]


def test_stateless_apply_follows_the_inner_optimizers_current_settings():
  pair = _StatefulAndStateless(
      lambda: keras.optimizers.SGD(0.5, momentum=0.5))
  kinds = ['ok', 'ok', 'inf', 'ok', 'ok', 'ok']
  for i, (changes, kind) in enumerate(zip(_SETTING_CHANGES, kinds)):
    for name, value in changes.items():
      setattr(pair.stateful.inner_optimizer, name, value)
      setattr(pair.stateless.inner_optimizer, name, value)
    if 'learning_rate' in changes:
      # The learning rate is a variable: its new value travels as a value.
      index = next(k for k, v in enumerate(pair.stateless.variables)
                   if v is pair.stateless.inner_optimizer.learning_rate)
      pair.optimizer_values[index] = tf.constant(changes['learning_rate'])
    pair.step([tf.constant(g) for g in _grads(i, kind)],
              pair.stateless.stateless_apply, f'step {i} after {changes}')
  # The changes mattered: without them the same steps end elsewhere.
  unchanged = LossScaleOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                                 initial_scale=8.0, dynamic_growth_steps=2)
  unchanged_vars = _variables()
  unchanged.build(unchanged_vars)
  for i, kind in enumerate(kinds):
    unchanged.apply([tf.constant(g) * unchanged.dynamic_scale
                     for g in _grads(i, kind)], unchanged_vars)
  assert not np.allclose(unchanged_vars[0].numpy(),
                         pair.variables[0].numpy())


def test_stateless_apply_needs_a_built_optimizer():
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5))
  with pytest.raises(ValueError, match='must be built'):
    opt.stateless_apply([], [], [])


def test_keras_private_step_helpers_are_never_called(monkeypatch):
  keras_class = keras.optimizers.LossScaleOptimizer
  for name in ('_stateful_handle_finite_grads', '_common_apply', '_tf_apply',
               '_stateful_handle_non_finite_grads',
               '_stateless_handle_finite_grads',
               '_stateless_handle_non_finite_grads'):
    monkeypatch.setattr(keras_class, name, _fail)
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=2.0)
  var = keras.Variable([1.0])
  opt.apply([tf.constant([2.0])], [var])
  opt.apply([tf.constant([INF])], [var])
  opt.stateless_apply([v.value for v in opt.variables], [tf.constant([2.0])],
                      [var.value])
  assert var.numpy().tolist() == [0.5]


def _fail(*args, **kwargs):
  raise AssertionError('a Keras LossScaleOptimizer helper was called')


def test_refusals_start_with_keras_wording():
  # `dynamic=False`: the installed Keras's message, whatever its release.
  with pytest.raises(ValueError) as keras_refusal:
    keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False)
  with pytest.raises(ValueError) as our_refusal:
    LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False)
  assert str(our_refusal.value) == str(keras_refusal.value)
  assert 'dynamic=False' in str(our_refusal.value)
  # Base optimizer arguments: refused with Keras 3.12's words on every
  # release (older Keras accepted and ignored them).
  with pytest.raises(
      ValueError, match='does not support `clipnorm`. Instead, set `clipnorm` '
      'on the `inner_optimizer`'):
    LossScaleOptimizer(keras.optimizers.SGD(), clipnorm=1.0)
  with pytest.raises(ValueError,
                     match='does not support arguments: `bogus`, `extra`'):
    LossScaleOptimizer(keras.optimizers.SGD(), bogus=1, extra=2)


def test_default_base_arguments_are_accepted():
  opt = LossScaleOptimizer(keras.optimizers.SGD(), clipnorm=None, use_ema=False,
                           ema_momentum=0.99, dynamic=True)
  assert opt.dynamic_growth_steps == 2000 and opt.initial_scale == 32768.0


def test_inner_loss_scale_factor_is_accepted_and_cleared_as_keras_does():
  inner = keras.optimizers.SGD(1.0, loss_scale_factor=4.0)
  opt = LossScaleOptimizer(inner, initial_scale=8.0)
  assert inner.loss_scale_factor is None
  var = keras.Variable([0.0])
  opt.apply([tf.constant([8.0])], [var])
  assert var.numpy().tolist() == [-1.0]


def test_bad_scale_arguments_name_themselves():
  with pytest.raises(ValueError, match='initial_scale=-1'):
    LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=-1.0)
  with pytest.raises(ValueError, match='dynamic_growth_steps=0'):
    LossScaleOptimizer(keras.optimizers.SGD(), dynamic_growth_steps=0)
  with pytest.raises(TypeError, match="initial_scale must be a .*'big'"):
    LossScaleOptimizer(keras.optimizers.SGD(), initial_scale='big')


def test_initial_scale_below_one_is_refused_where_keras_halves_it():
  # Keras's class starts at 0.5 and halves it on overflow; this scale's floor
  # is 1, so it could not follow (it would jump to 1).
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.1), initial_scale=0.5, dynamic_growth_steps=1)
  var = keras.Variable([1.0])
  scales = []
  for grad in (INF, 1.0, INF):
    reference.apply([tf.constant([grad])], [var])
    scales.append(float(reference.dynamic_scale.numpy()))
  assert scales == [0.25, 0.5, 0.25]
  with pytest.raises(
      ValueError, match=r'initial_scale must be a finite number of at least 1 '
      r'that fits in float32, but got initial_scale=0\.5'):
    LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=0.5)
  assert LossScaleOptimizer(keras.optimizers.SGD(0.1),
                            initial_scale=1).initial_scale == 1


@pytest.mark.parametrize('initial,steps,error,words', [
    (1e-50, 1, ValueError, 'fits in float32, but got {initial}=1e-50.'),
    (float('nan'), 1, ValueError, 'fits in float32, but got {initial}=nan.'),
    (2.0, 2.5, TypeError, '{steps} must be an integer, but got {steps}=2.5.'),
    (2.0, 2**63, ValueError, '{steps} must be an integer from 1 to '
     '2**63 - 1, but got {steps}=9223372036854775808.'),
    (2.0, '10', TypeError, "{steps} must be a Python or NumPy real number, "
     "but got '10' of type str."),
])
def test_every_front_end_checks_scale_arguments_in_the_same_words(
    initial, steps, error, words):
  for make, names in (
      (lambda: LossScaleOptimizer(keras.optimizers.SGD(), initial, steps),
       ('initial_scale', 'dynamic_growth_steps')),
      (lambda: tf_loss_scale.DynamicLossScale(initial, steps),
       ('initial_loss_scale', 'increment_period'))):
    with pytest.raises(error) as refusal:
      make()
    assert str(refusal.value).endswith(
        words.format(initial=names[0], steps=names[1]))


def test_bfloat16_policy_warns_through_the_precision_module(monkeypatch):
  calls = []
  monkeypatch.setattr(tf_loss_scale.precision, 'warn_if_scaling_is_not_needed',
                      lambda dtype, wrapper: calls.append((dtype, wrapper)))
  keras.mixed_precision.set_global_policy('mixed_bfloat16')
  try:
    LossScaleOptimizer(keras.optimizers.SGD())
  finally:
    keras.mixed_precision.set_global_policy('float32')
  LossScaleOptimizer(keras.optimizers.SGD())
  assert calls == [('bfloat16', 'LossScaleOptimizer'),
                   ('float32', 'LossScaleOptimizer')]
