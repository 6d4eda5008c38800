"""What the latest steps did, and why the latest skipped step was skipped.

A `StepRecord` is monitoring state, kept next to a loss scale's state but
never saved with it (checkpoints and `.keras` files keep the peers' layouts):

- `skipped_steps`, `last_step_skipped` and `steps` (every step, applied or
  skipped), moved once per step with the loss scale's state;
- the skip report of the latest skipped step: the step's number, the scale
  its gradients were computed with, and which gradients held a NaN and which
  an inf. It is written only on a skipped step, from the step's skip branch
  (`tf_loss_scale.step.apply_step`), so a finite step pays for the counts
  alone.

The report is held in as few variables as its dtypes allow: its numbers in
one float64 vector (its integers are exact there up to 2**53) and its flags
in one boolean matrix per site. Under a strategy every variable is mirrored
and a write of one is a write on every device, which a finite step pays for
in part even on the skip branch it does not take (the branch's inputs still
pass between devices, as dead tensors), so a skip writes two variables. The
counts stay three scalars, as Keras's optimizer tests expect of what an
optimizer assigns directly (they stand in for `assign` with a function that
refuses any other variable).

`SkipReport` is what `tf_loss_scale.monitoring.last_skip` returns. The
per-gradient flags live in one boolean variable per list of gradient names
the record has seen (a "site"; most steps have one), created the first time
a step with those names is traced: numbers only, so that the record
works under XLA too, with the names kept in Python.

In a TF1 graph the variables are local variables, which a default `Saver`
leaves out and `MonitoredTrainingSession` initialises; a session that
initialises only global ones still runs, and reads "no report" until a step
is skipped.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import gradients

# Entries of the report's numbers, and what they read as with no report.
_SKIP_STEP, _SKIP_SITE, _SKIP_SCALE = 0, 1, 2
_NO_REPORT = (-1.0, 0.0, 0.0)

OVERFLOW = 'overflow'
NAN = 'nan'
# A skipped step with no gradient flagged: under a strategy, the replicas'
# largest magnitudes of different variables together passed the bound.
NO_FLAG = 'the sum across replicas could overflow'


@dataclasses.dataclass(frozen=True)
class SkipReport:
  """Why one step was skipped.

  Attributes:
    step: How many steps, applied and skipped, went through the loss scale
      (in this process) before the skipped one.
    loss_scale: The scale the skipped step's gradients were computed with.
    nan: The variables whose gradient held a NaN, in the step's order:
      `tf.Variable.name`, a Keras variable's `path`, or `'gradient i'` (its
      position) where no variable is known. Under a strategy, on any replica.
    inf: The variables whose gradient held an inf of either sign, or whose
      sum across replicas may overflow. A variable can be in both lists.
    cause: `'nan'` when any gradient held a NaN (no loss scale cures that),
      `'overflow'` otherwise (a lower scale does): infinities, or under a
      strategy sums across replicas that could overflow (with both lists
      empty when no single variable's could, only their largest magnitudes
      together).
  """
  step: int
  loss_scale: float
  nan: Tuple[str, ...]
  inf: Tuple[str, ...]
  cause: str

  def __str__(self) -> str:
    found = []
    if self.nan:
      found.append(f'NaN in {", ".join(self.nan)}')
    if self.inf:
      found.append(f'inf in {", ".join(self.inf)}')
    if not found:
      found.append(NO_FLAG)
    return (f'step {self.step} skipped at loss scale {self.loss_scale:g} '
            f'({self.cause}): {"; ".join(found)}')


def gradient_names(variables: Sequence[Any]) -> Tuple[str, ...]:
  """The names a report gives the gradients of `variables`.

  Args:
    variables: One entry per gradient: a variable, or None where no variable
      is known.

  Returns:
    A Keras variable's `path`, else `tf.Variable.name`, else `'gradient i'`.
  """
  names = []
  for i, variable in enumerate(variables):
    path = getattr(variable, 'path', None)
    name = path if isinstance(path, str) else getattr(variable, 'name', None)
    names.append(name if isinstance(name, str) else f'gradient {i}')
  return tuple(names)


def positions(count: int) -> Tuple[str, ...]:
  """Names for `count` gradients whose variables are not known."""
  return gradient_names([None] * count)


class _Site:
  """The report's flags for one list of gradient names."""

  def __init__(self, index: int, names: Tuple[str, ...]):
    self.names = names
    self.index = index
    self.none_flagged = [[False] * len(names) for _ in range(2)]
    with tf.init_scope():
      # Row 0: which gradients held a NaN; row 1: which an inf.
      self.flags = _monitoring_variable(f'skip_flags_{index}',
                                        self.none_flagged, tf.bool,
                                        [2, len(names)])
      # In a TF1 graph, what `StepRecord.read` runs, made now: a graph may be
      # finalized (as `MonitoredTrainingSession` does) before it is read.
      self.read_in_graph = (self.read_flags() if execution.in_tf1_graph()
                            else None)

  def read_flags(self) -> tf.Tensor:
    """The flags, none set in a TF1 graph before the variable has a value."""
    return _read_or(self.flags, self.none_flagged)


