"""A pytest plugin that points Keras's own tests at install()'s class.

Keras's test files name `keras.src` modules, which `compat.install()` leaves
alone: they test Keras's `LossScaleOptimizer`, not the class install() puts
under `keras.mixed_precision.LossScaleOptimizer`. With this plugin (`pytest
-p keras_class_name_plugin`, .ci/ on PYTHONPATH), once the test modules are
imported and if install() is in effect (.ci/install_compat_plugin.py, loaded
first), `LossScaleOptimizer` in each test module, in `keras.src.optimizers`
(which `optimizers.LossScaleOptimizer` in the trainer's tests reads) and in
`keras.src.trainers.trainer` (whose `compile` makes one under
`mixed_float16`) is that class, until the session ends. Without install()
it rebinds nothing.

Also, in both runs: Keras's trainer tests import `jax` at the top, for their
JAX-only cases; where jax is not installed an empty module stands for it,
so that the file imports (its TensorFlow cases never reach it); Keras itself
is imported before, without it.

If TF_LOSS_SCALE_CI_REBOUND names a file, writes there one line per
rebinding: `module.LossScaleOptimizer -> class`.
"""

import importlib
import importlib.util
import os
import sys
import types

_rebound = []  # (namespace, previous value), to restore.

if importlib.util.find_spec('jax') is None:
  # Keras first: it looks for jax as it loads, and must find none.
  importlib.import_module('keras')
  sys.modules['jax'] = types.ModuleType(
      'jax', 'Not JAX: .ci/keras_class_name_plugin.py stands in for it.')


def _rebind(namespace, cls, lines):
  previous = getattr(namespace, 'LossScaleOptimizer', None)
  if previous is None or previous is cls:
    return
  _rebound.append((namespace, previous))
  namespace.LossScaleOptimizer = cls
  lines.append(f'{namespace.__name__}.LossScaleOptimizer -> '
               'keras.mixed_precision.LossScaleOptimizer')


def pytest_collection_modifyitems(session, config, items):
  del session, config  # Unused.
  import tf_loss_scale.compat  # pylint: disable=g-import-not-at-top
  if not tf_loss_scale.compat.is_installed():
    return
  keras = importlib.import_module('keras')
  cls = keras.mixed_precision.LossScaleOptimizer
  if cls is importlib.import_module(
      'keras.src.optimizers.loss_scale_optimizer').LossScaleOptimizer:
    raise RuntimeError('install() is in effect, but '
                       'keras.mixed_precision.LossScaleOptimizer is Keras\'s')
  lines = []
  modules = {item.module for item in items
             if getattr(item, 'module', None) is not None}
  for namespace in [importlib.import_module('keras.src.optimizers'),
                    importlib.import_module('keras.src.trainers.trainer'),
                    *sorted(modules, key=lambda m: m.__name__)]:
    _rebind(namespace, cls, lines)
  marker = os.environ.get('TF_LOSS_SCALE_CI_REBOUND')
  if marker:
    with open(marker, 'w') as f:
      f.write(''.join(f'{line}\n' for line in lines))


def pytest_unconfigure(config):
  del config  # Unused.
  while _rebound:
    namespace, previous = _rebound.pop()
    namespace.LossScaleOptimizer = previous
