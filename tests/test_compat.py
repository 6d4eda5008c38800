"""Tests for tf_loss_scale.compat: opt-in legacy names."""

import functools
import importlib
import os
import sys

import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import compat
from tf_loss_scale.keras import experimental

import fresh_process
import keras_families

_LEGACY_SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'legacy')
_GUIDE_LOOP = 'tf23_custom_training_loop.py'
_COMPILE_FIT = 'tf23_compile_fit.py'


# Whether a child process runs with TF_USE_LEGACY_KERAS=1: TensorFlow's
# default tf.keras (Keras 3 on 2.16+, Keras 2 before), or tf_keras on 2.16+.
LEGACY_KERAS = [
    pytest.param(False, id='default'),
    pytest.param(True, id='legacy_keras', marks=pytest.mark.skipif(
        not keras_families.tf_keras_can_be_keras3(),
        reason='TF_USE_LEGACY_KERAS=1 is for TensorFlow 2.16+ (tf.keras is '
        'Keras 2 already here)')),
]
# The child process setting in which tf.keras is Keras 2.
KERAS2_IS_TF_KERAS = keras_families.tf_keras_can_be_keras3()
# The package whose classes tf.keras holds, e.g. keras or tf_keras.
TF_KERAS_PACKAGE = importlib.import_module(
    tf.keras.mixed_precision.Policy.__module__.split('.')[0])


@pytest.fixture
def installed():
  compat.install()
  yield
  compat.uninstall()
  tf.keras.mixed_precision.set_global_policy('float32')


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_importing_changes_nothing(legacy_keras):
  code = (
      'import json, sys, tensorflow as tf, tf_loss_scale.compat as c\n'
      'print(json.dumps([hasattr(tf.keras.mixed_precision, "experimental"),\n'
      '  hasattr(tf.train.experimental, "DynamicLossScale"),\n'
      '  hasattr(tf, "mixed_precision"), c.is_installed(),\n'
      '  "tf_loss_scale.keras.experimental" in sys.modules]))\n')
  assert fresh_process.run_json(['-c', code], legacy_keras) == [
      False, False, False, False, False]


def test_install_puts_library_classes_under_legacy_names(installed):
  from tensorflow.keras.mixed_precision import experimental as mp  # pylint: disable=g-import-not-at-top
  assert mp.LossScaleOptimizer is experimental.LossScaleOptimizer
  # TF 2.3's policy with a loss scale, a policy of the Keras tf.keras is.
  assert mp.Policy is experimental.Policy
  assert issubclass(mp.Policy, tf.keras.mixed_precision.Policy)
  for name in ('set_policy', 'global_policy', 'get_layer_policy'):
    assert getattr(mp, name) is getattr(experimental, name)
  assert tf.keras.mixed_precision.experimental is mp
  assert TF_KERAS_PACKAGE.mixed_precision.experimental is mp
  for name in ('LossScale', 'FixedLossScale', 'DynamicLossScale'):
    assert getattr(tf.train.experimental, name) is getattr(tf_loss_scale, name)
    assert (getattr(tf.mixed_precision.experimental, name)
            is getattr(tf_loss_scale, name))
  assert sys.modules['tensorflow.mixed_precision.experimental'] is (
      tf.mixed_precision.experimental)


def test_names_tensorflow_still_has_are_left_alone_without_override(installed):
  assert (tf.compat.v1.mixed_precision.DynamicLossScale
          is not tf_loss_scale.DynamicLossScale)
  assert (tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
          is not tf_loss_scale.MixedPrecisionLossScaleOptimizer)


def test_override_replaces_and_uninstall_restores_v1_names():
  original = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
  original_scale = tf.compat.v1.train.experimental.DynamicLossScale
  compat.install(override=True)
  try:
    assert (tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
            is tf_loss_scale.MixedPrecisionLossScaleOptimizer)
    assert (tf.compat.v1.train.experimental.DynamicLossScale
            is tf_loss_scale.DynamicLossScale)
  finally:
    compat.uninstall()
  assert tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer is original
  assert tf.compat.v1.train.experimental.DynamicLossScale is original_scale


