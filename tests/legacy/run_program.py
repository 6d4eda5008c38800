"""Runs one legacy program unmodified after `tf_loss_scale.compat.install()`.

`python run_program.py [--override] PROGRAM` installs the legacy names
(with `--override`, `install(override=True)`, which also replaces the names
TensorFlow still ships) and runs PROGRAM as `__main__` in the current
directory. The program asserts what it trained and prints a JSON line last.
Used by tests/test_legacy_programs.py, one fresh process per program.
"""

import runpy
import sys

import tf_loss_scale.compat


def main(argv: list) -> None:
  *flags, program = argv
  tf_loss_scale.compat.install(override='--override' in flags)
  sys.argv = [program]
  runpy.run_path(program, run_name='__main__')


if __name__ == '__main__':
  main(sys.argv[1:])
