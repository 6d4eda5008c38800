"""The floors that benchmarks/run.py times beside TF1 graph steps do what
they stand for: every gradient read before any is applied, the update the
bare step makes."""

import numpy as np
import tensorflow as tf

from benchmarks import variants
from benchmarks import workloads

_WORKLOAD = workloads.Workload(
    'tiny', lambda: [np.arange(4, dtype=np.float32) + i for i in range(3)],
    lambda vs: tf.add_n([tf.reduce_sum(tf.square(v)) for v in vs]))


def _one_traced_step(make_optimizer):
  session, train_op, variables = variants.graph_step(_WORKLOAD, make_optimizer)
  with session:
    metadata = tf.compat.v1.RunMetadata()
    session.run(train_op, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                run_metadata=metadata)
    ran = [node.timeline_label for device in metadata.step_stats.dev_stats
           for node in device.node_stats]
    return session.run(variables), ran


def _kernels_run(ran, op_type):
  return sum(f' = {op_type}(' in label for label in ran)


def test_the_read_floor_runs_one_reduction_per_gradient():
  # Grappler drops stateless ops that nothing uses: reductions that only a
  # barrier waited on would be removed before the step runs.
  _, ran = _one_traced_step(variants.FLOORS['v1']['read_floor'])
  assert _kernels_run(ran, 'Max') == 3, ran


def test_the_floors_apply_what_the_bare_step_applies():
  expected, _ = _one_traced_step(variants.FAMILIES['v1']['bare'])
  for name, floor in variants.FLOORS['v1'].items():
    values, _ = _one_traced_step(floor)
    for got, want in zip(values, expected):
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
