"""Runs one pytest file as a Bazel py_test: `bazel_pytest_main.py TEST_FILE`."""

import sys

import pytest

if __name__ == '__main__':
  sys.exit(pytest.main([sys.argv[1], '-q', '-p', 'no:cacheprovider']))