class StepRecord:
  """A loss scale's monitoring state: step counts and the skip report.

  Create its variables with `create()` where the loss scale creates its own
  (in a strategy's scope when there is one), then call `record` once per
  step with whether it was skipped, and the function `skip_reporter`
  returns from the skip branch.
  """

  def __init__(self):
    self._counts = None
    self._report = None
    self._sites: Dict[Tuple[str, ...], _Site] = {}

  @property
  def created(self) -> bool:
    return self._counts is not None

  def create(self, names: Optional[Sequence[str]] = None) -> None:
    """Creates the variables, outside any `tf.function` being traced.

    Args:
      names: The names of the gradients the steps will have, when they are
        known now: their flags are created now too. Otherwise flags are
        created the first time a step with given names is built, which
        makes a `tf.function` trace its first call twice (as it does for any
        variable it creates).
    """
    with tf.init_scope():
      self._counts = {
          'steps': _monitoring_variable('steps', 0, tf.int64),
          'skipped_steps': _monitoring_variable('skipped_steps', 0, tf.int64),
          'last_step_skipped': _monitoring_variable('last_step_skipped',
                                                    False, tf.bool),
      }
      # The latest skipped step's number (-1 until a step is skipped), the
      # index of its site, and its loss scale.
      self._report = _monitoring_variable('skip_report', _NO_REPORT,
                                          tf.float64, [3])
      self._graph = (None if tf.executing_eagerly() else
                     tf.compat.v1.get_default_graph())
      self._report_in_graph = (self._read_report() if execution.in_tf1_graph()
                               else None)
    if names is not None:
      self._site(tuple(names))

  def _read_report(self) -> tf.Tensor:
    return _read_or(self._report, _NO_REPORT)

  def variables(self) -> Dict[str, tf.Variable]:
    """Every variable of the record, by name (for SavedModel tracking)."""
    if not self.created:
      return {}
    found = dict(self._counts, skip_report=self._report)
    for site in self._sites.values():
      found[f'skip_flags_{site.index}'] = site.flags
    return found

  def record(self, skipped: tf.Tensor) -> Any:
    """Counts one step, skipped or not; returns the op (graph) that does."""
    counts = self._counts
    return tf.group(
        _add([(counts['skipped_steps'], tf.cast(skipped, tf.int64)),
              (counts['steps'], tf.constant(1, tf.int64))]),
        counts['last_step_skipped'].assign(skipped))

  def skip_reporter(self, grads: List[Any], names: Sequence[str],
                    scale: Callable[[], tf.Tensor], summed: bool,
                    flags: Optional[Callable[[], Tuple[tf.Tensor, tf.Tensor]]]
                    = None) -> Callable[[], Any]:
    """Prepares the report of a step that may be skipped.

    Call it in the cross-replica context (or with no strategy) before the
    step takes a side, and call what it returns only on the skip side,
    before `record` counts the step.

    Args:
      grads: The step's unscaled gradients (per-replica values under a
        strategy).
      names: One name per gradient.
      scale: Returns the loss scale the gradients were computed with.
      summed: Whether `grads` are already the sums across replicas.
      flags: Returns the gradients' NaN and inf flags (bool vectors), when
        the step computes them with its verdict (under XLA). Otherwise the
        skip side reads the gradients, by one function call, so that a
        finite step does not pay for it.

    Returns:
      A function that writes the report and returns its op (graph), or None
      eagerly.
    """
    site = self._site(tuple(names))

    def write() -> Any:
      nan, inf = flags() if flags else _locate(grads, summed)
      # The steps counted before this one: 0 while a TF1 session has not
      # initialised the counts, as no step has been counted yet.
      step = _read_or(self._counts['steps'], 0)
      numbers = tf.stack([tf.cast(step, tf.float64),
                          tf.constant(site.index, tf.float64),
                          tf.cast(scale(), tf.float64)])
      return execution.op_in_graph_mode(lambda: tf.group(
          site.flags.assign(tf.stack([nan, inf]), read_value=False),
          self._report.assign(numbers, read_value=False)))

    return write

  def _site(self, names: Tuple[str, ...]) -> _Site:
    if names not in self._sites:
      self._sites[names] = _Site(len(self._sites), names)
    return self._sites[names]

  def skipped_steps(self) -> tf.Tensor:
    if not self.created:
      return tf.constant(0, tf.int64)
    return _read_or(self._counts['skipped_steps'], 0)

  def last_step_skipped(self) -> tf.Tensor:
    if not self.created:
      return tf.constant(False)
    return _read_or(self._counts['last_step_skipped'], False)

  def describe(self) -> tf.Tensor:
    """The latest report as a string tensor, for messages built in a graph.

    Returns:
      A string scalar: `' The last skipped step: '` and the report as
      `str(SkipReport)` words it, then `NAN_NOTE` when its cause is a NaN;
      empty with no report.
    """
    report = self._read_report()
    step = tf.cast(report[_SKIP_STEP], tf.int64)
    # Entry 0 stands for "no site": no names.
    texts, has_nan = [tf.constant('')], [tf.constant(False)]
    for site in self._sites.values():
      nan, inf = tf.unstack(site.read_flags())
      found = tf.stack([_listed('NaN in ', site.names, nan),
                        _listed('inf in ', site.names, inf)])
      texts.append(tf.strings.reduce_join(
          tf.boolean_mask(found, tf.strings.length(found) > 0),
          separator='; '))
      has_nan.append(tf.reduce_any(nan))
    which = tf.where(step >= 0, tf.cast(report[_SKIP_SITE], tf.int64) + 1,
                     tf.constant(0, tf.int64))
    found, nan_found = tf.gather(tf.stack(texts), which), tf.gather(
        tf.stack(has_nan), which)
    text = tf.strings.join([
        ' The last skipped step: step ', tf.strings.as_string(step),
        ' skipped at loss scale ',
        tf.strings.as_string(tf.cast(report[_SKIP_SCALE], tf.float32),
                             shortest=True),
        ' (', tf.where(nan_found, NAN, OVERFLOW), '): ',
        tf.where(tf.strings.length(found) > 0, found, NO_FLAG), '.',
        tf.where(nan_found, NAN_NOTE, '')])
    return tf.where(step >= 0, text, '')

  def read(self, session: Any = None) -> Optional[SkipReport]:
    """The latest report, read eagerly or through `session` (TF1 graph).

    Args:
      session: The session that runs the step, for a record built in a TF1
        graph; ignored otherwise.

    Returns:
      The latest report, or None before any skipped step.

    Raises:
      ValueError: For a record built in a TF1 graph, without a session or
        with a session of another graph.
    """
    if not self.created:
      return None
    sites = list(self._sites.values())
    if self._graph is None:
      report = self._read_report().numpy()
      flags = [site.read_flags().numpy() for site in sites]
    else:
      if session is None:
        raise ValueError(
            'This loss scale was built in a TF1 graph: pass the Session that '
            'runs it, as last_skip(obj, session=sess).')
      if getattr(session, 'graph', None) is not self._graph:
        raise ValueError(
            'The session given runs another graph than the one this loss '
            'scale was built in: pass the Session that runs its training '
            'step.')
      report, flags = _run_without_hooks(
          session, (self._report_in_graph,
                    [site.read_in_graph for site in sites]))
    if report[_SKIP_STEP] < 0:
      return None
    site_index = int(report[_SKIP_SITE])
    site, (nan_flags, inf_flags) = sites[site_index], flags[site_index]
    nan = tuple(n for n, flag in zip(site.names, nan_flags) if flag)
    inf = tuple(n for n, flag in zip(site.names, inf_flags) if flag)
    return SkipReport(step=int(report[_SKIP_STEP]),
                      loss_scale=float(report[_SKIP_SCALE]), nan=nan,
                      inf=inf, cause=NAN if nan else OVERFLOW)


