"""TF 2.1-2.3's experimental policy and the graph rewrite switches, installed.

Each Keras setting runs one fresh process (install(), policies and the graph
rewrite are process-wide) that reports what it saw; the tests below read it.
"""

import functools

import numpy as np
import pytest

import fresh_process
import keras_families
import v1_training
from test_compat import LEGACY_KERAS

_CHILD = r'''
import json, logging
import numpy as np
import tensorflow as tf
import tf_loss_scale
from tf_loss_scale import compat
from tf_loss_scale.keras import experimental
import v1_training

# The peers, before install() can rename anything.
keras_lso = tf.keras.mixed_precision.LossScaleOptimizer
tf_enable = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
tf_disable = tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite
original_compile = tf.keras.Model.compile
out = {}

def scale(ls):
  if ls is None:
    return None
  return [type(ls).__name__, float(ls()), ls.get_config()]

def error(fn):
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    return [type(e).__name__, str(e)]
  return None

compat.install(override=True)
mp = tf.keras.mixed_precision.experimental

# ---- Policy ----------------------------------------------------------------
shared = tf_loss_scale.DynamicLossScale(initial_loss_scale=8)
out['loss_scales'] = {
    'mixed_float16': scale(mp.Policy('mixed_float16').loss_scale),
    'mixed_bfloat16': scale(mp.Policy('mixed_bfloat16').loss_scale),
    'float32': scale(mp.Policy('float32').loss_scale),
    'mixed_float16, 1024': scale(mp.Policy('mixed_float16', 1024).loss_scale),
    'mixed_float16, dynamic': scale(
        mp.Policy('mixed_float16', 'dynamic').loss_scale),
    'mixed_float16, None': scale(mp.Policy('mixed_float16', None).loss_scale),
}
out['given_loss_scale_kept'] = (
    mp.Policy('mixed_float16', shared).loss_scale is shared)
out['repr'] = repr(mp.Policy('mixed_float16', 1024))
out['configs'] = [mp.Policy('mixed_float16').get_config(),
                  mp.Policy('float32', None).get_config()]
tf23_config = {'name': 'mixed_float16', 'loss_scale': {
    'class_name': 'DynamicLossScale', 'config': {
        'initial_loss_scale': 256.0, 'increment_period': 10,
        'multiplier': 2.0}}}
out['from_tf23_config'] = scale(mp.Policy.from_config(tf23_config).loss_scale)
out['round_trip'] = scale(mp.Policy.from_config(
    mp.Policy('mixed_float16', 64).get_config()).loss_scale)
out['bad_loss_scale'] = error(lambda: mp.Policy('mixed_float16', 'big'))

layer_policy = mp.Policy('mixed_float16', 16)
layer = tf.keras.layers.Dense(2, dtype=layer_policy)
y = layer(tf.ones([1, 3]))
out['layer'] = [mp.get_layer_policy(layer) is layer_policy, layer.compute_dtype,
                layer.variable_dtype, tf.as_dtype(y.dtype).name]
out['get_layer_policy_of_non_layer'] = error(lambda: mp.get_layer_policy(3))
mp.set_policy('mixed_float16')
out['global_policy'] = [type(mp.global_policy()).__name__,
                        scale(mp.global_policy().loss_scale),
                        mp.get_layer_policy(tf.keras.layers.Dense(1)) is
                        mp.global_policy()]
mp.set_policy(None)
out['reset_policy'] = [mp.global_policy().name,
                       scale(mp.global_policy().loss_scale)]

# ---- compile ---------------------------------------------------------------
def model(policy, seed=1):
  tf.keras.utils.set_random_seed(seed)
  inputs = tf.keras.Input((2,))
  outputs = tf.keras.layers.Dense(1, dtype=policy)(inputs)
  outputs = tf.keras.layers.Activation('linear', dtype='float32')(outputs)
  return tf.keras.Model(inputs, outputs)

def compiled(policy, optimizer):
  mp.set_policy(policy)
  m = model(policy)
  m.compile(optimizer, 'mse')
  mp.set_policy(None)
  return m

def describe(m):
  opt = m.optimizer
  return [type(opt).__module__ + '.' + type(opt).__name__,
          scale(getattr(opt, 'loss_scale', None)) if isinstance(
              opt, experimental.LossScaleOptimizer) else None]

policy = mp.Policy('mixed_float16', tf_loss_scale.DynamicLossScale(
    initial_loss_scale=1024, increment_period=1000))
sgd = tf.keras.optimizers.SGD(0.01)
m = compiled(policy, sgd)
out['compile'] = describe(m) + [m.optimizer.loss_scale is policy.loss_scale,
                                m.optimizer.inner_optimizer is sgd]
out['compile_string'] = describe(compiled(mp.Policy('mixed_float16', 4), 'sgd'))
mine = experimental.LossScaleOptimizer(tf.keras.optimizers.SGD(), 8)
out['compile_keeps_wrapper'] = (
    compiled(mp.Policy('mixed_float16', 4), mine).optimizer is mine)
out['compile_no_loss_scale'] = describe(
    compiled(mp.Policy('mixed_float16', None), 'sgd'))
out['compile_float32'] = describe(compiled(mp.Policy('float32'), 'sgd'))

# fit with the policy's loss scale, against Keras's own class on the same
# model and data; then a batch with an inf is skipped.
x = np.random.RandomState(0).uniform(-1, 1, (32, 2)).astype('float32')
y = x @ np.array([[0.5], [-1.0]], 'float32')
x_inf = x[:8].copy()
x_inf[0, 0] = np.inf
try:
  peer = model('mixed_float16')
  peer.compile(keras_lso(tf.keras.optimizers.SGD(0.01), initial_scale=1024),
               'mse')
  peer.fit(x, y, batch_size=8, epochs=2, verbose=0)
  m.fit(x, y, batch_size=8, epochs=2, verbose=0)
  before = [w.tolist() for w in m.get_weights()]
  same_as_peer = all(np.array_equal(a, b) for a, b in
                     zip(m.get_weights(), peer.get_weights()))
  good_steps = int(policy.loss_scale.good_steps.numpy())
  m.train_on_batch(x_inf, y[:8])
  out['fit'] = {
      'same_as_peer': same_as_peer,
      'good_steps': good_steps,
      'weights_moved': before[0] != model(policy).get_weights()[0].tolist(),
      'skip_kept_weights': before == [w.tolist() for w in m.get_weights()],
      'scale_after_inf': float(policy.loss_scale()),
  }
except Exception as e:  # pylint: disable=broad-except
  out['fit'] = {'error': f'{type(e).__name__}: {e}'}

# ---- the graph rewrite -----------------------------------------------------
def rewrite_option():
  return tf.config.optimizer.get_experimental_options().get(
      'auto_mixed_precision', False)

warnings = []
handler = logging.Handler()
handler.emit = lambda record: warnings.append(record.getMessage())
tf.get_logger().addHandler(handler)
rewrite = {'before': rewrite_option()}
v1_opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.compat.v1.train.GradientDescentOptimizer(0.1))
rewrite['v1'] = [type(v1_opt).__name__,
                 type(v1_opt) is tf_loss_scale.MixedPrecisionLossScaleOptimizer]
rewrite['on'] = [rewrite_option(),
                 tf.__internal__.train.is_mixed_precision_graph_rewrite_enabled()]
keras_opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD(0.1), loss_scale=128)
rewrite['keras'] = [isinstance(keras_opt, experimental.LossScaleOptimizer),
                    scale(keras_opt.loss_scale)]
rewrite['wrapped_again'] = error(
    lambda: tf.train.experimental.enable_mixed_precision_graph_rewrite(v1_opt))
try:
  tf.train.experimental.enable_mixed_precision_graph_rewrite(v1_opt)
except ValueError:  # TensorFlow's type, as code written for it catches it.
  rewrite['wrapped_again_caught_as_value_error'] = True
rewrite['not_an_optimizer'] = error(
    lambda: tf.train.experimental.enable_mixed_precision_graph_rewrite(3))
tf.train.experimental.disable_mixed_precision_graph_rewrite()
rewrite['off'] = [rewrite_option(),
                  tf.__internal__.train.is_mixed_precision_graph_rewrite_enabled()]
warnings.clear()
tf.train.experimental.disable_mixed_precision_graph_rewrite()
rewrite['warned_when_off'] = any('already disabled' in w for w in warnings)
rewrite['deprecation_notices'] = [w for w in warnings if 'deprecat' in w]
rewrite['v1_names_ours'] = [
    tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite is
    tf.train.experimental.enable_mixed_precision_graph_rewrite,
    tf.compat.v1.train.experimental.disable_mixed_precision_graph_rewrite is
    tf.train.experimental.disable_mixed_precision_graph_rewrite]

# A TF1 session step with the optimizer each rewrite returned.
steps = v1_training.random_steps(seed=3, count=12)
def session_run(enable, disable):
  make = lambda opt, loss_scale: enable(opt, loss_scale)
  records = v1_training.train((make,), v1_training.OPTIMIZERS['momentum'],
                              lambda classes: 'dynamic', steps, 'graph')
  disable()
  return [{k: np.asarray(v).tolist() for k, v in r.items()} for r in records]
rewrite['session'] = {
    'ours': session_run(
        tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite,
        tf.compat.v1.mixed_precision.disable_mixed_precision_graph_rewrite),
    'theirs': session_run(tf_enable, tf_disable)}
out['rewrite'] = rewrite

compat.uninstall()
out['uninstalled'] = [
    tf.keras.Model.compile is original_compile,
    tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite is tf_enable,
    tf.compat.v1.train.experimental.disable_mixed_precision_graph_rewrite is
    tf_disable,
    hasattr(tf.train.experimental, 'enable_mixed_precision_graph_rewrite')]
print(json.dumps(out))
'''


