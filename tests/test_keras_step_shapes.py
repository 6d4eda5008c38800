"""Every shape a step takes decides as the peer decides, step by step.

The class `compat.install()` puts under Keras's `LossScaleOptimizer` name
(`shared_name.LossScaleOptimizer`) serves Keras 3 programs as Keras's class
and TF 2.4-2.15 programs as tf_keras's. Which gradients its
`apply_gradients` takes is fixed by the methods the program calls, so it
must come out the same however the step runs: eagerly, in a `tf.function`
around all of it or around the gradients only, with `jit_compile`, on two
replicas of a MirroredStrategy (in one `strategy.run`, or split in two),
and with two applies after one `scale_loss`. Each shape is run on ours and
on the peer with the same losses; every step's weights, scale and count
are compared.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import versions

versions.KERAS_3.require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import tf_keras
from tf_loss_scale.keras.mixed_precision import shared_name
# pylint: enable=g-import-not-at-top,wrong-import-order

# What the loss multiplies each float16 weight by, per step: at a scale of
# 2**15, 4 overflows the scaled gradient (131072 > 65504) though its
# unscaled value is finite, and so does 2 once the scale has doubled back.
_FACTORS = [1.0, 4.0, 1.0, 1.0, 2.0, 0.5]
# The shapes on two replicas need Keras's optimizers to sum them (3.5 on).
_ON_REPLICAS = [pytest.param(shape, marks=versions.KERAS_SUMS_ACROSS_REPLICAS
                             .mark) for shape in ('mirrored', 'mirrored_split')]
_SHAPES = ['eager', 'function', 'function_gradients', 'jit'] + _ON_REPLICAS


def _keras3_parts(opt, var):
  """Keras 3's loop: `scale_loss`, gradients of the scaled loss, apply."""
  def gradients(factor):
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(tf.reduce_sum(var * factor))
    return tape.gradient(loss, [var])

  def apply(grads):
    opt.apply_gradients(zip(grads, [var]))

  return gradients, apply


def _tf24_parts(opt, var):
  """TF 2.4-2.15's loop: the gradients unscaled before `apply_gradients`."""
  def gradients(factor):
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.reduce_sum(var * factor))
    return opt.get_unscaled_gradients(tape.gradient(loss, [var]))

  def apply(grads):
    opt.apply_gradients(zip(grads, [var]))

  return gradients, apply


def _scale(opt):
  scale = getattr(opt, 'loss_scale', None)
  return float(tf.convert_to_tensor(
      opt.dynamic_scale if scale is None else scale))


def _trajectory(make_opt, make_var, parts, shape, mirrored):
  """Per step: the weights, the loss scale and the inner count."""
  strategy = (mirrored if shape.startswith('mirrored') else
              tf.distribute.get_strategy())
  with strategy.scope():
    opt = make_opt()
    var = make_var(np.array([1.0, -2.0], np.float16), dtype='float16')
    if isinstance(opt, keras.optimizers.Optimizer):
      # Built, as after `fit`: an unbuilt Keras class scales a loss traced
      # in a function by its initial scale for good (docs/differences.md).
      opt.build([var])
  gradients, apply = parts(opt, var)

  def whole(factor):
    apply(gradients(factor))

  if shape == 'eager':
    step = whole
  elif shape == 'function':
    step = tf.function(whole)
  elif shape == 'jit':
    step = tf.function(whole, jit_compile=True)
  elif shape == 'function_gradients':
    traced = tf.function(gradients)
    step = lambda factor: apply(traced(factor))
  elif shape == 'mirrored':
    step = tf.function(lambda factor: strategy.run(whole, (factor,)))
  else:  # mirrored_split: the gradients, then the apply, in two runs.
    compute = tf.function(lambda factor: strategy.run(gradients, (factor,)))
    apply_run = tf.function(lambda grads: strategy.run(apply, (grads,)))
    step = lambda factor: apply_run(compute(factor))
  out = []
  for factor in _FACTORS:
    step(tf.constant(factor, tf.float16))
    out.append((np.asarray(tf.convert_to_tensor(var)).tolist(), _scale(opt),
                int(tf.convert_to_tensor(opt.inner_optimizer.iterations))))
  return out


def _assert_same(ours, theirs, what):
  for i, (o, t) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(o[0], t[0], rtol=1e-6,
                               err_msg=f'{what}: weights after step {i}')
    assert o[1:] == t[1:], f'{what}: (scale, iterations) after step {i}'


