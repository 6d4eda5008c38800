"""What `tf-loss-scale run` sets up in the program's process and its children.

The launcher writes its choices into the environment (`TF_LOSS_SCALE_RUN`,
e.g. `keras=2,tf=2.3`) and puts `run_site/` on `PYTHONPATH`, whose
`sitecustomize` calls `apply_from_environ()` in every interpreter that
starts (the program's, its children). Nothing is imported there:
  - Keras 2 where `keras` is Keras 3: `keras` and `keras.*` are tf_keras.
  - Once `tensorflow` is imported: `compat.install(override=True)`; for a
    program of TensorFlow 2.10 or earlier, tf_keras's legacy optimizers
    under the names `tf.keras.optimizers` gave it; for a TF1 program
    (`tf=1`), v2 behaviour off and `import tensorflow` gives
    `tensorflow.compat.v1` (this library's modules get the real one), with
    `tf.contrib` refused with a message.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Callable, Dict, Optional, Tuple

ENVIRON = 'TF_LOSS_SCALE_RUN'
# The generation up to which Keras optimizers were `OptimizerV2`.
LAST_LEGACY_OPTIMIZERS = (2, 10)
_LEGACY_OPTIMIZER_NAMES = ('Adadelta', 'Adagrad', 'Adam', 'Adamax', 'Ftrl',
                           'Nadam', 'Optimizer', 'RMSprop', 'SGD')
CONTRIB_MESSAGE = (
    'tf.contrib was removed in TensorFlow 2 and tf-loss-scale run --tf 1 '
    'cannot serve it: port this use of tf.contrib (tf.contrib.mixed_precision '
    'is tf.train.experimental.MixedPrecisionLossScaleOptimizer, which the '
    'launcher serves)')
_LIBRARY = __name__.split('.')[0]
# The settings this process was set up for.
applied: Optional[Dict[str, str]] = None


def encode(settings: Dict[str, str]) -> str:
  """`{'keras': '2', 'tf': '1'}` -> `'keras=2,tf=1'`, for `ENVIRON`."""
  return ','.join(f'{key}={value}' for key, value in sorted(settings.items()))


def decode(text: str) -> Dict[str, str]:
  """The inverse of `encode`."""
  return dict(item.split('=', 1) for item in text.split(',') if item)


def generation(tf_version: Optional[str]) -> Optional[Tuple[int, ...]]:
  """`'2.3'` -> `(2, 3)`, `'1'` -> `(1,)`, None -> None."""
  return (None if tf_version is None else
          tuple(int(part) for part in tf_version.split('.')))


def apply_from_environ() -> None:
  """Applies the launcher's set-up read from `TF_LOSS_SCALE_RUN`, if set."""
  text = os.environ.get(ENVIRON)
  if text:
    apply(decode(text))


def apply(settings: Dict[str, str]) -> None:
  """Sets the process up, before it imports TensorFlow; once per process.

  Args:
    settings: `keras` (`'2'` or `'3'`), `alias` (`'1'`: `keras` is
      tf_keras) and optionally `tf` (`'1'` or `'2.N'`).

  Raises:
    RuntimeError: If other settings were applied already.
  """
  global applied
  if applied is not None:
    if applied != settings:
      raise RuntimeError(f'set up for {applied} already, not {settings}')
    return
  applied = dict(settings)
  # Consulted in this order: the alias, then the watch on TensorFlow.
  sys.meta_path.insert(0, _AfterImports(
      ('tensorflow', 'tf_keras', 'keras'),
      lambda: _set_up_tensorflow(settings)))
  if settings.get('alias') == '1':
    for name in [n for n in sys.modules if n == 'keras' or
                 n.startswith('keras.')]:
      del sys.modules[name]
    sys.meta_path.insert(0, _Alias('keras', 'tf_keras'))


def _set_up_tensorflow(settings: Dict[str, str]) -> None:
  """install(), and the names of the program's generation."""
  tf = sys.modules['tensorflow']
  version = generation(settings.get('tf'))
  from tf_loss_scale import compat  # pylint: disable=g-import-not-at-top
  compat.install(override=True)
  if version is not None and version <= LAST_LEGACY_OPTIMIZERS:
    _legacy_optimizers(tf)
  if version != (1,):
    return
  tf.compat.v1.disable_v2_behavior()
  # This library's modules, loaded from now on, get the real module.
  sys.meta_path.insert(0, _WithModule(_LIBRARY, 'tensorflow', tf))
  v1 = tf.compat.v1
  # `import tensorflow.compat.v1 as tf` reads `compat` off the module.
  v1.compat = tf.compat
  v1.contrib = _Refused('tensorflow.contrib')
  sys.meta_path.insert(0, _Alias('tensorflow.contrib', None))
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


class _AfterImports(importlib.abc.MetaPathFinder):
  """Calls `then()` once TensorFlow is imported and no import of NAMES runs:
  `import keras` imports TensorFlow, and `then` needs the Keras it ends."""

  def __init__(self, names: Tuple[str, ...], then: Callable[[], None]):
    self._names, self._then, self._running = names, then, 0

  def find_spec(self, fullname, path=None, target=None):
    if fullname not in self._names:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None:
      spec.loader = _Around(spec.loader, self._enter, self._exit)
    return spec

  def _enter(self) -> None:
    self._running += 1

  def _exit(self) -> None:
    self._running -= 1
    if not self._running and 'tensorflow' in sys.modules and (
        self in sys.meta_path):
      sys.meta_path.remove(self)
      self._then()


class _WithModule(importlib.abc.MetaPathFinder):
  """Modules under PACKAGE load while `sys.modules[NAME]` is MODULE."""

  def __init__(self, package: str, name: str, module: types.ModuleType):
    self._package, self._name, self._module = package, name, module

  def find_spec(self, fullname, path=None, target=None):
    if not fullname.startswith(self._package + '.'):
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None:
      spec.loader = _Around(spec.loader, self._swap, self._swap)
    return spec

  def _swap(self) -> None:
    self._module, sys.modules[self._name] = (sys.modules[self._name],
                                             self._module)


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
  """A namespace every attribute of which raises `CONTRIB_MESSAGE`."""

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    raise AttributeError(CONTRIB_MESSAGE)

