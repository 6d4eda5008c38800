"""TF 1.13-1.15's `tf.contrib.mixed_precision.LossScaleOptimizer`.

A `tf.compat.v1.train.Optimizer` around another, driven by a
`LossScaleManager`. Its step is this library's (`tf_loss_scale.step`): one
verdict on the gradients, the inner optimizer's apply on a finite step only
(a skipped step changes no variable, slot or `global_step`), and then, once
the side taken has run, the manager's `update_loss_scale(verdict)` and the
step's record (`tf_loss_scale.monitoring.last_skip`).
"""

import contextlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_loss_scale import execution
from tf_loss_scale import gradients
from tf_loss_scale import step
from tf_loss_scale import step_record

_V1Optimizer = tf.compat.v1.train.Optimizer
GradsAndVars = Sequence[Tuple[Any, tf.Variable]]


class LossScaleOptimizer(_V1Optimizer):
  """Trains with the loss scale a `LossScaleManager` gives.

  ```python
  manager = FixedLossScaleManager(128)
  opt = LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3), manager)
  train_op = opt.minimize(loss, global_step=global_step)
  ```

  `compute_gradients` multiplies the loss by the manager's scale and the
  gradients by its reciprocal (a `tf.IndexedSlices` gradient comes back
  dense, as TF 1.15's did); `apply_gradients` applies them only when every
  one is finite, whatever the manager, then updates the manager. To clip
  gradients, clip between the two calls.
  """

  def __init__(self, opt: _V1Optimizer, loss_scale_manager: Any):
    """Wraps `opt`.

    Args:
      opt: The optimizer that computes and applies the gradients, a
        `tf.compat.v1.train.Optimizer` (or an object with its
        `compute_gradients` and `apply_gradients`).
      loss_scale_manager: A `LossScaleManager` (or an object with its
        `get_loss_scale` and `update_loss_scale`).

    Raises:
      TypeError: If `opt` or `loss_scale_manager` lacks those methods.
    """
    _require_methods('opt', opt, ('compute_gradients', 'apply_gradients'))
    _require_methods('loss_scale_manager', loss_scale_manager,
                     ('get_loss_scale', 'update_loss_scale'))
    name = getattr(opt, 'get_name', lambda: 'LossScaleOptimizer')()
    super().__init__(use_locking=False, name=name)
    self._opt = opt
    self._loss_scale_manager = loss_scale_manager
    # Monitoring only: in no collection and no checkpoint. Its ops take no
    # name of the graph's root scope, where TF 1.15's names are reproduced.
    self._monitor = step_record.StepRecord()
    with _record_scope():
      self._monitor.create()

  @property
  def loss_scale_manager(self) -> Any:
    """The manager this optimizer scales by (for monitoring)."""
    return self._loss_scale_manager

  def compute_gradients(
      self, loss: gradients.Loss, var_list: Optional[List[tf.Variable]] = None,
      gate_gradients: int = _V1Optimizer.GATE_OP,
      aggregation_method: Any = None, colocate_gradients_with_ops: bool = False,
      grad_loss: Optional[tf.Tensor] = None) -> List[Tuple[Any, tf.Variable]]:
    """Computes the gradients of `loss` times the scale, then unscales them.

    The arguments are `tf.compat.v1.train.Optimizer.compute_gradients`'s;
    eagerly `loss` must be a callable.

    Returns:
      `(gradient, variable)` pairs; each gradient dense (or None).
    """
    scale = self._loss_scale_manager.get_loss_scale()
    if callable(loss) and not tf.executing_eagerly():
      loss = loss()  # As TF 1.15's: a graph's loss is built here.
    grads_and_vars = self._opt.compute_gradients(
        gradients.scale_loss(loss, scale),
        var_list=var_list,
        gate_gradients=gate_gradients,
        aggregation_method=aggregation_method,
        colocate_gradients_with_ops=colocate_gradients_with_ops,
        grad_loss=grad_loss)
    reciprocal = tf.math.reciprocal(scale)
    return [(None if g is None else _times(g, reciprocal), v)
            for g, v in grads_and_vars]

  def apply_gradients(self, grads_and_vars: GradsAndVars,
                      global_step: Optional[tf.Variable] = None,
                      name: Optional[str] = None) -> Optional[tf.Operation]:
    """Applies the gradients if every one is finite, then updates the manager.

    Args:
      grads_and_vars: `(gradient, variable)` pairs, as `compute_gradients`
        returns them.
      global_step: Optional variable the inner optimizer increments when the
        step is applied (a skipped step leaves it as it was).
      name: Optional name, given to the inner optimizer's apply.

    Returns:
      In a graph, the op that runs the step; eagerly None (the step has run).
    """
    grads_and_vars = tuple(grads_and_vars)
    variables = [v for _, v in grads_and_vars]
    inner_scope = _cond_scope()

    def apply(grads: List[Any]) -> Any:
      with _scope(inner_scope):
        return self._opt.apply_gradients(list(zip(grads, variables)),
                                         global_step, name)

    op = step.apply_step(
        [g for g, _ in grads_and_vars],
        _ManagerState(self._loss_scale_manager, self._monitor), apply,
        names=step_record.gradient_names(variables)).op
    if execution.in_tf1_graph():
      # So that `LossScaleHook` reads the skip count in the step's own run.
      self._monitor.follow(op)
    return op

  def get_name(self) -> str:
    """The wrapped optimizer's name."""
    return self._name

  def get_slot(self, var: tf.Variable, name: str) -> Optional[tf.Variable]:
    """Returns the wrapped optimizer's slot `name` for `var`, or None."""
    return self._opt.get_slot(var, name)

  def get_slot_names(self) -> List[str]:
    """Returns the wrapped optimizer's slot names."""
    return self._opt.get_slot_names()

  def variables(self) -> List[tf.Variable]:
    """Returns the wrapped optimizer's variables (the manager's are its own)."""
    return self._opt.variables()


