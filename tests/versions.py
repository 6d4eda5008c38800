"""What the installed TensorFlow and Kerases provide, and why a test skips.

The suite runs on every TensorFlow from 2.12 to 2.21 with the Keras of each
(Keras 2 up to 2.15, Keras 3 from 2.16, `tf_keras` where installed). A test
that needs something a version lacks skips with one of these conditions,
whose reason says what is absent, never silently and never as a pass:

    @versions.KERAS_3.mark
    def test_fit_with_the_keras_3_form(): ...

    versions.KERAS_3.require()  # at the top of a module that needs it to import

Versions are read from the installed packages' metadata and the
environment, not by importing Keras or `tf_keras` (which Keras `tf.keras` is
depends on `TF_USE_LEGACY_KERAS` when TensorFlow first loads it).
"""

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
from typing import Optional, Tuple

import pytest
import tensorflow as tf

Version = Tuple[int, ...]


def release(version: str) -> Version:
  """The numeric release of a version string: '2.16.0rc1' -> (2, 16, 0)."""
  numbers = re.match(r'\d+(\.\d+)*', version)
  if numbers is None:
    raise ValueError(f'not a version: {version!r}')
  return tuple(int(part) for part in numbers.group(0).split('.'))


def installed(distribution: str) -> Optional[Version]:
  """The release of an installed distribution, or None if it is absent."""
  try:
    return release(importlib.metadata.version(distribution))
  except importlib.metadata.PackageNotFoundError:
    return None


def _shown(version: Optional[Version]) -> str:
  return 'not installed' if version is None else '.'.join(map(str, version))


@dataclasses.dataclass(frozen=True)
class Condition:
  """Whether something a test needs is here, and the reason if it is not."""
  holds: bool
  reason: str

  @property
  def mark(self) -> pytest.MarkDecorator:
    """A mark that skips the test, with the reason, unless this holds."""
    return pytest.mark.skipif(not self.holds, reason=self.reason)

  def require(self) -> None:
    """Skips the calling module, with the reason, unless this holds."""
    if not self.holds:
      pytest.skip(self.reason, allow_module_level=True)

  def __and__(self, other: 'Condition') -> 'Condition':
    if not self.holds:
      return self
    return other

  def __bool__(self) -> bool:
    return self.holds


TF = release(tf.__version__)
KERAS = installed('keras')
TF_KERAS = installed('tf_keras')
# TensorFlow's own test of the variable (2.15 and later).
LEGACY_KERAS_REQUESTED = os.environ.get('TF_USE_LEGACY_KERAS') in (
    'true', 'True', '1')
# Whether tests that run child processes under tf_keras (TF_USE_LEGACY_KERAS
# =1) beside their Keras 3 runs do so: .ci/run turns it off (0) where the
# newest TensorFlow's run covers them.
TF_KERAS_CHILDREN_WANTED = os.environ.get(
    'TF_LOSS_SCALE_TF_KERAS_CHILDREN', '1') != '0'

_VERSIONS = (f'TensorFlow {tf.__version__}, keras {_shown(KERAS)}, '
             f'tf_keras {_shown(TF_KERAS)}')


def tf_at_least(*version: int) -> Condition:
  """TensorFlow is at least `version`."""
  wanted = '.'.join(map(str, version))
  return Condition(TF >= version,
                   f'needs TensorFlow {wanted} or later ({_VERSIONS})')


def keras_at_least(*version: int) -> Condition:
  """The `keras` package is Keras `version` or later."""
  wanted = '.'.join(map(str, version))
  return Condition(KERAS is not None and KERAS >= version,
                   f'needs Keras {wanted} or later ({_VERSIONS})')


KERAS_3 = Condition(
    KERAS is not None and KERAS >= (3,),
    'needs Keras 3 (keras 3.x, with TensorFlow 2.16 or later); TensorFlow '
    f'2.15 and earlier come with Keras 2 ({_VERSIONS})')

# Keras's TensorFlow optimizers sum gradients across replicas from 3.5 on;
# before, the Keras 3 forms refuse several replicas.
KERAS_SUMS_ACROSS_REPLICAS = KERAS_3 & Condition(
    KERAS is not None and KERAS >= (3, 5),
    'needs Keras 3.5 or later: older Keras optimizers do not sum gradients '
    'across replicas, and the Keras 3 forms refuse several replicas there '
    f'({_VERSIONS})')

