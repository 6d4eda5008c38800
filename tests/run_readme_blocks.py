"""Runs code blocks one after another, each as if it were a script of its own.

`python run_readme_blocks.py BLOCKS.json` reads a JSON list of
`{"id": ..., "code": ...}` and runs each block's code as `__main__` in a
namespace of its own and an empty working directory, restoring global state
(policies, `compat.install()`, environment variables) after it. Its last
output line is a JSON object mapping each id to None, or to the traceback of
the block's failure. Used by tests/test_readme.py in fresh processes.
"""

import functools
import json
import sys

import isolation


def _run_block(block_id: str, code: str) -> None:
  # pylint: disable-next=exec-used
  exec(compile(code, block_id, 'exec'), {'__name__': '__main__'})


def main(blocks_file: str) -> None:
  with open(blocks_file) as f:
    blocks = json.load(f)
  errors = {}
  for block in blocks:
    _, errors[block['id']] = isolation.run_isolated(
        functools.partial(_run_block, block['id'], block['code']))
  print(json.dumps(errors))


if __name__ == '__main__':
  main(sys.argv[1])
