"""Runs one legacy program unmodified after `tf_loss_scale.compat.install()`.

`python run_program.py [--override] PROGRAM` installs the legacy names
(with `--override`, `install(override=True)`, which also replaces the names
TensorFlow still ships) and runs PROGRAM as `__main__` in the current
directory; with `--installed` it installs nothing, for a run through
`python -m tf_loss_scale run run_program.py --installed PROGRAM`, which
installed them. The program asserts what it trained and prints a JSON line; the
runner then prints its own last: `{"made": [...]}`, the classes of the loss
scale optimizers the program constructed (module and qualname, in the order
first made, with " in compile" or " in enable_mixed_precision_graph_rewrite"
when one of those made it), TensorFlow's, Keras's and this library's alike,
so that a test can tell whose class ran. With `--compare` it first runs
PROGRAM with TensorFlow's own classes (nothing installed) in this same
process, echoes its output and prints `{"theirs": ITS_JSON_LINE}`, then
resets the default graph and runs it as above, for the test to compare the
two JSON lines. Used by tests/test_legacy_programs.py, one fresh process per
program.
"""

import contextlib
import io
import json
import runpy
import sys
from typing import Iterator, List

import tensorflow as tf

import class_names
import tf_loss_scale.compat

# Where each generation's loss scale optimizer is reachable through `tf`.
_NAMES = (
    'compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer',
    'compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer',
    'keras.mixed_precision.experimental.LossScaleOptimizer',
    'keras.mixed_precision.LossScaleOptimizer',
    'keras.optimizers.LossScaleOptimizer',
)


def _lookup(dotted: str, value=tf):
  for part in dotted.split('.'):
    value = getattr(value, part, None)
  return value if isinstance(value, type) else None


def _with_subclasses(cls: type) -> Iterator[type]:
  yield cls
  for subclass in cls.__subclasses__():
    yield from _with_subclasses(subclass)


# Functions that make loss scale optimizers of their own.
_MAKERS = ('compile', 'enable_mixed_precision_graph_rewrite')


def _maker() -> str:
  """' in NAME' when a function of `_MAKERS` is on the stack, else ''."""
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code.co_name in _MAKERS:
      return ' in ' + frame.f_code.co_name
    frame = frame.f_back
  return ''


def _record_construction(classes: List[type], made: List[str]) -> None:
  """Makes each class note the class of every instance it initializes."""
  for cls in classes:
    original = cls.__init__

    def init(self, *args, _original=original, **kwargs):
      name = class_names.class_name(type(self))
      name += _maker()
      if name not in made:
        made.append(name)
      _original(self, *args, **kwargs)

    cls.__init__ = init


def _run_captured(program: str) -> str:
  """Runs PROGRAM as `__main__`; returns its last line, also echoed."""
  out = io.StringIO()
  sys.argv = [program]
  try:
    with contextlib.redirect_stdout(out):
      runpy.run_path(program, run_name='__main__')
  finally:
    print(out.getvalue(), end='')
  return out.getvalue().strip().splitlines()[-1]


def main(argv: list) -> None:
  *flags, program = argv
  if '--compare' in flags:
    # TensorFlow's own wrapper, before anything is installed or recorded.
    print(json.dumps({'theirs': json.loads(_run_captured(program))}))
    tf.compat.v1.reset_default_graph()
  # TensorFlow's own v1 classes, before `install(override=True)` replaces
  # their names; then every class the names lead to once installed.
  classes = [_lookup(_NAMES[0]), _lookup(_NAMES[1])]
  if '--installed' not in flags:
    tf_loss_scale.compat.install(override='--override' in flags)
  classes += [_lookup(name) for name in _NAMES]
  # Keras 3's own names too, where `tf.keras` is tf_keras.
  import keras  # pylint: disable=g-import-not-at-top
  classes += [_lookup(name, keras) for name in (
      'mixed_precision.LossScaleOptimizer', 'optimizers.LossScaleOptimizer')]
  unique = {}
  for root in filter(None, classes):
    for cls in _with_subclasses(root):
      unique.setdefault(cls, None)
  made = []
  _record_construction(list(unique), made)
  sys.argv = [program]
  runpy.run_path(program, run_name='__main__')
  print(json.dumps({'made': made}))


if __name__ == '__main__':
  main(sys.argv[1:])
