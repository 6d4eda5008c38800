"""`LossScaleOptimizer`: TF 2.4-2.15's Keras API on Keras 3.

For custom loops written for `tf.keras.mixed_precision` of TF 2.4-2.15, on
TensorFlow 2.16 and later. A subclass of the Keras 3 form, so `compile`
keeps it; see docs/differences.md.
"""

import numbers
from typing import Any, Dict, Optional

import keras
import tensorflow as tf

from tf_loss_scale import step
from tf_loss_scale.keras import keras3_support
from tf_loss_scale.keras import loss_scale_optimizer
from tf_loss_scale.keras import protocols
from tf_loss_scale.keras import tf_keras_checkpoints

# TF 2.4-2.15's defaults for a dynamic scale.
_INITIAL_SCALE = 2.0**15
_GROWTH_STEPS = 2000
# Settings of Keras 2 optimizers that Keras 3's do not take, found in the
# configs of tf_keras's class: their values do nothing in Keras 3.
_KERAS2_ONLY_SETTINGS = ('jit_compile', 'is_legacy_optimizer')


@keras.saving.register_keras_serializable(
    package='tf_loss_scale.mixed_precision', name='LossScaleOptimizer')
class LossScaleOptimizer(protocols.TwoProtocols,
                         tf_keras_checkpoints.TfKerasCheckpointLayout,
                         loss_scale_optimizer.LossScaleOptimizer):
  """Loss scaling with TF 2.4-2.15's Keras API, around a Keras 3 optimizer.

  Custom loop, as written for TF 2.4-2.15:

  ```python
  opt = LossScaleOptimizer(keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_fn())
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))
  ```

  `apply_gradients` takes unscaled gradients unless `scale_loss` was
  called (`tf_loss_scale.keras.protocols`). A fixed scale (`dynamic=False`)
  applies every step, even a non-finite one, as TF 2.4-2.15's did. Config
  and checkpoint layout are tf_keras's.
  """

  def __init__(self, inner_optimizer: keras.optimizers.Optimizer,
               dynamic: bool = True, initial_scale: Optional[float] = None,
               dynamic_growth_steps: Optional[int] = None,
               name: Optional[str] = None):
    """Wraps `inner_optimizer`.

    Keras 3's positional form, `LossScaleOptimizer(inner, initial_scale,
    dynamic_growth_steps)`, is taken too (a number where `dynamic` stands):
    Keras 3 names this class `keras.mixed_precision.LossScaleOptimizer`
    where `tf_loss_scale.compat.install()` puts it.

    Args:
      inner_optimizer: The Keras 3 optimizer that applies the gradients.
      dynamic: Whether the scale adapts (True) or stays `initial_scale`.
      initial_scale: The first scale, a finite positive number: 2**15 by
        default when `dynamic`, required otherwise.
      dynamic_growth_steps: Finite steps in a row after which a dynamic
        scale doubles: 2000 by default; must be None when not `dynamic`.
      name: The optimizer's name, as Keras 3's class takes it.

    Raises:
      TypeError: If `dynamic` is not a bool, or as
        `tf_loss_scale.keras.LossScaleOptimizer` does.
      ValueError: For `dynamic=False` without `initial_scale` or with
        `dynamic_growth_steps`, or as `tf_loss_scale.keras.
        LossScaleOptimizer` does.
    """
    if _is_number(dynamic) and dynamic_growth_steps is None:
      # Keras 3's positional arguments.
      dynamic, initial_scale, dynamic_growth_steps = (
          True, dynamic, initial_scale)
    if not isinstance(dynamic, bool):
      raise TypeError(
          f'dynamic must be True or False, but got {dynamic!r}. (The TF '
          '2.0-2.3 form took a loss scale as its second argument: use '
          'tf_loss_scale.keras.experimental.LossScaleOptimizer for that.)')
    if not dynamic and initial_scale is None:
      raise ValueError('initial_scale must be given when dynamic=False: it '
                       'is the fixed loss scale.')
    if not dynamic and dynamic_growth_steps is not None:
      raise ValueError(
          'dynamic_growth_steps must be None when dynamic=False (a fixed '
          f'scale never grows), but got {dynamic_growth_steps!r}.')
    # Set past Keras's attribute tracking, before Keras's `__init__` sets
    # `dynamic_growth_steps`.
    object.__setattr__(self, '_dynamic', dynamic)
    super().__init__(
        inner_optimizer,
        _INITIAL_SCALE if initial_scale is None else initial_scale,
        dynamic_growth_steps or _GROWTH_STEPS, name=name)
    self._start_tf_keras_layout(dynamic)
    object.__setattr__(self, '_constructed', True)

  def build(self, var_list: Any) -> None:
    """Creates the variables, as `tf_loss_scale.keras.LossScaleOptimizer`."""
    held = self._hold_inner_restorations()
    super().build(var_list)
    self._finish_tf_keras_layout(self.dynamic_scale, self.step_counter, held)

  dynamic = property(lambda self: self._dynamic,
                     doc='Whether the loss scale is dynamic.')

  @property
  def dynamic_growth_steps(self) -> Optional[int]:
    """Finite steps after which a dynamic scale doubles; None when fixed."""
    return self._growth_steps if self._dynamic else None

  @dynamic_growth_steps.setter
  def dynamic_growth_steps(self, value: int) -> None:
    self._growth_steps = value

  @property
  def iterations(self) -> Any:
    """The inner optimizer's step count, as in TF 2.4-2.15 (a tf.Variable)."""
    return _tf(self.inner_optimizer.iterations)

  @iterations.setter
  def iterations(self, variable: Any) -> None:
    if not getattr(self, '_constructed', False):
      # Keras before 3.9 sets a counter of its own, which never moves, while
      # constructing: it stays in `variables` alone.
      return
    raise AttributeError(
        f'{type(self).__name__}.iterations cannot be replaced by '
        f'{variable!r}: the Keras 3 optimizer it wraps owns its step count '
        '(tf_keras let the global step stand in for it). Assign a value '
        'instead (optimizer.iterations.assign(step)), and where summaries '
        'need the step, use optimizer.iterations '
        '(tf.summary.experimental.set_step(optimizer.iterations)).')

  @property
  def dynamic_counter(self) -> Optional[tf.Variable]:
    """Finite steps since the scale last changed; None if fixed or unbuilt."""
    return _tf(self.step_counter) if self._dynamic and self.built else None

  def _on_skipped_step(self, given_unscaled: bool) -> Any:
    # TF 2.4-2.15's custom loops: `iterations` counts skipped steps too.
    # Keras 3's protocol (`fit`) counts them as Keras's class: not at all.
    if given_unscaled:
      return keras3_support.count_skipped_step(self.inner_optimizer)
    return None

  loss_scale = property(
      lambda self: self._current_scale(),
      doc='The current loss scale, a float32 scalar tensor.')

  def _scale_state(self, scale: Optional[tf.Tensor] = None,
                   counter: Optional[tf.Tensor] = None) -> step.ScaleState:
    if self._dynamic:
      return super()._scale_state(scale, counter)
    return _FixedScale(self._current_scale() if scale is None else scale,
                       None if scale is None else (scale, counter))

  def get_config(self) -> Dict[str, Any]:
    """TF 2.4-2.15's config: the inner optimizer and the three arguments."""
    return {
        'inner_optimizer': keras.optimizers.serialize(self.inner_optimizer),
        'dynamic': self.dynamic,
        'initial_scale': self.initial_scale,
        'dynamic_growth_steps': self.dynamic_growth_steps,
    }

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None
                 ) -> 'LossScaleOptimizer':
    """Recreates the optimizer (without its state) from a config.

    Args:
      config: The output of `get_config` of this class or of tf_keras's
        (not modified).
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new, unbuilt `LossScaleOptimizer`.
    """
    config = dict(config)
    inner = config.pop('inner_optimizer')
    if isinstance(inner, dict):
      inner = dict(inner, config={
          k: v for k, v in inner.get('config', {}).items()
          if k not in _KERAS2_ONLY_SETTINGS})
      inner = keras.optimizers.deserialize(inner,
                                           custom_objects=custom_objects)
    return cls(inner, **config)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _tf(value: Any) -> Any:
  # A Keras variable's tf.Variable, as tf_keras's (Keras 3.3's own refuses
  # `int()`); a computed count as it is.
  return getattr(value, 'value', value)


class _FixedScale(step.ScaleState):
  """A fixed scale for the step: every step is applied, nothing moves."""

  def __init__(self, scale: tf.Tensor, values: Optional[Any]):
    self._scale, self._values = scale, values

  def scale(self) -> tf.Tensor:
    return self._scale

  def decide(self, grads: Any, all_finite: Any) -> step.Decision:
    return step.Decision(True)

  def advance(self, verdict: Any, after: Any) -> Any:
    return self._values  # Stateless: the values given, unchanged.
