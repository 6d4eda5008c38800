"""Side-by-side step-time benchmark of loss scaling wrappers.

Usage (from the repository root):

  .venv/bin/python benchmarks/run.py            # full run, about 10 minutes
  .venv/bin/python benchmarks/run.py --quick    # short run, a few minutes
  .venv/bin/python benchmarks/run.py --modes graph --shapes 10x1M,200x1k
  .venv/bin/python benchmarks/run.py --against bae83b1 --shapes 10x1M,matmul

For every mode and workload it builds the bare SGD step, ours and the
reference wrapper in one process, times them interleaved, and prints the
median step times, the overhead each wrapper adds over the bare step, and
the ratio ours/reference against the target. In graph mode it also times a
floor variant (`variants._BarrierFloorV1`: scale, unscale, hold every
gradient until all exist, apply; no check, no state) and prints its ratio to
the reference, and a read floor (`variants._ReadFloorV1`: the same, with
every gradient read once, by one reduction whose results are kept, before
the barrier): the least overhead of an exact skip that reads each gradient
by a kernel of its own, since it cannot decide without reading every value.
The graph target is against the read floor. Every row also counts the ops
each wrapper adds to the traced step (over the bare step's; ops in called
functions, such as the branches of a conditional, included, but for the
bodies of functions never inlined, which run only when called) and checks
that ours ends with the same variable values as the reference. Rows under a strategy also count
the cross-replica reductions per step of each variant, and among them the
collective ops (benchmarks/collectives.py). With --against COMMIT every row
also times this library as it was at that commit (benchmarks/earlier.py),
interleaved with the others, and gives its ratio and ours' overhead over
its, with the quartiles: whether a change made a step slower, told apart
from the drift between runs. Results go to benchmarks/results.json (or
--json PATH).

Targets (ratio = ours' added overhead / the reference's): at most 0.75
under MirroredStrategy and in a `tf.function`, at most 0.5 with
`jit_compile=True`, within 0.05 of the read floor's ratio in a TF1 graph; on the
small CNN ours adds at most 3% to the bare step.

Modes: graph (tf.compat.v1 Session; v1 optimizers: bare
GradientDescentOptimizer, ours MixedPrecisionLossScaleOptimizer, TensorFlow's
tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer); function,
jit and mirrored (Keras 3 optimizers: bare keras SGD, our
tf_loss_scale.keras.LossScaleOptimizer, keras.optimizers.LossScaleOptimizer).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Two logical CPU devices for MirroredStrategy, configured before TensorFlow
# initialises its devices (every mode runs in this one process).
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices('CPU')[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks import collectives  # pylint: disable=g-import-not-at-top
from benchmarks import earlier  # pylint: disable=g-import-not-at-top
from benchmarks import memory  # pylint: disable=g-import-not-at-top
from benchmarks import timing  # pylint: disable=g-import-not-at-top
from benchmarks import variants  # pylint: disable=g-import-not-at-top
from benchmarks import workloads  # pylint: disable=g-import-not-at-top

# Ours may add at most this fraction of the reference wrapper's overhead.
RATIO_TARGETS = {'function': 0.75, 'jit': 0.5, 'mirrored': 0.75}
# In a TF1 graph ours may exceed the read floor's ratio by at most this.
FLOOR_MARGIN = {'graph': 0.05}
# On the small CNN the wrapper's cost must vanish next to the convolutions.
CNN_MAX_OVERHEAD = 0.03

FAMILY_OF_MODE = {'graph': 'v1', 'function': 'keras', 'jit': 'keras',
                  'mirrored': 'keras'}


def _parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='fewer repetitions, memory on 10x1M only')
  parser.add_argument('--modes', default=','.join(variants.MODES))
  parser.add_argument('--shapes', default=','.join(workloads.TABLE),
                      help=f'of {", ".join(workloads.WORKLOADS)}')
  parser.add_argument('--against', metavar='COMMIT',
                      help='also time this library as it was at COMMIT')
  parser.add_argument('--repetitions', type=int, default=None,
                      help='timed blocks per variant (default 30, quick 5)')
  parser.add_argument('--block-seconds', type=float, default=None,
                      help='target length of one timed block (default 0.2, '
                      'quick 0.08)')
  parser.add_argument('--no-memory', action='store_true',
                      help='skip the peak RSS child processes')
  parser.add_argument('--json', default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), 'results.json'))
  parser.add_argument('--child', help=argparse.SUPPRESS)
  return parser.parse_args(argv)


_STRATEGY = []


def _strategy_for(mode):
  # One strategy for the whole process: collective ops of two
  # MirroredStrategy instances would share instance keys and clash.
  if mode != 'mirrored':
    return None
  if not _STRATEGY:
    _STRATEGY.append(tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1']))
  return _STRATEGY[0]


def _run_child(spec):
  """Builds and steps one variant, then prints its peak RSS as JSON."""
  mode, family, variant, shape, steps = spec.split(':')
  runner = variants.build(mode, family, variant, workloads.WORKLOADS[shape],
                          _strategy_for(mode))
  for _ in range(int(steps)):
    runner.step()
  print(json.dumps(memory.child_report()))


def _identical(a, b):
  return all(np.array_equal(x, y) for x, y in zip(a, b))


def _op_count(graph_def) -> dict:
  """Ops of a traced step: at top level, and with every called function's.

  A function that is never inlined (`_noinline`) is one op where it is
  called, and its body runs only when the call does: its ops are counted
  apart, under 'not_inlined'.
  """
  functions = graph_def.library.function
  not_inlined = sum(len(f.node_def) for f in functions if '_noinline' in f.attr)
  in_functions = sum(len(f.node_def) for f in functions) - not_inlined
  return {'top': len(graph_def.node),
          'all': len(graph_def.node) + in_functions,
          'not_inlined': not_inlined}


def _measure_row(mode, shape, args):
  """Times bare, ours and the reference for one mode and workload."""
  family = FAMILY_OF_MODE[mode]
  names = list(variants.FAMILIES[family])
  bare, ours, reference = names
  strategy = _strategy_for(mode)
  workload = workloads.WORKLOADS[shape]
  floor = list(variants.FLOORS.get(family, {}))
  before = list(variants.EARLIER.get(family, {}))
  runners = {n: variants.build(mode, family, n, workload, strategy)
             for n in names + floor + before}
  for runner in runners.values():  # tracing, compilation, allocator warm-up
    for _ in range(5):
      runner.step()
  block = timing.steps_per_block(runners[bare].step, args.block_seconds)
  times = timing.interleaved({n: r.step for n, r in runners.items()},
                             args.repetitions, block)
  # Every variant ran the same number of steps from the same start.
  values = {n: runners[n].values() for n in names}
  ops = {n: _op_count(runners[n].graph_def()) for n in names}
  ours_over = timing.median_overhead(times[ours], times[bare])
  ref_over = timing.median_overhead(times[reference], times[bare])
  row = {
      'mode': mode,
      'shape': shape,
      'family': family,
      'reference': reference,
      'steps_per_block': block,
      'repetitions': args.repetitions,
      'median_ms': {n: 1e3 * statistics.median(t) for n, t in times.items()},
      'overhead': {ours: ours_over, reference: ref_over},
      'ratio': ours_over / ref_over if ref_over > 0 else None,
      # How much that ratio moves between blocks: its quartiles over them.
      'ratio_quartiles': timing.ratio_quartiles(times[ours], times[reference],
                                                times[bare]),
      # Each floor's overhead over the reference's: 'floor' holds the
      # gradients back, 'read_floor' also reads each once; no exact skip
      # goes below the read floor.
      'floor_ratios': {n: (timing.median_overhead(times[n], times[bare]) /
                           ref_over if ref_over > 0 else None)
                       for n in floor},
      'identical_to_reference': _identical(values[ours], values[reference]),
      'earlier': _earlier_figures(times, ours, bare, ref_over) if before
                 else None,
      # Ops of the traced step; the wrappers' are also given as added to
      # the bare step's.
      'ops': ops,
      'ops_added': {n: ops[n]['all'] - ops[bare]['all']
                    for n in (ours, reference)},
      # Cross-replica reductions per step (benchmarks/collectives.py); only
      # steps under a strategy have any.
      'reductions_per_step': None if strategy is None else {
          n: collectives.per_replica_step(runners[n].step, strategy)
          for n in names},
      # Of those, the collective ops (the rest are sums across devices).
      'collectives_per_step': None if strategy is None else {
          n: collectives.per_replica_step(runners[n].step, strategy,
                                          sums=False)
          for n in names},
  }
  if shape == 'cnn':
    row['target'] = f'ours <= +{CNN_MAX_OVERHEAD:.0%}'
    row['met'] = ours_over <= CNN_MAX_OVERHEAD
  elif mode in FLOOR_MARGIN:
    read_floor = row['floor_ratios']['read_floor']
    row['target'] = f'ratio <= read+{FLOOR_MARGIN[mode]}'
    row['met'] = (row['ratio'] is not None and read_floor is not None
                  and row['ratio'] <= read_floor + FLOOR_MARGIN[mode])
  else:
    row['target'] = f'ratio <= {RATIO_TARGETS[mode]}'
    row['met'] = row['ratio'] is not None and row['ratio'] <= RATIO_TARGETS[mode]
  return row


def _earlier_figures(times, ours, bare, ref_over):
  """How the library at an earlier commit (--against) compares in a row.

  Returns its overhead over the reference's ('ratio'), ours' over its
  ('ours_over_earlier': above 1 when ours is slower), and the quartiles of
  that over the repetitions.
  """
  earlier_over = timing.median_overhead(times['earlier'], times[bare])
  ours_over = timing.median_overhead(times[ours], times[bare])
  return {
      'ratio': earlier_over / ref_over if ref_over > 0 else None,
      'ours_over_earlier': ours_over / earlier_over if earlier_over > 0
                           else None,
      'quartiles': timing.ratio_quartiles(times[ours], times['earlier'],
                                          times[bare]),
  }


def _measure_memory(row, steps):
  family, mode, shape = row['family'], row['mode'], row['shape']
  row['peak_rss_mb'] = {
      n: memory.peak_rss_mb(mode, family, n, shape, steps)
      for n in variants.FAMILIES[family]
  }


def _format_table(rows):
  header = (f"{'mode':9} {'shape':7} {'bare ms':>8} {'ours ms':>8} "
            f"{'ref ms':>8} {'ours +%':>8} {'ref +%':>8} {'ratio':>6} {'q1-q3':>9} "
            f"{'floor':>6} "
            f"{'read':>6}  "
            f"{'reference':9} {'target':18} {'met':4} {'same':4} "
            f"{'ops +o/+r':>11} {'RSS MB bare/ours/ref':>22} {'reduce b/o/r':>12} "
            f"{'coll b/o/r':>10} {'earlier':>7} {'ours/earlier':>17}")
  lines = [header, '-' * len(header)]
  for r in rows:
    bare, ours, ref = variants.FAMILIES[r['family']]
    ms = r['median_ms']
    floors = r['floor_ratios']
    ratio, floor, read = ('-' if v is None else f'{v:.2f}' for v in (
        r['ratio'], floors.get('floor'), floors.get('read_floor')))
    quartiles = r.get('ratio_quartiles')
    spread = '-' if quartiles is None else '{:.2f}-{:.2f}'.format(*quartiles)
    met = {True: 'yes', False: 'NO', None: '-'}[r['met']]
    rss = r.get('peak_rss_mb')
    rss = '/'.join(f'{rss[n]:.0f}' for n in (bare, ours, ref)) if rss else '-'
    red = r.get('reductions_per_step')
    red = '/'.join(f'{red[n]:g}' for n in (bare, ours, ref)) if red else '-'
    coll = r.get('collectives_per_step')
    coll = '/'.join(f'{coll[n]:g}' for n in (bare, ours, ref)) if coll else '-'
    added = r['ops_added']
    ops = f'{added[ours]:+d}/{added[ref]:+d}'
    before = r.get('earlier') or {}
    before_ratio, ours_over_before = ('-' if v is None else f'{v:.2f}' for v in (
        before.get('ratio'), before.get('ours_over_earlier')))
    if before.get('quartiles'):
      ours_over_before += ' ({:.2f}-{:.2f})'.format(*before['quartiles'])
    lines.append(
        f"{r['mode']:9} {r['shape']:7} {ms[bare]:8.3f} {ms[ours]:8.3f} "
        f"{ms[ref]:8.3f} {100 * r['overhead'][ours]:+7.1f}% "
        f"{100 * r['overhead'][ref]:+7.1f}% {ratio:>6} {spread:>9} {floor:>6} {read:>6}  {ref:9} "
        f"{r['target']:18} {met:4} {'yes' if r['identical_to_reference'] else 'NO':4} "
        f"{ops:>11} {rss:>22} {red:>12} {coll:>10} {before_ratio:>7} "
        f"{ours_over_before:>17}")
  return '\n'.join(lines)


def main(argv=None):
  args = _parse_args(sys.argv[1:] if argv is None else argv)
  if args.child:
    _run_child(args.child)
    return 0
  if args.against:
    variants.add_earlier(earlier.load(
        args.against, os.path.dirname(os.path.abspath(__file__))))
  if args.repetitions is None:
    args.repetitions = 5 if args.quick else 30
  if args.block_seconds is None:
    args.block_seconds = 0.08 if args.quick else 0.2
  rows = []
  for mode in args.modes.split(','):
    for shape in args.shapes.split(','):
      row = _measure_row(mode, shape, args)
      if not args.no_memory and (not args.quick or shape == '10x1M'):
        _measure_memory(row, steps=20)
      rows.append(row)
      print(_format_table([row]).splitlines()[-1], flush=True)
  print()
  print(_format_table(rows))
  report = {
      'command': ' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
      'date': datetime.datetime.now().isoformat(timespec='seconds'),
      'tensorflow': tf.__version__,
      'keras': keras.__version__,
      'python': platform.python_version(),
      'cpus': os.cpu_count(),
      'against': args.against,
      'load_average': os.getloadavg(),
      'timing': ('median over repetitions of per-step time of an interleaved '
                 'block; overhead = median of paired (variant / bare - 1)'),
      'memory': ('peak RSS (VmHWM) of a child process that builds one '
                 'variant and runs 20 steps'),
      'rows': rows,
  }
  with open(args.json, 'w') as f:
    json.dump(report, f, indent=1)
  print(f'\nwrote {args.json}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
