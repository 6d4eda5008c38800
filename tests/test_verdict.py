"""What each front end's verdict is about under a strategy (two replicas).

The verdict must hold for the gradients that are applied, the sums across
replicas. How exactly depends on who sums:

- The experimental form around Keras 2 optimizers sums the gradients once
  itself (the inner optimizer applies them without summing again) and
  decides on the exact sums.
- The v1 wrapper, the Keras 3 form and the experimental form around Keras 3
  optimizers hand each replica's gradients to an inner optimizer that sums
  them inside its own apply, after the verdict. They decide on a bound: every
  replica's gradients finite and, per dtype, the replicas' largest
  magnitudes adding up to no more than the dtype's largest value. No
  overflowing sum is ever applied; a finite sum whose replica magnitudes
  together pass that value is skipped too. The Keras 3 form, as Keras's
  class, hands float16 gradients over in float32, where these sums fit,
  but its inner optimizer casts them back to a float16 variable: it bounds
  them by float16's largest value as well (Keras's class applies a sum
  that is inf there). TF 2.4-2.15's class, `keras.mixed_precision.
  LossScaleOptimizer` after `install()`, decides on the exact sums as
  Keras's class applies them (below).

The float16 gradients below are [40000, 1] on replica 0 and [-39008, 1] on
replica 1 (both exact in float16): each finite, their sum [992, 2] finite,
40000 + 39008 past float16's 65504.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import front_ends
import versions

_CANCELLING = ([40000.0, 1.0], [-39008.0, 1.0])
_WITHIN_THE_BOUND = ([30000.0, 1.0], [-29008.0, 1.0])


def _train_one_step(strategy, front_end, per_replica):
  """One float16 step from [0, 0] with SGD(1) and a scale of 1."""
  with strategy.scope():
    opt = front_end.wrap(front_end.inner(1.0), 1.0, 2000)
    var = front_end.variable([0.0, 0.0], np.float16)
    front_end.build(opt, [var])

  @tf.function
  def train_step():
    def replica_step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      grad = tf.cast(tf.gather(tf.constant(per_replica), replica), tf.float16)
      front_end.apply(opt, [grad], [var])
    strategy.run(replica_step)

  train_step()
  if not isinstance(var, tf.Variable):
    var = var.value  # A Keras variable's tf.Variable.
  replicas = [v.numpy().tolist()
              for v in strategy.experimental_local_results(var)]
  return replicas, front_end.state(opt)['skipped_steps']


def _assert_skipped(strategy, front_end, per_replica):
  replicas, skipped = _train_one_step(strategy, front_end, per_replica)
  assert skipped == 1, f'{front_end.name}: the step was applied'
  for replica, value in enumerate(replicas):
    assert value == [0.0, 0.0], f'{front_end.name}, replica {replica}: {value}'


def _assert_applied(strategy, front_end, per_replica):
  replicas, skipped = _train_one_step(strategy, front_end, per_replica)
  expected = [-(a + b) for a, b in zip(*per_replica)]
  assert skipped == 0, f'{front_end.name}: the step was skipped'
  for replica, value in enumerate(replicas):
    assert value == expected, f'{front_end.name}, replica {replica}: {value}'


def test_v1_wrapper_skips_a_finite_sum_whose_replica_magnitudes_pass_the_max(
    mirrored_strategy):
  _assert_skipped(mirrored_strategy, front_ends.V1, _CANCELLING)


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_keras3_form_bounds_float32_sums_by_its_float16_variables(
    mirrored_strategy):
  _assert_skipped(mirrored_strategy, front_ends.KERAS3, _CANCELLING)


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_experimental_keras3_skips_a_finite_sum_whose_magnitudes_pass_the_max(
    mirrored_strategy):
  _assert_skipped(mirrored_strategy, front_ends.EXPERIMENTAL_KERAS3,
                  _CANCELLING)


@versions.KERAS_2.mark
def test_experimental_keras2_applies_a_finite_sum_decided_on_exactly(
    mirrored_strategy):
  _assert_applied(mirrored_strategy, front_ends.EXPERIMENTAL_KERAS2,
                  _CANCELLING)


@pytest.mark.parametrize('front_end', front_ends.ON_REPLICAS)
def test_every_front_end_applies_a_sum_within_the_bound(front_end,
                                                        mirrored_strategy):
  # 30000 + 29008 = 59008 <= 65504: the bound holds, the sum [992, 2] too.
  _assert_applied(mirrored_strategy, front_end, _WITHIN_THE_BOUND)


@pytest.mark.parametrize('front_end', front_ends.ON_REPLICAS)
def test_every_front_end_skips_a_sum_that_overflows(front_end,
                                                    mirrored_strategy):
  # 40000 + 40000 = 80000: inf in float16, whoever sums (the Keras 3 forms
  # sum in float32, and skip a sum their float16 variable would get as
  # inf: tests/test_keras_distribute.py).
  _assert_skipped(mirrored_strategy, front_end,
                  ([40000.0, 1.0], [40000.0, 1.0]))


# TF 2.4-2.15's class driven as Keras 3 code drives Keras's (gradients of the
# scaled loss to `apply`), as under `install()`'s shared name: Keras's class
# applies any finite sum, and so does it, deciding on the exact sums (one
# more all-reduce). The Keras 3 form above keeps the bound
# (docs/differences.md).
_SHARED_NAME = dataclasses.replace(
    front_ends.KERAS3, name='shared_name',
    wrap=front_ends.KERAS_MIXED_PRECISION.wrap)


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_the_shared_name_class_applies_a_finite_sum_as_keras_class(
    mirrored_strategy):
  _assert_applied(mirrored_strategy, _SHARED_NAME, _CANCELLING)


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_the_shared_name_class_skips_a_sum_its_float16_variable_cannot_hold(
    mirrored_strategy):
  _assert_skipped(mirrored_strategy, _SHARED_NAME,
                  ([40000.0, 1.0], [40000.0, 1.0]))
