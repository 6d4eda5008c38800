"""The Keras 3 releases the Keras 3 form supports, and where they differ.

Supported: Keras 3.3.3 (the Keras of TensorFlow 2.16) and later; tested
with 3.3.3 and 3.15.1. Importing this module raises ImportError, naming
those versions, under an older Keras (or Keras 2), so the Keras 3 form
imports it before anything that subclasses Keras 3's classes.

Keras's own `LossScaleOptimizer` changed between the supported releases:
- before 3.9 its `iterations` was a counter of its own that never advanced
  (from 3.9, the inner optimizer's);
- before 3.10 it left the inner optimizer's `loss_scale_factor` set, which
  divided the gradients a second time;
- before 3.12 it accepted the base optimizer arguments (`clipnorm`,
  `use_ema`, ...) and ignored them, listed them in its config, and did not
  run the base optimizer's `build`.
"""

import re
from typing import Tuple

import keras

OLDEST = (3, 3, 3)
NEWEST_TESTED = (3, 15, 1)


def release(version: str) -> Tuple[int, ...]:
  """The numeric release of a version string: '3.12.0.dev1' -> (3, 12, 0)."""
  leading = re.match(r'\d+(\.\d+)*', version)
  if leading is None:
    raise ValueError(f'not a version: {version!r}')
  return tuple(int(part) for part in leading.group(0).split('.'))


RELEASE = release(keras.__version__)

# Keras's class itself refuses the base optimizer arguments, keeps its
# config to its own arguments and runs the base optimizer's build.
CLASS_RUNS_BASE_BUILD = RELEASE >= (3, 12)


def _shown(version: Tuple[int, ...]) -> str:
  return '.'.join(map(str, version))


def _refuse_unsupported() -> None:
  if RELEASE >= OLDEST:
    return
  if RELEASE < (3,):
    advice = ('TensorFlow 2.15 and earlier come with Keras 2: use '
              'tf_loss_scale.keras.experimental.LossScaleOptimizer there.')
  else:
    advice = f"Upgrade it: pip install 'keras>={_shown(OLDEST)}'."
  raise ImportError(
      'tf_loss_scale.keras.LossScaleOptimizer needs Keras 3, release '
      f'{_shown(OLDEST)} (the Keras of TensorFlow 2.16) or later; it is '
      f'tested with Keras {_shown(OLDEST)} to {_shown(NEWEST_TESTED)}, but '
      f'Keras {keras.__version__} is installed. {advice}')


_refuse_unsupported()
