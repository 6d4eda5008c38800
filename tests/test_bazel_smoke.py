"""Checks that tests run on the venv's TensorFlow and this workspace's package.

Under Bazel this proves the Python toolchain (tools/venv_python.sh) works.
"""

import os
import sys

import tensorflow as tf

import tf_loss_scale

WORKSPACE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_runs_in_a_virtualenv():
  assert sys.prefix != sys.base_prefix, sys.executable


def test_tensorflow_is_2_21():
  assert tf.__version__.startswith('2.21'), tf.__version__


def test_package_comes_from_this_workspace():
  package_file = os.path.abspath(tf_loss_scale.__file__)
  assert package_file == os.path.join(WORKSPACE, 'tf_loss_scale', '__init__.py')
