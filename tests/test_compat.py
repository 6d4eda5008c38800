"""Tests for tf_loss_scale.compat: opt-in legacy names."""

import os
import runpy
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import compat
from tf_loss_scale.keras import experimental

_LEGACY_SCRIPT = os.path.join(
    os.path.dirname(__file__), 'legacy_scripts', 'tf23_custom_training_loop.py')


@pytest.fixture
def installed():
  compat.install()
  yield
  compat.uninstall()
  keras.mixed_precision.set_global_policy('float32')


def test_importing_changes_nothing():
  code = ('import tensorflow as tf, keras, tf_loss_scale.compat as c; '
          'print(hasattr(keras.mixed_precision, "experimental"), '
          'hasattr(tf.train.experimental, "DynamicLossScale"), '
          'hasattr(tf, "mixed_precision"), c.is_installed())')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True).stdout.split()
  assert out == ['False', 'False', 'False', 'False']


def test_install_puts_library_classes_under_legacy_names(installed):
  from tensorflow.keras.mixed_precision import experimental as mp  # pylint: disable=g-import-not-at-top
  assert mp.LossScaleOptimizer is experimental.LossScaleOptimizer
  assert tf.keras.mixed_precision.experimental is mp
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
  assert not hasattr(keras.mixed_precision, 'experimental')
  assert not hasattr(tf.keras.mixed_precision, 'experimental')
  assert not hasattr(tf.train.experimental, 'DynamicLossScale')
  assert 'tensorflow.keras.mixed_precision.experimental' not in sys.modules
  assert 'tensorflow.mixed_precision.experimental' not in sys.modules


def test_legacy_tf23_script_runs_unmodified_after_install(installed):
  keras.utils.set_random_seed(0)
  script_globals = runpy.run_path(_LEGACY_SCRIPT)
  optimizer = script_globals['optimizer']
  losses = script_globals['losses']
  assert isinstance(optimizer, experimental.LossScaleOptimizer)
  assert isinstance(optimizer.loss_scale, tf_loss_scale.DynamicLossScale)
  assert len(losses) == 24
  first_epoch, last_epoch = np.mean(losses[:8]), np.mean(losses[-8:])
  assert last_epoch < first_epoch, f'loss did not decrease: {losses}'
  # 24 finite steps (3 epochs of 8 batches) at period 10 double the initial
  # 256 twice and leave 4 good steps counted.
  assert float(optimizer.loss_scale()) == 1024.0
  assert int(optimizer.loss_scale.good_steps.numpy()) == 4