def _run_without_hooks(session: Any, fetches: Any) -> Any:
  """Runs `fetches` once, without the hooks of a `MonitoredSession`.

  A read of the report is not a training step: the hooks (a step counter,
  `LossScaleHook`) must not see it. One run reads one consistent record.
  """
  run_step_fn = getattr(session, 'run_step_fn', None)
  if run_step_fn is None:
    return session.run(fetches)
  return run_step_fn(
      lambda step_context: step_context.session.run(fetches))


NAN_NOTE = (' A NaN is not an overflow: no loss scale will cure it. Look for '
            'its source in the model, the loss or the inputs.')


def note_for(report: Optional[SkipReport]) -> str:
  """The sentences a collapse message adds about `report` (eagerly)."""
  if report is None:
    return ''
  return f' The last skipped step: {report}.' + (
      NAN_NOTE if report.cause == NAN else '')


def _listed(prefix: str, names: Tuple[str, ...], flags: tf.Tensor
           ) -> tf.Tensor:
  if not names:
    return tf.constant('')
  found = tf.boolean_mask(tf.constant(names, tf.string), flags)
  return tf.where(tf.reduce_any(flags), tf.strings.join(
      [prefix, tf.strings.reduce_join(found, separator=', ')]), '')


# ---- the flags of one step --------------------------------------------------


