"""TF 2.4-2.15's form under both protocols, its arguments, against the peers.

One optimizer of this form serves Keras 3's protocol (`scale_loss`, as
`fit` calls it) and TensorFlow's (`get_scaled_loss`/`get_unscaled_gradients`)
step by step: under the first it trains as Keras's own class, under the
second as tf_keras's class. Each test feeds the same losses to the peer.
"""

import logging
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import versions

versions.KERAS_3.require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import tf_keras
from tf_loss_scale.keras import mixed_precision
from tf_loss_scale.keras.mixed_precision import shared_name
import tf_loss_scale.keras  # pylint: disable=g-bad-import-order
import tf_loss_scale.keras.experimental  # pylint: disable=g-bad-import-order
# pylint: enable=g-import-not-at-top,wrong-import-order

# Per step, what the loss multiplies each float16 weight by: at a scale of
# 2**15, 4 overflows the scaled gradient (131072 > 65504) though its
# unscaled value is finite, 2 does once the scale has doubled.
_FACTORS = [1.0, 4.0, 1.0, 1.0, 2.0, 0.5]


def _keras3_step(opt, var):
  """Keras 3's custom loop: `scale_loss`, then gradients of the scaled loss."""

  def step(factor):
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(tf.reduce_sum(var * tf.cast(factor, var.dtype)))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

  return step


def _tf24_step(opt, var):
  """TF 2.4-2.15's custom loop: gradients unscaled before the apply."""

  def step(factor):
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(
          tf.reduce_sum(var * tf.cast(factor, var.dtype)))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))

  return step


def _trajectory(opt, var, step, factors, mode):
  if mode == 'function':
    step = tf.function(step)
  out = []
  for factor in factors:
    step(tf.constant(factor))
    scale = getattr(opt, 'loss_scale', None)
    scale = opt.dynamic_scale if scale is None else scale
    # The inner optimizer's count: Keras's class before 3.9 has its own.
    out.append((np.asarray(var.numpy(), np.float32).tolist(),
                float(tf.convert_to_tensor(scale)),
                int(tf.convert_to_tensor(opt.inner_optimizer.iterations))))
  return out


def _run(opt, make_var, loop, mode):
  """The trajectory of float16 weights [1, -2] trained by `loop`."""
  var = make_var(np.array([1.0, -2.0], np.float16), dtype='float16')
  return _trajectory(opt, var, loop(opt, var), _FACTORS, mode)


def _ours():
  return mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                            dynamic_growth_steps=2)


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_keras_3_protocol_trains_and_counts_as_keras_class(mode):
  ours = _run(_ours(), keras.Variable, _keras3_step, mode)
  keras_class = _run(
      keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                          dynamic_growth_steps=2),
      keras.Variable, _keras3_step, mode)
  assert ours == keras_class
  # The second step was skipped, and Keras's class does not count it.
  assert [(s, i) for _, s, i in ours] == [
      (32768.0, 1), (16384.0, 1), (16384.0, 2), (32768.0, 3),
      (16384.0, 3), (16384.0, 4)]


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_tensorflow_protocol_trains_and_counts_as_tf_keras(mode):
  ours = _run(_ours(), keras.Variable, _tf24_step, mode)
  # tf_keras's class eagerly: in a tf.function Grappler reassociates its
  # float16 products and it applies steps it skips eagerly
  # (test_keras_mixed_precision pins that peer difference).
  tf_keras_class = _run(
      tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.125), dynamic_growth_steps=2),
      tf.Variable, _tf24_step, 'eager')
  assert ours == tf_keras_class
  # tf_keras counts the skipped steps in iterations.
  assert [(s, i) for _, s, i in ours] == [
      (32768.0, 1), (16384.0, 2), (16384.0, 3), (32768.0, 4),
      (16384.0, 5), (16384.0, 6)]


def _dense_model(api, dtype_policy=None):
  model = api.Sequential([
      api.Input((3,)),
      api.layers.Dense(2, kernel_initializer=api.initializers.Constant(0.25),
                       bias_initializer='zeros', dtype=dtype_policy)])
  return model


def _fit_loop_fit(api, make_opt):
  """A `fit` warm-up, a custom loop of TF 2.4-2.15, then `fit` again."""
  model = _dense_model(api)
  opt = make_opt()
  model.compile(opt, 'mse')
  x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
  y = np.array([[1.0, -1.0]] * 4, np.float32)
  record = []

  def note():
    record.append(([w.tolist() for w in model.get_weights()],
                   float(opt.loss_scale), int(opt.iterations.numpy())))

  model.fit(x, y, batch_size=4, epochs=3, verbose=0)
  note()

  @tf.function
  def loop_step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - y))
      scaled = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))

  for _ in range(3):
    loop_step()
  note()
  model.fit(x, y, batch_size=4, epochs=2, verbose=0)
  note()
  return record


