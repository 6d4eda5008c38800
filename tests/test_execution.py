"""Specification of where code runs: tf_loss_scale/execution.py."""

import pytest
import tensorflow as tf

from tf_loss_scale import execution


def test_where_ops_are_built():
  seen = {}

  def probe(where):
    seen[where] = (execution.in_tf1_graph(), execution.in_xla_computation())
    return tf.constant(0)

  probe('eager')
  tf.function(lambda: probe('function'))()
  tf.function(lambda: probe('jit'), jit_compile=True)()
  # A function called by an XLA-compiled one is compiled with it.
  inner = tf.function(lambda: probe('called by jit'))
  tf.function(lambda: inner(), jit_compile=True)()  # pylint: disable=unnecessary-lambda
  with tf.Graph().as_default():
    probe('graph')
  assert seen == {'eager': (False, False), 'function': (False, False),
                  'jit': (False, True), 'called by jit': (False, True),
                  'graph': (True, False)}


def _to_number(text):
  # A stateless op that fails when it runs on a text that is not a number.
  return tf.strings.to_number(text)


def test_computed_unless_runs_the_computation_only_when_needed_eagerly():
  calls = []

  def compute():
    calls.append('called')
    return tf.constant(2.5)

  kept = execution.computed_unless(tf.constant(True), compute,
                                   tf.constant(-1.0))
  assert float(kept) == -1.0 and not calls
  computed = execution.computed_unless(tf.constant(False), compute,
                                       tf.constant(-1.0))
  assert float(computed) == 2.5 and calls == ['called']


def test_computed_unless_in_a_function_never_runs_the_gated_ops():

  @tf.function
  def value(known, text):
    return execution.computed_unless(
        known, lambda: _to_number(text), tf.constant(-1.0))

  # 'x' is not a number: the conversion would fail if it ran.
  assert float(value(tf.constant(True), tf.constant('x'))) == -1.0
  assert float(value(tf.constant(False), tf.constant('2.5'))) == 2.5
  with pytest.raises(tf.errors.InvalidArgumentError, match='x'):
    value(tf.constant(False), tf.constant('x'))


def test_computed_unless_in_a_tf1_graph_never_runs_the_gated_ops():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    known = tf.compat.v1.placeholder(tf.bool, [])
    text = tf.compat.v1.placeholder(tf.string, [])
    value = execution.computed_unless(
        known, lambda: _to_number(text), tf.constant(-1.0))
    assert session.run(value, {known: True, text: 'x'}) == -1.0
    assert session.run(value, {known: False, text: '2.5'}) == 2.5
    with pytest.raises(tf.errors.InvalidArgumentError, match='x'):
      session.run(value, {known: False, text: 'x'})


def test_computed_unless_refuses_a_computation_xla_compiles():

  @tf.function(jit_compile=True)
  def value():
    return execution.computed_unless(tf.constant(True),
                                     lambda: tf.constant(1.0),
                                     tf.constant(-1.0))

  with pytest.raises(ValueError, match='XLA.*tf.cond'):
    value()
