"""Small training programs, each a point in the product of the axes users combine.

A `Program` names one choice per axis: the front end and the peer it is
judged against, the inner optimizer, the dtypes, how the step runs, when the
optimizer is built, the loss scale, each step's gradients and a save and
restore at some step. `programs()` is the Hypothesis strategy that draws them
(and shrinks them); `run(program, side)` trains it once with this library
(`side='ours'`) or with the peer (`side='peer'`) and returns what a program
can observe after every step; `divergences` compares two such traces, with
the declared differences (`generated_declarations.py`) read as data;
`script(program)` is the program as a script that runs both sides and prints
where they part.

Front ends and their peers (one process; Keras 3 and tf_keras both loaded):
  keras3: the Keras 3 drop-in `tf_loss_scale.keras.LossScaleOptimizer`, or
    the class `compat.install()` names (`shared_name.LossScaleOptimizer`),
    in a Keras 3 loop (`scale_loss`, `apply_gradients`) or `fit`, against
    `keras.optimizers.LossScaleOptimizer`.
  tf24: TF 2.4-2.15's form `tf_loss_scale.keras.mixed_precision.
    LossScaleOptimizer` or the class `install()` names, in a TF 2.4-2.15 loop
    (`get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`), against
    `tf_keras.mixed_precision.LossScaleOptimizer` around tf_keras's namesake.
  tf1: `tf_loss_scale.MixedPrecisionLossScaleOptimizer` against
    `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`, in a
    `tf.Graph` and a `Session`, with control flow v2 or v1 (switched for the
    graph's construction and switched back).
"""

import dataclasses
import math
import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from hypothesis import strategies as st
import keras
import numpy as np
import tensorflow as tf

import versions

FAMILIES = ('keras3', 'tf24', 'tf1')
INNERS = ('sgd', 'momentum', 'adam', 'rmsprop', 'adagrad', 'schedule',
          'clipnorm')
DTYPES = ('float32', 'mixed_float16', 'float16')
KINDS = ('finite', 'overflow', 'inf', 'nan')
# How a step of a custom loop runs. `split_*`: the gradients and the apply in
# two parts, the one named traced in a `tf.function`, the other eager.
# `split_unscale_eager` (TF 2.4-2.15's loop): the scaled loss and its
# gradients traced, `get_unscaled_gradients` and the apply eager.
LOOP_SHAPES = ('eager', 'function', 'split_traced_gradients',
               'split_traced_apply', 'split_unscale_eager', 'jit', 'mirrored')
_INITIAL_W = (1.0, -2.0)


@dataclasses.dataclass(frozen=True)
class Program:
  """One generated program: a choice on every axis.

  Attributes:
    family: 'keras3', 'tf24' or 'tf1' (module docstring).
    ours: Which of our classes: 'form' (the family's own) or 'installed'
      (the class `compat.install()` puts under Keras's name; Keras families).
    inner: The inner optimizer: one of `INNERS`.
    dtype: 'float32'; 'mixed_float16' (float32 variables, float16 compute,
      and the Keras policy under `fit`); 'float16' (float16 variables).
    loss_float32: Whether the loss is cast to float32 before it is scaled.
    shape: One of `LOOP_SHAPES`, 'fit' (keras3) or 'session' (tf1).
    steps_per_execution: `fit`'s, and how many steps each `fit` call runs.
    built_before: Whether the optimizer is built before the first step
      (otherwise its first step, or trace, builds it).
    dynamic: A dynamic loss scale (otherwise fixed at `initial_scale`).
    initial_scale: The initial (or fixed) scale; None for the default.
    growth_steps: Finite steps before a dynamic scale grows; None: default.
    gradients: Per step, what the gradients are: one of `KINDS`, and the
      magnitude of a finite one.
    replica: Under 'mirrored': which replica gets a non-finite kind (0, 1)
      or both (-1); the other gets the finite gradient.
    restore_after: After that step, the state is saved through a checkpoint
      and restored into fresh variables and a fresh optimizer, which run the
      rest; None: no restore.
    restore_built: Whether the fresh optimizer is built before the restore.
    control_flow_v2: tf1: whether the graph is built with control flow v2.
  """
  family: str
  ours: str = 'form'
  inner: str = 'sgd'
  dtype: str = 'float32'
  loss_float32: bool = True
  shape: str = 'eager'
  steps_per_execution: int = 1
  built_before: bool = True
  dynamic: bool = True
  initial_scale: Optional[float] = None
  growth_steps: Optional[int] = None
  gradients: Tuple[Tuple[str, float], ...] = (('finite', 1.0),)
  replica: int = -1
  restore_after: Optional[int] = None
  restore_built: bool = True
  control_flow_v2: bool = True

  @property
  def scale0(self) -> float:
    return 2.0 ** 15 if self.initial_scale is None else self.initial_scale


