"""Shared harness for the tests of `MixedPrecisionLossScaleOptimizer`.

A small model with a dense and a sparse (tf.gather) gradient and an unused
weight, seeded input sequences with inf, NaN and scale-dependent overflow, and
a `Trainer` that runs our wrapper or TensorFlow's own in a TF1 session,
eagerly or in a tf.function, records every variable after each step, and
saves and restores checkpoints (a v1 `Saver` in a session, otherwise
`tf.train.Checkpoint`).
"""

import re

import numpy as np
import tensorflow as tf

import tf_loss_scale

INF, NAN = np.inf, np.nan
MODES = ('graph', 'eager', 'function')
OPTIMIZERS = {
    'sgd': lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    'momentum': lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    'adam': lambda: tf.compat.v1.train.AdamOptimizer(0.01),
}
_TF_V1 = tf.compat.v1.mixed_precision
# (optimizer wrapper, dynamic loss scale, fixed loss scale) classes.
OURS = (tf_loss_scale.MixedPrecisionLossScaleOptimizer,
        tf_loss_scale.DynamicLossScale, tf_loss_scale.FixedLossScale)
THEIRS = (_TF_V1.MixedPrecisionLossScaleOptimizer, _TF_V1.DynamicLossScale,
          _TF_V1.FixedLossScale)
EMBEDDING_IDS = [1, 3]


class Model(tf.Module):
  """A dense weight, an embedding read by tf.gather, and an unused weight."""

  def __init__(self, dtype=tf.float32):
    super().__init__(name='model')
    self.w = tf.Variable(tf.constant([0.5, -1.0, 2.0], dtype), name='w')
    self.embedding = tf.Variable(
        tf.constant(np.arange(10).reshape(5, 2) / 10, dtype), name='embedding')
    self.unused = tf.Variable(tf.constant([1.0], dtype), name='unused')
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name='global_step')

  @property
  def weights(self):
    return [self.w, self.embedding, self.unused]

  def loss(self, x, y):
    """The gradients are `x` for `w` and `y` for the gathered rows."""
    rows = tf.gather(self.embedding, EMBEDDING_IDS)
    return tf.reduce_sum(self.w * x) + tf.reduce_sum(rows * y)


def random_steps(seed, count=16):
  """Seeded inputs `(x [3], y [2, 2])` for `Model.loss`.

  About a quarter of the steps hold inf, -inf or NaN; another quarter hold
  1e34, which overflows only at a loss scale of 2**16 or more.

  Args:
    seed: The numpy random seed.
    count: How many steps.

  Returns:
    A list of `(x, y)` float32 arrays.
  """
  rng = np.random.default_rng(seed)
  steps = []
  for _ in range(count):
    x = rng.normal(size=3).astype(np.float32)
    y = rng.normal(size=(2, 2)).astype(np.float32)
    draw = rng.random()
    if draw < 0.12:
      x[rng.integers(3)] = rng.choice([INF, -INF, NAN])
    elif draw < 0.24:
      y[rng.integers(2), rng.integers(2)] = rng.choice([INF, NAN])
    elif draw < 0.5:
      x[rng.integers(3)] = 1e34
    steps.append((x, y))
  return steps


def state_variables(model, optimizer):
  """The variables to compare: the model's, then `optimizer.variables()`.

  Keys are stable across runs and implementations: the model's attribute
  names, then each optimizer variable's position and base name, e.g.
  '1:embedding/Momentum', without the numbered suffixes eager slot names get
  or the cond scopes of variables first created inside a tf.function's cond.
  """
  state = {'w': model.w, 'embedding': model.embedding,
           'unused': model.unused, 'global_step': model.global_step}
  for index, variable in enumerate(optimizer.variables()):
    base_name = re.sub(r'^(cond(_\d+)?/)+', '', variable.name)
    base_name = re.sub(r'(_\d+)?:\d+$', '', base_name)
    state[f'{index}:{base_name}'] = variable
  return state


def named(record, base_name):
  """The value of the optimizer variable called `base_name` in a record."""
  values = [v for k, v in record.items() if k.split(':', 1)[-1] == base_name]
  assert len(values) == 1, (base_name, sorted(record))
  return values[0]


def applied_steps(records):
  """Whether each step was applied, read from the global step."""
  steps = [int(r['global_step']) for r in records]
  return [now > before for before, now in zip([0] + steps[:-1], steps)]