def _locate(grads: List[Any], summed: bool) -> Tuple[tf.Tensor, tf.Tensor]:
  """Which gradients hold a NaN, and which an inf (or a sum that may overflow).

  Under a strategy, in the cross-replica context, the union over replicas:
  each local replica's gradients are read by one call on its device (in the
  caller's thread, so that the caller's control dependencies gate it), and
  across workers the results are summed with one all-reduce. `summed` gradients
  are the same on every replica, so the first replica's are read.
  """
  if not tf.distribute.has_strategy():
    return _flags(_summed_kinds([_values(grads)]), dtypes=None)
  strategy = tf.distribute.get_strategy()
  if summed:
    return _flags(_summed_kinds(
        [_values(distribute.first_replica_value(grads))]), dtypes=None)
  local = [None if g is None else strategy.experimental_local_results(g)
           for g in grads]
  replicas = max([len(l) for l in local if l is not None], default=1)
  if replicas == strategy.num_replicas_in_sync:
    # One call per replica, on its device: its gradients are not copied
    # to another device (a copy that a finite step would also pay).
    per_replica = []
    for r in range(replicas):
      values = _values([None if l is None else l[r] for l in local])
      device = next((v.device for v in values if v is not None), None)
      with tf.device(device):
        per_replica.append(_summed_kinds([values]))
    total = tf.add_n(per_replica)
  else:
    total = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.extended.call_for_each_replica(
            lambda g: _summed_kinds([_values(g)]), args=(grads,)),
        axis=None)
  return _flags(total, dtypes=[
      None if v is None else v.dtype
      for v in _values(distribute.first_replica_value(grads))])


