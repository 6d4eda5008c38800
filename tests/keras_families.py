"""The Keras of each family in this process, for tests that need one.

Keras 2 is `tf.keras` on TensorFlow <= 2.15 (and on 2.16+ under
`TF_USE_LEGACY_KERAS=1`), otherwise `tf_keras` when installed; Keras 3 is
`keras` 3.x (TensorFlow 2.16+). A test of a family that is absent skips,
saying which.
"""

import importlib
import os
import types

import pytest
import tensorflow as tf

KERAS3_ABSENT = 'Keras 3 is absent (it needs TensorFlow 2.16 or later)'
KERAS2_ABSENT = ('Keras 2 is absent (TensorFlow 2.16+ without the tf_keras '
                 'package)')


def _is_keras3(namespace) -> bool:
  return hasattr(namespace.optimizers.Optimizer, 'stateless_apply')


def keras3_or_none():
  """Keras 3's `keras`, or None where it is not installed."""
  try:
    keras = importlib.import_module('keras')
  except ImportError:
    return None
  return keras if _is_keras3(keras) else None


def keras2_or_none():
  """The Keras 2 API namespace (`tf.keras` or `tf_keras`), or None."""
  if not _is_keras3(tf.keras):
    return tf.keras
  try:
    return importlib.import_module('tf_keras')
  except ImportError:
    return None


def keras3() -> types.ModuleType:
  """Keras 3, or skips the calling test (module) saying it is absent."""
  keras = keras3_or_none()
  if keras is None:
    pytest.skip(KERAS3_ABSENT, allow_module_level=True)
  return keras


def keras2() -> types.ModuleType:
  """Keras 2, or skips the calling test (module) saying it is absent."""
  keras = keras2_or_none()
  if keras is None:
    pytest.skip(KERAS2_ABSENT, allow_module_level=True)
  return keras


def tf_keras_is_keras3() -> bool:
  """Whether `tf.keras` is Keras 3 in this process."""
  return _is_keras3(tf.keras)


def legacy_keras_env() -> bool:
  """Whether this process runs with `TF_USE_LEGACY_KERAS=1`.

  For child processes that must see the same Keras: TensorFlow 2.15 and
  earlier read the variable too (and then need `tf_keras` installed).
  """
  return os.environ.get('TF_USE_LEGACY_KERAS', '').lower() in ('1', 'true')


def value(tensor_or_variable):
  """The NumPy value of a tensor or a (Keras or TensorFlow) variable.

  Keras 3.3's variables have no `__float__`/`__int__`.
  """
  if hasattr(tensor_or_variable, 'numpy'):
    return tensor_or_variable.numpy()
  return tensor_or_variable


def tf_keras_can_be_keras3() -> bool:
  """Whether this TensorFlow picks `tf.keras` by `TF_USE_LEGACY_KERAS`.

  TensorFlow 2.16 and later: `tf.keras` is Keras 3 unless the variable asks
  for tf_keras. Earlier ones have Keras 2 built in.
  """
  major, minor = (int(part) for part in tf.__version__.split('.')[:2])
  return (major, minor) >= (2, 16)
