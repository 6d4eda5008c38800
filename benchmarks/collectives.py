"""Cross-replica reductions launched per training step, from the traced step.

Usage (from the repository root):

  .venv/bin/python benchmarks/collectives.py    # about a minute

prints, for the bare SGD step, ours and the reference wrapper of each family
(v1: TensorFlow's `tf.compat.v1` wrapper; keras: Keras 3's
`LossScaleOptimizer`), how many cross-replica reductions one step launches
under MirroredStrategy (two logical CPUs, in this process) and under
MultiWorkerMirroredStrategy (two worker processes on 127.0.0.1, one replica
each), on the small CNN workload. Results go to benchmarks/collectives.json.

Counting (`in_graph_def`): collective ops (per replica) and sums across
devices in the step function's graph and in every function it calls,
counting a conditional's most expensive branch (a finite step takes the
apply branch) and a loop body once. MirroredStrategy on CPUs reduces
through collective ops, except `strategy.reduce` to the host, which sums
the replicas' values on one device.
"""

import functools
import json
import os
import sys
from typing import Any, Dict, Iterable, Mapping

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Every op that takes part in a cross-device or cross-worker exchange.
COLLECTIVE_OPS = frozenset({
    'CollectiveReduce', 'CollectiveReduceV2', 'CollectiveReduceV3',
    'CollectiveGather', 'CollectiveGatherV2',
    'CollectiveBcastSend', 'CollectiveBcastSendV2',
    'CollectiveBcastRecv', 'CollectiveBcastRecvV2',
    'CollectiveAllToAllV2', 'CollectiveAllToAllV3',
    'CollectiveReduceScatterV2',
    'NcclAllReduce', 'NcclReduce', 'NcclBroadcast',
})
_BRANCHING_OPS = frozenset({'If', 'StatelessIf', 'Case', 'StatelessCase'})
_SUM_OPS = frozenset({'AddN', 'AddV2', 'Add'})
_WORKLOAD = 'cnn'
_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     'collectives.json')


def in_graph_def(graph_def: Any, replicas: int = 1, sums: bool = True) -> float:
  """Cross-replica reductions one run of a graph launches, per replica.

  Two kinds are counted. Each op of `COLLECTIVE_OPS` is launched by every
  replica of the process, so their number is divided by `replicas`. A sum
  whose inputs live on several devices (how MirroredStrategy reduces to one
  device, for example to the host in `strategy.reduce`) is one reduction
  for all replicas. Ops in nested functions count too.

  Args:
    graph_def: A `tf.compat.v1.GraphDef` with its function library.
    replicas: The replicas of this process.
    sums: Whether to count the sums across devices; False counts collective
      ops only (what crosses workers).

  Returns:
    The count: a conditional contributes its most expensive branch, a loop
    its condition and body once.
  """
  library = {f.signature.name: f for f in graph_def.library.function}

  @functools.lru_cache(maxsize=None)
  def in_function(name: str) -> float:
    return in_nodes(library[name].node_def)

  def in_nodes(nodes: Iterable[Any]) -> float:
    nodes = list(nodes)
    device_of = {node.name: node.device for node in nodes}
    total = 0.0
    for node in nodes:
      if node.op in COLLECTIVE_OPS:
        total += 1 / replicas
      elif (sums and node.op in _SUM_OPS and
            len(input_devices(node, device_of)) > 1):
        total += 1
      if node.op in library:  # A function called by its name.
        total += in_function(node.op)
      called = [in_function(name) for name in _called_functions(node)]
      if node.op in _BRANCHING_OPS:
        total += max(called, default=0)
      else:
        total += sum(called)
    return total

  return in_nodes(graph_def.node)


def per_replica_step(step: Any, strategy: tf.distribute.Strategy,
                     sums: bool = True) -> float:
  """Cross-replica reductions per replica in one call of `step`.

  Args:
    step: A `tf.function` without arguments that runs one training step
      (usually `strategy.run(...)` inside).
    strategy: The strategy it runs under.
    sums: As in `in_graph_def`.

  Returns:
    `in_graph_def` of its traced graph.
  """
  graph_def = step.get_concrete_function().graph.as_graph_def()
  return in_graph_def(graph_def, len(strategy.extended.worker_devices), sums)


def input_devices(node: Any, device_of: Mapping[str, str]) -> set:
  """The devices of the nodes whose outputs `node` takes (control inputs too).

  Args:
    node: A NodeDef.
    device_of: Node name -> its device, for the nodes of `node`'s graph or
      function body.

  Returns:
    The set of those devices that are known (non-empty).
  """
  names = (name.lstrip('^').split(':')[0] for name in node.input)
  return {device_of[name] for name in names if device_of.get(name)}


def _called_functions(node: Any) -> Iterable[str]:
  for value in node.attr.values():
    if value.HasField('func'):
      yield value.func.name
    elif value.HasField('list'):
      for func in value.list.func:
        yield func.name


def measure(strategy: tf.distribute.Strategy) -> Dict[str, Dict[str, float]]:
  """Per-replica collectives of every variant, family by family.

  Args:
    strategy: The strategy to build and trace the steps under.

  Returns:
    {family: {variant: collective ops per replica and step}}.
  """
  from benchmarks import variants  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  counts = {}
  for family, makers in variants.FAMILIES.items():
    counts[family] = {}
    for variant in makers:
      runner = variants.build('mirrored', family, variant,
                              workloads.WORKLOADS[_WORKLOAD], strategy)
      counts[family][variant] = per_replica_step(runner.step, strategy)
  return counts


def format_table(results: Mapping[str, Mapping[str, Mapping[str, float]]]
                 ) -> str:
  """The README's table: one row per strategy and family."""
  from benchmarks import variants  # pylint: disable=g-import-not-at-top
  lines = [f"{'strategy':28} {'family':7} {'bare':>5} {'ours':>5} "
           f"{'ref':>5}  reference"]
  for strategy, families in results.items():
    for family, counts in families.items():
      bare, ours, reference = variants.FAMILIES[family]
      lines.append(
          f'{strategy:28} {family:7} {counts[bare]:5g} {counts[ours]:5g} '
          f'{counts[reference]:5g}  {reference}')
  return '\n'.join(lines)


def _worker(index: int, ports: str) -> None:
  from benchmarks import local_cluster  # pylint: disable=g-import-not-at-top
  os.environ['TF_CONFIG'] = json.dumps(local_cluster.tf_config(
      [int(p) for p in ports.split(',')], index))
  print(json.dumps(measure(tf.distribute.MultiWorkerMirroredStrategy())))


def _multi_worker() -> Dict[str, Dict[str, float]]:
  from benchmarks import local_cluster  # pylint: disable=g-import-not-at-top
  ports = ','.join(str(p) for p in local_cluster.free_ports(2))
  outputs = local_cluster.run_workers(
      lambda i: [sys.executable, os.path.abspath(__file__), '--worker',
                 str(i), ports], 2, timeout=300)
  # Both workers trace the same program; worker 0 speaks for both.
  return json.loads(outputs[0].strip().splitlines()[-1])


def main(argv) -> int:
  if argv[:1] == ['--worker']:
    _worker(int(argv[1]), argv[2])
    return 0
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  results = {
      'MirroredStrategy (2 CPUs)': measure(
          tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])),
      'MultiWorkerMirrored (2x1)': _multi_worker(),
  }
  print(format_table(results))
  with open(_JSON, 'w') as f:
    json.dump({'workload': _WORKLOAD, 'tensorflow': tf.__version__,
               'unit': 'collective ops per replica and step',
               'results': results}, f, indent=1)
  print(f'\nwrote {_JSON}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
