"""What one pass over the gradients costs in an XLA-compiled step, by shape.

Usage (from the repository root):

  .venv/bin/python benchmarks/check_pass.py        # ~1 min, 10x1M

A jit step with an exact skip makes at least two passes over each gradient
(`benchmarks/xla_passes.py`): the check, which must read every value before
any variable is written, and the update. This times, interleaved in one
process, each pass alone as an XLA-compiled function over the 10x1M
workload's variables, each gradient made from its variable in the same
fusion (`g = v * c`, as in the step):

  update    `v -= lr * g`: the bare step's one pass (reads and writes).
  keras3    `all(is_finite(g))` per gradient, and-ed: Keras's check.
  ours      `tf_loss_scale.gradients.read`, reduced to a verdict: the
            check of our jit step, which also gives the skip report's NaN
            and inf flags.
  max       the largest `|g|` per gradient, one whole reduction each: the
            shape of a read that XLA:CPU reduces on one thread.
  max_rows  the same over rows of 32 values, then over the rows: a row
            reduction, which XLA:CPU spreads over its threads.

Prints each pass's median time and its ratio to Keras's check.
"""

import argparse
import functools
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from benchmarks import timing  # pylint: disable=g-import-not-at-top
from benchmarks import workloads  # pylint: disable=g-import-not-at-top
from tf_loss_scale import gradients  # pylint: disable=g-import-not-at-top

_ROW = 32
# Its variables' sizes are multiples of `_ROW`.
_SHAPE = '10x1M'


def compiled_passes(variables: List[tf.Variable], factor: tf.Variable
                    ) -> Dict[str, Callable[[], Optional[tf.Tensor]]]:
  """Each pass over `variables` as an XLA-compiled function of no arguments.

  Args:
    variables: The model's variables; each gradient is `variable * factor`.
    factor: A scalar variable (a constant would be folded away).

  Returns:
    Pass name -> its function: the checks return the verdict, the reads
    the largest magnitude, `update` nothing.
  """

  def grads():
    return [v * factor for v in variables]

  def update():
    for v in variables:
      v.assign_sub(0.01 * (v * factor))

  def keras3():
    return tf.reduce_all(
        tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads()]))

  def ours():
    return tf.logical_not(tf.reduce_any(gradients.read(grads()) > 0))

  def whole_max():
    return tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(g)) for g in grads()]))

  def row_max():
    return tf.reduce_max(tf.stack([
        tf.reduce_max(tf.reduce_max(tf.reshape(tf.abs(g), [-1, _ROW]), 1))
        for g in grads()]))

  fns = {'update': update, 'keras3': keras3, 'ours': ours, 'max': whole_max,
         'max_rows': row_max}
  return {name: tf.function(fn, jit_compile=True) for name, fn in fns.items()}


def _call(fn: Callable[[], Optional[tf.Tensor]]) -> None:
  """Calls `fn` and, for a check, reads its result."""
  result = fn()
  if result is not None:
    result.numpy()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repetitions', type=int, default=15)
  args = parser.parse_args(argv)
  variables = [tf.Variable(v)
               for v in workloads.WORKLOADS[_SHAPE].initial_values()]
  factor = tf.Variable(1.0 / 1024)
  passes = compiled_passes(variables, factor)
  steps = {}
  for name, fn in passes.items():
    fn()  # Compiles.
    steps[name] = functools.partial(_call, fn)
  block = timing.steps_per_block(steps['keras3'], 0.1)
  times = timing.interleaved(steps, args.repetitions, block)
  reference = times['keras3']
  print(f'{_SHAPE}, XLA:CPU, {os.cpu_count()} cores; median of '
        f'{args.repetitions} interleaved blocks of {block} calls')
  print(f'{"pass":<10}{"ms":>8}{"/ keras3":>10}')
  for name, per_call in times.items():
    ratio = statistics.median(t / r for t, r in zip(per_call, reference))
    print(f'{name:<10}{1e3 * statistics.median(per_call):>8.2f}'
          f'{ratio:>10.2f}')


if __name__ == '__main__':
  main()