@st.composite
def programs(draw) -> Program:
  """The Hypothesis strategy of `Program`s where the peer has such a point."""
  family = draw(st.sampled_from(FAMILIES))
  tf1 = family == 'tf1'
  inner = draw(st.sampled_from(INNERS[:-1] if tf1 else INNERS))
  dtype = draw(st.sampled_from(DTYPES[:2] if tf1 else DTYPES))
  if tf1:
    shape = 'session'
  else:
    # Keras 3 before 3.5 sums no gradients across replicas: the Keras 3
    # forms refuse a strategy there (docs/differences.md), no program.
    shapes = tuple(
        s for s in LOOP_SHAPES if s != 'mirrored' or
        versions.KERAS_SUMS_ACROSS_REPLICAS.holds)
    if family == 'keras3':
      shapes = tuple(s for s in shapes if s != 'split_unscale_eager') + (
          'fit',)
    shape = draw(st.sampled_from(shapes))
  if shape == 'fit' and dtype == 'float16':
    dtype = 'mixed_float16'
  # Keras's class has no fixed scale; tf_keras's and TensorFlow's do.
  dynamic = True if family == 'keras3' else draw(st.booleans())
  initial = draw(st.one_of(st.none(),
                           st.sampled_from([1.0, 2.0 ** 4, 2.0 ** 10,
                                            2.0 ** 20])))
  growth = draw(st.one_of(st.none(), st.integers(1, 3))) if dynamic else None
  inner_keeps_zero_momentum = (family == 'tf24' and not dynamic and
                               inner in ('sgd', 'schedule', 'clipnorm'))
  # A fixed scale applies non-finite steps, on both sides; tf_keras's SGD
  # then multiplies its zero momentum by the inf it kept (NaN) where Keras
  # 3's SGD keeps none: the inner optimizers differ, so no such program
  # (float16 would overflow a finite gradient at the fixed scale too).
  kinds = ('finite',) if inner_keeps_zero_momentum else KINDS
  if inner_keeps_zero_momentum:
    dtype = 'float32'
  steps = draw(st.lists(
      st.tuples(st.sampled_from(kinds), st.sampled_from([0.5, 1.0, 2.0])),
      min_size=1, max_size=4))
  restore_after = draw(st.one_of(st.none(), st.integers(1, len(steps))))
  return Program(
      family=family,
      ours='form' if tf1 else draw(st.sampled_from(['form', 'installed'])),
      inner=inner,
      dtype=dtype,
      loss_float32=draw(st.booleans()) if dtype != 'float32' else True,
      shape=shape,
      steps_per_execution=(draw(st.integers(1, 2)) if shape == 'fit' else 1),
      built_before=draw(st.booleans()) if not tf1 else True,
      dynamic=dynamic,
      initial_scale=initial,
      growth_steps=growth,
      gradients=tuple(steps),
      replica=draw(st.sampled_from([-1, 0, 1])) if shape == 'mirrored' else -1,
      restore_after=restore_after if shape != 'fit' else None,
      restore_built=draw(st.booleans()) if not tf1 else True,
      control_flow_v2=draw(st.booleans()) if tf1 else True)


def _factors(program: Program, kind: str, magnitude: float, replica: int
             ) -> np.ndarray:
  """The loss's factors for one step: its gradient with respect to `w`."""
  if program.replica not in (-1, replica):
    kind = 'finite'
  compute = 'float32' if program.dtype == 'float32' else 'float16'
  if kind == 'overflow':
    # Finite, but past the dtype's largest value once scaled by 2**14+.
    big = 4.0 if compute == 'float16' else 3e34
    return np.array([big * magnitude, magnitude], compute)
  first = {'finite': magnitude, 'inf': np.inf, 'nan': np.nan}[kind]
  return np.array([first, -magnitude], compute)


