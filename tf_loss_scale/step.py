"""The training step with a loss scale, written once for every front end.

Each step every front end does the same thing, in this order:

```
front end -> apply_step -> distribute.merge_step: divide by the scale, sum
  across replicas, read each replica's gradients (the kernels of
  tf_loss_scale.gradients) -> verdict: no gradient flagged -> apply on every
  replica, or skip (write the skip report from the reading's flags, run
  `on_skip`) -> state = rule(state, verdict), once the side has completed
```

The gradients are read once: the verdict and the skip report
(`tf_loss_scale.step_record`) share that reading, and a finite step pays
for the report only the flags it does not write.

The step is a transaction: the loss scale's state (its scale, its counters
and its monitoring record) moves only after the side taken has completed. An
apply that raises eagerly leaves the state as it was; in a `tf.function` or a
TF1 graph the new state is assigned under an explicit control dependency on
the side taken (automatic control dependencies would not order the two,
which touch different resources). Only the assignments wait: the new values
depend on the verdict and the current state alone, so they are computed
while the side runs, which keeps them off the end of the step.

`apply_step` is that block, once. Its two callbacks make it a stateful or a
stateless step:

- `state`, a `ScaleState`, reads the scale and moves it. `LossScaleState`
  assigns the variables of a `tf_loss_scale.LossScale`; the Keras 3 form
  adapts Keras's two variables, assigning them (`apply`) or returning their
  new values (`stateless_apply`).
- `apply_fn` applies the gradients: a real optimizer on real variables, or
  (stateless) a scratch copy whose results the caller reads back after the
  step.

It runs in a replica context (inside `strategy.run`) or with no strategy,
eagerly, in a `tf.function` or in a TF1 graph; in a graph it returns one op
that runs the whole step, made in the cross-replica context so that every
replica returns that same op (`Session.run` can fetch what `strategy.run`
returns).

Under a strategy the verdict is about the gradients that are applied,
the all-reduced ones, and every replica reaches it without exchanging it:

- `reduces=False`: `apply_fn` applies gradients as it is given them (a
  tf_keras optimizer's `apply_gradients(..., experimental_aggregate_gradients=
  False)`). The step all-reduces them once and decides on the exact sums,
  which it hands to `apply_fn`; with `summed=True` the caller made the sums.
  (TF 2.4-2.15's form hands sums to a Keras 3 optimizer, which sums what
  it is given, as `distribute.shares_summing_to`: one more all-reduce.)
- `reduces=True`: `apply_fn` all-reduces them itself (a Keras 3
  optimizer's `apply`, a `tf.compat.v1` optimizer's `apply_gradients`), and
  no public API of those optimizers takes sums without summing them again.
  The step decides before the sums exist, on a bound of them: each
  replica's reading, added up (`distribute.read`).
- Either way, with `held_as` a sum is finite only if it is in its
  variable's dtype too (a Keras 3 optimizer casts a float32 sum of float16
  gradients back to its float16 variable).

A user's own `LossScale` subclass decides through its `update(grads)`, which
assigns its own state as it decides, so that state moves before the apply
and does not take part in the transaction; the step still applies or skips
on its verdict, and runs `update`'s op with the step in a graph.
"""

import abc
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Union

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import step_record

Verdict = Union[bool, tf.Tensor]
Reader = distribute.Reader  # Returns the step's reading of its gradients.


class Decision(NamedTuple):
  """A state's verdict on one step.

  Attributes:
    verdict: Whether to apply the step: a bool scalar tensor, the same on
      every replica, or the Python `True` for a state that never skips.
    update_op: In a graph, an op that must run with the step (a user
      `LossScale`'s update); None otherwise.
  """
  verdict: Verdict
  update_op: Any = None


class Outcome(NamedTuple):
  """What one step did.

  Attributes:
    applied: Whether the step was applied. Eagerly `True` or a bool tensor;
      in a graph always a bool tensor, ready once the side taken has run.
    state: What `ScaleState.advance` returned: None or an op for a stateful
      state, the new state's values for a stateless one.
    op: In a graph, one op that runs the whole step (the side taken, then
      the new state); None eagerly, where the step has run.
  """
  applied: Verdict
  state: Any
  op: Optional[tf.Operation]


