"""Which of the demo's APIs work with the installed TensorFlow and Keras.

The Keras 3 run needs Keras 3 (TensorFlow 2.16 or later installs it); the
custom-loop run needs the experimental wrapper to work with the installed
Keras; the TF1 session loop needs only TensorFlow. Each API is tried by
importing its run module and taking one step through its front end, so the
answer is what actually works here.
"""

import importlib
from typing import Optional, Tuple

from tf_loss_scale.demo import config as config_lib

_MODULES = {
    config_lib.KERAS: 'tf_loss_scale.demo.keras_run',
    config_lib.EXPERIMENTAL: 'tf_loss_scale.demo.experimental_run',
    config_lib.V1: 'tf_loss_scale.demo.v1_run',
}
# What 'auto' runs: the Keras 3 form where there is Keras 3, else the TF1
# loop, which needs no Keras at all.
_AUTO_ORDER = (config_lib.KERAS, config_lib.V1)


class UnavailableError(ValueError):
  """The requested API does not work with the installed packages."""


def unavailable_reason(api: str) -> Optional[str]:
  """Why `api` cannot run here, or None if it can.

  Imports TensorFlow (and Keras, for the Keras APIs).

  Args:
    api: One of `config.APIS`.

  Returns:
    None, or a short reason naming what is missing.
  """
  if api == config_lib.KERAS:
    keras_version = _keras_version()
    if keras_version is None:
      return 'needs Keras 3, which is not installed'
    if int(keras_version.split('.')[0]) < 3:
      return (f'needs Keras 3 (TensorFlow 2.16 or later); keras '
              f'{keras_version} is installed')
  try:
    importlib.import_module(_MODULES[api])
    _take_a_step(api)
  # Whatever a front end that does not fit the installed Keras raises, on
  # import or on its first step, means this API cannot run here; the reason
  # names the error.
  except Exception as error:  # pylint: disable=broad-except
    return f'does not work here ({_one_line(error)})'
  return None


def resolve(requested: str) -> Tuple[str, str]:
  """The API to run and how it was chosen.

  Args:
    requested: `'auto'` or one of `config.APIS`.

  Returns:
    `(api, note)`: the API, and '' if it was asked for by name or
    '(the default here)' if `'auto'` chose it.

  Raises:
    UnavailableError: If the API asked for cannot run here; the message is
      one line that names the APIs that can.
  """
  if requested != config_lib.AUTO:
    reason = unavailable_reason(requested)
    if reason is None:
      return requested, ''
    available = [api for api in config_lib.APIS
                 if api != requested and unavailable_reason(api) is None]
    raise UnavailableError(
        f'--api {requested} {reason}; available here: '
        f'{", ".join(available) or "none"}.')
  reasons = {}
  for api in _AUTO_ORDER:
    reasons[api] = unavailable_reason(api)
    if reasons[api] is None:
      return api, '(the default here)'
  raise UnavailableError('no demo API works here: ' + '; '.join(
      f'{api} {reason}' for api, reason in reasons.items()))


def run_module(api: str):
  """The module whose `train` runs one training of `api`."""
  return importlib.import_module(_MODULES[api])


def _take_a_step(api: str) -> None:
  """Applies one gradient through `api`'s front end, in a graph as its run does."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  if api == config_lib.V1:
    from tf_loss_scale import optimizer_v1
    with tf.Graph().as_default():
      variable = tf.compat.v1.Variable(1.0)
      train_op = optimizer_v1.MixedPrecisionLossScaleOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.1),
          'dynamic').minimize(2.0 * variable, var_list=[variable])
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
    return
  import keras
  layer = keras.layers.Dense(1)
  layer.build((None, 1))
  variables = layer.trainable_variables
  if api == config_lib.KERAS:
    from tf_loss_scale.keras import keras3
    optimizer = keras3.LossScaleOptimizer(keras.optimizers.SGD(0.1))
  else:
    from tf_loss_scale.keras import experimental
    optimizer = experimental.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                                'dynamic')
  optimizer.build(variables)
  tf.function(lambda: optimizer.apply_gradients(
      [(tf.ones_like(v), v) for v in variables]))()


def _one_line(error: Exception) -> str:
  # An error raised inside a tf.function starts with "in user code:" and
  # ends with the line that says what went wrong.
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  message = lines[-1] if lines else ''
  name = type(error).__name__
  return message if message.startswith(name + ':') else f'{name}: {message}'


def _keras_version() -> Optional[str]:
  try:
    import keras  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return keras.__version__