# Keras's own LossScaleOptimizer answers `iterations` with the inner
# optimizer's count from Keras 3.9; before, with a counter of its own that
# stays at 0 (a Keras bug, which the class under install()'s name keeps for
# Keras 3 programs).
KERAS_CLASS_COUNTS_STEPS = bool(KERAS is not None and KERAS >= (3, 9))

# The TF 2.4-2.15 form's checkpoints interchange with tf_keras's class where
# Keras 3's optimizers name and order what they save as tf_keras's do: from
# Keras 3.12 (tested with 3.15; Keras 3.3 names and orders them otherwise).
KERAS_TF_KERAS_CHECKPOINTS = KERAS_3 & Condition(
    KERAS is not None and KERAS >= (3, 12),
    "needs Keras 3.12 or later for checkpoints of tf_keras's "
    f'LossScaleOptimizer ({_VERSIONS})')

TF_KERAS_INSTALLED = Condition(
    TF_KERAS is not None,
    f'needs tf_keras (Keras 2 for TensorFlow 2.16 and later) ({_VERSIONS})')

# `tf.keras` is Keras 2: the keras 2.x of TensorFlow 2.15 and earlier, or
# tf_keras under TF_USE_LEGACY_KERAS=1 (which TensorFlow honours from 2.15).
_KERAS_2_TF_KERAS = TF < (2, 16) or (LEGACY_KERAS_REQUESTED and
                                     TF_KERAS is not None)
TF_KERAS_IS_KERAS_2 = Condition(
    _KERAS_2_TF_KERAS,
    'needs tf.keras to be Keras 2 (TensorFlow 2.15 and earlier, or '
    f'TF_USE_LEGACY_KERAS=1 with tf_keras installed) ({_VERSIONS})')
TF_KERAS_IS_KERAS_3 = Condition(
    not _KERAS_2_TF_KERAS,
    'needs tf.keras to be Keras 3 (TensorFlow 2.16 and later without '
    f'TF_USE_LEGACY_KERAS) ({_VERSIONS})')



def _keras_ships(relative_path: str) -> bool:
  # Looked up on disk: importing keras.src.* would import Keras.
  spec = importlib.util.find_spec('keras')
  return spec is not None and any(
      os.path.exists(os.path.join(location, relative_path))
      for location in spec.submodule_search_locations or ())


# Some Keras 3 wheels (3.3.3 among them) ship no test files.
KERAS_TEST_FILES = KERAS_3 & Condition(
    _keras_ships(os.path.join('src', 'optimizers',
                              'loss_scale_optimizer_test.py')),
    'needs the test files Keras installs with itself, which this keras '
    f'wheel does not ship ({_VERSIONS})')

LIBRARY_INSTALLED = Condition(
    installed('tf_loss_scale') is not None,
    'needs tf_loss_scale installed (pip install .) in this Python; here it '
    'is imported from the checkout only')

# What a child process started with TF_USE_LEGACY_KERAS=1 gets as tf.keras.
# TensorFlow 2.15 reads the variable too, and then imports tf_keras.
LEGACY_KERAS_IS_KERAS_2 = Condition(
    TF < (2, 15) or TF_KERAS is not None,
    'needs tf.keras to be Keras 2 under TF_USE_LEGACY_KERAS=1 (TensorFlow '
    f'2.14 and earlier, or tf_keras installed) ({_VERSIONS})')

# A Keras 2 to train with in this process: tf.keras where it is Keras 2,
# else tf_keras imported by name.
KERAS_2 = Condition(
    _KERAS_2_TF_KERAS or TF_KERAS is not None,
    'needs Keras 2: TensorFlow 2.15 or earlier, or tf_keras installed '
    f'({_VERSIONS})')


def keras_2():
  """The Keras 2 module KERAS_2 speaks of (call only where it holds)."""
  if _KERAS_2_TF_KERAS:
    return tf.keras
  import tf_keras  # pylint: disable=g-import-not-at-top
  return tf_keras
