"""Opt-in aliases that let TensorFlow 2.0-2.3 era code run unchanged.

Importing this module changes nothing (and loads no Keras). `install()` puts
this library's classes under the names legacy code uses; `uninstall()` puts
everything back:

```python
import tf_loss_scale.compat
tf_loss_scale.compat.install()
# Legacy code now runs as written, e.g.
# from tensorflow.keras.mixed_precision import experimental as mixed_precision
# opt = mixed_precision.LossScaleOptimizer(opt, loss_scale='dynamic')
```

The Keras names go into the Keras that `tf.keras` is. See
docs/migrating_tf23.md.
"""

import importlib
import sys
import types
from typing import Any, Callable, Dict, List

import tensorflow as tf

import tf_loss_scale

_MISSING = object()
# What undoes each change install() made, in order.
_undo: List[Callable[[], Any]] = []

_LOSS_SCALE_NAMES = ('LossScale', 'FixedLossScale', 'DynamicLossScale')


def install(override: bool = False) -> None:
  """Makes the legacy loss scaling names resolve to this library.

  TF 2.3's `tf.keras.mixed_precision.experimental` (as attribute and for
  `import`); `compile`, applying the `Policy`'s loss scale; on Keras 3, TF
  2.4-2.15's `mixed_precision.LossScaleOptimizer`; and the loss scales and
  graph rewrite in `tf.train.experimental` and
  `tf.mixed_precision.experimental`. docs/differences.md lists every name.
  Idempotent: to change `override`, call `uninstall()` first.

  Args:
    override: Whether to replace names TensorFlow itself still defines.
  """
  if _undo:
    return
  # pylint: disable=g-import-not-at-top
  from tf_loss_scale import graph_rewrite
  from tf_loss_scale.keras import experimental
  from tf_loss_scale.keras.experimental import policy as experimental_policy
  from tf_loss_scale.keras.shared import families

  mixed_precision = _keras_mixed_precision_modules()
  keras_experimental = _new_module(
      'tensorflow.keras.mixed_precision.experimental',
      LossScaleOptimizer=experimental.LossScaleOptimizer,
      **{name: getattr(experimental, name)
         for name in experimental.POLICY_NAMES})
  for namespace in mixed_precision:
    _attach_module(namespace, 'experimental', keras_experimental)
  tf24 = None
  if families.is_keras3(tf.keras):
    from tf_loss_scale.keras.mixed_precision import shared_name as tf24
  # On the class that defines `compile`: Keras's loader compares a model's
  # `compile` with that class's and skips restoring the optimizer and loss
  # of a model whose `compile` differs (a user's own, it assumes).
  compile_owner = _defining_class(tf.keras.Model, 'compile')
  _replace(compile_owner, 'compile',
           experimental_policy.compile_with_policy_loss_scale(
               vars(compile_owner)['compile'],
               tf24_form=getattr(tf24, 'LossScaleOptimizer', None)))
  if tf24 is not None:
    # On Keras 3, TF 2.4-2.15's class takes the `mixed_precision` name
    # (which `compile` makes too); `keras.optimizers` keeps Keras's own.
    for namespace in mixed_precision:
      if hasattr(getattr(namespace, 'LossScaleOptimizer', None),
                 'stateless_apply'):
        _replace(namespace, 'LossScaleOptimizer', tf24.LossScaleOptimizer)
    # Files naming `LossScaleOptimizer` (see `shared_name`; `.h5` files in
    # lower case) load into this class, and so do tf_keras's configs of
    # `LossScaleOptimizerV3`, which Keras's deserializers do not know.
    saving = importlib.import_module('keras.saving')
    for name in ('LossScaleOptimizer', 'lossscaleoptimizer',
                 'LossScaleOptimizerV3'):
      _replace_item(saving.get_custom_objects(), name,
                    tf24.LossScaleOptimizer)

  loss_scales = {name: getattr(tf_loss_scale, name) for name in _LOSS_SCALE_NAMES}
  rewrite = {name: getattr(graph_rewrite, name) for name in (
      'enable_mixed_precision_graph_rewrite',
      'disable_mixed_precision_graph_rewrite')}
  for name, value in dict(loss_scales, **rewrite).items():
    # `import tensorflow.compat.v2 as tf` (TF 1.14-1.15 code) reads its own.
    for namespace in (tf.train.experimental, tf.compat.v2.train.experimental):
      if not hasattr(namespace, name):
        _replace(namespace, name, value)

  _attach_module(tf, 'mixed_precision',
                 _new_module('tensorflow.mixed_precision'))
  _attach_module(tf.mixed_precision, 'experimental', _new_module(
      'tensorflow.mixed_precision.experimental', **loss_scales))

  if override:
    v1_names = dict(loss_scales, **rewrite, MixedPrecisionLossScaleOptimizer=(
        tf_loss_scale.MixedPrecisionLossScaleOptimizer))
    for namespace in (tf.compat.v1.mixed_precision,
                      tf.compat.v1.train.experimental):
      for name, value in v1_names.items():
        _replace(namespace, name, value)