def test_one_optimizer_serves_fit_then_a_custom_loop_then_fit_as_tf_keras():
  ours = _fit_loop_fit(keras, lambda: mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.1), initial_scale=4, dynamic_growth_steps=2))
  theirs = _fit_loop_fit(
      tf_keras, lambda: tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.1), initial_scale=4,
          dynamic_growth_steps=2))
  for stage, (o, t) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(
        np.concatenate([np.ravel(w) for w in o[0]]),
        np.concatenate([np.ravel(w) for w in t[0]]), rtol=1e-5,
        err_msg=f'weights after stage {stage}')
    assert o[1] == t[1], f'loss scale after stage {stage}'
    assert o[2] == t[2], f'iterations after stage {stage}'
  # The scale doubled every two steps across fit and the loop: 3, 6, 8 steps.
  assert [t[1:] for t in theirs] == [(8.0, 3), (32.0, 6), (64.0, 8)]


def test_keras_3_arguments_and_name_are_taken_as_keras_class_takes_them():
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), 1024.0,
                                            10, name='scaled')
  keras_class = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(), 1024.0, 10, name='scaled')
  for opt in (ours, keras_class):
    assert (opt.initial_scale, opt.dynamic_growth_steps, opt.name) == (
        1024.0, 10, 'scaled')
  assert ours.dynamic
  # The class install() names takes Keras's instances too (a TF 2.4-2.15
  # train_step branches on it); the library's own class does not.
  assert isinstance(keras_class, shared_name.LossScaleOptimizer)
  assert not isinstance(keras_class, mixed_precision.LossScaleOptimizer)
  assert not isinstance(keras.optimizers.SGD(), shared_name.LossScaleOptimizer)


def test_arguments_are_kept_as_tf_keras_keeps_them():
  for make, sgd in ((mixed_precision.LossScaleOptimizer,
                     keras.optimizers.SGD),
                    (tf_keras.mixed_precision.LossScaleOptimizer,
                     tf_keras.optimizers.SGD)):
    assert make(sgd(), initial_scale=8).initial_scale == 8.0
    assert isinstance(make(sgd(), initial_scale=8).initial_scale, float)
    assert make(sgd(), initial_scale=tf.constant(8)).initial_scale == 8.0
    fixed = make(sgd(1.0), dynamic=False, initial_scale=0.5)
    var = keras.Variable([1.0]) if make is not tf_keras.mixed_precision.\
        LossScaleOptimizer else tf.Variable([1.0])
    _tf24_step(fixed, var)(tf.constant(3.0))
    assert var.numpy().tolist() == [-2.0]
    assert float(fixed.loss_scale) == 0.5
    with pytest.raises(TypeError, match='LossScaleOptimizer cannot wrap '
                       'another LossScaleOptimizer'):
      make(make(sgd()))
  # tf_keras keeps a growth period of 0; this form refuses it instead of
  # silently replacing it.
  assert tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(), dynamic_growth_steps=0
  ).dynamic_growth_steps == 0
  with pytest.raises(ValueError, match='dynamic_growth_steps=0'):
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(),
                                       dynamic_growth_steps=0)
  # Code written for Keras's class, which raises ValueError there, still
  # catches it.
  with pytest.raises(ValueError, match='cannot wrap another'):
    mixed_precision.LossScaleOptimizer(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))


def test_replacing_iterations_raises_saying_what_to_do():
  step = tf.Variable(5, dtype=tf.int64)
  theirs = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD())
  theirs.iterations = step  # tf_keras's class takes it.
  assert theirs.iterations is step
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
  with pytest.raises(AttributeError, match=r'cannot be replaced .*'
                     r'optimizer\.iterations\.assign\(step\)'):
    ours.iterations = step
  var = keras.Variable([1.0])
  step = _tf24_step(ours, var)
  step(tf.constant(1.0))
  ours.iterations.assign(5)
  step(tf.constant(1.0))
  assert int(ours.iterations) == 6