def _values(grads: List[Any]) -> List[Optional[tf.Tensor]]:
  """Each gradient's values (an `IndexedSlices`'s `values`), None kept."""
  return [None if g is None else gradients.dense_values(g)[0] for g in grads]


def _kinds_summed_over(replicas: List[List[Optional[tf.Tensor]]]
                      ) -> tf.Tensor:
  """Per gradient: [holds a NaN, holds an inf, largest finite |value|].

  `gradients.kinds_by_gradient` of each of `replicas` (each a list of
  gradient values), added up, so that the rows of other workers can be
  added to it.
  """
  return tf.add_n([gradients.kinds_by_gradient(values) for values in replicas])


def _one_call(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` as one function call in the graphs that call it.

  A call that TensorFlow inlined would leave hundreds of ops per replica
  on the step's skip side, which an executor visits (as dead ops) on every
  finite step too. `_noinline`, a function attribute of TensorFlow's
  runtime that `tf.function` accepts from TensorFlow 2.15 on, keeps the
  call one op, whose body runs only when the call does. Earlier
  TensorFlows refuse it; there the call is inlined: the same report, at
  that cost.
  """
  options = dict(autograph=False, reduce_retracing=True)
  try:
    return tf.function(fn, experimental_attributes={'_noinline': True},
                       **options)
  except ValueError:
    return tf.function(fn, **options)


_summed_kinds = _one_call(_kinds_summed_over)


def _flags(kinds: tf.Tensor, dtypes: Optional[List[Optional[tf.DType]]]
          ) -> Tuple[tf.Tensor, tf.Tensor]:
  nan = kinds[:, 0] > 0
  inf = kinds[:, 1] > 0
  if dtypes:
    # The replicas' largest magnitudes added up: past the bound the step
    # checks (`distribute.sum_limit`), the sum may overflow.
    limits = tf.constant([distribute.sum_limit(d) if d else float('inf')
                          for d in dtypes], tf.float64)
    inf = tf.logical_or(inf, kinds[:, 2] > limits)
  return nan, inf


# ---- variables ----------------------------------------------------------------


def _monitoring_variable(name: str, initial_value: Any, dtype: tf.DType,
                         shape: Optional[List[int]] = None) -> tf.Variable:
  """A variable no checkpoint sees: local in a TF1 graph."""
  options = dict(name=name, dtype=dtype, trainable=False, shape=shape,
                 synchronization=tf.VariableSynchronization.AUTO,
                 aggregation=tf.VariableAggregation.NONE)
  if execution.in_tf1_graph():
    return tf.compat.v1.Variable(
        initial_value, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        use_resource=True, **options)
  return tf.Variable(initial_value, **options)


def _add(increments: List[Tuple[tf.Variable, tf.Tensor]]) -> Any:
  """Adds to counters created together; returns the op (graph)."""
  def assign(method: str) -> tf.Operation:
    return tf.group(*[getattr(variable, method)(increment)
                      for variable, increment in increments])
  if execution.in_tf1_graph():
    # Uninitialised counters (a session that initialised only the global
    # variables) are set rather than incremented.
    return execution.one_side_runs(_is_initialized(increments[0][0]),
                                   lambda _: assign('assign_add'),
                                   lambda: assign('assign'))
  return assign('assign_add')


def _read_or(variable: tf.Variable, uninitialized: Any) -> tf.Tensor:
  """The variable's value; in a TF1 graph, `uninitialized` until it has one."""
  if execution.in_tf1_graph():
    return tf.cond(_is_initialized(variable), lambda: tf.identity(variable),
                   lambda: tf.constant(uninitialized, variable.dtype))
  return tf.identity(variable)


def _is_initialized(variable: tf.Variable) -> tf.Tensor:
  return tf.compat.v1.is_variable_initialized(variable)
