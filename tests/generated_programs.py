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
  tf23: TF 2.0-2.3's form `tf_loss_scale.keras.experimental.
    LossScaleOptimizer(optimizer, loss_scale)`, or the name `install()`
    gives it (`tf.keras.mixed_precision.experimental`), around tf_keras's
    optimizers (legacy or not), in TF 2.3's loop or `fit` of a tf_keras
    model, against `tf_keras.mixed_precision.LossScaleOptimizer` around the
    same optimizer: TF 2.4's class, whose step TF 2.3's was.
  tf1: `tf_loss_scale.MixedPrecisionLossScaleOptimizer` (or, after
    `install(override=True)`, TensorFlow's name for it) against
    `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`, in a
    `tf.Graph` and a `Session`, with control flow v2 or v1, v2 behaviour on
    or off (each switched for the graph's construction and switched back).

With `Program.install`, `compat.install()` is in effect while the program
runs, on both sides (`uninstall()` after): the peer's classes are those
this module found at import, before any `install()`.
"""

import contextlib
import dataclasses
import math
import os
import re
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hypothesis import strategies as st
import keras
import numpy as np
import tensorflow as tf
import tf_keras

import versions

FAMILIES = ('keras3', 'tf24', 'tf23', 'tf1')
# 'decay': a legacy optimizer's `decay=` (tf23 with legacy optimizers only).
INNERS = ('sgd', 'momentum', 'adam', 'rmsprop', 'adagrad', 'schedule',
          'clipnorm', 'decay')
DTYPES = ('float32', 'mixed_float16', 'float16')
KINDS = ('finite', 'overflow', 'inf', 'nan')
# How a step of a custom loop runs. `split_*`: the gradients and the apply in
# two parts, the one named traced in a `tf.function`, the other eager.
# `split_unscale_eager` (TF 2.4-2.15's loop): the scaled loss and its
# gradients traced, `get_unscaled_gradients` and the apply eager.
# `mirrored`: one `strategy.run` a step; `mirrored_two_runs`: the gradients
# in one and the apply in another, in one `tf.function`.
LOOP_SHAPES = ('eager', 'function', 'split_traced_gradients',
               'split_traced_apply', 'split_unscale_eager', 'jit', 'mirrored',
               'mirrored_two_runs')
# How `fit` runs a step: Keras's own step, the model's `train_step` (the
# generation's loss scaling calls written out), or Keras's own under the
# MirroredStrategy.
FIT_SHAPES = ('fit', 'train_step', 'fit_mirrored')
# The files a program saves to and restores from: a `tf.train.Checkpoint`
# (a `Saver` in a TF1 graph), or, under `fit`, the model's `.keras` file,
# or its `.h5` file or SavedModel (tf_keras's models: tf23).
FILE_KINDS = ('checkpoint', 'keras', 'h5', 'savedmodel')
_MIRRORED = ('mirrored', 'mirrored_two_runs', 'fit_mirrored')
_INITIAL_W = (1.0, -2.0)

# The peers' classes, found before any `install()` (which changes names).
_KERAS_PEER = keras.optimizers.LossScaleOptimizer
_TF_KERAS_PEER = tf_keras.mixed_precision.LossScaleOptimizer
_V1_PEERS = {name: getattr(tf.compat.v1.mixed_precision, name) for name in (
    'MixedPrecisionLossScaleOptimizer', 'DynamicLossScale')}


@dataclasses.dataclass(frozen=True)
class Program:
  """One generated program: a choice on every axis.

  Attributes:
    family: 'keras3', 'tf24', 'tf23' or 'tf1' (module docstring).
    ours: Which of our classes: 'form' (the family's own module) or
      'installed' (the name `compat.install()` gives it: for Keras 3 and
      TF 2.4-2.15, `shared_name.LossScaleOptimizer`, by that name where
      `install` is set).
    install: Whether `compat.install()` is in effect (`override=True` for
      tf1's 'installed') while the program runs, on both sides.
    inner: The inner optimizer: one of `INNERS`.
    keras2_legacy: tf23: tf_keras's legacy optimizers (else its others).
    dtype: 'float32'; 'mixed_float16' (float32 variables, float16 compute,
      and the Keras policy under `fit`); 'float16' (float16 variables).
    loss_float32: Whether the loss is cast to float32 before it is scaled.
    shape: One of `LOOP_SHAPES` or `FIT_SHAPES`, or 'session' (tf1).
    steps_per_execution: `fit`'s, and how many steps each `fit` call runs.
    policy_before_scope: 'fit_mirrored': whether the policy is set before
      the strategy's scope is entered (else inside it).
    policy_loss_scale: tf23 under `fit`: the loss scale is TF 2.3's
      `Policy('mixed_float16', loss_scale=...)`'s, set with `set_policy`
      (under `install()`), and `compile` wraps the optimizer: on our side a
      Keras 3 model and optimizer (`tf.keras`, as the program finds it);
      the peer, tf_keras's model and optimizer in tf_keras's class.
    built_before: Whether the optimizer is built before the first step
      (otherwise its first step, or trace, builds it).
    dynamic: A dynamic loss scale (otherwise fixed at `initial_scale`).
    initial_scale: The initial (or fixed) scale; None for the default.
    growth_steps: Finite steps before a dynamic scale grows; None: default.
    gradients: Per step, what the gradients are: one of `KINDS`, and the
      magnitude of a finite one.
    replica: On two replicas: which gets a non-finite kind (0, 1) or both
      (-1); the other gets the finite gradient.
    restore_after: After that step, the state is saved to a file of
      `file_kind` and restored into fresh variables and a fresh optimizer,
      which run the rest; None: no restore.
    file_kind: One of `FILE_KINDS`.
    restore_built: Whether the fresh optimizer is built before the restore.
    control_flow_v2: tf1: whether the graph is built with control flow v2.
    v2_behaviour: tf1: whether TensorFlow 2's behaviour is on while the
      graph is built (else `_graph_behaviour`'s switches are off).
  """
  family: str
  ours: str = 'form'
  install: bool = False
  inner: str = 'sgd'
  keras2_legacy: bool = True
  dtype: str = 'float32'
  loss_float32: bool = True
  shape: str = 'eager'
  steps_per_execution: int = 1
  policy_before_scope: bool = False
  policy_loss_scale: bool = False
  built_before: bool = True
  dynamic: bool = True
  initial_scale: Optional[float] = None
  growth_steps: Optional[int] = None
  gradients: Tuple[Tuple[str, float], ...] = (('finite', 1.0),)
  replica: int = -1
  restore_after: Optional[int] = None
  file_kind: str = 'checkpoint'
  restore_built: bool = True
  control_flow_v2: bool = True
  v2_behaviour: bool = True

  @property
  def scale0(self) -> float:
    return 2.0 ** 15 if self.initial_scale is None else self.initial_scale

  @property
  def replicas(self) -> int:
    return 2 if self.shape in _MIRRORED else 1


def _shapes(family: str) -> Tuple[str, ...]:
  """The step shapes a program of `family` may take."""
  if family == 'tf1':
    return ('session',)
  # Keras 3 before 3.5 sums no gradients across replicas: the Keras 3
  # forms refuse a strategy there (docs/differences.md), no program.
  shapes = tuple(s for s in LOOP_SHAPES + FIT_SHAPES if s not in _MIRRORED or
                 versions.KERAS_SUMS_ACROSS_REPLICAS.holds)
  if family == 'keras3':  # Keras 3's loop has no unscaling of its own.
    shapes = tuple(s for s in shapes if s != 'split_unscale_eager')
  return shapes


@st.composite
def programs(draw) -> Program:
  """The Hypothesis strategy of `Program`s where the peer has such a point."""
  family = draw(st.sampled_from(FAMILIES))
  tf1 = family == 'tf1'
  keras2_legacy = draw(st.booleans()) if family == 'tf23' else True
  inners = INNERS[:-1] if family != 'tf23' or not keras2_legacy else INNERS
  inner = draw(st.sampled_from(inners[:-1] if tf1 else inners))
  dtype = draw(st.sampled_from(DTYPES[:2] if tf1 else DTYPES))
  shape = draw(st.sampled_from(_shapes(family)))
  fit = shape in FIT_SHAPES
  if fit and dtype == 'float16':
    dtype = 'mixed_float16'
  # Under TF_USE_LEGACY_KERAS=1 the policy `install()` sets is tf_keras's,
  # which a Keras 3 model (ours, here) never reads.
  policy_loss_scale = (family == 'tf23' and fit and
                       versions.TF_KERAS_IS_KERAS_3.holds and
                       draw(st.booleans()))
  if policy_loss_scale:  # Keras 3's optimizers, as tf_keras's non-legacy.
    dtype, keras2_legacy = 'mixed_float16', False
    inner = 'sgd' if inner == 'decay' else inner
  # Keras's class has no fixed scale; tf_keras's and TensorFlow's do.
  dynamic = True if family == 'keras3' else draw(st.booleans())
  initial = draw(st.one_of(st.none(),
                           st.sampled_from([1.0, 2.0 ** 4, 2.0 ** 10,
                                            2.0 ** 20])))
  growth = draw(st.one_of(st.none(), st.integers(1, 3))) if dynamic else None
  inner_keeps_zero_momentum = ((family == 'tf24' or policy_loss_scale) and
                               not dynamic and
                               inner in ('sgd', 'schedule', 'clipnorm'))
  if inner_keeps_zero_momentum and policy_loss_scale:
    inner, inner_keeps_zero_momentum = 'momentum', False  # float16 overflows
  if (inner == 'clipnorm' and shape == 'fit_mirrored' and
      (family == 'tf24' or policy_loss_scale)):
    # Keras 3's `fit` clips each replica's gradients, tf_keras's their sum:
    # the inner optimizers differ, with Keras's class too; no such program.
    inner = 'momentum'
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
  ours = 'installed' if policy_loss_scale else draw(
      st.sampled_from(['form', 'installed']))
  # TF 2.0-2.3's and TF1's names are ours only after `install()`.
  install = (ours == 'installed' and family in ('tf23', 'tf1')) or draw(
      st.booleans())
  # A legacy optimizer makes its slots when it first applies: no `build`.
  buildable = not (family == 'tf23' and keras2_legacy) and not tf1
  v2_behaviour = draw(st.booleans()) if tf1 else True
  return Program(
      family=family,
      ours=ours,
      install=install,
      inner=inner,
      keras2_legacy=keras2_legacy,
      dtype=dtype,
      loss_float32=draw(st.booleans()) if dtype != 'float32' else True,
      shape=shape,
      # Keras 3's `fit` under a MirroredStrategy fails to run two steps an
      # execution ("You must feed a value for placeholder tensor"), with a
      # plain SGD too: no such program.
      steps_per_execution=(draw(st.integers(1, 2))
                           if fit and shape != 'fit_mirrored' else 1),
      policy_before_scope=(draw(st.booleans()) if shape == 'fit_mirrored'
                           and dtype != 'float32' else False),
      policy_loss_scale=policy_loss_scale,
      built_before=draw(st.booleans()) if buildable else tf1,
      dynamic=dynamic,
      initial_scale=initial,
      growth_steps=growth,
      gradients=tuple(steps),
      replica=(draw(st.sampled_from([-1, 0, 1])) if shape in _MIRRORED
               else -1),
      restore_after=draw(st.one_of(st.none(), st.integers(1, len(steps)))),
      file_kind=(draw(st.sampled_from(
          FILE_KINDS if family == 'tf23' and not policy_loss_scale
          else FILE_KINDS[:2]))
                 if fit else 'checkpoint'),
      restore_built=draw(st.booleans()) if buildable else tf1,
      control_flow_v2=draw(st.booleans()) if v2_behaviour else False,
      v2_behaviour=v2_behaviour)


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


def _tf_keras_side(program: Program, side: str) -> bool:
  """Whether `side` of `program` runs on tf_keras (its model and optimizer)."""
  if side == 'peer':
    return program.family in ('tf24', 'tf23')
  return program.family == 'tf23' and not program.policy_loss_scale


def _keras_inner(program: Program, side: str) -> Any:
  if not _tf_keras_side(program, side):
    opts, schedules = keras.optimizers, keras.optimizers.schedules
  else:
    legacy = program.family == 'tf23' and program.keras2_legacy
    opts = tf_keras.optimizers.legacy if legacy else tf_keras.optimizers
    schedules = tf_keras.optimizers.schedules
  return {
      'sgd': lambda: opts.SGD(0.1),
      'momentum': lambda: opts.SGD(0.1, momentum=0.9),
      'adam': lambda: opts.Adam(0.01),
      'rmsprop': lambda: opts.RMSprop(0.01),
      'adagrad': lambda: opts.Adagrad(0.1),
      'schedule': lambda: opts.SGD(schedules.ExponentialDecay(
          0.1, decay_steps=2, decay_rate=0.5)),
      'clipnorm': lambda: opts.SGD(0.1, clipnorm=1.0),
      'decay': lambda: opts.SGD(0.1, decay=0.5),
  }[program.inner]()


def _scale_arguments(program: Program) -> Dict[str, Any]:
  """The loss scale's arguments of Keras 3's and TF 2.4-2.15's classes."""
  if program.family != 'keras3' and not program.dynamic:
    return {'dynamic': False, 'initial_scale': program.scale0}
  args = {}
  if program.initial_scale is not None:
    args['initial_scale'] = program.initial_scale
  if program.growth_steps is not None:
    args['dynamic_growth_steps'] = program.growth_steps
  return args


def _tf23_loss_scale(program: Program) -> Any:
  """TF 2.3's `loss_scale` argument: a number, 'dynamic' or a loss scale."""
  import tf_loss_scale  # pylint: disable=g-import-not-at-top
  if not program.dynamic:
    return program.scale0
  if program.initial_scale is None and program.growth_steps is None:
    return 'dynamic'
  args = {}
  if program.initial_scale is not None:
    args['initial_loss_scale'] = program.initial_scale
  if program.growth_steps is not None:
    args['increment_period'] = program.growth_steps
  namespace = (tf.mixed_precision.experimental if program.ours == 'installed'
               else tf_loss_scale)
  return namespace.DynamicLossScale(**args)


def _keras_optimizer(program: Program, side: str) -> Any:
  """The loss scale optimizer of `side`, around a new inner optimizer."""
  # pylint: disable=g-import-not-at-top
  import tf_loss_scale.keras as tls_keras
  from tf_loss_scale.keras.mixed_precision import shared_name
  inner = _keras_inner(program, side)
  if side == 'ours' and program.policy_loss_scale:
    return inner  # `compile` wraps it.
  if side == 'peer':
    peer = _KERAS_PEER if program.family == 'keras3' else _TF_KERAS_PEER
    return peer(inner, **_scale_arguments(program))
  if program.family == 'tf23':
    cls = (tf.keras.mixed_precision.experimental.LossScaleOptimizer
           if program.ours == 'installed' else
           tls_keras.experimental.LossScaleOptimizer)
    return cls(inner, _tf23_loss_scale(program))
  if program.ours == 'installed':
    # The name gives our class where `tf.keras` is Keras 3; under
    # TF_USE_LEGACY_KERAS=1 it is tf_keras's own, so the class is used.
    by_name = program.install and versions.TF_KERAS_IS_KERAS_3.holds
    cls = (tf.keras.mixed_precision.LossScaleOptimizer if by_name
           else shared_name.LossScaleOptimizer)
  elif program.family == 'tf24':
    cls = tls_keras.mixed_precision.LossScaleOptimizer
  else:
    cls = tls_keras.LossScaleOptimizer
  return cls(inner, **_scale_arguments(program))


def _build(program: Program, side: str, opt: Any, variables: List[Any]
           ) -> None:
  """Builds `opt` for `variables`, as a program of its generation would."""
  if side == 'peer' and program.family != 'keras3':
    opt.inner_optimizer.build(variables)  # tf_keras's class has no `build`.
  else:
    opt.build(variables)


def _value(x: Any) -> np.ndarray:
  return np.array(tf.convert_to_tensor(x))


def _variables_of(opt: Any) -> List[Any]:
  variables = opt.variables
  return list(variables() if callable(variables) else variables)


def _keras_observation(family: str, opt: Any, weights: List[Any]
                       ) -> Dict[str, Any]:
  """What a Keras program reads of its optimizer and weights."""
  if family != 'keras3':  # TF 2.4-2.15's members, on both sides.
    scale = opt.loss_scale
    if not hasattr(opt, 'dynamic'):  # TF 2.0-2.3's, on Keras 3: its scale's.
      counter = getattr(scale, 'good_steps', 0)
    else:
      counter = opt.dynamic_counter if opt.dynamic else 0
    if callable(scale):  # TF 2.0-2.3's: a `LossScale`, called for its value.
      scale = scale()
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


def _per_replica(strategy: Any, values: List[np.ndarray]) -> Any:
  """A distributed value of `values[r]` on replica r."""
  tensors = [tf.constant(v) for v in values]
  return strategy.experimental_distribute_values_from_function(
      lambda context: tensors[context.replica_id_in_sync_group])


class _KerasLoop:
  """A custom loop's variables, optimizer and step, as `program` shapes it."""

  def __init__(self, program: Program, side: str, strategy: Any):
    self.program, self.side = program, side
    self.scaled_loss = []
    self.strategy = (strategy if program.shape in _MIRRORED
                     else tf.distribute.get_strategy())
    dtype = 'float16' if program.dtype == 'float16' else 'float32'
    with self.strategy.scope():
      init = np.array(_INITIAL_W, dtype)
      self.w = (tf.Variable(init) if _tf_keras_side(program, side)
                else keras.Variable(init))
      self.opt = _keras_optimizer(program, side)
    self._tf24 = program.family != 'keras3'  # TF 2.0-2.15's loop
    self._make_step()

  def build(self) -> None:
    with self.strategy.scope():
      _build(self.program, self.side, self.opt, [self.w])

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
    elif shape == 'mirrored':
      strategy = self.strategy
      self.step = tf.function(lambda x: strategy.run(self._whole, (x,)))
    else:  # mirrored_two_runs
      strategy = self.strategy

      def step(x):
        grads, scaled = strategy.run(self._gradients, (x,))
        strategy.run(self._apply, (grads,))
        return scaled
      self.step = tf.function(step)

  def run_step(self, kind: str, magnitude: float) -> None:
    program = self.program
    if program.replicas == 2:
      x = _per_replica(self.strategy, [
          _factors(program, kind, magnitude, r) for r in (0, 1)])
    else:
      x = tf.constant(_factors(program, kind, magnitude, 0))
    scaled = self.strategy.experimental_local_results(self.step(x))
    self.scaled_loss = [float(_value(s)) for s in scaled]

  def observe(self) -> Dict[str, Any]:
    return dict(_keras_observation(self.program.family, self.opt,
                                   [self.w]),
                scaled_loss=self.scaled_loss)

  def save(self, directory: str) -> str:
    return tf.train.Checkpoint(optimizer=self.opt, w=self.w).write(
        os.path.join(directory, 'ckpt'))

  def restore(self, path: str) -> None:
    tf.train.Checkpoint(optimizer=self.opt, w=self.w).read(path)


def _train_step_model(namespace: Any, family: str) -> type:
  """A model class whose `train_step` writes out its generation's scaling."""

  class TrainStepModel(namespace.Model):
    """One Dense layer, trained by a `train_step` of a user's."""

    def train_step(self, data):
      x, y = data
      variables = self.trainable_variables
      with tf.GradientTape() as tape:
        loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        if family == 'keras3':
          scaled = self.optimizer.scale_loss(loss)
        else:
          scaled = self.optimizer.get_scaled_loss(loss)
      grads = tape.gradient(scaled, variables)
      if family != 'keras3':
        grads = self.optimizer.get_unscaled_gradients(grads)
      self.optimizer.apply_gradients(zip(grads, variables))
      return {'loss': loss}

  return TrainStepModel


def _set_policy(program: Program, side: str) -> None:
  """The global dtype policy of `program`'s Keras, with its loss scale."""
  if side == 'ours' and program.policy_loss_scale:
    experimental = tf.keras.mixed_precision.experimental  # install()'s
    experimental.set_policy(experimental.Policy(
        'mixed_float16', loss_scale=_tf23_loss_scale(program)))
  else:
    namespace = tf_keras if _tf_keras_side(program, side) else keras
    namespace.mixed_precision.set_global_policy(program.dtype)


class _KerasFit:
  """A compiled model of one Dense layer and its optimizer, for `fit`."""

  def __init__(self, program: Program, side: str, strategy: Any):
    self.program, self.side = program, side
    self.keras = tf_keras if _tf_keras_side(program, side) else keras
    self.strategy = (strategy if program.shape == 'fit_mirrored'
                     else tf.distribute.get_strategy())
    with self.strategy.scope():
      if not program.policy_before_scope:
        _set_policy(program, side)
      namespace = self.keras
      inputs = namespace.Input((2,))
      dense = namespace.layers.Dense(1, use_bias=False)
      cls = (_train_step_model(namespace, program.family)
             if program.shape == 'train_step' else namespace.Model)
      self.model = cls(inputs, dense(inputs))
      # (Assigned: a `.h5` file cannot hold an initializer of an array.)
      dense.kernel.assign(np.array(_INITIAL_W)[:, None])
      self.opt = _keras_optimizer(program, side)

  def build(self) -> None:
    with self.strategy.scope():
      _build(self.program, self.side, self.opt,
             self.model.trainable_variables)

  def compile(self) -> None:
    with self.strategy.scope():
      self.model.compile(
          self.opt, 'mse',
          steps_per_execution=self.program.steps_per_execution)
    self.opt = self.model.optimizer  # (What `compile` wrapped it in.)

  def fit(self, steps: List[Tuple[str, float]]) -> None:
    """Runs `steps` in one `fit` call, a batch (one row a replica) each."""
    program = self.program
    xs = np.concatenate([
        np.stack([_factors(program, kind, magnitude, r).astype('float32')
                  for r in range(program.replicas)])
        for kind, magnitude in steps])
    self.model.fit(xs, np.zeros((len(xs), 1), 'float32'),
                   batch_size=program.replicas, epochs=1, shuffle=False,
                   verbose=0)

  def observe(self) -> Dict[str, Any]:
    return _keras_observation(self.program.family, self.opt,
                              self.model.trainable_variables)

  def save(self, directory: str) -> str:
    kind = self.program.file_kind
    if kind == 'savedmodel':
      path = os.path.join(directory, 'model')
      self.model.save(path, save_format='tf')
      return path
    if kind != 'checkpoint':
      path = os.path.join(directory, 'model.' + kind)
      self.model.save(path)
      return path
    return tf.train.Checkpoint(model=self.model, optimizer=self.opt).write(
        os.path.join(directory, 'ckpt'))

  def restore(self, path: str) -> None:
    if self.program.file_kind != 'checkpoint':
      custom = ({'TrainStepModel': type(self.model)}
                if self.program.shape == 'train_step' else None)
      with self.strategy.scope():
        self.model = self.keras.models.load_model(path, custom_objects=custom)
      self.opt = self.model.optimizer
    else:
      tf.train.Checkpoint(model=self.model, optimizer=self.opt).read(path)


def _run_keras(program: Program, side: str, strategy: Any,
               trace: List[Dict[str, Any]]) -> None:
  """A Keras program: a loop of steps, or `fit` calls of a few steps each."""
  fit = program.shape in FIT_SHAPES
  session = _KerasFit if fit else _KerasLoop
  per_call = program.steps_per_execution if fit else 1

  def start(built):
    run = session(program, side, strategy)
    if built:
      run.build()
    if fit:
      run.compile()
    return run

  keras_namespace = tf_keras if _tf_keras_side(program, side) else keras
  if program.policy_before_scope:
    _set_policy(program, side)
  try:
    run = start(program.built_before)
    done = 0
    with tempfile.TemporaryDirectory() as tmp:
      while done < len(program.gradients):
        steps = list(program.gradients[done:done + per_call])
        if fit:
          run.fit(steps)
        else:
          run.run_step(*steps[0])
        done += len(steps)
        trace.append(run.observe())
        if (program.restore_after is not None and
            done - len(steps) < program.restore_after <= done):
          path = run.save(tmp)
          run = start(program.restore_built)
          run.restore(path)
          trace.append(dict(run.observe(), restored=True))
  finally:
    keras_namespace.mixed_precision.set_global_policy('float32')


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


def _v1_class(program: Program, side: str, name: str) -> type:
  """`name` of `side`: TensorFlow's, or ours (by TensorFlow's name after
  `install(override=True)`, or by our module's)."""
  import tf_loss_scale  # pylint: disable=g-import-not-at-top
  if side == 'peer':
    return _V1_PEERS[name]
  if program.ours == 'installed':
    return getattr(tf.compat.v1.mixed_precision, name)
  return getattr(tf_loss_scale, name)


def _v1_loss_scale(program: Program, side: str) -> Any:
  if not program.dynamic:
    return program.scale0
  if program.initial_scale is None and program.growth_steps is None:
    return 'dynamic'
  cls = _v1_class(program, side, 'DynamicLossScale')
  args = {}
  if program.initial_scale is not None:
    args['initial_loss_scale'] = program.initial_scale
  if program.growth_steps is not None:
    args['increment_period'] = program.growth_steps
  return cls(**args)


@contextlib.contextmanager
def _graph_behaviour(program: Program) -> Iterator[None]:
  """TensorFlow's switches for a graph's construction, as `program` has them.

  Control flow v2 or v1; without v2 behaviour, also reference variables, v1
  `TensorShape`s and tensors compared by identity: what
  `tf.compat.v1.disable_v2_behavior()` switches but eager execution, which
  a graph of its own does not use (and which a process cannot turn back on
  once it ran an op). All are as they were after the block.

  Args:
    program: The program whose graph is built in the block.

  Yields:
    Nothing.
  """
  v1 = tf.compat.v1
  was_v2 = v1.control_flow_v2_enabled()
  was_resource = v1.resource_variables_enabled()
  (v1.enable_control_flow_v2 if program.control_flow_v2
   else v1.disable_control_flow_v2)()
  if not program.v2_behaviour:
    v1.disable_resource_variables()
    v1.disable_v2_tensorshape()
    v1.disable_tensor_equality()
  try:
    yield
  finally:
    (v1.enable_control_flow_v2 if was_v2 else v1.disable_control_flow_v2)()
    if not program.v2_behaviour:
      # TensorFlow 2's defaults, which the tests' processes keep.
      v1.enable_tensor_equality()
      v1.enable_v2_tensorshape()
      (v1.enable_resource_variables if was_resource
       else v1.disable_resource_variables)()


class _V1Graph:
  """A TF1 graph of `program`: variables, the train op, a session."""

  def __init__(self, program: Program, side: str):
    self.graph = tf.Graph()
    with _graph_behaviour(program), self.graph.as_default():
      compute = 'float32' if program.dtype == 'float32' else 'float16'
      self.x = tf.compat.v1.placeholder(compute, [2])
      self.w = tf.compat.v1.Variable(np.array(_INITIAL_W, 'float32'),
                                     name='w')
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      inner = _v1_inner(program, self.global_step)
      wrapper = _v1_class(program, side, 'MixedPrecisionLossScaleOptimizer')
      opt = wrapper(inner, _v1_loss_scale(program, side))
      self.train_op = opt.minimize(_loss(program, self.w, self.x),
                                   global_step=self.global_step)
      self.saver = tf.compat.v1.train.Saver()
      self.session = tf.compat.v1.Session()
      self.session.run(tf.compat.v1.global_variables_initializer())
      self.variables = tf.compat.v1.global_variables()

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
        with graph.graph.as_default():  # (Eagerly, a Saver saves eagerly.)
          path = graph.saver.save(graph.session, os.path.join(tmp, 'ckpt'))
        graph.session.close()
        graph = _V1Graph(program, side)
        with graph.graph.as_default():
          graph.saver.restore(graph.session, path)
        trace.append(dict(graph.observe(), restored=True))
    graph.session.close()


# -------------------------------------------------------------- running ---

# The arguments an error message may name.
_ARGUMENTS = ('initial_scale', 'dynamic_growth_steps', 'dynamic',
              'loss_scale', 'inner_optimizer', 'learning_rate', 'var_list',
              'grads')


@contextlib.contextmanager
def _process_state(program: Program) -> Iterator[None]:
  """`install()` in effect while the block runs, if `program` has it."""
  from tf_loss_scale import compat  # pylint: disable=g-import-not-at-top
  if program.install:
    compat.install(override=program.family == 'tf1' and
                   program.ours == 'installed')
  try:
    yield
  finally:
    if program.install:
      compat.uninstall()


def run(program: Program, side: str, strategy: Any = None
        ) -> List[Dict[str, Any]]:
  """Trains `program` on `side` ('ours' or 'peer').

  Args:
    program: The program.
    side: 'ours' (this library) or 'peer' (its peer).
    strategy: The process's MirroredStrategy of two replicas, for programs
      on two replicas.

  Returns:
    One observation per step (and one after a restore); the last is
    `{'error': (type name, arguments its message names)}` if a step raised.
  """
  trace = []  # The steps' observations, appended as they run.
  try:
    with _process_state(program):
      if program.family == 'tf1':
        _run_v1(program, side, trace)
      else:
        _run_keras(program, side, strategy, trace)
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
      "            if program.replicas == 2 else None)",
      "ours, peer = (g.run(program, side, strategy) for side in ('ours', 'peer'))",
      "print('\\n'.join(g.divergences(program, ours, peer)) or 'same')",
  ])