class ScaleState(abc.ABC):
  """A loss scale's state, as the step reads, consults and moves it."""

  @abc.abstractmethod
  def scale(self) -> tf.Tensor:
    """Returns the current loss scale, a float32 scalar tensor."""

  def decide(self, grads: List[Any],
             all_finite: Callable[[], tf.Tensor]) -> Decision:
    """Gives the step's verdict; runs in the cross-replica context.

    `grads` are the step's unscaled gradients as `apply_fn` will get them
    (per-replica values under a strategy); `all_finite()` computes the
    verdict on the gradients that will be applied, by default the decision.
    A state that never skips need not call it: then nothing is read.
    """
    del grads
    return Decision(all_finite())

  def skip_reporter(self, names: Sequence[str], reading: Reader
                   ) -> Optional[Callable[[], Any]]:
    """Prepares the report of why the step is skipped, if the state keeps one.

    Called in the cross-replica context before the step takes a side, with
    one name per gradient and the reading the verdict came from. What it
    returns (a function that writes the report, returning an op in a graph)
    is called only on the skip side, before `advance`. By default None.
    """
    del names, reading
    return None

  @abc.abstractmethod
  def advance(self, verdict: Verdict,
              after: Sequence[Union[tf.Tensor, tf.Operation]]) -> Any:
    """Moves the state once the side taken has run (cross-replica context).

    The new state may be computed while the side runs (it depends on the
    verdict and the current state only), but everything that writes it
    must run after `after`.

    Args:
      verdict: The decision's verdict.
      after: In a graph, what marks the side taken as done: the writes go
        under a control dependency on it. Empty eagerly, where the side has
        run.

    Returns:
      Anything the front end needs: an op (graph) or None for a stateful
      state, the new values for a stateless one.
    """


class LossScaleState(ScaleState):
  """The state of a `tf_loss_scale.LossScale`, for the step."""

  def __init__(self, loss_scale: loss_scale_lib.LossScale):
    """Adapts `loss_scale`, any `LossScale`.

    A `DynamicLossScale` (whose `update` is this library's) is consulted and
    moved by the step; any other decides, and moves its own state, in its
    own `update(grads)`.
    """
    self._loss_scale = loss_scale
    self._follows_the_rule = (
        isinstance(loss_scale, loss_scale_lib.DynamicLossScale) and
        type(loss_scale).update is loss_scale_lib.DynamicLossScale.update)

  @property
  def follows_the_rule(self) -> bool:
    """Whether the step moves the state (else the scale's `update` does)."""
    return self._follows_the_rule

  def scale(self) -> tf.Tensor:
    return self._loss_scale()

  def decide(self, grads: List[Any],
             all_finite: Callable[[], tf.Tensor]) -> Decision:
    if self._follows_the_rule:
      return Decision(all_finite())
    update_op, should_apply = self._loss_scale.update(grads)
    return Decision(should_apply, update_op)

  def skip_reporter(self, names: Sequence[str], reading: Reader
                   ) -> Optional[Callable[[], Any]]:
    # A loss scale that decides in its own `update` reports there, if at all.
    record = loss_scale_lib.step_record_of(self._loss_scale)
    if not self._follows_the_rule or record is None:
      return None
    return record.skip_reporter(names, self.scale, reading)

  def advance(self, verdict: Verdict,
              after: Sequence[Union[tf.Tensor, tf.Operation]]) -> Any:
    if self._follows_the_rule:
      return self._loss_scale.assign_next_state(verdict, after=after)
    return None