@functools.lru_cache(maxsize=None)
def _child(legacy_keras):
  return fresh_process.run_json(['-c', _CHILD], legacy_keras, timeout=600)


def _keras3(legacy_keras):
  return keras_families.tf_keras_can_be_keras3() and not legacy_keras


def _dynamic(initial, period=2000):
  return ['DynamicLossScale', initial, {
      'initial_loss_scale': initial, 'increment_period': period,
      'multiplier': 2.0}]


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_policy_loss_scale_as_tf23_defined_it(legacy_keras):
  out = _child(legacy_keras)
  # TF 2.3: 'mixed_float16' defaults to a dynamic scale (2**15, doubling
  # every 2000 finite steps), other policies to none; a number is fixed.
  assert out['loss_scales'] == {
      'mixed_float16': _dynamic(32768.0),
      'mixed_bfloat16': None,
      'float32': None,
      'mixed_float16, 1024': ['FixedLossScale', 1024.0,
                              {'loss_scale_value': 1024.0}],
      'mixed_float16, dynamic': _dynamic(32768.0),
      'mixed_float16, None': None,
  }
  assert out['given_loss_scale_kept']
  assert out['repr'] == (
      '<Policy "mixed_float16", loss_scale=FixedLossScale(1024.0)>')
  # The default loss scale is left out of the config, as in TF 2.3.
  assert out['configs'] == [{'name': 'mixed_float16'},
                            {'name': 'float32', 'loss_scale': None}]
  assert out['from_tf23_config'] == _dynamic(256.0, 10)
  assert out['round_trip'] == ['FixedLossScale', 64.0,
                               {'loss_scale_value': 64.0}]
  assert out['bad_loss_scale'][0] == 'ValueError'
  assert "'big'" in out['bad_loss_scale'][1]


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_layers_take_the_policy_and_get_layer_policy_returns_it(legacy_keras):
  out = _child(legacy_keras)
  assert out['layer'] == [True, 'float16', 'float32', 'float16']
  assert out['get_layer_policy_of_non_layer'][0] == 'ValueError'
  # set_policy('mixed_float16') made TF 2.3's Policy, dynamic scale included,
  # and new layers use that very policy; None goes back to float32.
  assert out['global_policy'] == ['Policy', _dynamic(32768.0), True]
  assert out['reset_policy'] == ['float32', None]


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_compile_wraps_with_the_policy_loss_scale(legacy_keras):
  out = _child(legacy_keras)
  kind, loss_scale, same_loss_scale, same_inner = out['compile']
  assert kind.startswith('tf_loss_scale.keras.experimental'), kind
  assert loss_scale == _dynamic(1024.0, 1000)
  assert same_loss_scale and same_inner
  kind, loss_scale = out['compile_string']
  assert kind.startswith('tf_loss_scale.keras.experimental'), kind
  assert loss_scale == ['FixedLossScale', 4.0, {'loss_scale_value': 4.0}]
  assert out['compile_keeps_wrapper']
  assert out['compile_float32'][0].endswith('SGD'), out['compile_float32']
  # A float16 Policy with no loss scale: TF 2.3 trained without one, and so
  # does Keras 3 (told so); tf_keras's compile wraps any mixed_float16 model.
  no_scale = out['compile_no_loss_scale'][0]
  if _keras3(legacy_keras):
    assert no_scale.endswith('SGD'), no_scale
  else:
    assert 'LossScaleOptimizer' in no_scale, no_scale


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_fit_trains_like_keras_and_skips_an_inf_batch(legacy_keras):
  fit = _child(legacy_keras)['fit']
  assert 'error' not in fit, fit['error']
  assert fit['same_as_peer'] and fit['weights_moved']
  assert fit['good_steps'] == 8  # 2 epochs of 4 finite batches.
  assert fit['skip_kept_weights']
  assert fit['scale_after_inf'] == 512.0


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_graph_rewrite_switches_tensorflow_rewrite_and_wraps_with_ours(
    legacy_keras):
  rewrite = _child(legacy_keras)['rewrite']
  assert rewrite['before'] is False
  assert rewrite['v1'] == ['MixedPrecisionLossScaleOptimizer', True]
  # On for tf.functions and Sessions without a config (the grappler option)
  # and for Sessions with one (the flag TensorFlow's Session reads).
  assert rewrite['on'] == [True, True]
  assert rewrite['keras'] == [True, ['FixedLossScale', 128.0,
                                     {'loss_scale_value': 128.0}]]
  # Both a TypeError (tf_keras's) and a ValueError (TensorFlow's).
  assert rewrite['wrapped_again'][0] == 'WrapsAWrapperError'
  assert rewrite['wrapped_again_caught_as_value_error']
  assert rewrite['not_an_optimizer'][0] == 'ValueError'
  assert rewrite['off'] == [False, False]
  assert rewrite['warned_when_off']
  assert not rewrite['deprecation_notices'], rewrite['deprecation_notices']
  assert rewrite['v1_names_ours'] == [True, True]


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_graph_rewrite_session_trains_and_skips_as_tensorflow(legacy_keras):
  session = _child(legacy_keras)['rewrite']['session']
  applied = v1_training.applied_steps(session['ours'])
  assert True in applied and False in applied, applied
  v1_training.assert_same_trajectory(
      [{k: np.array(v) for k, v in r.items()} for r in session['ours']],
      [{k: np.array(v) for k, v in r.items()} for r in session['theirs']])


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_uninstall_restores_compile_and_the_rewrite_names(legacy_keras):
  assert _child(legacy_keras)['uninstalled'] == [True, True, True, False]