def _warnings(caplog, opt, var, calls):
  caplog.clear()
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(var * 2.0)
    if 'get_scaled_loss' in calls:
      loss = opt.get_scaled_loss(loss)
  grads = tape.gradient(loss, [var])
  if 'get_unscaled_gradients' in calls:
    grads = opt.get_unscaled_gradients(grads)
  opt.apply_gradients(zip(grads, [var]))
  return [r.getMessage() for r in caplog.records
          if 'You forgot to call' in r.getMessage()]


@pytest.mark.parametrize('calls,forgotten', [
    ((), 'get_scaled_loss() and LossScaleOptimizer.get_unscaled_gradients()'),
    (('get_scaled_loss',), 'get_unscaled_gradients()'),
    (('get_unscaled_gradients',), 'get_scaled_loss()'),
])
def test_a_forgotten_scaling_method_is_named_as_tf_keras_names_it(
    caplog, calls, forgotten):
  caplog.set_level(logging.WARNING)
  theirs = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD())
  # TF 2.4-2.15's `dynamic=`: its protocol from the start, even before a
  # scaling method is called (without it, Keras's class: no warning).
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(),
                                            dynamic=True)
  for opt, var in ((theirs, tf.Variable([1.0])),
                   (ours, keras.Variable([1.0]))):
    messages = _warnings(caplog, opt, var, calls)
    assert len(messages) == 1, (type(opt), messages)
    assert f'You forgot to call LossScaleOptimizer.{forgotten}' in messages[0]
  # Both methods called: no warning.
  assert not _warnings(
      caplog, mixed_precision.LossScaleOptimizer(keras.optimizers.SGD()),
      keras.Variable([1.0]), ('get_scaled_loss', 'get_unscaled_gradients'))


# ---- Keras's class until a TF 2.4-2.15 method is called ---------------------
# Under `compat.install()` `shared_name`'s class is `keras.mixed_precision.
# LossScaleOptimizer`: a Keras 3 program that calls no TF 2.4-2.15 method
# must see Keras's class (`tests/test_compat_keras_behaviour.py` runs these
# programs under that name). The library's own TF 2.4-2.15 class is
# tf_keras's from the start.


def _caller_scaled_steps(opt, apply):
  """Keras's own pattern: the caller scales the loss, `apply` unscales.

  A step of infinite gradients (skipped), then one of the loss
  sum(var * [0.5, 3, 3.5, 1]) times the scale, from [1, 2, 3, 4], SGD(1).
  """
  var = keras.Variable([1.0, 2.0, 3.0, 4.0])
  apply(opt, [tf.constant([np.inf, 0.0, 0.0, 0.0])], var)
  after_skip = int(opt.iterations.numpy())
  scale = tf.convert_to_tensor(opt.dynamic_scale)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(var * [0.5, 3.0, 3.5, 1.0]) * scale
  apply(opt, tape.gradient(loss, [var]), var)
  return (var.numpy().tolist(), after_skip, int(opt.iterations.numpy()),
          float(scale))


def _apply(opt, grads, var):
  opt.apply(grads, [var])


def _stateless_apply(opt, grads, var):
  if not opt.built:
    opt.build([var])
  new_vars, new_opt = opt.stateless_apply(
      [v.value for v in opt.variables], grads, [var.value])
  var.assign(new_vars[0])
  for variable, value in zip(opt.variables, new_opt):
    variable.assign(value)


@pytest.mark.parametrize('apply', [_apply, _stateless_apply])
def test_apply_takes_gradients_of_the_scaled_loss_as_keras_class(apply):
  ours = _caller_scaled_steps(
      shared_name.LossScaleOptimizer(keras.optimizers.SGD(1.0)), apply)
  # Keras's stateless_apply refuses the TensorFlow backend: its `apply`.
  assert ours == _caller_scaled_steps(
      keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0)), _apply)
  # Skipped (not counted, the scale halved), then applied unscaled. Keras's
  # class before 3.9 counts in a counter that stays at 0 (Keras's bug).
  assert ours == ([0.5, -1.0, -0.5, 3.0], 0,
                  1 if versions.KERAS_CLASS_COUNTS_STEPS else 0, 16384.0)