class _ManagerState(step.ScaleState):
  """A manager's state, as the step consults and moves it.

  The verdict is always the step's own (a manager is told it, and a fixed
  scale skips non-finite steps too); the manager moves once the side taken
  has run, and the step's record with it.
  """

  def __init__(self, manager: Any, record: step_record.StepRecord):
    self._manager = manager
    self._record = record

  def scale(self) -> tf.Tensor:
    return tf.cast(self._manager.get_loss_scale(), tf.float32)

  def skip_reporter(self, names: Sequence[str], reading: step.Reader
                   ) -> Optional[Callable[[], Any]]:
    return self._record.skip_reporter(names, self.scale, reading)

  def advance(self, verdict: step.Verdict,
              after: Sequence[Any]) -> Optional[tf.Operation]:
    verdict = tf.convert_to_tensor(verdict, tf.bool)
    with tf.control_dependencies(after):
      updated = self._manager.update_loss_scale(verdict)
      recorded = self._record.record(tf.logical_not(verdict))
    if tf.executing_eagerly():
      return None
    return tf.group(*step.graph_elements(updated, recorded))


def _cond_scope() -> Optional[str]:
  """The name scope TF 1.15's `tf.cond` gave the inner apply, in a TF1 graph.

  What the inner optimizer creates as it applies takes it: Adam's
  `cond/beta1_power` and `cond/beta2_power`, which a `Saver` checkpoint
  names. Reserved now, before the step makes ops, as TF 1.15 made its
  `cond` first.
  """
  if not execution.in_tf1_graph():
    return None
  return tf.compat.v1.get_default_graph().unique_name('cond') + '/'


def _scope(name: Optional[str]) -> Any:
  """The absolute name scope `name` of a TF1 graph; nothing for None."""
  if name is None:
    return contextlib.nullcontext()
  return tf.compat.v1.get_default_graph().name_scope(name)


def _record_scope() -> Any:
  return _scope(step_record.GRAPH_SCOPE + '/' if execution.in_tf1_graph()
                else None)


def _times(grad: Any, reciprocal: tf.Tensor) -> tf.Tensor:
  # TF 1.15 multiplied each gradient, made dense, by the reciprocal of the
  # scale in the gradient's own dtype: the same rounding, bit for bit.
  grad = tf.convert_to_tensor(grad)
  return grad * tf.cast(reciprocal, grad.dtype.base_dtype)


def _require_methods(argument: str, value: Any, names: Sequence[str]) -> None:
  missing = [name for name in names if not callable(getattr(value, name, None))]
  if missing:
    raise TypeError(
        f'{argument} must have the methods {", ".join(names)} (it has no '
        f'{", ".join(missing)}), but got {value!r} of type '
        f'{type(value).__name__}.')