def _by_hand(counts_skipped, replicas):
  """The trajectory worked out by hand, SGD(0.125) from [1, -2].

  Steps 1 and 4 overflow: skipped, the scale halves; two finite steps in a
  row double it. A replica's gradient is the factor; two replicas' are
  summed. tf_keras counts a skipped step in `iterations`, Keras's class
  does not.
  """
  applied = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5]
  scales = [32768.0, 16384.0, 16384.0, 32768.0, 16384.0, 16384.0]
  out, moved, count = [], 0.0, 0
  for factor, scale in zip(applied, scales):
    moved += 0.125 * replicas * factor
    count += 1 if (factor or counts_skipped) else 0
    out.append(([1.0 - moved, -2.0 - moved], scale, count))
  return out


def _ours():
  return shared_name.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                        dynamic_growth_steps=2)


def _keras_class():
  return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                             dynamic_growth_steps=2)


def _tf_keras_class():
  return tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.125), dynamic_growth_steps=2)


# Per program: its loop, its peer (made, its variables, the shape it runs
# in: tf_keras's class eagerly, as in a tf.function Grappler reassociates
# its float16 products and it applies steps it skips eagerly), and whether
# a skipped step counts in `iterations`.
_PROGRAMS = {
    'keras_3_loop': (_keras3_parts, _keras_class, keras.Variable, None,
                     False),
    'tf24_loop': (_tf24_parts, _tf_keras_class, tf.Variable, 'eager', True),
}


@pytest.mark.parametrize('shape', _SHAPES)
@pytest.mark.parametrize('program', list(_PROGRAMS))
def test_a_loop_trains_as_its_peer_in_every_shape(program, shape,
                                                  mirrored_strategy):
  parts, peer, peer_variable, peer_shape, counts_skipped = _PROGRAMS[program]
  ours = _trajectory(_ours, keras.Variable, parts, shape, mirrored_strategy)
  mirrored = shape.startswith('mirrored')
  if not mirrored:
    # (The peers in a custom loop under a strategy: test_keras_distribute
    # runs Keras's class with `apply`; the values by hand cover it here.)
    _assert_same(ours, _trajectory(peer, peer_variable, parts,
                                   peer_shape or shape, mirrored_strategy),
                 f'{program}, {shape}')
  _assert_same(ours, _by_hand(counts_skipped, 2 if mirrored else 1),
               f'{program}, {shape}, by hand')


def test_two_applies_after_one_scale_loss_each_unscale_as_keras_class():
  def run(opt):
    var = keras.Variable([1.0, -2.0])
    opt.build([var])
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(tf.reduce_sum(var * 2.0))
    grads = tape.gradient(loss, [var])
    opt.apply_gradients(zip(grads, [var]))
    opt.apply_gradients(zip(grads, [var]))
    return var.numpy().tolist(), _scale(opt)

  ours = run(_ours())
  assert ours == run(_keras_class())
  # Each apply unscales 2 * 2**15 to 2: two steps of 0.125 * 2; the second
  # finite step doubles the scale.
  assert ours == ([0.5, -2.5], 65536.0)


def _sync_bn_fit(make_opt, strategy, steps=4):
  """`fit` of a SyncBN model under mixed_float16 on two replicas."""
  keras.utils.set_random_seed(1)
  keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    with strategy.scope():
      model = keras.Sequential([
          keras.Input((4,)),
          keras.layers.Dense(
              8, kernel_initializer=keras.initializers.Constant(0.1)),
          keras.layers.BatchNormalization(synchronized=True),
          keras.layers.Dense(
              1, kernel_initializer=keras.initializers.Constant(0.2),
              dtype='float32')])
      model.compile(make_opt(), 'mse')
    x = np.linspace(-2.0, 2.0, 64, dtype=np.float32).reshape(16, 4)
    y = np.sum(x, axis=1, keepdims=True) * 3.0
    losses = model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=steps,
                       shuffle=False, verbose=0).history['loss']
    return losses, [w.numpy() for w in model.weights]
  finally:
    keras.mixed_precision.set_global_policy('float32')


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_fit_with_sync_batch_norm_on_two_replicas_trains_as_keras_class(
    mirrored_strategy):
  make = lambda cls: lambda: cls(keras.optimizers.SGD(0.01), initial_scale=16)
  ours_losses, ours = _sync_bn_fit(make(shared_name.LossScaleOptimizer),
                                   mirrored_strategy)
  theirs_losses, theirs = _sync_bn_fit(
      make(keras.optimizers.LossScaleOptimizer), mirrored_strategy)
  np.testing.assert_allclose(ours_losses, theirs_losses, rtol=1e-5,
                             err_msg='losses per epoch')
  for i, (o, t) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-6,
                               err_msg=f'weight {i}')
  assert all(np.isfinite(loss) for loss in ours_losses)
