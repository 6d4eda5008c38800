"""Specification of where code runs: tf_loss_scale/execution.py."""

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