class Trainer:
  """Trains `Model` with `minimize` in one execution mode.

  Use as a context manager; `step` returns every variable after the step.
  """

  def __init__(self, classes, make_inner, make_loss_scale, mode):
    """Builds the model and the wrapped optimizer.

    Args:
      classes: `OURS` or `THEIRS`.
      make_inner: Factory of the wrapped tf.compat.v1 optimizer.
      make_loss_scale: Function of `classes` returning the loss scale.
      mode: 'graph' (a TF1 session), 'eager' or 'function'.
    """
    self.mode = mode
    self._graph = tf.Graph() if mode == 'graph' else None
    self._context = self._graph.as_default() if self._graph else None
    if self._context:
      self._context.__enter__()
    self.model = Model()
    self.optimizer = classes[0](make_inner(), make_loss_scale(classes))
    if mode == 'graph':
      self._build_graph()
    else:
      self._build_eager()

  def _build_graph(self):
    self._x = tf.compat.v1.placeholder(tf.float32, [3])
    self._y = tf.compat.v1.placeholder(tf.float32, [2, 2])
    self._train_op = self.optimizer.minimize(
        self.model.loss(self._x, self._y), var_list=self.model.weights,
        global_step=self.model.global_step)
    self._state = state_variables(self.model, self.optimizer)
    self.saver = tf.compat.v1.train.Saver()
    self.session = tf.compat.v1.Session(graph=self._graph)
    self.session.run(tf.compat.v1.global_variables_initializer())

  def _build_eager(self):
    model, optimizer = self.model, self.optimizer

    def step(x, y):
      optimizer.minimize(lambda: model.loss(x, y), var_list=model.weights,
                         global_step=model.global_step)

    if self.mode == 'function':
      step = tf.function(step, input_signature=[
          tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 2], tf.float32)])
    self._step = step
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

  def step(self, x, y):
    """Runs one training step; returns `read()` after it."""
    if self.mode == 'graph':
      self.session.run(self._train_op, {self._x: x, self._y: y})
    else:
      self._step(tf.constant(x), tf.constant(y))
    return self.read()

  def read(self):
    """Returns {name: value} of the `state_variables` that exist now."""
    if self.mode == 'graph':
      return self.session.run(self._state)
    return {name: variable.numpy() for name, variable in
            state_variables(self.model, self.optimizer).items()}

  def run(self, steps):
    return [self.step(x, y) for x, y in steps]

  def save(self, prefix):
    """Saves a checkpoint; returns its path."""
    if self.mode == 'graph':
      return self.saver.save(self.session, prefix)
    return self.checkpoint.save(prefix)

  def restore(self, path):
    """Restores a checkpoint; returns the restore status (None in a graph)."""
    if self.mode == 'graph':
      self.saver.restore(self.session, path)
      return None
    return self.checkpoint.restore(path)

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    if self.mode == 'graph':
      self.session.close()
      self._context.__exit__(None, None, None)


def train(classes, make_inner, make_loss_scale, steps, mode):
  """Runs a whole sequence in a fresh `Trainer`; returns the records."""
  with Trainer(classes, make_inner, make_loss_scale, mode) as trainer:
    return trainer.run(steps)


def assert_same_trajectory(ours, theirs):
  """Asserts two runs recorded the same variables with the same values."""
  assert len(ours) == len(theirs)
  for step, (mine, reference) in enumerate(zip(ours, theirs)):
    assert sorted(mine) == sorted(reference), f'step {step}: variable names'
    for name in reference:
      np.testing.assert_array_equal(
          mine[name], reference[name],
          err_msg=f'step {step}: {name} differs (ours vs tensorflow)')


def train_in_a_while_loop(classes, steps):
  """Trains a whole sequence inside one `tf.while_loop` of a TF1 graph.

  Each iteration of the loop is one `minimize` step on the next `(x, y)` of
  `steps`; the session runs the loop once.

  Args:
    classes: `OURS` or `THEIRS`.
    steps: A list of `(x, y)` inputs, as from `random_steps`.

  Returns:
    The final values of every state variable, by name (lists of floats, so
    that a subprocess can print them as JSON).
  """
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    model = Model()
    optimizer = classes[0](OPTIMIZERS['momentum'](),
                           classes[1](2.0**15, increment_period=2))
    xs = tf.constant(np.stack([x for x, _ in steps]))
    ys = tf.constant(np.stack([y for _, y in steps]))

    def body(i):
      train_op = optimizer.minimize(model.loss(xs[i], ys[i]),
                                    var_list=model.weights,
                                    global_step=model.global_step)
      with tf.control_dependencies([train_op]):
        return i + 1

    loop = tf.while_loop(lambda i: i < len(steps), body, [tf.constant(0)])
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(loop)
    state = session.run(state_variables(model, optimizer))
  return {name: np.asarray(value, np.float64).tolist()
          for name, value in state.items()}