def _loss(program: Program, w: Any, x: Any) -> tf.Tensor:
  loss = tf.reduce_sum(tf.cast(w, x.dtype) * x)
  return tf.cast(loss, tf.float32) if program.loss_float32 else loss


# ---------------------------------------------------------------- Keras ---


def _keras_inner(program: Program, namespace: Any) -> Any:
  opts = namespace.optimizers
  return {
      'sgd': lambda: opts.SGD(0.1),
      'momentum': lambda: opts.SGD(0.1, momentum=0.9),
      'adam': lambda: opts.Adam(0.01),
      'rmsprop': lambda: opts.RMSprop(0.01),
      'adagrad': lambda: opts.Adagrad(0.1),
      'schedule': lambda: opts.SGD(opts.schedules.ExponentialDecay(
          0.1, decay_steps=2, decay_rate=0.5)),
      'clipnorm': lambda: opts.SGD(0.1, clipnorm=1.0),
  }[program.inner]()


def _scale_arguments(program: Program) -> Dict[str, Any]:
  args = {}
  if program.initial_scale is not None:
    args['initial_scale'] = program.initial_scale
  if program.growth_steps is not None:
    args['dynamic_growth_steps'] = program.growth_steps
  if program.family == 'tf24' and not program.dynamic:
    args = {'dynamic': False, 'initial_scale': program.scale0}
  return args


def _keras_optimizer(program: Program, side: str) -> Any:
  """The loss scale optimizer of `side`, around a new inner optimizer."""
  # pylint: disable=g-import-not-at-top
  import tf_loss_scale.keras as tls_keras
  from tf_loss_scale.keras.mixed_precision import shared_name
  args = _scale_arguments(program)
  if side == 'peer' and program.family == 'tf24':
    import tf_keras
    return tf_keras.mixed_precision.LossScaleOptimizer(
        _keras_inner(program, tf_keras), **args)
  inner = _keras_inner(program, keras)
  if side == 'peer':
    return keras.optimizers.LossScaleOptimizer(inner, **args)
  if program.ours == 'installed':
    return shared_name.LossScaleOptimizer(inner, **args)
  if program.family == 'tf24':
    return tls_keras.mixed_precision.LossScaleOptimizer(inner, **args)
  return tls_keras.LossScaleOptimizer(inner, **args)


def _value(x: Any) -> np.ndarray:
  return np.array(tf.convert_to_tensor(x))


def _variables_of(opt: Any) -> List[Any]:
  variables = opt.variables
  return list(variables() if callable(variables) else variables)


def _keras_observation(family: str, opt: Any, weights: List[Any]
                       ) -> Dict[str, Any]:
  """What a Keras program reads of its optimizer and weights."""
  if family == 'tf24':  # TF 2.4-2.15's members, on both sides.
    scale = opt.loss_scale
    counter = opt.dynamic_counter if opt.dynamic else 0
  elif opt.built:  # Keras's: made by `build`.
    scale, counter = opt.dynamic_scale, opt.step_counter
  else:  # What an unbuilt Keras optimizer scales by; no counter to read.
    scale, counter = opt.initial_scale, 0
  shapes = {tuple(w.shape) for w in weights}
  inner = opt.inner_optimizer
  slots = sorted(
      _value(v).tolist() for v in _variables_of(inner)
      if tuple(v.shape) in shapes and tuple(v.shape) != ())
  if type(inner).__name__ == 'SGD' and not getattr(inner, 'momentum', 0):
    # tf_keras's SGD keeps a momentum slot at momentum 0, Keras 3's none:
    # the inner optimizers differ there, not the loss scale optimizers.
    slots = []
  return {'weights': [_value(w).tolist() for w in weights],
          'slots': slots,
          'scale': float(_value(scale)),
          'good_steps': int(_value(counter)),
          'iterations': int(_value(opt.iterations)),
          'inner_iterations': int(_value(opt.inner_optimizer.iterations))}