def uninstall() -> None:
  """Undoes `install()`, restoring every name it changed; safe to repeat."""
  while _undo:
    _undo.pop()()


def is_installed() -> bool:
  """Returns whether `install()` is in effect."""
  return bool(_undo)


def _keras_mixed_precision_modules() -> List[types.ModuleType]:
  # Legacy code reaches the name through up to four `mixed_precision`
  # modules: `tf.keras`'s (first), `import tensorflow.keras.mixed_precision`'s,
  # the Keras package's (told by where `tf.keras`'s classes are defined) and
  # tf_keras's v1 API (`tf.compat.v1.keras`).
  tf_keras_mixed_precision = tf.keras.mixed_precision
  keras_package = importlib.import_module(
      tf_keras_mixed_precision.Policy.__module__.split('.')[0])
  modules = [tf_keras_mixed_precision,
             importlib.import_module('tensorflow.keras.mixed_precision'),
             keras_package.mixed_precision,
             tf.compat.v1.keras.mixed_precision]
  return [m for i, m in enumerate(modules)
          if m not in modules[:i] and _forgets_attributes(m)]


def _defining_class(cls: type, name: str) -> type:
  """The first class in `cls`'s MRO whose own namespace holds `name`."""
  return next(c for c in cls.__mro__ if name in vars(c))


def _forgets_attributes(namespace: Any) -> bool:
  # TensorFlow 2.12's tf.compat.v1.keras.mixed_precision is a lazy-loading
  # wrapper that keeps a name it was given after the name is deleted, so
  # uninstall() could not remove it: such a namespace gets no name.
  return type(namespace).__delattr__ is types.ModuleType.__delattr__


def _new_module(name: str, **attributes: Any) -> types.ModuleType:
  module = types.ModuleType(name, f'Legacy names installed by {__name__}.')
  module.__dict__.update(attributes)
  return module


def _attach_module(namespace: Any, name: str, module: types.ModuleType) -> None:
  # Both attribute access and `import a.b.c` / `from a.b import c` must work.
  if hasattr(namespace, name):
    return
  _replace(namespace, name, module)
  _replace_item(sys.modules, module.__name__, module)


def _replace(namespace: Any, name: str, value: Any) -> None:
  # A class gets back its own attribute, or none (so it inherits again).
  previous = (vars(namespace).get(name, _MISSING) if isinstance(namespace, type)
              else getattr(namespace, name, _MISSING))
  setattr(namespace, name, value)
  _undo.append(lambda: delattr(namespace, name) if previous is _MISSING else
               setattr(namespace, name, previous))


def _replace_item(mapping: Dict[str, Any], key: str, value: Any) -> None:
  # As `_replace`, for an entry of a dict (a registry, `sys.modules`).
  previous = mapping.get(key, _MISSING)
  mapping[key] = value
  _undo.append(lambda: mapping.pop(key, None) if previous is _MISSING else
               mapping.update({key: previous}))
