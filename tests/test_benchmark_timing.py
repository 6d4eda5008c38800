"""The spread benchmarks/run.py prints beside each ratio."""

import pytest

from benchmarks import timing


def test_ratio_quartiles_are_those_of_the_ratio_of_each_repetition():
  # Overheads over the bare step of 10%, 20%, 30%, 5% and 15%, against the
  # reference's 20% each time: per-block ratios 0.5, 1, 1.5, 0.25, 0.75.
  baseline = [1.0, 2.0, 1.0, 4.0, 1.0]
  reference = [1.2, 2.4, 1.2, 4.8, 1.2]
  ours = [1.1, 2.4, 1.3, 4.2, 1.15]
  first, third = timing.ratio_quartiles(ours, reference, baseline)
  # Sorted 0.25, 0.5, 0.75, 1, 1.5; the quartiles sit at positions 1.5
  # and 4.5 of 5 (the exclusive method), between neighbours.
  assert first == pytest.approx(0.375)
  assert third == pytest.approx(1.25)


def test_no_quartiles_when_the_reference_added_nothing_in_some_block():
  assert timing.ratio_quartiles([1.1, 1.1], [1.2, 0.99], [1.0, 1.0]) is None