class _KerasLoop:
  """A custom loop's variables, optimizer and step, as `program` shapes it."""

  def __init__(self, program: Program, side: str, strategy: Any):
    self.program, self.side = program, side
    self.scaled_loss = []
    self.strategy = (strategy if program.shape == 'mirrored'
                     else tf.distribute.get_strategy())
    tf24_peer = side == 'peer' and program.family == 'tf24'
    dtype = 'float16' if program.dtype == 'float16' else 'float32'
    with self.strategy.scope():
      init = np.array(_INITIAL_W, dtype)
      self.w = tf.Variable(init) if tf24_peer else keras.Variable(init)
      self.opt = _keras_optimizer(program, side)
    self._tf24 = program.family == 'tf24'
    self._make_step()

  def build(self) -> None:
    with self.strategy.scope():
      if self.side == 'peer' and self._tf24:
        self.opt.inner_optimizer.build([self.w])
      else:
        self.opt.build([self.w])

  def _gradients(self, x, unscale=True):
    """The gradients to apply (unscaled if `unscale`), and the scaled loss."""
    with tf.GradientTape() as tape:
      loss = _loss(self.program, self.w, x)
      if self._tf24:
        scaled = self.opt.get_scaled_loss(loss)
      else:
        scaled = self.opt.scale_loss(loss)
    grads = tape.gradient(scaled, [self.w])
    if self._tf24 and unscale:
      grads = self.opt.get_unscaled_gradients(grads)
    return grads, scaled

  def _apply(self, grads):
    self.opt.apply_gradients(zip(grads, [self.w]))

  def _whole(self, x):
    grads, scaled = self._gradients(x)
    self._apply(grads)
    return scaled

  def _make_step(self) -> None:
    """`self.step(x)`: one step, as the program's shape runs it."""
    shape = self.program.shape
    if shape == 'eager':
      self.step = self._whole
    elif shape == 'function':
      self.step = tf.function(self._whole)
    elif shape == 'jit':
      self.step = tf.function(self._whole, jit_compile=True)
    elif shape == 'split_traced_gradients':
      traced = tf.function(self._gradients)

      def step(x):
        grads, scaled = traced(x)
        self._apply(grads)
        return scaled
      self.step = step
    elif shape == 'split_unscale_eager':
      traced = tf.function(lambda x: self._gradients(x, unscale=False))

      def step(x):
        grads, scaled = traced(x)
        self._apply(self.opt.get_unscaled_gradients(grads))
        return scaled
      self.step = step
    elif shape == 'split_traced_apply':
      traced = tf.function(self._apply)

      def step(x):
        grads, scaled = self._gradients(x)
        traced(grads)
        return scaled
      self.step = step
    else:  # mirrored: one strategy.run in a tf.function.
      strategy = self.strategy
      self.step = tf.function(lambda x: strategy.run(self._whole, (x,)))

  def run_step(self, kind: str, magnitude: float) -> None:
    program = self.program
    if program.shape == 'mirrored':
      per_replica = [tf.constant(_factors(program, kind, magnitude, r))
                     for r in (0, 1)]
      x = self.strategy.experimental_distribute_values_from_function(
          lambda context: per_replica[context.replica_id_in_sync_group])
    else:
      x = tf.constant(_factors(program, kind, magnitude, 0))
    scaled = self.strategy.experimental_local_results(self.step(x))
    self.scaled_loss = [float(_value(s)) for s in scaled]

  def observe(self) -> Dict[str, Any]:
    return dict(_keras_observation(self.program.family, self.opt,
                                   [self.w]),
                scaled_loss=self.scaled_loss)

  def checkpoint(self) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(optimizer=self.opt, w=self.w)


def _run_keras_loop(program: Program, side: str, strategy: Any,
                    trace: List[Dict[str, Any]]) -> None:
  loop = _KerasLoop(program, side, strategy)
  if program.built_before:
    loop.build()
  with tempfile.TemporaryDirectory() as tmp:
    for i, (kind, magnitude) in enumerate(program.gradients):
      loop.run_step(kind, magnitude)
      trace.append(loop.observe())
      if program.restore_after == i + 1:
        path = loop.checkpoint().write(os.path.join(tmp, 'ckpt'))
        loop = _KerasLoop(program, side, strategy)
        if program.restore_built:
          loop.build()
        loop.checkpoint().read(path)
        trace.append(dict(loop.observe(), restored=True))


