"""TF 2.4-2.15's form under both protocols, its arguments, against the peers.

One optimizer of this form serves Keras 3's protocol (`scale_loss`, as
`fit` calls it) and TensorFlow's (`get_scaled_loss`/`get_unscaled_gradients`)
step by step: under the first it trains as Keras's own class, under the
second as tf_keras's class. Each test feeds the same losses to the peer.
"""

import logging

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
                   float(opt.loss_scale), int(opt.iterations)))

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
    assert o[1:] == t[1:], f'loss scale and iterations after stage {stage}'
  # The scale doubled every two steps across fit and the loop: 3, 6, 8 steps.
  assert [o[1:] for o in ours] == [(8.0, 3), (32.0, 6), (64.0, 8)]


def test_keras_3_arguments_and_name_are_taken_as_keras_class_takes_them():
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), 1024.0,
                                            10, name='scaled')
  keras_class = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(), 1024.0, 10, name='scaled')
  for opt in (ours, keras_class):
    assert (opt.initial_scale, opt.dynamic_growth_steps, opt.name) == (
        1024.0, 10, 'scaled')
  assert ours.dynamic
  assert isinstance(keras_class, mixed_precision.LossScaleOptimizer)
  assert not isinstance(keras.optimizers.SGD(), mixed_precision.LossScaleOptimizer)


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
  ours.iterations.assign(5)
  var = keras.Variable([1.0])
  _tf24_step(ours, var)(tf.constant(1.0))
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
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
  for opt, var in ((theirs, tf.Variable([1.0])),
                   (ours, keras.Variable([1.0]))):
    messages = _warnings(caplog, opt, var, calls)
    assert len(messages) == 1, (type(opt), messages)
    assert f'You forgot to call LossScaleOptimizer.{forgotten}' in messages[0]
  # Both methods called: no warning.
  assert not _warnings(
      caplog, mixed_precision.LossScaleOptimizer(keras.optimizers.SGD()),
      keras.Variable([1.0]), ('get_scaled_loss', 'get_unscaled_gradients'))
