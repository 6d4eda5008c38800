"""The experimental base around Keras 3 optimizers.

`LossScaleOptimizerBase` is the base
of the TF 2.0-2.3 form (`experimental.py`): it holds a
`tf_loss_scale.LossScale` and runs `tf_loss_scale.step` with it each
`apply`. (The Keras 3 form keeps Keras's own state and does not use it.)

It subclasses `keras.optimizers.LossScaleOptimizer` for one reason: under a
`mixed_float16` policy, `Model.compile` wraps every optimizer that is not an
instance of that class in Keras's own loss scale optimizer, which would scale
the loss a second time.
"""

from typing import Any, Iterable, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import step


class LossScaleOptimizerBase(keras.optimizers.LossScaleOptimizer):
  """Loss scaling around a Keras 3 optimizer (the shared implementation).

  `apply` takes unscaled gradients (TF 2.3's contract). Subclasses may
  override `_on_skipped_step()`.
  """

  def __init__(self, inner_optimizer: keras.optimizers.Optimizer,
               loss_scale: loss_scale_lib.LossScale,
               name: Optional[str] = None):
    """Wraps `inner_optimizer`.

    Args:
      inner_optimizer: A Keras 3 optimizer, not itself a loss scale optimizer
        and not wrapped by another live one.
      loss_scale: The `LossScale` to drive.
      name: The wrapper's name; by default one derived from its class.

    Raises:
      TypeError: If `inner_optimizer` is not a Keras 3 optimizer.
      ValueError: If it is a loss scale optimizer, is already wrapped, or has
        its own `loss_scale_factor`; or under an unsupported strategy.
    """
    guards.check_new_wrapper(inner_optimizer, guards.EXPERIMENTAL_FORM,
                             loss_scale)
    if inner_optimizer.loss_scale_factor is not None:
      raise ValueError(
          'inner_optimizer has loss_scale_factor='
          f'{inner_optimizer.loss_scale_factor!r}; the loss would be scaled '
          'twice. Create it with loss_scale_factor=None.')
    # Deliberately skips keras.optimizers.LossScaleOptimizer.__init__: only
    # the generic optimizer state (name, own iterations) is wanted.
    keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
    self.inner_optimizer = inner_optimizer
    self._loss_scale = loss_scale

  @property
  def iterations(self) -> Any:
    """The inner optimizer's step counter."""
    return self.inner_optimizer.iterations

  @property
  def variables(self) -> List[Any]:
    """The loss scale's variables, then the inner optimizer's."""
    return list(self._loss_scale.variables) + list(
        self.inner_optimizer.variables)

  def build(self, var_list: Sequence[Any]) -> None:
    """Creates the inner optimizer's variables for `var_list`.

    Args:
      var_list: The trainable variables this optimizer will update.
    """
    if not self.inner_optimizer.built:
      self.inner_optimizer.build(var_list)
    keras.optimizers.Optimizer.build(self, var_list)

  def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
    """Lets the inner optimizer finalize `var_list` (for example its EMA)."""
    self.inner_optimizer.finalize_variable_values(var_list)

  def check_finite(self, grads: Iterable[Any]) -> tf.Tensor:
    """Tells whether every gradient is finite, on every replica.

    Works in a replica or a cross-replica context, or with no strategy.

    Args:
      grads: A list of gradients (None entries are ignored).

    Returns:
      A scalar bool tensor, the same on every replica.
    """
    return distribute.all_finite_in_any_context(list(grads))

  # ---- the step -----------------------------------------------------------

  def apply(self, grads: Sequence[Any],
            trainable_variables: Optional[Sequence[Any]] = None) -> None:
    """Applies the gradients if they are all finite on every replica.

    Call it in a replica context (inside `strategy.run`, or with no strategy).
    A skipped step changes no model or optimizer variable; the loss scale is
    updated either way.

    Args:
      grads: One gradient per variable (None allowed).
      trainable_variables: The variables; optional once the optimizer is
        built, required the first time.

    Raises:
      ValueError: In a cross-replica context, under an unsupported strategy,
        or without variables before the optimizer is built.
    """
    guards.check_step(f'{type(self).__name__}.apply()',
                      [self._loss_scale, self.inner_optimizer])
    distribute.require_replica_context(f'{type(self).__name__}.apply()')
    grads = list(grads)
    if trainable_variables is None:
      if not self.built:
        raise ValueError(
            f'{type(self).__name__}.apply() needs trainable_variables the '
            'first time it is called (or call build(variables) first).')
      trainable_variables = self._trainable_variables
    trainable_variables = list(trainable_variables)
    if not self.built:
      self.build(trainable_variables)
    if len(grads) != len(trainable_variables):
      raise ValueError(
          f'apply() got {len(grads)} gradients for '
          f'{len(trainable_variables)} variables.')
    step.apply_step(
        grads, step.LossScaleState(self._loss_scale),
        lambda g: self.inner_optimizer.apply(g, trainable_variables),
        on_skip=lambda _: self._on_skipped_step())

  def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]]) -> Any:
    """Applies `(gradient, variable)` pairs like `apply`.

    Args:
      grads_and_vars: An iterable of `(gradient, variable)` pairs.

    Returns:
      The `iterations` variable.
    """
    grads, trainable_variables = _unzip(grads_and_vars)
    self.apply(grads, trainable_variables)
    return self.iterations

  def _on_skipped_step(self) -> None:
    """Runs in the cross-replica context when a step is skipped."""
    return None


def _unzip(grads_and_vars: Iterable[Tuple[Any, Any]]) -> Tuple[list, list]:
  pairs = list(grads_and_vars)
  return [g for g, _ in pairs], [v for _, v in pairs]
