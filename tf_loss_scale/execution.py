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
