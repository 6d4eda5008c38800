"""What the latest steps did, and why the latest skipped step was skipped.

A `StepRecord` is monitoring state kept next to a loss scale's, never saved
with it (checkpoints and `.keras` files keep the peers' layouts): the counts
`skipped_steps`, `last_step_skipped` and `steps`, and the latest skip report
(`SkipReport`, from the step's one reading of its gradients), written only
on the skip branch so a finite step pays for the counts alone.

A write of a mirrored variable is a write on every device, so the report
takes few variables: its numbers one float64 vector, its flags one boolean
matrix per "site" (list of gradient names, kept in Python, so XLA works),
made when a step with those names is first traced. The counts stay three
scalars, as Keras's optimizer tests expect of what an optimizer assigns.

In a TF1 graph the variables are in no collection, under the library's own
name scope (`GRAPH_SCOPE`), as with TensorFlow's wrapper. No initialiser
resets them: each session's first step sets them; until then they read "no
step".
"""

import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution

# Entries of the report's numbers, and what they read as with no report.
_SKIP_STEP, _SKIP_SITE, _SKIP_SCALE = 0, 1, 2
_NO_REPORT = (-1.0, 0.0, 0.0)

OVERFLOW = 'overflow'
NAN = 'nan'


@dataclasses.dataclass(frozen=True)
class SkipReport:
  """Why one step was skipped.

  Attributes:
    step: How many steps, applied and skipped, went through the loss scale
      (in this process; in a TF1 graph, in this session) before this one.
    loss_scale: The scale the skipped step's gradients were computed with.
    nan: The variables whose gradient held a NaN (on any replica), in the
      step's order, named by `gradient_names`.
    inf: The variables whose gradient held an inf of either sign, or whose
      sum across replicas may overflow. A variable can be in both lists.
    cause: `'nan'` when any gradient held a NaN (no loss scale cures that),
      else `'overflow'` (a lower scale does).
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
    return (f'step {self.step} skipped at loss scale {self.loss_scale:g} '
            f'({self.cause}): {"; ".join(found)}')


def gradient_names(variables: Sequence[Any]) -> Tuple[str, ...]:
  """The names a report gives the gradients of `variables` (None: unknown).

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

  `create()` it where the loss scale creates its state; then per step call
  `record`, and on the skip branch what `skip_reporter` returned.
  """

  def __init__(self):
    self._counts = None
    self._report = None
    self._sites: Dict[Tuple[str, ...], _Site] = {}
    # The skip count once a step's op has run, by the op's name (TF1 graph).
    self._counted_after: Dict[str, tf.Tensor] = {}

  @property
  def created(self) -> bool:
    return self._counts is not None

  def create(self, names: Optional[Sequence[str]] = None) -> None:
    """Creates the variables, outside any `tf.function` being traced.

    Args:
      names: The steps' gradient names, if known now: their flags are made
        now too, not when a step is first built (which makes a `tf.function`
        trace its first call twice, as any variable it creates does).
    """
    with tf.init_scope():
      self._counts = {
          'steps': _monitoring_variable('steps', 0, tf.int64),
          'skipped_steps': _monitoring_variable('skipped_steps', 0, tf.int64),
          'last_step_skipped': _monitoring_variable('last_step_skipped',
                                                    False, tf.bool),
      }
      # The latest skipped step's number (-1: none), site and loss scale.
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

  def follow(self, step_op: tf.Operation) -> None:
    """Makes `skipped_after` know `step_op`, a step's op in a TF1 graph."""
    with tf.control_dependencies([step_op]):
      self._counted_after[step_op.name] = self.skipped_steps()

  def skipped_after(self, fetches: Any) -> Optional[tf.Tensor]:
    """The skip count once the step among `fetches` has run, if one is.

    Args:
      fetches: What a `Session.run` fetches: any nest of ops, tensors, names.

    Returns:
      A tensor to fetch in that same run (no run of its own); None when no
      step `follow` was given is fetched, by op, name, or in a group of ops.
    """
    for fetch in tf.nest.flatten(fetches):
      if isinstance(fetch, str) and fetch in self._counted_after:
        return self._counted_after[fetch]
      fetch = fetch.op if isinstance(fetch, tf.Tensor) else fetch
      if isinstance(fetch, tf.Operation):
        found = self._step_in(fetch)
        if found is not None:
          return found
    return None

  def _step_in(self, op: tf.Operation) -> Optional[tf.Tensor]:
    """The count after a followed step that `op` is or groups, if any."""
    pending, seen = [op], set()
    while pending:
      op = pending.pop()
      if op.name in self._counted_after:
        return self._counted_after[op.name]
      if op.type == 'NoOp' and op.name not in seen:
        seen.add(op.name)
        pending.extend(op.control_inputs)
    return None

  def skip_reporter(self, names: Sequence[str],
                    scale: Callable[[], tf.Tensor],
                    reading: Callable[[], distribute.Reading]
                   ) -> Callable[[], Any]:
    """Prepares the report of a step that may be skipped.

    Call it in the cross-replica context before the step takes a side, and
    what it returns only on the skip side, before `record` counts the step.

    Args:
      names: One name per gradient.
      scale: Returns the loss scale the gradients were computed with.
      reading: Returns the step verdict's `distribute.Reading`, whose flags
        the report keeps (the gradients are not read again).

    Returns:
      A function that writes the report: its op in a graph, None eagerly.
    """
    site = self._site(tuple(names))

    def write() -> Any:
      found = reading()
      # The steps counted before this one: 0 before a TF1 session's first
      # step has set the counts.
      step = _read_or(self._counts['steps'], 0)
      numbers = tf.stack([tf.cast(step, tf.float64),
                          tf.constant(site.index, tf.float64),
                          tf.cast(scale(), tf.float64)])
      return execution.op_in_graph_mode(lambda: tf.group(
          site.flags.assign(tf.stack([found.nan, found.inf]),
                           read_value=False),
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
    """The latest report as a string tensor, for collapse messages.

    `' The last skipped step: '`, the report as `str(SkipReport)` words it,
    then `NAN_NOTE` for a NaN; empty with no report.
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
        found, '.',
        tf.where(nan_found, NAN_NOTE, '')])
    return tf.where(step >= 0, text, '')

  def read(self, session: Any = None) -> Optional[SkipReport]:
    """The latest report (None before any skip); in a TF1 graph via `session`.

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
    nan, inf = (tuple(n for n, flag in zip(sites[site_index].names, row)
                      if flag) for row in flags[site_index])
    return SkipReport(step=int(report[_SKIP_STEP]),
                      loss_scale=float(report[_SKIP_SCALE]), nan=nan,
                      inf=inf, cause=NAN if nan else OVERFLOW)


def _run_without_hooks(session: Any, fetches: Any) -> Any:
  """Runs `fetches` once, without a `MonitoredSession`'s hooks: a read of
  the report is no training step. One run reads one consistent record."""
  run_step_fn = getattr(session, 'run_step_fn', None)
  if run_step_fn is None:
    return session.run(fetches)
  return run_step_fn(
      lambda step_context: step_context.session.run(fetches))


NAN_NOTE = (' A NaN is not an overflow: no loss scale will cure it. Look for '
            'its source in the model, the loss or the inputs.')


def _listed(prefix: str, names: Tuple[str, ...], flags: tf.Tensor
           ) -> tf.Tensor:
  if not names:
    return tf.constant('')
  found = tf.boolean_mask(tf.constant(names, tf.string), flags)
  return tf.where(tf.reduce_any(flags), tf.strings.join(
      [prefix, tf.strings.reduce_join(found, separator=', ')]), '')


# The name scope of the record's variables in a TF1 graph: the library's
# own, so that they take no name a user's variable or op could want.
GRAPH_SCOPE = 'tf_loss_scale_record'


def _monitoring_variable(name: str, initial_value: Any, dtype: tf.DType,
                         shape: Optional[List[int]] = None) -> tf.Variable:
  """A variable no checkpoint sees; in a TF1 graph, in no collection."""
  options = dict(name=name, dtype=dtype, trainable=False, shape=shape,
                 synchronization=tf.VariableSynchronization.AUTO,
                 aggregation=tf.VariableAggregation.NONE)
  if not execution.in_tf1_graph():
    return tf.Variable(initial_value, **options)
  # No initialiser, `ready_op`, `Saver` or metrics reset of the user's sees
  # it: the step sets it on its first run (see `_add`). With no strategy it
  # lives on the device of the session that runs it, never on a parameter
  # server a `replica_device_setter` names, which every worker would share.
  graph = tf.compat.v1.get_default_graph()
  device = (contextlib.nullcontext() if tf.distribute.has_strategy() else
            graph.device(None))
  with graph.name_scope(GRAPH_SCOPE + '/'), device:
    return tf.compat.v1.Variable(initial_value, collections=[],
                                 use_resource=True, **options)


def _add(increments: List[Tuple[tf.Variable, tf.Tensor]]) -> Any:
  """Adds to counters created together; returns the op (graph)."""
  def assign(method: str) -> tf.Operation:
    return tf.group(*[getattr(variable, method)(increment)
                      for variable, increment in increments])
  if execution.in_tf1_graph():
    # A session's first step sets the counters, which no initialiser does.
    return execution.one_side_runs(_is_initialized(increments[0][0]),
                                   lambda _: assign('assign_add'),
                                   lambda: assign('assign'))
  return assign('assign_add')


def _read_or(variable: tf.Variable, uninitialized: Any) -> tf.Tensor:
  """The variable's value; in a TF1 graph, `uninitialized` until it has one."""
  if execution.in_tf1_graph():
    # Gated, not a `tf.cond`: TF1's adds to the graph's `cond_context`
    # collection and takes a `cond` name, which moves the names of the
    # program's own later conds away from those TensorFlow's wrapper leaves.
    return execution.computed_unless(
        tf.logical_not(_is_initialized(variable)),
        lambda: tf.identity(variable),
        tf.constant(uninitialized, variable.dtype))
  return tf.identity(variable)


def _is_initialized(variable: tf.Variable) -> tf.Tensor:
  return tf.compat.v1.is_variable_initialized(variable)
