"""Which Keras an optimizer belongs to, told by what the Keras offers.

A package name does not say which: Keras 2 is `tf.keras` on TensorFlow
<= 2.15 and `tf_keras` later, with legacy (`optimizers.legacy.*`) and new
optimizers; Keras 3 is `keras` 3.x. A Keras API namespace is classed by its
optimizer base: Keras 3's has `stateless_apply`, Keras 2's legacy one
`get_updates`. Only Keras packages already imported are looked at.
"""

import importlib
import sys
import types
from typing import Any, List, NamedTuple

import tensorflow as tf

# The kinds of inner optimizer, as recorded in the experimental form's config.
KERAS3 = 'keras3'
KERAS2_LEGACY = 'keras2_legacy'
KERAS2 = 'keras2'
KINDS = (KERAS3, KERAS2_LEGACY, KERAS2)


class Family(NamedTuple):
  """An optimizer's kind and the Keras API namespace it belongs to."""
  kind: str
  keras: types.ModuleType


def is_keras3(keras: Any) -> bool:
  """Whether a Keras API namespace is Keras 3 (its optimizers are stateless)."""
  optimizer = getattr(getattr(keras, 'optimizers', None), 'Optimizer', None)
  return callable(getattr(optimizer, 'stateless_apply', None))


def is_keras2(keras: Any) -> bool:
  """Whether a Keras API namespace is Keras 2 (legacy optimizers, TF 2.3's)."""
  optimizers = getattr(keras, 'optimizers', None)
  legacy = getattr(getattr(optimizers, 'legacy', None), 'Optimizer', None)
  return (callable(getattr(legacy, 'get_updates', None)) and
          hasattr(optimizers, 'Optimizer') and
          hasattr(getattr(keras, 'mixed_precision', None),
                  'LossScaleOptimizer') and not is_keras3(keras))


def loaded_namespaces() -> List[types.ModuleType]:
  """The API namespaces of the Keras packages this process has imported."""
  candidates = [sys.modules.get('tf_keras'), sys.modules.get('keras')]
  if any(candidates):
    candidates.append(tf.keras)
  found = []
  for keras in candidates:
    if keras is None or not (is_keras3(keras) or is_keras2(keras)):
      continue
    if all(keras.optimizers.Optimizer is not known.optimizers.Optimizer
           for known in found):
      found.append(keras)
  return found


def family_of(optimizer: Any) -> Family:
  """The `Family` of a Keras optimizer.

  Raises:
    TypeError: If it is not an optimizer of any Keras this process has
      imported.
  """
  for keras in loaded_namespaces():
    if is_keras3(keras):
      if isinstance(optimizer, keras.optimizers.Optimizer):
        return Family(KERAS3, keras)
    elif isinstance(optimizer, keras.optimizers.legacy.Optimizer):
      return Family(KERAS2_LEGACY, keras)
    elif isinstance(optimizer, keras.optimizers.Optimizer):
      return Family(KERAS2, keras)
  raise TypeError(
      'optimizer must be a Keras optimizer (tf.keras.optimizers.*: Keras 3, '
      'or Keras 2 new or legacy), but got '
      f'{optimizer!r} of type {type(optimizer).__name__}.')


def default_kind() -> str:
  """The kind a config written without one (TF 2.3's) is restored as.

  `tf.keras`'s; Keras 2's deserializer tells legacy optimizers apart.
  """
  return KERAS3 if is_keras3(tf.keras) else KERAS2


def namespace_for(kind: str) -> types.ModuleType:
  """The Keras API namespace that restores inner optimizers of `kind`.

  Args:
    kind: One of `KINDS`.

  Returns:
    `tf.keras` if of that family, else `keras` or `tf_keras`.

  Raises:
    ImportError: If no Keras of that family is installed.
    ValueError: If `kind` is not one of `KINDS`.
  """
  if kind not in KINDS:
    raise ValueError(f'Unknown optimizer family {kind!r}: expected one of '
                     f'{list(KINDS)}.')
  wanted = is_keras3 if kind == KERAS3 else is_keras2
  if wanted(tf.keras):
    return tf.keras
  package = 'keras' if kind == KERAS3 else 'tf_keras'
  try:
    keras = importlib.import_module(package)
  except ImportError as e:
    raise ImportError(_missing_family_message(kind)) from e
  if not wanted(keras):
    raise ImportError(_missing_family_message(kind))
  return keras


def require_keras3(what: str) -> None:
  """Raises an ImportError naming what works instead, unless Keras 3 is here.

  Args:
    what: The name that needs Keras 3, for the message.
  """
  try:
    keras = importlib.import_module('keras')
  except ImportError:
    keras = None
  if keras is not None and is_keras3(keras):
    return
  version = getattr(keras, '__version__', None)
  found = f'keras {version} is installed' if version else 'keras is missing'
  raise ImportError(
      f'{what} needs Keras 3 (TensorFlow 2.16 or later), but {found}. '
      'On this TensorFlow use tf_loss_scale.keras.experimental.'
      'LossScaleOptimizer(optimizer, loss_scale), the TF 2.0-2.3 form, '
      'which wraps the tf.keras optimizers of every Keras.')


def _missing_family_message(kind: str) -> str:
  if kind == KERAS3:
    return ('This optimizer config holds a Keras 3 optimizer, which needs '
            'Keras 3 (TensorFlow 2.16 or later).')
  return ('This optimizer config holds a Keras 2 optimizer; on TensorFlow '
          '2.16 or later Keras 2 is the tf_keras package: pip install '
          'tf_keras (of the TensorFlow version installed).')
