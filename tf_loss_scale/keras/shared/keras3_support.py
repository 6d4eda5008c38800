"""The Keras 3 releases the Keras 3 form supports, and where they differ.

Supported: Keras 3.3.3 (the Keras of TensorFlow 2.16) and later; tested
with 3.3.3 and 3.15.1. Importing this module raises ImportError, naming
those versions, under an older Keras (or Keras 2), so the Keras 3 form
imports it before anything that subclasses Keras 3's classes.
The constants below say where the releases differ, each with why. (Keras's
class before 3.10 also left the inner optimizer's `loss_scale_factor` set,
dividing the gradients twice: the Keras 3 form always clears it.)
"""

import re
from typing import Any, Tuple

import keras
import tensorflow as tf

OLDEST = (3, 3, 3)
NEWEST_TESTED = (3, 15, 1)


def release(version: str) -> Tuple[int, ...]:
  """The numeric release of a version string: '3.12.0.dev1' -> (3, 12, 0)."""
  leading = re.match(r'\d+(\.\d+)*', version)
  if leading is None:
    raise ValueError(f'not a version: {version!r}')
  return tuple(int(part) for part in leading.group(0).split('.'))


RELEASE = release(keras.__version__)

# Keras's TensorFlow optimizers sum the gradients across replicas in their
# `apply` from 3.5 on; before, mirrored copies drifted apart (the Keras 3
# forms refuse several replicas there: `check_replicas_are_summed`).
OPTIMIZER_SUMS_ACROSS_REPLICAS = RELEASE >= (3, 5)

# Keras's optimizers name and order what they save in a checkpoint as
# their tf_keras namesakes do (tested with 3.15; Keras 3.3 does otherwise):
# only then are tf_keras's slot positions read into them.
SAVES_AS_TF_KERAS = RELEASE >= (3, 12)

# Keras's class refuses the base optimizer arguments (before, it took and
# ignored them), keeps them out of its config and runs the base's build.
CLASS_RUNS_BASE_BUILD = RELEASE >= (3, 12)

# Keras's variables take aggregation 'none' from 3.7, when Keras began to
# pass the aggregation on to TensorFlow's variable; before, every Keras
# variable's TensorFlow variable had aggregation NONE, whatever it was told.
VARIABLES_TAKE_AGGREGATION_NONE = RELEASE >= (3, 7)

# Keras's class answers `iterations` with the inner optimizer's count; before
# 3.9, with a counter of its own that stays at 0.
CLASS_COUNTS_INNER_STEPS = RELEASE >= (3, 9)


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


def check_replicas_are_summed(where: str) -> None:
  """Refuses several replicas under a Keras whose optimizers do not sum them.

  Args:
    where: The call being checked, for the message.

  Raises:
    ValueError: Under a strategy of more than one replica with Keras older
      than 3.5.
  """
  if OPTIMIZER_SUMS_ACROSS_REPLICAS or not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  if strategy.num_replicas_in_sync > 1:
    raise ValueError(
        f'{where}: Keras {keras.__version__} optimizers do not sum gradients '
        f'across replicas under {type(strategy).__name__} (each replica '
        'applies its own, and the copies of the model drift apart); Keras '
        "3.5 and later do. Upgrade Keras (pip install 'keras>=3.5', which "
        'TensorFlow 2.16 accepts), or use Keras 2 (tf_keras, with '
        'TF_USE_LEGACY_KERAS=1) and tf_loss_scale.keras.experimental.'
        'LossScaleOptimizer.')


def tf_variable(value: Any) -> Any:
  """A Keras variable's `tf.Variable`, as TF 2.x's classes gave; else `value`.

  Keras 3.3's variables refuse `int()`; an accumulating optimizer's computed
  step count is a tensor already.
  """
  if isinstance(value, tf.Variable):
    return value
  return getattr(value, 'value', value)


def count_skipped_step(inner: keras.optimizers.Optimizer) -> Any:
  """Adds a skipped step to `inner.iterations`, as TF 2.3-2.15's wrappers.

  Not for an accumulating optimizer: it derives its update steps from
  `iterations`, and counting a skipped micro-step would end its window
  early, a gradient missing. Returns what the assignment returns.
  """
  if getattr(inner, 'gradient_accumulation_steps', None):
    return None
  return inner.iterations.assign_add(1)
