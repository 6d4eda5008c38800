"""Builds one training step per (mode, optimizer variant, workload).

A variant is one way of applying SGD: bare, wrapped by this library, or
wrapped by a reference (TensorFlow's `tf.compat.v1` wrapper, Keras 3's
`LossScaleOptimizer`). Every variant owns its variables, which start from the
workload's initial values, so variants can be stepped in any interleaving.

Modes:
  graph: a `tf.compat.v1` graph run by a `tf.compat.v1.Session`.
  function: a `tf.function`.
  jit: a `tf.function(jit_compile=True)`.
  mirrored: a `tf.function` running `strategy.run` on a MirroredStrategy
    over two logical CPU devices.
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import gradients
from benchmarks.workloads import Workload

LEARNING_RATE = 0.01
INITIAL_SCALE = 2.0**15
GROWTH_STEPS = 2000

MODES = ('graph', 'function', 'jit', 'mirrored')


@dataclasses.dataclass
class Runner:
  """A built variant.

  Attributes:
    step: Runs one training step.
    values: Returns the current variable values as NumPy arrays.
    graph_def: Returns the GraphDef of the traced step (with its function
      library: the branches of conditionals and other called functions).
  """
  step: Callable[[], None]
  values: Callable[[], List[np.ndarray]]
  graph_def: Callable[[], Any]


# Optimizer factories. v1 families use `tf.compat.v1` optimizers, Keras
# families use Keras 3 optimizers; both wrap plain SGD.
def _bare_v1():
  return tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE)


def _ours_v1(package=tf_loss_scale):
  return package.MixedPrecisionLossScaleOptimizer(_bare_v1(), 'dynamic')


def _tf_v1():
  return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      _bare_v1(), 'dynamic')


def _bare_keras():
  return keras.optimizers.SGD(LEARNING_RATE)


def _ours_keras(package=tf_loss_scale):
  return package.keras.LossScaleOptimizer(
      _bare_keras(), initial_scale=INITIAL_SCALE,
      dynamic_growth_steps=GROWTH_STEPS)


def _keras3():
  return keras.optimizers.LossScaleOptimizer(
      _bare_keras(), initial_scale=INITIAL_SCALE,
      dynamic_growth_steps=GROWTH_STEPS)


class _BarrierFloorV1:
  """Not a loss scale optimizer: the least work any exact skip has to do.

  It scales the loss by a loss scale variable, unscales the gradients, and
  then holds every gradient until all of them exist before applying any: the
  barrier an exact skip cannot avoid, since no variable may change before
  every gradient has been checked. It has no finite check, no branch and no
  loss scale update, so a wrapper built from TensorFlow ops that skips
  exactly cannot add less overhead than it does.
  """

  def minimize(self, loss, var_list):
    optimizer = _bare_v1()
    scale = tf.Variable(INITIAL_SCALE, trainable=False).read_value()
    grads_and_vars = optimizer.compute_gradients(loss * scale,
                                                 var_list=var_list)
    grads = gradients.unscale([g for g, _ in grads_and_vars], scale)
    with tf.control_dependencies(self.barrier(grads)):
      held = [tf.identity(g) for g in grads]
    return optimizer.apply_gradients(zip(held, var_list))

  def barrier(self, grads):
    """What every gradient waits for before any is applied."""
    return [tf.group(*grads)]


class _ReadFloorV1(_BarrierFloorV1):
  """The barrier floor, with every gradient also read once before it.

  Whether a gradient holds an inf or a NaN cannot be known without reading
  each of its values: here that read is one `Max` reduction per gradient (one
  kernel, no temporary). Their sum is stored in a variable of the floor's
  own, since Grappler removes stateless ops whose results nothing uses (a
  barrier on the reductions alone would never run them). It still has no
  verdict, no branch and no loss scale update.
  """

  def barrier(self, grads):
    sink = tf.Variable(0.0, trainable=False, name='read_floor_sink')
    largest = tf.add_n([tf.reduce_max(g) for g in grads])
    return [tf.group(*grads, sink.assign(largest))]


# family -> {variant name: optimizer factory}; the first variant is the bare
# baseline, the second is ours, the third the reference we are measured by.
FAMILIES = {
    'v1': {'bare': _bare_v1, 'ours': _ours_v1, 'tf_v1': _tf_v1},
    'keras': {'bare': _bare_keras, 'ours': _ours_keras, 'keras3': _keras3},
}
# family -> {name: factory} of a floor variant timed beside the others.
FLOORS = {'v1': {'floor': _BarrierFloorV1, 'read_floor': _ReadFloorV1}}
# family -> {'earlier': factory} of this library at an earlier commit, once
# `add_earlier` has given it.
EARLIER = {}


def add_earlier(package: Any) -> None:
  """Makes `package`, this library at an earlier commit, a variant.

  Args:
    package: The package as `benchmarks.earlier.load` imports it.
  """
  EARLIER['v1'] = {'earlier': functools.partial(_ours_v1, package)}
  EARLIER['keras'] = {'earlier': functools.partial(_ours_keras, package)}


def build(mode: str, family: str, variant: str, workload: Workload,
          strategy: Optional[tf.distribute.Strategy] = None) -> Runner:
  """Builds the training step of one variant.

  Args:
    mode: One of `MODES`.
    family: 'v1' or 'keras'.
    variant: A key of `variants_of(family)`.
    workload: The model to train.
    strategy: The MirroredStrategy, required for mode 'mirrored'.

  Returns:
    A `Runner`.
  """
  make_optimizer = variants_of(family)[variant]
  if mode == 'graph':
    if family != 'v1':
      raise ValueError('graph mode runs tf.compat.v1 optimizers only.')
    return _graph_runner(workload, make_optimizer)
  if mode == 'mirrored':
    with strategy.scope():
      return _function_runner(workload, family, make_optimizer, strategy,
                              jit_compile=False)
  return _function_runner(workload, family, make_optimizer, None,
                          jit_compile=(mode == 'jit'))


def graph_step(workload: Workload, make_optimizer
              ) -> Tuple[tf.compat.v1.Session, tf.Operation, List[tf.Variable]]:
  """Builds a TF1 graph step in a session of its own, variables initialised.

  Args:
    workload: The model to train.
    make_optimizer: Makes the `tf.compat.v1`-style optimizer to minimize with.

  Returns:
    The session, the training op and the model's variables.
  """
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.Variable(v) for v in workload.initial_values()]
    train_op = make_optimizer().minimize(workload.loss(variables),
                                         var_list=variables)
    init_op = tf.compat.v1.global_variables_initializer()
  session = tf.compat.v1.Session(graph=graph)
  session.run(init_op)
  return session, train_op, variables


def _graph_runner(workload: Workload, make_optimizer) -> Runner:
  session, train_op, variables = graph_step(workload, make_optimizer)
  return Runner(lambda: session.run(train_op),
                lambda: session.run(variables),
                session.graph.as_graph_def)


def _function_runner(workload: Workload, family: str, make_optimizer,
                     strategy: Optional[tf.distribute.Strategy],
                     jit_compile: bool) -> Runner:
  if family == 'v1':
    variables = [tf.Variable(v) for v in workload.initial_values()]
    optimizer = make_optimizer()

    def replica_step():
      optimizer.minimize(lambda: workload.loss(variables), var_list=variables)
  else:
    variables = [keras.Variable(v) for v in workload.initial_values()]
    optimizer = make_optimizer()
    optimizer.build(variables)
    scales = hasattr(optimizer, 'scale_loss')

    def replica_step():
      with tf.GradientTape() as tape:
        loss = workload.loss(variables)
        if scales:
          loss = optimizer.scale_loss(loss)
      grads = tape.gradient(loss, variables)
      optimizer.apply(grads, variables)

  if strategy is None:
    step = tf.function(replica_step, jit_compile=jit_compile)
  else:
    step = tf.function(lambda: strategy.run(replica_step))

  def values():
    return [np.asarray(v.numpy() if hasattr(v, 'numpy') else v)
            for v in variables]

  return Runner(step, values,
                lambda: step.get_concrete_function().graph.as_graph_def())


def variants_of(family: str) -> Dict[str, Callable]:
  """Every variant of `family` that `build` can make: floors, earlier too."""
  return {**FAMILIES[family], **FLOORS.get(family, {}),
          **EARLIER.get(family, {})}
