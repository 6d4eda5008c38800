"""Where code runs: eagerly, in a `tf.function`, or in a TF1 graph.

The library behaves the same in all three; the few places where how it
builds ops must differ ask here, so the distinction is made in one module.
"""

from typing import Any, Callable, Optional

import tensorflow as tf


def in_tf1_graph() -> bool:
  """Whether ops are being added to a TF1 graph run by a `Session`.

  False eagerly and inside a `tf.function` (even one called from eager
  code), where stateful ops run in program order.
  """
  return not tf.compat.v1.executing_eagerly_outside_functions()


def op_in_graph_mode(make_op: Callable[[], Any]) -> Optional[tf.Operation]:
  """Runs `make_op` and returns its op when building a graph.

  Args:
    make_op: Creates the op (eagerly, runs it).

  Returns:
    The op in a TF1 graph or a `tf.function`; None eagerly, where the work
    has already been done.
  """
  op = make_op()
  return None if tf.executing_eagerly() else op


def in_xla_computation() -> bool:
  """Whether ops are being added to a computation that XLA compiles.

  True while a `tf.function(jit_compile=True)` (or a function it calls) is
  traced, which is how Keras compiles `model.fit`'s step with XLA.

  Hook: `tf.__internal__.get_enclosing_xla_context()`, the function
  TensorFlow exports for Keras to ask exactly this; no other API tells.
  Why: a step's skip report must be read from the gradients differently
  under XLA to stay free on finite steps (see
  `tf_loss_scale.step_record.StepRecord.skip_reporter`). A TensorFlow
  without it gets False: the report stays correct, only slower under XLA.
  """
  internal = getattr(tf, '__internal__', None)
  enclosing = getattr(internal, 'get_enclosing_xla_context', None)
  return enclosing is not None and enclosing() is not None
