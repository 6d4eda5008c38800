"""Where code runs: eagerly, in a `tf.function`, or in a TF1 graph.

The few places where how the library builds ops must differ ask here.
"""

from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tf_loss_scale import private_api


def in_tf1_graph() -> bool:
  """Whether ops are being added to a TF1 graph run by a `Session`.

  False eagerly and inside a `tf.function` (even one called from eager
  code), where stateful ops run in program order.
  """
  return not tf.compat.v1.executing_eagerly_outside_functions()


def op_in_graph_mode(make_op: Callable[[], Any]) -> Optional[tf.Operation]:
  """Runs `make_op`; returns its op in a graph, None eagerly (work done)."""
  op = make_op()
  return None if tf.executing_eagerly() else op


def in_xla_computation() -> bool:
  """Whether ops are being added to a computation that XLA compiles.

  True while a `tf.function(jit_compile=True)` (or a function it calls) is
  traced, as Keras compiles `model.fit`'s step. XLA has no kernel for the op
  that reads gradients elsewhere and no gating of ops
  (`tf_loss_scale.gradients.read`). False on a TensorFlow without the hook.
  """
  return private_api.enclosing_xla_context() is not None


def one_side_runs(predicate: tf.Tensor,
                  if_true: Callable[[Sequence[tf.Tensor]], Any],
                  if_false: Callable[[], Any]) -> tf.Tensor:
  """Runs one of two sides in a TF1 graph, as TF1's own `cond` does inside.

  A Switch of the predicate makes one of two pivots live; every op a side
  creates has a control edge from its pivot, so the side not taken never
  runs, and its inputs need no Switch of their own (`tf.cond` makes a
  functional `If`, costlier per step, or one Switch per input). A Merge
  rejoins the sides.

  Args:
    predicate: A bool scalar tensor.
    if_true: Called with the tensors its ops must depend on (for ops built
      in other threads, such as replica threads); returns an op, a tensor or
      None, as `if_false` does.
    if_false: Called with no argument.

  Returns:
    `predicate`'s value, once the chosen side has run.
  """
  false_pivot, true_pivot = _pivots(predicate)
  with tf.control_dependencies([false_pivot]):
    false_done = if_false()
  with tf.control_dependencies([true_pivot]):
    true_done = if_true([true_pivot])
  return tf.raw_ops.Merge(inputs=[_once_done(false_done, false_pivot),
                                  _once_done(true_done, true_pivot)]).output


def computed_unless(known: tf.Tensor, compute: Callable[[], tf.Tensor],
                    otherwise: tf.Tensor) -> tf.Tensor:
  """`otherwise` when `known` is True; else `compute`'s result, run only then.

  Eagerly `compute` is called only when needed; in a graph its ops are gated
  by a pivot as in `one_side_runs`, and ops outside it never wait for
  `known`.

  Args:
    known: A bool scalar tensor.
    compute: Returns a tensor of `otherwise`'s dtype and shape; called in
      this thread (replica threads would not inherit the gate). It must
      create no stateful op (in a `tf.function` every stateful op runs).
    otherwise: The result when `known` is True.

  Raises:
    ValueError: In a computation XLA compiles, which has no such gating.
  """
  if tf.executing_eagerly():
    return otherwise if bool(known) else compute()
  if in_xla_computation():
    raise ValueError(
        'computed_unless() cannot gate ops that XLA compiles; use tf.cond '
        'there, or compute both values and select one.')
  compute_pivot, known_pivot = _pivots(known)
  with tf.control_dependencies([compute_pivot]):
    computed = compute()
  with tf.control_dependencies([known_pivot]):
    kept = tf.identity(otherwise)
  return tf.raw_ops.Merge(inputs=[computed, kept]).output


def _pivots(predicate: tf.Tensor) -> Sequence[tf.Tensor]:
  # Two tensors of which only one is live: the first when `predicate` is
  # False, the second when it is True.
  to_false, to_true = tf.raw_ops.Switch(data=predicate, pred=predicate)
  return tf.identity(to_false), tf.identity(to_true)


def _once_done(done: Any, pivot: tf.Tensor) -> tf.Tensor:
  # The pivot again, ready only once `done` (an op, a tensor or None) ran.
  with tf.control_dependencies([] if done is None else [done]):
    return tf.identity(pivot)
