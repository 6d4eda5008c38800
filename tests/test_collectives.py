"""The benchmark's count of cross-replica reductions per step
(benchmarks/collectives.py), on steps whose reductions are known, and what
each front end adds to its bare optimizer's: one scalar for the v1 wrapper
and the Keras 3 form (whose inner optimizers sum after the verdict), none
for the experimental form around tf_keras (which sums once itself).

Only traced, never run: tracing is enough to read the graph.
"""

import pytest
import tensorflow as tf

from benchmarks import collectives
from benchmarks import variants
from benchmarks import workloads
import versions

_SUM = tf.distribute.ReduceOp.SUM


def _count(strategy, replica_fn):
  step = tf.function(lambda: strategy.run(replica_fn))
  return collectives.per_replica_step(step, strategy)


def _all_reduce(value):
  return tf.distribute.get_replica_context().all_reduce(_SUM, value)


def test_a_step_without_reductions_counts_zero(mirrored_strategy):
  assert _count(mirrored_strategy, lambda: tf.constant(1.0) + 2.0) == 0


def test_one_all_reduce_counts_one_per_replica(mirrored_strategy):
  # Each of the two replicas launches its own collective op.
  assert _count(mirrored_strategy, lambda: _all_reduce(tf.constant(1.0))) == 1


def test_two_all_reduces_count_two(mirrored_strategy):

  def replica_fn():
    first = _all_reduce(tf.constant(1.0))
    return _all_reduce(first * 2.0)

  assert _count(mirrored_strategy, replica_fn) == 2


def _collective(value):
  # A collective op traced outside any strategy (MirroredStrategy refuses
  # all-reduces inside nested functions and conditionals).
  return tf.raw_ops.CollectiveReduceV2(
      input=value, group_size=2, group_key=1, instance_key=1,
      ordering_token=[], merge_op='Add', final_op='Id')


def _traced(fn):
  return tf.function(fn).get_concrete_function(
      tf.TensorSpec([], tf.float32)).graph.as_graph_def()


def test_a_nested_function_is_counted_each_time_it_is_called():
  nested = tf.function(lambda x: _collective(x) + 1.0)
  assert collectives.in_graph_def(_traced(lambda x: nested(nested(x)))) == 2


def test_a_conditional_counts_its_most_expensive_branch():
  graph_def = _traced(lambda x: tf.cond(
      x > 0.0, lambda: _collective(x), lambda: _collective(_collective(x))))
  assert collectives.in_graph_def(graph_def) == 2


def test_collectives_count_per_replica_of_the_process():
  graph_def = _traced(lambda x: _collective(x) + _collective(x))
  assert collectives.in_graph_def(graph_def, replicas=2) == 1


def test_a_reduce_to_the_host_counts_one(mirrored_strategy):
  # MirroredStrategy sums the replicas' values on one device here: one
  # reduction for all replicas, and no collective op.

  @tf.function
  def step():
    per_replica = mirrored_strategy.run(lambda: tf.constant(1.0))
    return mirrored_strategy.reduce(_SUM, per_replica, axis=None)

  graph_def = step.get_concrete_function().graph.as_graph_def()
  assert collectives.in_graph_def(graph_def, replicas=2) == 1


@pytest.mark.parametrize('family', [
    'v1', pytest.param('keras', marks=versions.KERAS_SUMS_ACROSS_REPLICAS.mark)])
def test_v1_and_keras3_forms_add_at_most_one_reduction_to_the_bare_one(
    mirrored_strategy, family):
  # The verdict's one scalar: a bound on the sums, which the inner optimizer
  # computes after the verdict. TensorFlow 2.12 packs the gradients' own
  # reductions into one when the step hands them over in one call.
  counts = _reductions_per_step(family, mirrored_strategy)
  assert counts['bare'] >= 1, counts  # The gradients are all-reduced.
  assert 1 <= counts['ours'] <= counts['bare'] + 1, counts


def test_a_sum_across_devices_is_not_a_collective_op(mirrored_strategy):

  @tf.function
  def step():
    per_replica = mirrored_strategy.run(lambda: tf.constant(1.0))
    return tf.add_n(mirrored_strategy.experimental_local_results(per_replica))

  graph_def = step.get_concrete_function().graph.as_graph_def()
  assert collectives.in_graph_def(graph_def, replicas=2) == 1
  assert collectives.in_graph_def(graph_def, replicas=2, sums=False) == 0


@pytest.mark.parametrize('family', [
    'v1', pytest.param('keras', marks=versions.KERAS_SUMS_ACROSS_REPLICAS.mark)])
def test_the_verdict_launches_no_collective_op_on_one_worker(
    mirrored_strategy, family):
  # Every replica runs in this process: their largest magnitudes are added
  # where the verdict is taken, and only the gradients' own all-reduce (on
  # TensorFlow 2.12-2.15 a sum on one device, not a collective op) crosses
  # devices through collective ops.
  counts = _reductions_per_step(family, mirrored_strategy, sums=False)
  assert counts['ours'] == counts['bare'], counts


def _reductions_per_step(family, strategy, sums=True):
  """Cross-device reductions per replica in the bare and our CNN step."""
  return {
      variant: collectives.per_replica_step(
          variants.build('mirrored', family, variant,
                         workloads.WORKLOADS['cnn'], strategy).step,
          strategy, sums=sums)
      for variant in ('bare', 'ours')
  }


@pytest.mark.parametrize('op', ['CollectiveReduceV2', 'CollectiveGatherV2',
                                'NcclAllReduce', 'CollectiveBcastSendV2'])
def test_known_collective_op_types(op):
  assert op in collectives.COLLECTIVE_OPS


@versions.KERAS_2.mark
def test_experimental_form_around_tf_keras_adds_no_reduction(
    mirrored_strategy):
  # It sums the gradients once itself, in the inner optimizer's stead, and
  # decides on those sums.
  tf_keras = versions.keras_2()
  from tf_loss_scale.keras import experimental  # pylint: disable=g-import-not-at-top

  def count(wrap):
    with mirrored_strategy.scope():
      variables = [tf.Variable(tf.ones([3])), tf.Variable(tf.ones([2, 2]))]
      optimizer = wrap(tf_keras.optimizers.legacy.SGD(0.1))

    def replica_step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variables[0]) + tf.reduce_sum(variables[1])
      optimizer.apply_gradients(
          zip(tape.gradient(loss, variables), variables))

    return collectives.per_replica_step(
        tf.function(lambda: mirrored_strategy.run(replica_step)),
        mirrored_strategy)

  bare = count(lambda inner: inner)
  ours = count(lambda inner: experimental.LossScaleOptimizer(inner, 'dynamic'))
  assert bare >= 1, bare
  assert ours == bare, (bare, ours)
