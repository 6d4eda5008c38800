"""Checks that tests run on the venv's TensorFlow and this workspace's package.

Under Bazel this proves the Python toolchain (tools/venv_python.sh) works,
running the tests on the README's .venv (whose TensorFlow is the newest the
package admits; .ci/run's other virtualenvs hold older ones);
the last test checks, without Bazel, the root `__init__.py` that Bazel
consumers of `@tf_loss_scale` get (tools/repository_init.py).
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import tensorflow as tf

import tf_loss_scale

WORKSPACE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_runs_in_a_virtualenv():
  assert sys.prefix != sys.base_prefix, sys.executable


def test_tensorflow_is_the_virtualenvs():
  prefix = os.path.realpath(sys.prefix)
  assert os.path.realpath(tf.__file__).startswith(prefix + os.sep), (
      tf.__file__, sys.prefix)
  assert tf.__version__ == importlib.metadata.version('tensorflow')


def test_package_comes_from_this_workspace():
  package_file = os.path.abspath(tf_loss_scale.__file__)
  assert package_file == os.path.join(WORKSPACE, 'tf_loss_scale', '__init__.py')


def test_repository_init_hands_the_name_to_the_package(tmp_path):
  # The runfiles layout of a workspace depending on @tf_loss_scale: the
  # repository directory, named like the package, holds the generated
  # __init__.py and the package itself, and comes first on sys.path.
  repository = tmp_path / 'tf_loss_scale'
  repository.mkdir()
  shutil.copy(os.path.join(WORKSPACE, 'tools', 'repository_init.py'),
              repository / '__init__.py')
  os.symlink(os.path.join(WORKSPACE, 'tf_loss_scale'),
             repository / 'tf_loss_scale')
  # Where each submodule would load from, without loading TensorFlow: the
  # library's own directory (Bazel's step imports them for real).
  script = ('import importlib.util, sys, tf_loss_scale; '
            'print(tf_loss_scale.__name__, tf_loss_scale.__file__, '
            'importlib.util.find_spec("tf_loss_scale.loss_scale").origin, '
            'importlib.util.find_spec("tf_loss_scale.monitoring").origin, '
            '"tensorflow" in sys.modules)')
  done = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True,
      timeout=120, check=False, cwd=str(tmp_path),
      env=dict(os.environ, PYTHONPATH=str(tmp_path)))
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == [
      'tf_loss_scale',
      str(repository / 'tf_loss_scale' / '__init__.py'),
      str(repository / 'tf_loss_scale' / 'loss_scale.py'),
      str(repository / 'tf_loss_scale' / 'monitoring.py'), 'False'], done.stdout