def _run_keras_fit(program: Program, side: str,
                   trace: List[Dict[str, Any]]) -> None:
  """`compile` and `fit` of one Dense layer, `steps_per_execution` a call."""
  keras.utils.set_random_seed(1)
  keras.mixed_precision.set_global_policy(program.dtype)
  try:
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(1, use_bias=False, kernel_initializer=(
            keras.initializers.Constant(np.array(_INITIAL_W)[:, None])))])
    opt = _keras_optimizer(program, side)
    if program.built_before:
      opt.build(model.trainable_variables)
    model.compile(opt, 'mse', steps_per_execution=program.steps_per_execution)
    xs = np.stack([_factors(program, kind, magnitude, 0).astype('float32')
                   for kind, magnitude in program.gradients])
    ys = np.zeros((len(xs), 1), 'float32')
    per_call = program.steps_per_execution
    for start in range(0, len(xs), per_call):
      model.fit(xs[start:start + per_call], ys[start:start + per_call],
                batch_size=1, epochs=1, shuffle=False, verbose=0)
      trace.append(_keras_observation(program.family, opt,
                                       model.trainable_variables))
  finally:
    keras.mixed_precision.set_global_policy('float32')


# ------------------------------------------------------------------ TF1 ---


def _v1_inner(program: Program, global_step: tf.Variable) -> Any:
  train = tf.compat.v1.train
  return {
      'sgd': lambda: train.GradientDescentOptimizer(0.1),
      'momentum': lambda: train.MomentumOptimizer(0.1, 0.9),
      'adam': lambda: train.AdamOptimizer(0.01),
      'rmsprop': lambda: train.RMSPropOptimizer(0.01),
      'adagrad': lambda: train.AdagradOptimizer(0.1),
      'schedule': lambda: train.GradientDescentOptimizer(
          train.exponential_decay(0.1, global_step, 2, 0.5)),
  }[program.inner]()


def _v1_loss_scale(program: Program, side: str) -> Any:
  import tf_loss_scale  # pylint: disable=g-import-not-at-top
  if not program.dynamic:
    return program.scale0
  if program.initial_scale is None and program.growth_steps is None:
    return 'dynamic'
  lib = (tf_loss_scale if side == 'ours'
         else tf.compat.v1.mixed_precision)
  args = {}
  if program.initial_scale is not None:
    args['initial_loss_scale'] = program.initial_scale
  if program.growth_steps is not None:
    args['increment_period'] = program.growth_steps
  return lib.DynamicLossScale(**args)


class _V1Graph:
  """A TF1 graph of `program`: variables, the train op, a session."""

  def __init__(self, program: Program, side: str):
    import tf_loss_scale  # pylint: disable=g-import-not-at-top
    self.graph = tf.Graph()
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    if program.control_flow_v2:
      tf.compat.v1.enable_control_flow_v2()
    else:
      tf.compat.v1.disable_control_flow_v2()
    try:
      with self.graph.as_default():
        compute = 'float32' if program.dtype == 'float32' else 'float16'
        self.x = tf.compat.v1.placeholder(compute, [2])
        self.w = tf.compat.v1.Variable(np.array(_INITIAL_W, 'float32'),
                                       name='w')
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        inner = _v1_inner(program, self.global_step)
        wrapper = (tf_loss_scale.MixedPrecisionLossScaleOptimizer
                   if side == 'ours' else
                   tf.compat.v1.mixed_precision
                   .MixedPrecisionLossScaleOptimizer)
        opt = wrapper(inner, _v1_loss_scale(program, side))
        self.train_op = opt.minimize(_loss(program, self.w, self.x),
                                     global_step=self.global_step)
        self.saver = tf.compat.v1.train.Saver()
        self.session = tf.compat.v1.Session()
        self.session.run(tf.compat.v1.global_variables_initializer())
        self.variables = tf.compat.v1.global_variables()
    finally:
      (tf.compat.v1.enable_control_flow_v2 if was_v2
       else tf.compat.v1.disable_control_flow_v2)()

  def observe(self) -> Dict[str, Any]:
    values = self.session.run({v.op.name: v for v in self.variables})
    return {'variables': {name: np.asarray(value).tolist()
                          for name, value in sorted(values.items())}}


