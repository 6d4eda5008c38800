"""A pytest plugin that points Keras's own tests at install()'s class.

Keras's test files name `keras.src` modules, which `compat.install()` leaves
alone: they test Keras's `LossScaleOptimizer`, not the class install() puts
under `keras.mixed_precision.LossScaleOptimizer`. With this plugin (`pytest
-p keras_class_name_plugin`, .ci/ on PYTHONPATH), once the test modules are
imported and if install() is in effect (.ci/install_compat_plugin.py, loaded
first), `LossScaleOptimizer` in each test module, in `keras.src.optimizers`
(which `optimizers.LossScaleOptimizer` in the trainer's tests reads) and in
`keras.src.trainers.trainer` (whose `compile` makes one under
`mixed_float16`) is that class, until the session ends. Keras's tests of
`stateless_apply` skip on TensorFlow, where Keras's class has none
(`_skip_test_for_stateless`); install()'s class has it there, so, with
install() in effect, a test class's `_skip_test_for_stateless` lets those
cases run on TensorFlow (Keras's other reason to skip, JAX, stays). Without
install() it changes nothing.

Also, in both runs: Keras's trainer tests import `jax` at the top, for their
JAX-only cases; where jax is not installed an empty module stands for it,
so that the file imports (its TensorFlow cases never reach it); Keras itself
is imported before, without it.

If TF_LOSS_SCALE_CI_REBOUND names a file, writes there one line per
rebinding: `module.LossScaleOptimizer -> class`, and one per test class
whose stateless cases it lets run.
"""

import importlib
import importlib.util
import os
import sys
import types

_rebound = []  # (namespace, name, previous value), to restore.

if importlib.util.find_spec('jax') is None:
  # Keras first: it looks for jax as it loads, and must find none.
  importlib.import_module('keras')
  sys.modules['jax'] = types.ModuleType(
      'jax', 'Not JAX: .ci/keras_class_name_plugin.py stands in for it.')


def _rebind(namespace, cls, lines):
  previous = getattr(namespace, 'LossScaleOptimizer', None)
  if previous is None or previous is cls:
    return
  _rebound.append((namespace, 'LossScaleOptimizer', previous))
  namespace.LossScaleOptimizer = cls
  lines.append(f'{namespace.__name__}.LossScaleOptimizer -> '
               'keras.mixed_precision.LossScaleOptimizer')


def _run_stateless_cases(test_class, lines):
  """Lets `test_class`'s stateless cases run on TensorFlow."""
  original = test_class.__dict__.get('_skip_test_for_stateless')
  if original is None:
    return
  backend = importlib.import_module('keras').backend.backend()

  def skip_only_where_the_class_cannot_run(self, stateless):
    if stateless and backend == 'tensorflow':
      return  # install()'s class has stateless_apply on TensorFlow.
    original(self, stateless)

  _rebound.append((test_class, '_skip_test_for_stateless', original))
  test_class._skip_test_for_stateless = skip_only_where_the_class_cannot_run  # pylint: disable=protected-access
  lines.append(f'{test_class.__module__}.{test_class.__qualname__}.'
               '_skip_test_for_stateless -> runs the stateless cases on '
               f'{backend}')


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
  for test_class in sorted({item.cls for item in items
                            if getattr(item, 'cls', None) is not None},
                           key=lambda c: (c.__module__, c.__qualname__)):
    _run_stateless_cases(test_class, lines)
  marker = os.environ.get('TF_LOSS_SCALE_CI_REBOUND')
  if marker:
    with open(marker, 'w') as f:
      f.write(''.join(f'{line}\n' for line in lines))


def pytest_unconfigure(config):
  del config  # Unused.
  while _rebound:
    namespace, name, previous = _rebound.pop()
    setattr(namespace, name, previous)
