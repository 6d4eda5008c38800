"""The small model, data and state record shared by the worker scripts.

A linear layer (3 inputs, 2 outputs) trained with momentum SGD on rows whose
values are exact in float32; `data` multiplies one slice of the inputs by
1e30 so that its gradients overflow. States are recorded as the bytes of
every variable, so that runs can be compared bit for bit.
"""

from typing import Any, Dict, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_loss_scale import keras as tls_keras

KERNEL = [[0.5, -0.25], [0.125, 0.75], [-0.5, 0.25]]
BIAS = [0.0625, -0.125]
LEARNING_RATE, MOMENTUM = 0.1, 0.9


def data(steps: int, replicas: int, rows: int, overflow: Sequence[int]):
  """Inputs and targets, [step, replica, row, feature], float32.

  Args:
    steps: Steps of data.
    replicas: Replicas per step (each gets its own rows).
    rows: Rows per replica and step.
    overflow: (step, replica) whose inputs are multiplied by 1e30.

  Returns:
    (x, y) NumPy arrays.
  """
  cells = np.arange(steps * replicas * rows * 3, dtype=np.float32)
  x = ((cells * 7) % 11 - 5).reshape(steps, replicas, rows, 3) / 8
  y = ((cells[:steps * replicas * rows * 2] * 5) % 7 - 3).reshape(
      steps, replicas, rows, 2) / 4
  step, replica = overflow
  x[step, replica] *= 1e30
  return x.astype(np.float32), y.astype(np.float32)


def squared_error(kernel: Any, bias: Any, x: tf.Tensor, y: tf.Tensor,
                  divisor: float) -> tf.Tensor:
  """The sum of squared errors of the linear layer, divided by `divisor`."""
  error = tf.matmul(x, kernel) + bias - y
  return tf.reduce_sum(error * error) / divisor


def keras_model(*first_layers: keras.layers.Layer) -> keras.Model:
  """The linear layer as a Sequential model, after `first_layers`."""
  return keras.Sequential([
      keras.Input((3,)), *first_layers,
      keras.layers.Dense(
          2, kernel_initializer=keras.initializers.Constant(KERNEL),
          bias_initializer=keras.initializers.Constant(BIAS)),
  ])


def keras_form(initial_scale: float,
               growth_steps: int) -> tls_keras.LossScaleOptimizer:
  """The Keras 3 form around momentum SGD."""
  return tls_keras.LossScaleOptimizer(
      keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
      initial_scale=initial_scale, dynamic_growth_steps=growth_steps)


def record(copies_by_name: Dict[str, Sequence[Any]]) -> Dict[str, Any]:
  """{name: [{'hex': bytes as hex, 'value': as a list}, ...]} per copy."""
  return {name: [{'hex': np.asarray(c).tobytes().hex(),
                  'value': np.asarray(c).tolist()} for c in copies]
          for name, copies in copies_by_name.items()}


def keras_optimizer_state(optimizer: Any) -> Dict[str, Any]:
  """A Keras loss scale optimizer's state, through its public API.

  The loss scale, good steps and iterations under names of their own (for
  checks of expected values), and every variable by position and name.
  """
  if hasattr(optimizer, 'dynamic_scale'):  # The Keras 3 form.
    scale, good_steps = optimizer.dynamic_scale, optimizer.step_counter
  else:
    scale, good_steps = optimizer.loss_scale(), optimizer.loss_scale.good_steps
  return {'loss_scale': scale, 'good_steps': good_steps,
          'iterations': optimizer.iterations,
          **{f'optimizer/{i}/{v.name}': v
             for i, v in enumerate(optimizer.variables)}}