def test_apply_gradients_takes_plain_gradients_after_fit_as_tf_keras():
  # TF 2.4-2.15 code: `fit`, then an apply of gradients it computed itself.
  def run(api, opt):
    model = _dense_model(api)
    model.compile(opt, 'mse')
    x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
    model.fit(x, np.ones((4, 2), np.float32), batch_size=4, verbose=0)
    kernel = model.trainable_variables[0]
    before = np.asarray(kernel.numpy())
    opt.apply_gradients([(tf.ones((3, 2)), kernel)])
    return (np.asarray(kernel.numpy()) - before).tolist()

  ours = run(keras, mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.5), dynamic=True))
  theirs = run(tf_keras, tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.5)))
  assert ours == theirs == [[-0.5, -0.5]] * 3
  # The class under Keras's name, constructed as Keras 3's, no TF 2.4-2.15
  # method called: the gradients are of the scaled loss (2**15), as
  # Keras's class takes them.
  as_keras = run(keras, shared_name.LossScaleOptimizer(
      keras.optimizers.SGD(0.5)))
  assert as_keras == run(keras, keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.5))) == [[-0.5 / 2**15, -0.5 / 2**15]] * 3


def _scales_after_overflows(opt, tf24_call):
  var = keras.Variable([1.0])
  if tf24_call:
    opt.get_scaled_loss(tf.constant(1.0))
    opt.get_unscaled_gradients([tf.constant([1.0])])
  scales = []
  for _ in range(2):
    opt.apply_gradients([(tf.constant([np.inf]), var)]
                        ) if tf24_call else opt.apply([tf.constant([np.inf])],
                                                      [var])
    scales.append(float(tf.convert_to_tensor(opt.dynamic_scale)))
  return scales


def test_a_dynamic_scale_has_keras_floor_until_a_tf24_method_is_called():
  def make(api):
    return api.mixed_precision.LossScaleOptimizer(api.optimizers.SGD(1.0),
                                                  initial_scale=1.0)

  # Keras's class halves past 1 (its scale has no floor).
  assert _scales_after_overflows(make(keras), False) == [0.5, 0.25]
  assert _scales_after_overflows(
      shared_name.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                         initial_scale=1.0),
      False) == [0.5, 0.25]
  # tf_keras's stops at 1; so does this class once TF 2.4-2.15's methods
  # are called.
  theirs = make(tf_keras)
  var = tf.Variable([1.0])
  theirs.apply_gradients([(tf.constant([np.inf]), var)])
  assert float(theirs.loss_scale) == 1.0
  assert _scales_after_overflows(
      shared_name.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                         initial_scale=1.0),
      True) == [1.0, 1.0]


@pytest.mark.parametrize('kwargs', [
    {'dynamic': 1}, {'dynamic': 1, 'initial_scale': 1024},
    {'dynamic': 'dynamic'}])
def test_dynamic_by_name_must_be_a_bool_as_tf_keras(kwargs):
  with pytest.raises(TypeError, match='"dynamic" argument to '
                     'LossScaleOptimizer.__init__ must be a bool'):
    tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(),
                                                **kwargs)
  with pytest.raises(TypeError, match='"dynamic" argument to '
                     r'LossScaleOptimizer.__init__ must be a bool, but got: '
                     f'{kwargs["dynamic"]!r}'):
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)


def test_positional_arguments_are_keras_3s_for_a_number_tf24s_for_a_bool():
  keras3 = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), 1024, 7)
  assert (keras3.dynamic, keras3.initial_scale, keras3.dynamic_growth_steps
         ) == (True, 1024.0, 7)
  tf24 = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), False,
                                            128)
  assert (tf24.dynamic, tf24.initial_scale) == (False, 128.0)
  with pytest.raises(TypeError, match="multiple values for argument "
                     "'initial_scale'"):
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), 1024,
                                       initial_scale=8)


def test_iterations_is_a_keras_variable_until_a_tf24_method_is_called():
  ours = shared_name.LossScaleOptimizer(keras.optimizers.SGD())
  keras_class = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
  assert type(ours.iterations) is type(keras_class.iterations)
  for opt in (ours, keras_class):
    assert type(opt.iterations).__module__.startswith('keras.')
    assert opt.iterations.path.endswith('iteration')
    assert isinstance(opt.iterations.value, tf.Variable)  # A property.
  ours.get_scaled_loss(tf.constant(1.0))
  assert isinstance(ours.iterations, tf.Variable)
  assert isinstance(
      shared_name.LossScaleOptimizer(keras.optimizers.SGD(),
                                         dynamic=True).iterations,
      tf.Variable)


def test_numpy_gradients_are_unscaled_as_tf_keras():
  grads = [np.array([2.0, 4.0], np.float32), np.float32(8.0)]
  theirs = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(), initial_scale=2.0)
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(),
                                            initial_scale=2.0)
  expected = [[1.0, 2.0], 4.0]
  for opt in (theirs, ours):
    assert [np.asarray(g).tolist()
            for g in opt.get_unscaled_gradients(grads)] == expected


