"""What `tf-loss-scale run` sets up in the interpreters it starts.

`run_site`'s `sitecustomize` calls `apply()` in every interpreter of the
launcher's Python (the program's, its children's) before its first line.
Nothing is imported then: `keras` is aliased to tf_keras for Keras 2, and
the rest waits for the program's own first import of TensorFlow (so that
what it sets before, `TF_USE_LEGACY_KERAS` or logging, counts as under
`python`): `compat.install(override=True)`, the names of the program's
generation, and messages for what it cannot have.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Callable, Dict, Optional, Tuple

ENVIRON = 'TF_LOSS_SCALE_RUN'
# The generation up to which Keras optimizers were `OptimizerV2`.
LAST_LEGACY_OPTIMIZERS = (2, 10)
_LEGACY_OPTIMIZER_NAMES = ('Adadelta', 'Adagrad', 'Adam', 'Adamax', 'Ftrl',
                           'Nadam', 'Optimizer', 'RMSprop', 'SGD')
# What this library serves of `tf.contrib` under `--tf 1`.
CONTRIB_SERVED = {'mixed_precision': 'tf_loss_scale.contrib.mixed_precision'}
CONTRIB_MESSAGE = (
    'tf.contrib was removed in TensorFlow 2: port this use of it '
    '(tf-loss-scale run --tf 1 serves tf.contrib.mixed_precision only)')
ESTIMATOR_MESSAGE = ('tf.estimator was removed in TensorFlow 2.16: run on '
                     '2.15 or earlier, where this library runs too')
_LIBRARY = __name__.split('.')[0]


def generation(tf_version: Optional[str]) -> Optional[Tuple[int, ...]]:
  """`'2.3.4'` -> `(2, 3)`, `'1'` -> `(1,)`, None -> None."""
  return (None if tf_version is None else
          tuple(int(part) for part in tf_version.split('.')[:2]))


def served(module: Optional[str]) -> bool:
  """Whether `module` (of `CONTRIB_SERVED`) can be imported here."""
  try:
    return module is not None and importlib.util.find_spec(module) is not None
  except ImportError:
    return False


def apply(settings: Dict[str, Any]) -> None:
  """Sets the interpreter up, before its program's first line.

  Args:
    settings: `keras` (`'2'` or `'3'`), `alias` (True: `keras` is tf_keras)
      and `tf` (None, or the program's TensorFlow: `'1.15'`, `'2.3'`...).
  """
  # Consulted in this order: the alias, then the watch on TensorFlow. The
  # set-up needs the Keras that an import of `keras` (importing TensorFlow)
  # ends with: it runs once TensorFlow is imported and none of these runs.
  running = []

  def exit_():
    running.pop()
    if not running and 'tensorflow' in sys.modules and watch in sys.meta_path:
      sys.meta_path.remove(watch)
      _set_up_tensorflow(settings)

  watch = _Watch(('tensorflow', 'tf_keras', 'keras').__contains__,
                 lambda: running.append(1), exit_)
  sys.meta_path.insert(0, watch)
  if settings['alias']:
    sys.meta_path.insert(0, _Alias('keras', 'tf_keras'))


def _set_up_tensorflow(settings: Dict[str, Any]) -> None:
  """install(); `tf.estimator` refused on 2.16+; up to TF 2.10, its legacy
  optimizers; for TF 1.x, `tensorflow.compat.v1` with v2 behaviour off,
  `tf.contrib` refused but for what is served, and the experimental form's
  `iterations` counting applied steps (TF 1.15's Keras)."""
  tf = sys.modules['tensorflow']
  version = generation(settings['tf'])
  from tf_loss_scale import compat  # pylint: disable=g-import-not-at-top
  compat.install(override=True)
  if generation(tf.__version__) >= (2, 16):
    for namespace in (tf, tf.compat.v1):
      if not hasattr(namespace, 'estimator'):
        namespace.estimator = _Refused('tensorflow.estimator',
                                       ESTIMATOR_MESSAGE)
  if version is not None and version <= LAST_LEGACY_OPTIMIZERS:
    _legacy_optimizers(tf)
  if version is None or version[0] != 1:
    return
  from tf_loss_scale.keras import experimental as tf23  # pylint: disable=g-import-not-at-top
  tf23.LossScaleOptimizer.counts_skipped_steps = False
  tf.compat.v1.disable_v2_behavior()
  # This library's modules, loaded from now on, get the real module.
  other = [tf]

  def swap():
    other[0], sys.modules['tensorflow'] = sys.modules['tensorflow'], other[0]

  sys.meta_path.insert(0, _Watch(
      lambda name: name.startswith(_LIBRARY + '.'), swap, swap))
  v1 = tf.compat.v1
  # `import tensorflow.compat.v1 as tf` reads `compat` off the module.
  v1.compat = tf.compat
  v1.contrib = sys.modules['tensorflow.contrib'] = _Refused(
      'tensorflow.contrib', CONTRIB_MESSAGE, {
          name: module for name, module in CONTRIB_SERVED.items()
          if served(module)})
  sys.meta_path.insert(0, _Alias('tensorflow.contrib', None))
  for name, module in v1.contrib.served.items():
    sys.meta_path.insert(0, _Alias(f'tensorflow.contrib.{name}', module))
  sys.modules['tensorflow'] = v1


def _legacy_optimizers(tf: types.ModuleType) -> None:
  """TF 2.10's optimizers under the names a TF 2.10 program reads."""
  legacy = tf.keras.optimizers.legacy
  # Up to three modules: tf.keras's, `import tensorflow.keras`'s, Keras's.
  for namespace in (tf.keras.optimizers,
                    importlib.import_module('tensorflow.keras.optimizers'),
                    importlib.import_module(
                        legacy.SGD.__module__.split('.')[0] + '.optimizers')):
    for name in _LEGACY_OPTIMIZER_NAMES:
      setattr(namespace, name, getattr(legacy, name))


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """`import NAME[.sub]` gives the module `TARGET[.sub]`, the same object;
  with no TARGET, an ImportError with `CONTRIB_MESSAGE`."""

  def __init__(self, name: str, target: Optional[str]):
    self._name, self._target = name, target

  def find_spec(self, fullname, path=None, target=None):
    del path, target  # Unused.
    if fullname != self._name and not fullname.startswith(self._name + '.'):
      return None
    if self._target is None:
      raise ImportError(CONTRIB_MESSAGE, name=fullname)
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    # The import system returns what `sys.modules` holds after this.
    sys.modules[module.__name__] = importlib.import_module(
        self._target + module.__name__[len(self._name):])


class _Watch(importlib.abc.MetaPathFinder):
  """Modules `wanted(name)`, found as Python finds them, load between
  `enter()` and `exit()`."""

  def __init__(self, wanted: Callable[[str], bool], enter: Callable[[], None],
               exit_: Callable[[], None]):
    self._wanted, self._enter, self._exit = wanted, enter, exit_

  def find_spec(self, fullname, path=None, target=None):
    if not self._wanted(fullname):
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None:
      spec.loader = _Around(spec.loader, self._enter, self._exit)
    return spec


class _Around(importlib.abc.Loader):
  """The loader, with `enter()` before `exec_module` and `exit()` after."""

  def __init__(self, loader: importlib.abc.Loader, enter: Callable[[], None],
               exit_: Callable[[], None]):
    self._loader, self._enter, self._exit = loader, enter, exit_

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._enter()
    try:
      self._loader.exec_module(module)
    finally:
      self._exit()

  def __getattr__(self, name):  # get_source, get_resource_reader...
    return getattr(self._loader, name)


class _Refused(types.ModuleType):
  """A namespace whose attributes raise MESSAGE, but the SERVED modules."""

  def __init__(self, name: str, message: str,
               served_modules: Optional[Dict[str, str]] = None):
    super().__init__(name)
    self.message, self.served = message, dict(served_modules or {})
    self.__path__ = []  # `import tensorflow.contrib.NAME` looks for NAME.

  def __getattr__(self, name):
    if name.startswith('__') or name not in self.served:
      raise AttributeError(name if name.startswith('__') else self.message)
    return importlib.import_module(self.served[name])