def _run_v1(program: Program, side: str,
            trace: List[Dict[str, Any]]) -> None:
  graph = _V1Graph(program, side)
  with tempfile.TemporaryDirectory() as tmp:
    for i, (kind, magnitude) in enumerate(program.gradients):
      graph.session.run(graph.train_op, {
          graph.x: _factors(program, kind, magnitude, 0)})
      trace.append(graph.observe())
      if program.restore_after == i + 1:
        path = graph.saver.save(graph.session, os.path.join(tmp, 'ckpt'))
        graph.session.close()
        graph = _V1Graph(program, side)
        graph.saver.restore(graph.session, path)
        trace.append(dict(graph.observe(), restored=True))
    graph.session.close()


# -------------------------------------------------------------- running ---

# The arguments an error message may name.
_ARGUMENTS = ('initial_scale', 'dynamic_growth_steps', 'dynamic',
              'loss_scale', 'inner_optimizer', 'learning_rate', 'var_list',
              'grads')


def run(program: Program, side: str, strategy: Any = None
        ) -> List[Dict[str, Any]]:
  """Trains `program` on `side` ('ours' or 'peer').

  Args:
    program: The program.
    side: 'ours' (this library) or 'peer' (its peer).
    strategy: The process's MirroredStrategy of two replicas, for programs
      whose shape is 'mirrored'.

  Returns:
    One observation per step (and one after a restore); the last is
    `{'error': (type name, arguments its message names)}` if a step raised.
  """
  trace = []  # The steps' observations, appended as they run.
  try:
    if program.family == 'tf1':
      _run_v1(program, side, trace)
    elif program.shape == 'fit':
      _run_keras_fit(program, side, trace)
    else:
      _run_keras_loop(program, side, strategy, trace)
  except Exception as e:  # pylint: disable=broad-except
    # What a program observes of an error: its type and what it names,
    # after the observations of the steps before it.
    named = tuple(a for a in _ARGUMENTS if re.search(rf'\b{a}\b', str(e)))
    trace.append({'error': (type(e).__name__, named)})
  # (No keras.backend.clear_session(): its garbage collection costs more
  # than the program, and no observation reads Keras's name counters.)
  return trace


def _same(a: Any, b: Any) -> bool:
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  if isinstance(a, float) or isinstance(b, float):
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
      return False
    if math.isnan(a) or math.isnan(b):
      return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
  return a == b


def divergences(program: Program, ours: List[Dict[str, Any]],
                peer: List[Dict[str, Any]], excuses=()) -> List[str]:
  """Where the traces differ and no excuse applies, as sentences.

  Args:
    program: The program both traces come from.
    ours: Its trace under this library.
    peer: Its trace under the peer.
    excuses: `generated_declarations.Excuse`s; a field an applicable excuse
      names is not compared from the step it gives on.

  Returns:
    One line per differing field of a step, the first few; empty if none.
  """
  excused = {}  # field -> the first step from which it is excused
  for excuse in excuses:
    start = excuse.applies(program, peer)
    if start is not None:
      for field in excuse.fields:
        excused[field] = min(start, excused.get(field, start))
  out = []
  for i in range(max(len(ours), len(peer))):
    o = ours[i] if i < len(ours) else {'missing': True}
    p = peer[i] if i < len(peer) else {'missing': True}
    for field in sorted(set(o) | set(p)):
      if excused.get('*', math.inf) <= i or excused.get(field, math.inf) <= i:
        continue
      if not _same(o.get(field), p.get(field)):
        out.append(f'observation {i}, {field}: ours {o.get(field)!r}, '
                   f'peer {p.get(field)!r}')
  return out[:8]


def script(program: Program) -> str:
  """`program` as a script that runs it on both sides and prints the traces."""
  tests = os.path.dirname(os.path.abspath(__file__))
  return '\n'.join([
      'import os, sys',
      f'sys.path[:0] = [{os.path.dirname(tests)!r}, {tests!r}]',
      "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')",
      'import conftest  # two logical CPUs, as in the tests',
      'import tensorflow as tf',
      'import generated_programs as g',
      f'program = g.{program!r}',
      'strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])',
      "            if program.shape == 'mirrored' else None)",
      "ours, peer = (g.run(program, side, strategy) for side in ('ours', 'peer'))",
      "print('\\n'.join(g.divergences(program, ours, peer)) or 'same')",
  ])