def test_install_is_idempotent_and_uninstall_removes_everything():
  compat.install()
  compat.install()
  assert compat.is_installed()
  compat.uninstall()
  compat.uninstall()
  assert not compat.is_installed()
  assert not hasattr(TF_KERAS_PACKAGE.mixed_precision, 'experimental')
  assert not hasattr(tf.keras.mixed_precision, 'experimental')
  assert not hasattr(tf.train.experimental, 'DynamicLossScale')
  assert not hasattr(tf.train.experimental,
                     'enable_mixed_precision_graph_rewrite')
  assert 'tensorflow.keras.mixed_precision.experimental' not in sys.modules
  assert 'tensorflow.mixed_precision.experimental' not in sys.modules


_NAMES_WHERE_TF_KERAS_IS_KERAS2 = '''
import importlib, json, sys
import tensorflow as tf
import tf_loss_scale
from tf_loss_scale.keras import experimental

# The Keras 2 package tf.keras is: keras 2.x (TF <= 2.15) or tf_keras.
package = importlib.import_module(
    tf.keras.mixed_precision.Policy.__module__.split('.')[0])
compile_before = vars(tf.keras.Model).get('compile')
tf_loss_scale.compat.install()
from tensorflow.keras.mixed_precision import experimental as mp
names = {
    'tf.keras is Keras 2': hasattr(tf.keras.optimizers, 'legacy') and not
        hasattr(tf.keras.optimizers.Optimizer, 'stateless_apply'),
    'LossScaleOptimizer': (
        mp.LossScaleOptimizer is experimental.LossScaleOptimizer),
    'Policy': issubclass(mp.Policy, tf.keras.mixed_precision.Policy),
    'tf.keras.mixed_precision.experimental': (
        tf.keras.mixed_precision.experimental is mp),
    package.__name__ + '.mixed_precision.experimental': (
        package.mixed_precision.experimental is mp),
}
v1 = tf.compat.v1.keras.mixed_precision
if type(v1).__delattr__ is type(sys).__delattr__:
  # A plain module (TensorFlow 2.12's lazy wrapper could not forget it).
  names['tf.compat.v1.keras.mixed_precision.experimental'] = (
      v1.experimental is mp)
for name in ('LossScale', 'FixedLossScale', 'DynamicLossScale'):
  ours = getattr(tf_loss_scale, name)
  names['tf.train.experimental.' + name] = (
      getattr(tf.train.experimental, name) is ours)
  names['tf.mixed_precision.experimental.' + name] = (
      getattr(tf.mixed_precision.experimental, name) is ours)
mp.set_policy('mixed_float16')
names['set_policy sets the policy of tf.keras layers'] = (
    tf.keras.layers.Dense(1).dtype_policy.name == 'mixed_float16')
mp.set_policy('float32')
tf_loss_scale.compat.uninstall()
names['uninstall removes them'] = not (
    hasattr(tf.keras.mixed_precision, 'experimental') or
    hasattr(package.mixed_precision, 'experimental') or
    hasattr(tf.compat.v1.keras.mixed_precision, 'experimental') or
    'tensorflow.keras.mixed_precision.experimental' in sys.modules or
    hasattr(tf.train.experimental, 'DynamicLossScale') or
    hasattr(tf, 'mixed_precision') or
    vars(tf.keras.Model).get('compile') is not compile_before)
print(json.dumps(names))
'''


def test_install_where_tf_keras_is_keras2_puts_its_names_under_legacy_names():
  # tf.keras is Keras 2 (keras 2.x on TF <= 2.15, tf_keras under
  # TF_USE_LEGACY_KERAS=1 on 2.16+), so Policy and set_policy must be its
  # own (Keras 3's would not reach its layers).
  names = fresh_process.run_json(['-c', _NAMES_WHERE_TF_KERAS_IS_KERAS2],
                                 legacy_keras=KERAS2_IS_TF_KERAS)
  wrong = [name for name, ok in names.items() if not ok]
  assert not wrong, f'where tf.keras is Keras 2, wrong: {wrong}'


@functools.lru_cache(maxsize=None)
def _run_legacy_scripts(legacy_keras):
  """Both TF 2.3-era scripts, in one fresh process after compat.install()."""
  return fresh_process.run_json(
      [os.path.join(_LEGACY_SCRIPTS, 'run_after_install.py'),
       os.path.join(_LEGACY_SCRIPTS, _GUIDE_LOOP),
       os.path.join(_LEGACY_SCRIPTS, _COMPILE_FIT)],
      legacy_keras=legacy_keras, timeout=600)