def test_scaling_in_a_function_traced_once_warns_nothing_as_tf_keras(caplog):
  caplog.set_level(logging.WARNING)

  def three_steps(opt, var):
    @tf.function
    def scaled_gradients():
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * 2.0))
      return tape.gradient(loss, [var])

    for _ in range(3):
      grads = opt.get_unscaled_gradients(scaled_gradients())
      opt.apply_gradients(zip(grads, [var]))
    return var.numpy().tolist()

  ours = three_steps(mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.5)), keras.Variable([1.0]))
  theirs = three_steps(tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.5)), tf.Variable([1.0]))
  assert ours == theirs == [-2.0]
  assert not [r for r in caplog.records if 'forgot' in r.getMessage()]


def test_mismatched_counts_are_named_as_counts():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
  var = keras.Variable([1.0])
  with pytest.raises(ValueError,
                     match=r'apply\(\) got 2 gradients for 1 variables'):
    opt.apply([tf.constant([1.0]), tf.constant([1.0])], [var])


# ---- Keras's class in everything, until a TF 2.4-2.15 call -----------------


def _no_config_schedule(api):
  """A user's schedule without `get_config`, as many are written."""

  class NoConfig(api.optimizers.schedules.LearningRateSchedule):

    def __call__(self, step):
      return tf.constant(0.25)

  return NoConfig()


def test_settings_are_the_wrappers_own_until_a_tf24_call_as_keras_class():
  def settings(cls):
    inner = keras.optimizers.SGD(0.5)
    opt = cls(inner)
    opt.clipvalue = 0.1
    return opt.use_ema, opt.clipvalue, inner.clipvalue

  # Keras's class ignores a clip set on the wrapper; its use_ema is False.
  assert settings(keras.optimizers.LossScaleOptimizer) == (False, 0.1, None)
  assert settings(shared_name.LossScaleOptimizer) == (False, 0.1, None)
  # Once a TF 2.4-2.15 method is called, tf_keras's forwarding.
  inner = keras.optimizers.SGD(0.5)
  opt = shared_name.LossScaleOptimizer(inner)
  opt.get_scaled_loss(tf.constant(1.0))
  opt.clipvalue = 0.2
  assert (opt.clipvalue, inner.clipvalue) == (0.2, 0.2)


def test_a_second_wrapper_of_one_optimizer_is_taken_as_keras_class_takes_it():
  inner = keras.optimizers.SGD(0.5)
  first = shared_name.LossScaleOptimizer(inner)
  second = shared_name.LossScaleOptimizer(inner)
  assert first.inner_optimizer is second.inner_optimizer is inner
  keras.optimizers.LossScaleOptimizer(inner)  # Keras's class takes it too.
  # TF 2.4-2.15's class (and `dynamic=`) refuses it, as tf_keras's did.
  with pytest.raises(ValueError, match='already wrapped'):
    mixed_precision.LossScaleOptimizer(inner)
  held = keras.optimizers.SGD(0.5)
  holder = shared_name.LossScaleOptimizer(held, dynamic=True)
  with pytest.raises(ValueError, match='already wrapped'):
    shared_name.LossScaleOptimizer(held, dynamic=True)
  assert holder.inner_optimizer is held


@pytest.mark.parametrize('cls', [shared_name.LossScaleOptimizer,
                                 mixed_precision.LossScaleOptimizer])
def test_base_optimizer_arguments_are_refused_with_keras_messages(cls):
  for name, value in (('clipnorm', 0.5), ('use_ema', True),
                      ('gradient_accumulation_steps', 2)):
    with pytest.raises(ValueError, match=(
        f'LossScaleOptimizer does not support `{name}`. Instead, set '
        f'`{name}` on the `inner_optimizer`.')):
      cls(keras.optimizers.SGD(), **{name: value})
  with pytest.raises(ValueError, match='does not support arguments: `foo`'):
    cls(keras.optimizers.SGD(), foo=1)
  # Keras's words for dynamic=False, beside TF 2.4-2.15's.
  with pytest.raises(ValueError, match=r'set `loss_scale_factor`.*'
                     'inner_optimizer'):
    cls(keras.optimizers.SGD(), dynamic=False)
  # At their defaults (as old configs hold them), they are taken.
  assert cls(keras.optimizers.SGD(), clipnorm=None, use_ema=False).dynamic


