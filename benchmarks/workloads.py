"""The models the benchmark trains: a list of initial values and a loss.

Each workload is a pure function of its variables, so the same loss can be
built into a `tf.compat.v1` graph, a `tf.function`, an XLA-compiled function or
a replica function, over `tf.Variable`s or `keras.Variable`s alike.
"""

import dataclasses
from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Workload:
  """A benchmark model.

  Attributes:
    name: The name used in tables and on the command line.
    initial_values: Makes the variables' initial values (float32 arrays),
      the same on every call so that every variant starts alike.
    loss: Builds the float32 scalar loss from the variables.
  """
  name: str
  initial_values: Callable[[], List[np.ndarray]]
  loss: Callable[[Sequence[tf.Variable]], tf.Tensor]


def _dense(count: int, size: int) -> Workload:
  """`count` float32 vectors of `size` values; loss = sum of mean squares.

  The gradient of each variable depends on the variable itself, so Grappler
  cannot fold it into a constant and the bare step does real work.
  """

  def initial_values():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]

  def loss(variables):
    return tf.add_n([tf.reduce_mean(tf.square(v)) for v in variables])

  return Workload(f'{count}x{_short(size)}', initial_values, loss)


def _matmul(count: int, size: int, batch: int) -> Workload:
  """`count` float32 `size`x`size` weights, each applied to a fixed batch.

  loss = sum of the mean squares of `batch @ weight`. Each gradient is the
  output of a `MatMul`, as a dense layer's is: unlike `_dense`'s, which are
  a variable times scalars, no product with a scalar after it can be folded
  by Grappler into its computation.
  """
  rng = np.random.default_rng(3)
  inputs = rng.standard_normal((batch, size)).astype(np.float32)

  def initial_values():
    init = np.random.default_rng(0)
    return [(init.standard_normal((size, size)) / np.sqrt(size)).astype(
        np.float32) for _ in range(count)]

  def loss(variables):
    return tf.add_n([tf.reduce_mean(tf.square(tf.matmul(inputs, w)))
                     for w in variables])

  return Workload('matmul', initial_values, loss)


def _small_cnn() -> Workload:
  """Two 3x3 convolutions and a dense layer on a fixed 16x32x32x3 batch."""
  batch = 16
  shapes = [(3, 3, 3, 16), (16,), (3, 3, 16, 32), (32,), (32, 10), (10,)]
  rng = np.random.default_rng(1)
  images = rng.standard_normal((batch, 32, 32, 3)).astype(np.float32)
  labels = rng.integers(0, 10, batch)

  def initial_values():
    init = np.random.default_rng(2)
    return [(0.1 * init.standard_normal(s)).astype(np.float32) for s in shapes]

  def loss(variables):
    k1, b1, k2, b2, w, b = variables
    x = tf.nn.relu(tf.nn.conv2d(images, k1, 1, 'SAME') + b1)
    x = tf.nn.relu(tf.nn.conv2d(x, k2, 2, 'SAME') + b2)
    logits = tf.matmul(tf.reduce_mean(x, axis=[1, 2]), w) + b
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

  return Workload('cnn', initial_values, loss)


def _short(size: int) -> str:
  return f'{size // 10**6}M' if size >= 10**6 else f'{size // 1000}k'


WORKLOADS = {w.name: w for w in (_dense(10, 10**6), _dense(200, 1000),
                                 _small_cnn(), _matmul(10, 1000, 16))}
# The workloads of benchmarks/results.json's table.
TABLE = ('10x1M', '200x1k', 'cnn')
