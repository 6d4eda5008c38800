"""A pytest plugin that runs a test session with `compat.install()` active.

`pytest -p install_compat_plugin ...` (with .ci/ on PYTHONPATH) calls
`tf_loss_scale.compat.install(override=True)` when pytest configures, before
any test module is imported, and `uninstall()` when the session ends. Used
by .ci/keras_tests_with_install.py to run test files, Keras's own among
them, as clients of install().
"""

import tf_loss_scale.compat


def pytest_configure(config):
  del config  # Unused.
  tf_loss_scale.compat.install(override=True)


def pytest_unconfigure(config):
  del config  # Unused.
  tf_loss_scale.compat.uninstall()
