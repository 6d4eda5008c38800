"""The five front ends, driven the same way by tests of what they share.

`FRONT_ENDS` holds one `FrontEnd` per public form: the v1 wrapper around a
`tf.compat.v1` optimizer, the Keras 3 form, TF 2.4-2.15's form on Keras 3,
and the experimental (TF 2.3) form around a Keras 3 and around a Keras 2
optimizer (tf_keras, or tf.keras on TensorFlow 2.15 and earlier). Each makes
its inner optimizer, the wrapper with a dynamic scale, a variable, one step, and reads
back the scale, its good-step counter and the monitoring record, so a test
can state one rule once and check it on every front end.
"""

import dataclasses
from typing import Any, Callable, List

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import keras as tls_keras

import versions


@dataclasses.dataclass(frozen=True)
class FrontEnd:
  """One front end and how to drive it.

  Attributes:
    name: The id tests are parametrized by.
    inner: Makes an SGD inner optimizer of the front end's family, given the
      learning rate.
    wrap: Wraps an inner optimizer, given it, the initial scale and the
      finite steps after which the scale grows.
    variable: Makes a variable of the family, given its initial value and
      dtype.
    peer: Wraps an inner optimizer in the family's peer loss scale
      optimizer (Keras's, tf_keras's, TensorFlow's v1).
    needs: Where the front end exists (its Keras).
    scaled_gradients: Whether `apply` takes gradients of the scaled loss
      (the Keras 3 form) rather than unscaled ones.
    keras_state: Whether the scale lives in Keras's variables
      (`dynamic_scale`, `step_counter`) rather than in a `LossScale`.
  """
  name: str
  inner: Callable[[float], Any]
  wrap: Callable[[Any, float, int], Any]
  variable: Callable[[Any, Any], Any]
  peer: Callable[[Any], Any]
  needs: versions.Condition
  scaled_gradients: bool = False
  keras_state: bool = False

  def apply(self, opt: Any, grads: List[Any], variables: List[Any]) -> Any:
    """One step: the front end's own apply, in its own calling convention."""
    if self.scaled_gradients:
      scale = tf.cast(self.scale_tensor(opt), tf.float32)
      return opt.apply([tf.cast(tf.cast(g, tf.float32) * scale, g.dtype)
                        for g in grads], variables)
    return opt.apply_gradients(list(zip(grads, variables)))

  def build(self, opt: Any, variables: List[Any]) -> None:
    """Creates a Keras 3 optimizer's variables (the others need no build)."""
    if self.variable is _keras_variable:
      opt.build(variables)

  def scale_tensor(self, opt: Any) -> tf.Tensor:
    if self.keras_state:
      if not opt.built:
        return tf.constant(opt.initial_scale, tf.float32)
      return tf.convert_to_tensor(opt.dynamic_scale)
    return opt.loss_scale()

  def state(self, opt: Any) -> dict:
    """The scale, its counter and the monitoring record, as Python values."""
    if self.keras_state:
      counter, record = opt.step_counter, opt
    else:
      counter, record = opt.loss_scale.good_steps, opt.loss_scale
    return {'scale': float(self.scale_tensor(opt)),
            'good_steps': int(tf.convert_to_tensor(counter)),
            'skipped_steps': int(record.skipped_steps),
            'last_step_skipped': bool(record.last_step_skipped)}


def _dynamic(initial: float, period: int) -> tf_loss_scale.DynamicLossScale:
  return tf_loss_scale.DynamicLossScale(initial_loss_scale=initial,
                                        increment_period=period)


def _tf_variable(value: Any, dtype: Any) -> tf.Variable:
  return tf.Variable(np.asarray(value, dtype))


def _keras_variable(value: Any, dtype: Any) -> Any:
  return keras.Variable(np.asarray(value, dtype), dtype=np.dtype(dtype).name)


V1 = FrontEnd(
    name='v1',
    inner=tf.compat.v1.train.GradientDescentOptimizer,
    wrap=lambda inner, initial, period: (
        tf_loss_scale.MixedPrecisionLossScaleOptimizer(
            inner, _dynamic(initial, period))),
    variable=_tf_variable,
    peer=lambda inner: (
        tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            inner, 'dynamic')),
    needs=versions.Condition(True, ''))

# Keras is looked up when a test runs: the Keras 3 front ends exist with
# Keras 3 only, the Keras 2 one where a Keras 2 is installed.
KERAS3 = FrontEnd(
    name='keras3',
    inner=lambda lr: keras.optimizers.SGD(lr),
    wrap=lambda inner, initial, period: tls_keras.LossScaleOptimizer(
        inner, initial_scale=initial, dynamic_growth_steps=period),
    variable=_keras_variable,
    peer=lambda inner: keras.optimizers.LossScaleOptimizer(inner),
    needs=versions.KERAS_3,
    scaled_gradients=True,
    keras_state=True)

# TF 2.4-2.15's API on Keras 3, driven as its loops did (unscaled gradients).
KERAS_MIXED_PRECISION = FrontEnd(
    name='keras_mixed_precision',
    inner=lambda lr: keras.optimizers.SGD(lr),
    wrap=lambda inner, initial, period: (
        tls_keras.mixed_precision.LossScaleOptimizer(
            inner, initial_scale=initial, dynamic_growth_steps=period)),
    variable=_keras_variable,
    peer=lambda inner: keras.optimizers.LossScaleOptimizer(inner),
    needs=versions.KERAS_3,
    keras_state=True)

EXPERIMENTAL_KERAS3 = FrontEnd(
    name='experimental_keras3',
    inner=lambda lr: keras.optimizers.SGD(lr),
    wrap=lambda inner, initial, period: (
        tls_keras.experimental.LossScaleOptimizer(inner,
                                                  _dynamic(initial, period))),
    variable=_keras_variable,
    peer=lambda inner: keras.optimizers.LossScaleOptimizer(inner),
    needs=versions.KERAS_3)

EXPERIMENTAL_KERAS2 = FrontEnd(
    name='experimental_keras2',
    inner=lambda lr: versions.keras_2().optimizers.legacy.SGD(lr),
    wrap=lambda inner, initial, period: (
        tls_keras.experimental.LossScaleOptimizer(inner,
                                                  _dynamic(initial, period))),
    variable=_tf_variable,
    peer=lambda inner: versions.keras_2().mixed_precision.LossScaleOptimizer(
        inner),
    needs=versions.KERAS_2)

FRONT_ENDS = (V1, KERAS3, KERAS_MIXED_PRECISION, EXPERIMENTAL_KERAS3,
              EXPERIMENTAL_KERAS2)


def params(*front_ends: FrontEnd, on_replicas: bool = False) -> List[Any]:
  """Test parameters for `front_ends` (all five by default).

  Args:
    *front_ends: The front ends to test.
    on_replicas: Whether the test trains on several replicas, where the
      Keras 3 front ends also need a Keras that sums gradients across them.

  Returns:
    One `pytest.param` per front end, named after it, skipped with the
    reason where it does not exist.
  """
  chosen = front_ends or FRONT_ENDS
  return [
      pytest.param(f, id=f.name, marks=[f.needs.mark] + (
          [versions.KERAS_SUMS_ACROSS_REPLICAS.mark]
          if on_replicas and f.variable is _keras_variable else []))
      for f in chosen
  ]


ALL = params()
ON_REPLICAS = params(on_replicas=True)
