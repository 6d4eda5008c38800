"""A pytest plugin that runs only the tests a file lists, by JUnit id.

`pytest -p select_tests_plugin ...` (with .ci/ on PYTHONPATH) reads
TF_LOSS_SCALE_CI_SELECT, a file of test ids one a line, each as
.ci/keras_tests_with_install.py reads them from a JUnit report
(`CLASSNAME::NAME`), and deselects every collected test it does not list.
Used to run plainly only the tests that did not pass with install().
"""

import os
import re


def junit_id(nodeid: str) -> str:
  """The id a JUnit report gives a test: `dotted.module.Class::name`."""
  path, bracket, params = nodeid.partition('[')
  names = path.split('::')
  names[0] = re.sub(r'\.py$', '', names[0].replace('/', '.'))
  names[-1] += bracket + params
  return '.'.join(names[:-1]) + '::' + names[-1]


def pytest_collection_modifyitems(config, items):
  with open(os.environ['TF_LOSS_SCALE_CI_SELECT']) as f:
    wanted = set(f.read().splitlines())
  kept = [item for item in items if junit_id(item.nodeid) in wanted]
  config.hook.pytest_deselected(
      items=[item for item in items if junit_id(item.nodeid) not in wanted])
  items[:] = kept
