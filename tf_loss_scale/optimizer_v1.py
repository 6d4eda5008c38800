"""`MixedPrecisionLossScaleOptimizer`: loss scaling for `tf.compat.v1` optimizers."""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_loss_scale import private_api
from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import gradients
from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import step
from tf_loss_scale import step_record

_V1Optimizer = tf.compat.v1.train.Optimizer
GradsAndVars = Sequence[Tuple[Any, tf.Variable]]


class MixedPrecisionLossScaleOptimizer(private_api.HidesForwardedSlots,
                                       _V1Optimizer):
  """Wraps a `tf.compat.v1.train.Optimizer` to train with a loss scale.

  `compute_gradients` scales the loss and unscales the gradients;
  `apply_gradients` applies them only if they are finite on every replica (a
  skipped step changes no variable, slot or `global_step`), and the loss
  scale adjusts either way.

  ```python
  opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
  opt = MixedPrecisionLossScaleOptimizer(opt, 'dynamic')
  train_op = opt.minimize(loss, global_step=global_step)
  ```

  Checkpoints interchange with TensorFlow's
  `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`.
  """

  def __init__(self, opt: _V1Optimizer, loss_scale: loss_scale_lib.Identifier):
    """Wraps `opt`, the `tf.compat.v1.train.Optimizer` that applies the step.

    Args:
      opt: The optimizer.
      loss_scale: A `LossScale`, a number (a fixed scale) or `'dynamic'`.

    Raises:
      ValueError: If `opt` is not a `tf.compat.v1.train.Optimizer` or is a
        loss scale optimizer; if `loss_scale` is None or not a
        loss scale identifier; or under a strategy this library refuses.
    """
    # TensorFlow's wrapper lets two wrappers hold one optimizer.
    guards.check_new_wrapper(opt, guards.V1_FORM, self, exclusive=False)
    if loss_scale is None:
      raise ValueError(
          "loss_scale cannot be None: pass 'dynamic', a number or a LossScale.")
    super().__init__(use_locking=False, name=opt.get_name())
    self._optimizer = opt
    self._loss_scale = loss_scale_lib.get(loss_scale)
    private_api.name_dependencies(self, base_optimizer=self._optimizer,
                                  loss_scale=self._loss_scale)

  @property
  def loss_scale(self) -> loss_scale_lib.LossScale:
    """The `LossScale` this optimizer scales by (call it for its value)."""
    return self._loss_scale

  @property
  def inner_optimizer(self) -> _V1Optimizer:
    """The wrapped optimizer."""
    return self._optimizer

  def compute_gradients(
      self, loss: gradients.Loss, var_list: Optional[List[tf.Variable]] = None,
      gate_gradients: int = _V1Optimizer.GATE_OP,
      aggregation_method: Any = None, colocate_gradients_with_ops: bool = False,
      grad_loss: Optional[tf.Tensor] = None) -> List[Tuple[Any, tf.Variable]]:
    """Computes the unscaled gradients of `loss`.

    Takes the arguments of `tf.compat.v1.train.Optimizer.compute_gradients`:
    `loss` is a tensor or (required eagerly) a callable returning it.

    Returns:
      A list of `(gradient, variable)` pairs, gradients unscaled.
    """
    scale = self._loss_scale()
    grads_and_vars = self._optimizer.compute_gradients(
        loss=gradients.scale_loss(loss, scale),
        var_list=var_list,
        gate_gradients=gate_gradients,
        aggregation_method=aggregation_method,
        colocate_gradients_with_ops=colocate_gradients_with_ops,
        grad_loss=grad_loss)
    grads = gradients.unscale([g for g, _ in grads_and_vars], scale)
    return list(zip(grads, [v for _, v in grads_and_vars]))

  def apply_gradients(self,
                      grads_and_vars: GradsAndVars,
                      global_step: Optional[tf.Variable] = None,
                      name: Optional[str] = None) -> Optional[tf.Operation]:
    """Applies the gradients if they are all finite on every replica.

    Call it in a replica context (inside `strategy.run` or with no strategy).

    Args:
      grads_and_vars: `(gradient, variable)` pairs from `compute_gradients`.
      global_step: Optional variable to increment when the step is applied.
      name: Optional name for the returned op.

    Returns:
      In graph mode, an op that updates the loss scale and applies the step
      when it is finite. Eagerly the work is done and the result is None.

    Raises:
      ValueError: In a cross-replica context, under a strategy this library
        refuses, or for state created outside the strategy's scope.
    """
    distribute.require_replica_context('apply_gradients()')
    guards.check_step(f'{type(self).__name__}.apply_gradients()',
                      [self._optimizer])
    grads_and_vars = tuple(grads_and_vars)
    if isinstance(self._loss_scale, loss_scale_lib.FixedLossScale):
      # Nothing to decide or move: the inner optimizer's step is the whole
      # step, under the name TensorFlow's wrapper gives it.
      op = self._optimizer.apply_gradients(grads_and_vars, global_step, name)
      return None if tf.executing_eagerly() else op
    variables = [v for _, v in grads_and_vars]
    # v1 optimizers sum the gradients in their own merge_call: the step's
    # default `reduces=True` (see tf_loss_scale.step). The op returned, one
    # for every replica, is the whole step and takes the name TensorFlow's
    # wrapper gives it, so a graph run by op name runs the whole step; the
    # inner apply takes the name TensorFlow's gives it. One string for every
    # replica: a merge_call takes two equal strings that are not one object
    # for per-replica values.
    name = name or self.get_name()
    inner_name = name + '-wrapped'
    if _in_tf1_control_flow():
      state = _StateInTF1Conds(self._loss_scale)
      cond = state.take_side
    else:
      state, cond = step.LossScaleState(self._loss_scale), None
    op = step.apply_step(
        [g for g, _ in grads_and_vars], state,
        lambda grads: self._optimizer.apply_gradients(
            list(zip(grads, variables)), global_step, name=inner_name),
        names=step_record.gradient_names(variables), name=name,
        cond=cond).op
    record = loss_scale_lib.step_record_of(self._loss_scale)
    if record is not None and execution.in_tf1_graph():
      # So that `LossScaleHook` reads the skip count in the step's own run.
      record.follow(op)
    return op

  def get_slot(self, var: tf.Variable, name: str) -> Optional[tf.Variable]:
    """Returns the wrapped optimizer's slot `name` for `var`, or None."""
    return self._optimizer.get_slot(var, name)

  def get_slot_names(self) -> List[str]:
    """The wrapped optimizer's slot names; `[]` on TF <= 2.14, as TF's."""
    if not private_api.V1_SLOT_NAMES_FORWARDED:
      return []
    return self._optimizer.get_slot_names()

  def variables(self) -> List[tf.Variable]:
    """Returns the wrapped optimizer's variables followed by the loss scale's."""
    return self._optimizer.variables() + list(self._loss_scale.variables)


