"""The count of passes over each variable in XLA-compiled steps
(benchmarks/xla_passes.py): its reading of HLO, and the plans it reads; and
the passes benchmarks/check_pass.py times one by one."""

import collections

from benchmarks import xla_passes
import versions

_ENTRY = """\
  %arg0.1 = f32[4]{0} parameter(0), metadata={op_type="_Arg"}
  %arg1.1 = f32[4]{0} parameter(1)
  %arg2.1 = f32[] parameter(2)
  %arg3.1 = f32[7]{0} parameter(3)
  %copy.1 = f32[] copy(%arg2.1)
  %is-finite_fusion.3 = pred[4]{0} fusion(%arg0.1, %copy.1), kind=kLoop, calls=%fused.1
  %is-finite_fusion.4 = pred[4]{0} fusion(%arg1.1, %copy.1), kind=kLoop, calls=%fused.2
  %subtract_select_fusion = f32[4]{0} fusion(%arg0.1, %arg3.1, %copy.1), kind=kLoop, calls=%fused.3
  ROOT %tuple.8 = (f32[4]{0}, pred[4]{0}) tuple(%subtract_select_fusion, %is-finite_fusion.4)
"""


def test_passes_are_the_instructions_reading_each_variable_of_the_size():
  readers = xla_passes.passes_per_variable(_ENTRY.splitlines(), 4)
  # Only the parameters of 4 float32 values are variables here; a fusion's
  # number is dropped, other instructions keep their opcode.
  assert readers == {
      'arg0.1': ['is-finite_fusion', 'subtract_select_fusion'],
      'arg1.1': ['is-finite_fusion'],
  }
  # Older XLA writes names without `%` and closes the entry with a comment.
  older = [line.replace('%', '') for line in _ENTRY.splitlines()]
  assert xla_passes.passes_per_variable(older, 4) == readers


@versions.KERAS_3.mark
def test_an_exact_check_under_xla_is_one_pass_with_the_skip_report_in_it():
  # The bare SGD step passes once over each variable (the update); Keras's
  # wrapper adds the minimum an exact skip needs, one pass to check before
  # the update may write. Ours adds no more: the same pass tells NaN from
  # inf for the skip report.
  passes = {}
  for variant in ('bare', 'keras3', 'ours'):
    readers = xla_passes.compiled_step_readers(variant, '10x1M')
    counts = collections.Counter(len(r) for r in readers.values())
    assert len(readers) == 10 and len(counts) == 1, (variant, counts)
    passes[variant] = next(iter(counts))
  assert passes == {'bare': 1, 'keras3': 2, 'ours': 2}, passes


def test_the_timed_passes_compute_what_they_are_named_for():
  # benchmarks/check_pass.py times each pass alone: the checks must give
  # the verdict, the reads the largest magnitude, the update write.
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import check_pass  # pylint: disable=g-import-not-at-top
  values = [np.arange(64, dtype=np.float32) - 40.0, np.ones(4096, np.float32)]
  variables = [tf.Variable(v) for v in values]
  passes = check_pass.compiled_passes(variables, tf.Variable(0.5))
  assert passes['keras3']().numpy() and passes['ours']().numpy()
  assert passes['max']().numpy() == passes['max_rows']().numpy() == 20.0
  for value in (np.inf, np.nan):
    variables[1][4000].assign(value)
    assert not passes['keras3']().numpy(), value
    assert not passes['ours']().numpy(), value
  variables[1][4000].assign(1.0)
  passes['update']()
  np.testing.assert_allclose(variables[0].numpy(), values[0] * 0.995)
