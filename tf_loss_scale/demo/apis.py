"""Which of the demo's APIs work with the installed TensorFlow and Keras.

The Keras 3 run needs Keras 3 (TensorFlow 2.16 or later installs it); the
custom-loop run needs the experimental wrapper to import with the installed
Keras; the TF1 session loop needs only TensorFlow. Each API is tried by
importing its run module, so the answer is what actually works here.
"""

import importlib
from typing import Optional, Tuple

from tf_loss_scale.demo import config as config_lib

_MODULES = {
    config_lib.KERAS: 'tf_loss_scale.demo.keras_run',
    config_lib.EXPERIMENTAL: 'tf_loss_scale.demo.experimental_run',
    config_lib.V1: 'tf_loss_scale.demo.v1_run',
}
# The library's front end each run uses (the Keras 3 run imports its front
# end only where it is used, as the custom-loop run shares its module).
_FRONT_ENDS = {
    config_lib.KERAS: 'tf_loss_scale.keras.loss_scale_optimizer',
    config_lib.EXPERIMENTAL: 'tf_loss_scale.keras.experimental',
    config_lib.V1: 'tf_loss_scale.optimizer_v1',
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
    for module in (_FRONT_ENDS[api], _MODULES[api]):
      importlib.import_module(module)
  # An import that fails on an older Keras may fail with any of these.
  except (ImportError, AttributeError, TypeError) as error:
    first_line = (str(error).strip().splitlines() or [''])[0]
    return f'does not import here ({type(error).__name__}: {first_line})'
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


def _keras_version() -> Optional[str]:
  try:
    import keras  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return keras.__version__