# The step is plain graph building, written for TF1 graphs too: AutoGraph
# has nothing to convert in it, and left on, it would convert the step, the
# front ends' callbacks and everything they call each time a `tf.function`
# traces a step (the inner optimizer's apply included, which Keras's own
# class calls unconverted).
@tf.autograph.experimental.do_not_convert
def apply_step(grads: Sequence[Any],
               state: ScaleState,
               apply_fn: Callable[[List[Any]], Any],
               scaled: Optional[Sequence[bool]] = None,
               reduces: bool = True,
               summed: bool = False,
               on_skip: Optional[Callable[[List[Any]], Any]] = None,
               names: Optional[Sequence[str]] = None,
               name: Optional[str] = None,
               held_as: Optional[Sequence[Any]] = None,
               decides_on_sums: bool = False,
               cond: Optional[Callable[..., tf.Tensor]] = None) -> Outcome:
  """Unscales, decides, applies or skips, and then moves the state.

  Call it in a replica context (inside `strategy.run`) or with no strategy.

  Args:
    grads: One gradient per variable (`None` allowed, `tf.IndexedSlices`
      kept sparse).
    state: The loss scale's state.
    apply_fn: Applies a list of gradients like `grads`; called in a replica
      context, on every replica, only when the step is applied.
    scaled: None when `grads` are already unscaled; otherwise one bool per
      gradient, True where it is a gradient of the scaled loss (False for
      Keras variables overwritten with their gradient), which the step
      divides as Keras 3 does (`distribute.merge_step`).
    reduces: Whether `apply_fn` all-reduces the gradients itself (see the
      module docstring).
    summed: Whether `grads` are already the sums across replicas, made by
      the caller; nothing sums them again and `reduces` does not matter.
    on_skip: The one place for work that runs only on a skipped step: called
      once, in the cross-replica context, with the step's unscaled gradients
      (per-replica values under a strategy, or the sums when the step
      applies sums); may return an op.
    names: One name per gradient for the skip report (see
      `tf_loss_scale.step_record.gradient_names`); by default positions.
    name: The name of `Outcome.op`.
    held_as: The dtype of each gradient's variable, or None: a gradient
      (or sum) is read as the variable will receive it (`distribute.read`).
    decides_on_sums: With `reduces`, whether the step still decides on the
      exact sums rather than on the bound (one more all-reduce, for the
      reading only).
    cond: In a graph, None for the library's own gating of the two sides,
      or a function like TF1's `tf.compat.v1.cond` that takes them instead
      (the TF1 front end's, to build the graph TensorFlow's wrapper builds;
      see `distribute.apply_on_every_replica_if`).

  Returns:
    The step's `Outcome`.
  """
  grads = list(grads)
  names = (tuple(names) if names is not None else
           step_record.positions(len(grads)))
  if len(names) != len(grads):
    raise ValueError(
        f'Got {len(grads)} gradients for {len(names)} variables: pass one '
        'gradient per variable.')

  def in_cross_replica(strategy: tf.distribute.Strategy, grads: List[Any],
                       reading: Reader) -> Outcome:
    decision = state.decide(grads, lambda: reading().finite)
    report = state.skip_reporter(names, reading)

    def skip_side() -> Any:
      # Nothing here may run on a step that is applied.
      done = [d for d in (report() if report else None,
                          on_skip(grads) if on_skip else None)
              if d is not None]
      if tf.executing_eagerly() or not done:
        return None
      with tf.control_dependencies(done):
        return tf.no_op()

    applied = distribute.apply_on_every_replica_if(
        strategy, decision.verdict, apply_fn, (grads,), on_skip=skip_side,
        cond=cond)
    # The new state is computed beside the side taken and written only once
    # that side has completed.
    advanced = state.advance(decision.verdict, after=graph_elements(applied))
    op = None
    if not tf.executing_eagerly():
      op = tf.group(*graph_elements(applied, decision.update_op, advanced),
                    name=name)
    return Outcome(applied, advanced, op)

  return distribute.merge_step(
      in_cross_replica, grads, None if scaled is None else state.scale(),
      scaled, sums=not reduces, summed=summed, exact=decides_on_sums,
      held_as=held_as)


def graph_elements(*values: Any) -> List[Union[tf.Tensor, tf.Operation]]:
  """The ops and tensors among `values`, to order later ops after them.

  Args:
    *values: Nested structures, such as an `Outcome`'s fields.

  Returns:
    The graph ops and tensors among them (Python values and eager results
    have nothing to order): a list for `tf.control_dependencies`.
  """
  if tf.executing_eagerly():
    return []
  return [v for v in tf.nest.flatten(values)
          if isinstance(v, (tf.Tensor, tf.Operation))]