def test_a_schedule_without_config_or_a_lambda_is_never_serialized(
    caplog, recwarn):
  caplog.set_level(logging.WARNING)
  var = keras.Variable([1.0, 2.0])
  experimental = tf_loss_scale.keras.experimental.LossScaleOptimizer
  for api, make in (
      (keras, lambda lr: shared_name.LossScaleOptimizer(
          keras.optimizers.SGD(lr))),
      (keras, lambda lr: mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(lr))),
      (keras, lambda lr: tf_loss_scale.keras.LossScaleOptimizer(
          keras.optimizers.SGD(lr))),
      (keras, lambda lr: experimental(keras.optimizers.Adam(lr), 'dynamic')),
      (tf_keras, lambda lr: experimental(tf_keras.optimizers.Adam(lr),
                                         'dynamic'))):
    for lr in (_no_config_schedule(api), lambda: 0.25):
      opt = make(lr)
      if isinstance(opt, tf_loss_scale.keras.experimental.LossScaleOptimizer):
        v = tf.Variable([1.0, 2.0]) if isinstance(
            opt.inner_optimizer, tf_keras.optimizers.Optimizer) else var
        opt.apply_gradients([(tf.constant([1.0, 1.0]), v)])
        continue
      opt.apply([opt.scale_loss(tf.constant([1.0, 1.0]))], [var])
      if hasattr(opt, 'get_scaled_loss'):  # TF 2.4-2.15's forwarding too.
        opt.get_scaled_loss(tf.constant(1.0))
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
        assert float(opt.learning_rate) == 0.25
  assert not [w for w in recwarn if 'lambda' in str(w.message)]
  assert not [r for r in caplog.records if 'lambda' in r.getMessage()]


def _variable_names(opt):
  return [v.path.split('/', 1)[1] for v in opt.variables]


def test_an_unbuilt_wrapper_holds_keras_class_variables_until_a_tf24_call(
    tmp_path):
  def compiled(cls):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(cls(keras.optimizers.SGD(0.5)), 'mse')
    return model

  ours = compiled(shared_name.LossScaleOptimizer)
  keras_class = compiled(keras.optimizers.LossScaleOptimizer)
  assert _variable_names(ours.optimizer) == _variable_names(
      keras_class.optimizer) == ['iteration', 'learning_rate'] * 2
  # Weights saved before training load across the two classes, silently
  # and whole, both ways.
  for write, read in ((shared_name.LossScaleOptimizer,
                       keras.optimizers.LossScaleOptimizer),
                      (keras.optimizers.LossScaleOptimizer,
                       shared_name.LossScaleOptimizer)):
    writer, reader = compiled(write), compiled(read)
    path = str(tmp_path / f'{write.__module__}.weights.h5')
    writer.save_weights(path)
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      reader.load_weights(path)
  # TF 2.4-2.15's class, as tf_keras's, holds its scale from the start.
  assert _variable_names(mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.5))) == [
          'iteration', 'learning_rate', 'step_counter', 'dynamic_scale',
          'iteration', 'learning_rate']


def test_a_built_keras_class_values_go_to_their_variables_before_build():
  # What Keras's HDF5 loader does with a file of Keras's class: sets the
  # values of its built `variables` (the wrapper's own two, the scale's
  # counter and the scale, the inner count and rate, the slots) on the
  # optimizer it built for no variables. The class under Keras's name,
  # unbuilt, takes each value into its variable: the scale and counter at
  # once, as Keras's class; the count and rate, and the slots once built, as
  # TF 2.4-2.15's kept them.
  v = keras.Variable([1.0, 2.0])
  written = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.5, momentum=0.9))
  written.build([v])
  for variable, value in zip(written.variables,
                             [0, 0.0, 3, 8.0, 6, 0.25, [0.1, 0.2]]):
    variable.assign(value)
  ours = shared_name.LossScaleOptimizer(
      keras.optimizers.SGD(0.5, momentum=0.9))
  ours.set_weights([variable.numpy() for variable in written.variables])
  assert (int(ours.step_counter.numpy()), float(ours.dynamic_scale.numpy()),
          int(ours.inner_optimizer.iterations.numpy()),
          float(np.asarray(ours.inner_optimizer.learning_rate))) == (
              3, 8.0, 6, 0.25)
  ours.build([v])
  np.testing.assert_array_equal(ours.inner_optimizer.variables[2],
                                np.float32([0.1, 0.2]))
  assert _variable_names(ours) == _variable_names(written)
