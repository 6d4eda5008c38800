"""A pytest plugin that runs a test session with `compat.install()` active.

`pytest -p install_compat_plugin ...` (with .ci/ on PYTHONPATH) calls
`tf_loss_scale.compat.install(override=True)` when pytest configures, before
any test module is imported, and `uninstall()` when the session ends. Used
by .ci/keras_tests_with_install.py to run test files, Keras's own among
them, as clients of install(). If TF_LOSS_SCALE_CI_INSTALLED names a file,
writes there whether install() is in effect once configured.
"""

import os

import tf_loss_scale.compat


def pytest_configure(config):
  del config  # Unused.
  tf_loss_scale.compat.install(override=True)
  # Proof for the caller that this session ran installed.
  marker = os.environ.get('TF_LOSS_SCALE_CI_INSTALLED')
  if marker:
    with open(marker, 'w') as f:
      f.write(f'{tf_loss_scale.compat.is_installed()}\n')


def pytest_unconfigure(config):
  del config  # Unused.
  tf_loss_scale.compat.uninstall()
