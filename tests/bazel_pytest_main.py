"""Runs one pytest file as a Bazel py_test: `bazel_pytest_main.py TEST_FILE`.

Every test of the file, the slow ones too (--full: docs/testing.md).
"""

import sys

import pytest

if __name__ == '__main__':
  sys.exit(pytest.main(
      [sys.argv[1], '-q', '--full', '-p', 'no:cacheprovider']))
