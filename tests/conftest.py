"""Test setup shared by every test module.

Splits the one physical CPU into two logical devices before TensorFlow
initialises, so that MirroredStrategy runs two real replicas.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

_cpus = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)


@pytest.fixture(scope='session')
def mirrored_strategy():
  """A MirroredStrategy over the two logical CPUs, one per test process.

  A second MirroredStrategy in the same process breaks its collectives
  ("Shape mismatch in the collective instance"), so every test shares one.
  """
  return tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])


def pytest_addoption(parser):
  parser.addoption(
      '--full', action='store_true',
      help='also run the tests marked slow (the full tier; docs/testing.md)')


def pytest_collection_modifyitems(config, items):
  """Leaves the tests marked slow out unless --full is given."""
  if config.getoption('--full'):
    return
  slow = [item for item in items if item.get_closest_marker('slow')]
  if slow:
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if not item.get_closest_marker('slow')]