def _script_run(script, legacy_keras):
  run = _run_legacy_scripts(legacy_keras)[script]
  keras_name = 'tf_keras' if legacy_keras else 'the default tf.keras'
  assert 'error' not in run, f'{script} under {keras_name}:\n{run["error"]}'
  # The mixed precision names were the Keras tf.keras is, and they took
  # effect: float16 compute in the layers, float32 outputs.
  assert run['policy_package'] == ('tf_keras' if legacy_keras else 'keras')
  assert run['global_policy'] == 'mixed_float16'
  assert set(run['layer_policies']) == {'mixed_float16'}, run['layer_policies']
  assert run['output_dtype'] == 'float32'
  assert run['optimizer'].startswith('tf_loss_scale.keras.'), run['optimizer']
  assert run['loss_scale_class'] == 'tf_loss_scale.loss_scale.DynamicLossScale'
  return run


def _assert_trained(run, expected_state, min_test_accuracy):
  """The loss scale ended as expected and the run with it learned."""
  state = (run['loss_scale'], run['good_steps'], run['skipped_steps'],
           run['iterations'])
  assert state == expected_state, (
      f'(loss scale, good steps, skipped steps, iterations) = {state}')
  losses = run['losses']
  assert losses[-1] < losses[0] / 2, f'epoch losses did not fall: {losses}'
  assert run['test_accuracy'] > min_test_accuracy, run


@pytest.mark.parametrize('legacy_keras', LEGACY_KERAS)
def test_tf23_mixed_precision_guide_runs_unmodified_after_install(
    legacy_keras):
  run = _script_run(_GUIDE_LOOP, legacy_keras)
  # The guide's fit: compile under Policy('mixed_float16') wrapped the plain
  # RMSprop in the experimental LossScaleOptimizer with the policy's dynamic
  # loss scale, as TF 2.3 did, and the loss fell.
  assert run['compiled_optimizer'].startswith(
      'tf_loss_scale.keras.experimental'), run
  assert run['compiled_with_policy_loss_scale'], run
  assert run['fit_losses'][-1] < run['fit_losses'][0], run['fit_losses']
  # The guide's custom loop with LossScaleOptimizer(opt, 'dynamic'): TF
  # 2.3's default DynamicLossScale (2**15, grows every 2000 finite steps).
  # 3 epochs of 8 finite steps leave the scale where it started, with 24
  # good steps; iterations counts every step.
  _assert_trained(run, (32768.0, 24, 0, 24), min_test_accuracy=0.9)


def test_tf23_compile_fit_script_runs_unmodified_where_tf_keras_is_keras2():
  # Keras 2's compile keeps the wrapper and its fit calls minimize(), which
  # scales the loss once.
  run = _script_run(_COMPILE_FIT, legacy_keras=KERAS2_IS_TF_KERAS)
  assert run['compiled_optimizer_is_optimizer'], (
      f'compile replaced the LossScaleOptimizer: {run["compiled_optimizer"]}')
  # DynamicLossScale(2**8, increment_period=10): 24 finite steps (3 epochs of
  # 8 batches) double it twice and leave 4 good steps.
  _assert_trained(run, (1024.0, 4, 0, 24), min_test_accuracy=0.6)


def test_tf23_compile_fit_script_runs_unmodified_under_keras_3():
  # Keras 3's fit calls scale_loss(), after which apply_gradients() takes
  # the gradients of the scaled loss (tf_loss_scale/keras/shared/protocols.py).
  if not keras_families.tf_keras_can_be_keras3():
    pytest.skip(keras_families.KERAS3_ABSENT)
  run = _run_legacy_scripts(False)[_COMPILE_FIT]
  assert 'error' not in run, run['error']
  assert run['compiled_optimizer_is_optimizer'], run['compiled_optimizer']
  # As on Keras 2: 24 finite steps double 2**8 twice, leave 4 good steps.
  _assert_trained(run, (1024.0, 4, 0, 24), min_test_accuracy=0.6)
