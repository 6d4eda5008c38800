"""`__init__.py` of this repository's root directory, for Bazel consumers only.

A workspace that depends on this repository as `@tf_loss_scale` gets its
files under `<runfiles>/tf_loss_scale/`, the first entry of the test's
sys.path, and Bazel makes that directory a package: `import tf_loss_scale`
would find the repository instead of the library in it. This module, which
Bazel imports under that name, loads the library package in its place.
"""

import importlib.util
import os
import sys

_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            'tf_loss_scale')
_spec = importlib.util.spec_from_file_location(
    __name__, os.path.join(_PACKAGE_DIR, '__init__.py'),
    submodule_search_locations=[_PACKAGE_DIR])
_package = importlib.util.module_from_spec(_spec)
# The import system returns whatever sys.modules holds once this module ends.
sys.modules[__name__] = _package
_spec.loader.exec_module(_package)