def _in_tf1_control_flow() -> bool:
  """Whether a step is built in a TF1 graph with TF1's `cond` (no `If` op)."""
  return (execution.in_tf1_graph() and
          not tf.compat.v1.control_flow_v2_enabled())


class _StateInTF1Conds(step.LossScaleState):
  """A step's sides and new state in TF1 `cond`s, as TensorFlow's wrapper.

  There, the loss scale's update is a `cond` on the verdict, made first,
  then the inner optimizer's apply is built inside a second `cond`: the
  apply's ops, the variables the inner optimizer makes there (Adam's
  `cond_1/beta1_power`), the `train_op` collection's entry and the
  `cond_context` entries carry those `cond` names, and a program's own
  later `cond`s take the names that follow. The step is unchanged: its
  side is taken in the second `cond` (`take_side`, the step's `cond`), and
  the new state, still written once the side has run, in the first; its
  true side writes the state of a finite step, its false side that of a
  skipped one. A loss scale that decides in its own `update` makes its
  own `cond`s before the step, as in TensorFlow's wrapper.
  """

  def __init__(self, loss_scale: loss_scale_lib.LossScale):
    super().__init__(loss_scale)
    self._update_scope = self._apply_scope = None

  def take_side(self, verdict: tf.Tensor, if_true: Any, if_false: Any
               ) -> tf.Tensor:
    """The step's `cond`; called once, in the cross-replica context."""
    if self.follows_the_rule:
      # The update's name first, as TensorFlow's wrapper makes it first.
      graph = tf.compat.v1.get_default_graph()
      self._update_scope = graph.unique_name('cond') + '/'
      self._apply_scope = graph.unique_name('cond') + '/'
    return tf.compat.v1.cond(verdict, if_true, if_false,
                             name=self._apply_scope)

  def advance(self, verdict: step.Verdict, after: Any) -> Any:
    advance = super().advance
    if self._update_scope is None:
      return advance(verdict, after)
    advanced = tf.compat.v1.cond(verdict, lambda: advance(True, after),
                                 lambda: advance(False, after),
                                 name=self._update_scope)
    # Made second, listed first, as TensorFlow's wrapper lists them (a cond
    # inside another control flow construct is in no collection).
    contexts = tf.compat.v1.get_collection_ref('cond_context')
    updates = [c for c in contexts if c.name.startswith(self._update_scope)]
    applies = [i for i, c in enumerate(contexts)
               if c.name.startswith(self._apply_scope)]
    if updates and applies:
      rest = [c for c in contexts if c not in updates]
      rest[applies[0]:applies[0]] = updates
      contexts[:] = rest
    return advanced
