"""Every front end's step traced by a `tf.function` with AutoGraph on.

A user's training function is converted by AutoGraph, and so is whatever it
calls, unless that is marked not to be. The step is plain graph building: a
conversion that fails there logs a warning asking the user to report a bug
to TensorFlow, on every trace. In strict conversion mode such a failure
raises instead, so the test fails on one wherever it happens.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import front_ends

INF = float('inf')


@pytest.mark.parametrize('front_end', front_ends.ALL)
def test_a_traced_step_skips_and_applies_with_nothing_left_unconverted(
    front_end, monkeypatch, caplog):
  monkeypatch.setenv('AUTOGRAPH_STRICT_CONVERSION', '1')
  with caplog.at_level(logging.INFO, logger='tensorflow'):
    opt = front_end.wrap(front_end.inner(1.0), 4.0, 1)
    var = front_end.variable([1.0, 2.0], np.float32)
    front_end.build(opt, [var])

    @tf.function
    def step(grad):
      front_end.apply(opt, [grad], [var])

    step(tf.constant([INF, 1.0]))
    assert front_end.state(opt) == {'scale': 2.0, 'good_steps': 0,
                                    'skipped_steps': 1,
                                    'last_step_skipped': True}
    step(tf.constant([1.0, 3.0]))
    assert front_end.state(opt) == {'scale': 4.0, 'good_steps': 0,
                                    'skipped_steps': 1,
                                    'last_step_skipped': False}
    np.testing.assert_array_equal(np.asarray(var), [0.0, -1.0])
  assert not [r.getMessage() for r in caplog.records
              if 'AutoGraph' in r.getMessage()]
