"""A TF1 graph with this library's v1 wrapper is the graph TensorFlow's makes.

Each test builds one program twice, with TensorFlow's
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` and with
ours, each in its own graph, and compares what a TF1 program relies on: the
variables and every collection (what initialisers, `ready_op`, `Saver` and
metrics resets act on), the names of the ops, what runs under the train
op's name, and the trajectories. Ours keeps a skip record besides, in no
collection: it must survive whatever the program does to its own state, in
a `Session`, a `MonitoredTrainingSession` with or without a `Scaffold`, and
on two workers of a `replica_device_setter` cluster.
"""

import glob
import os
import socket
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import monitoring

INF = float('inf')
TF_V1 = tf.compat.v1.mixed_precision
THEIRS, OURS = 'theirs', 'ours'
_CLASSES = {
    THEIRS: (TF_V1.MixedPrecisionLossScaleOptimizer, TF_V1.DynamicLossScale),
    OURS: (tf_loss_scale.MixedPrecisionLossScaleOptimizer,
           tf_loss_scale.DynamicLossScale),
}
# The names the record's variables had when they sat at the root of a graph.
_RECORD_NAMES = ('steps', 'skipped_steps', 'last_step_skipped', 'skip_report',
                 'skip_flags_0')
# One input per step: the gradient of `w` is [x, x] unscaled.
_XS = [1.0, INF, 1.0, 1.0, 1.0]


class _Program(NamedTuple):
  graph: tf.Graph
  opt: Any
  train_op: tf.Operation
  x: Any
  reads: dict  # Tensors read after the steps, made before any finalize.


def _optimizer(which: str, loss_scale: str) -> Any:
  """The wrapper and its loss scale (TensorFlow's keeps it private)."""
  wrapper, dynamic = _CLASSES[which]
  scale = (dynamic(initial_loss_scale=8.0, increment_period=2)
           if loss_scale == 'dynamic' else TF_V1.FixedLossScale(128.0)
           if which == THEIRS else tf_loss_scale.FixedLossScale(128.0))
  return wrapper(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), scale), scale


def _build(which: str, loss_scale: str = 'dynamic',
           inputs: Optional[Callable[[], Any]] = None,
           after: Optional[Callable[[], Any]] = None,
           device: Any = None) -> _Program:
  """`w` trained on `sum(w * x)` with Momentum and a global step."""
  graph = tf.Graph()
  with graph.as_default(), graph.device(device):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable('w', initializer=[1.0, 2.0],
                                  use_resource=True)
    x = (inputs or (lambda: tf.compat.v1.placeholder(tf.float32, [],
                                                     name='x')))()
    opt, scale = _optimizer(which, loss_scale)
    train_op = opt.minimize(tf.reduce_sum(w * x), global_step=global_step)
    made = after() if after is not None else None
    reads = {'w': tf.identity(w), 'global_step': tf.identity(global_step),
             'loss_scale': scale()}
    if isinstance(made, tf.Variable):
      reads[made.op.name] = tf.identity(made)
    if loss_scale == 'dynamic':
      reads['good_steps'] = tf.identity(
          scale.good_steps if which == OURS else scale._num_good_steps)
    if loss_scale == 'dynamic' and which == OURS:
      reads['skipped_steps'] = scale.skipped_steps
  return _Program(graph, opt, train_op, x, reads)


def _names(items) -> list:
  return [getattr(item, 'name', repr(item)) for item in items]


def _collections(graph: tf.Graph) -> dict:
  return {key: _names(graph.get_collection(key))
          for key in graph.get_all_collection_keys()}


def _user_names():
  """What a program makes after the optimizer, under names it chose."""
  tf.compat.v1.get_variable('steps', initializer=5.0, use_resource=True)
  for name in _RECORD_NAMES[1:]:
    tf.constant(0, name=name)


def _run(program: _Program, session: Any, xs=_XS) -> dict:
  for x in xs:
    session.run(program.train_op, {program.x: x})
  return session.run(program.reads)


def _same(ours: dict, theirs: dict, what: str) -> None:
  """Compares what both read (ours reads its skip count besides)."""
  assert {'w', 'global_step', 'loss_scale'} <= set(ours) & set(theirs)
  for key in set(ours) & set(theirs):
    np.testing.assert_array_equal(ours[key], theirs[key],
                                  err_msg=f'{what}: {key}')


# --- The graph: variables, collections, names -----------------------------------


@pytest.mark.parametrize('loss_scale', ['dynamic', 'fixed'])
def test_a_graph_holds_tensorflows_variables_collections_and_names(
    loss_scale):
  theirs = _build(THEIRS, loss_scale, after=_user_names)
  ours = _build(OURS, loss_scale, after=_user_names)
  assert ours.train_op.name == theirs.train_op.name == 'Momentum'
  assert _collections(ours.graph) == _collections(theirs.graph)
  with ours.graph.as_default():
    assert 'steps:0' in _names(tf.compat.v1.global_variables())
    assert tf.compat.v1.local_variables() == []
  # A name the program chose is the name it gets.
  for name in _RECORD_NAMES[1:]:
    assert ours.graph.get_operation_by_name(name).type == 'Const', name
  # Everything a Scaffold's ready_op checks is initialised by the
  # initialisers a program runs.
  with ours.graph.as_default(), tf.compat.v1.Session() as session:
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    assert session.run(
        tf.compat.v1.report_uninitialized_variables()).tolist() == []


@pytest.mark.parametrize('loss_scale', ['dynamic', 'fixed'])
def test_the_op_under_the_train_ops_name_is_the_whole_step(loss_scale):
  # A program that fetches the step by name (a graph read back, a serving
  # graph) runs what TensorFlow's wrapper ran under that name.
  found = {}
  for which in (THEIRS, OURS):
    program = _build(which, loss_scale)
    with program.graph.as_default(), tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for x in [1.0, INF, 1.0, 1.0, 1.0]:
        session.run('Momentum', {'x:0': x})
      found[which] = session.run(program.reads)
  _same(found[OURS], found[THEIRS], f'{loss_scale}, run by name')
  assert found[OURS]['global_step'] == (5 if loss_scale == 'fixed' else 4)
  if loss_scale == 'dynamic':
    # 8, halved by the skip, doubled after two finite steps, then one more.
    assert (found[OURS]['loss_scale'], found[OURS]['good_steps']) == (8.0, 1)


def test_a_saver_restores_tensorflows_checkpoint_beside_a_steps_variable(
    tmp_path):
  def steps_variable():
    return tf.compat.v1.get_variable('steps', initializer=5.0,
                                     use_resource=True)

  values = {}
  for writer, reader in ((THEIRS, OURS), (OURS, THEIRS)):
    path = str(tmp_path / writer / 'model')
    written = _build(writer, after=steps_variable)
    with written.graph.as_default(), tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values[writer] = _run(written, session)
      tf.compat.v1.train.Saver().save(session, path)
    read = _build(reader, after=steps_variable)
    with read.graph.as_default(), tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, path)
      _same(session.run(read.reads), values[writer], f'{writer} to {reader}')
  assert values[OURS]['steps'] == 5.0
  _same(values[OURS], values[THEIRS], 'trajectory')


# --- The record survives what programs do to their state ---------------------------


def _expected_report(step: int, scale: float) -> monitoring.SkipReport:
  return monitoring.SkipReport(step=step, loss_scale=scale, nan=(),
                               inf=('w:0',), cause='overflow')


def test_the_record_survives_local_variable_initialisers_and_metric_resets():
  def metric():
    tf.compat.v1.metrics.mean(tf.constant(1.0), name='loss_mean')

  program = _build(OURS, after=metric)
  with program.graph.as_default(), tf.compat.v1.Session() as session:
    skipped_steps = program.reads['skipped_steps']
    metric_reset = tf.compat.v1.variables_initializer(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES))
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    _run(program, session)
    report = _expected_report(1, 8.0)
    for reset in (tf.compat.v1.local_variables_initializer(), metric_reset):
      session.run(reset)
      assert session.run(skipped_steps) == 1, reset.name
      assert monitoring.last_skip(program.opt, session) == report, reset.name


@pytest.mark.parametrize('scaffold', [False, True])
def test_monitored_training_session_with_and_without_a_scaffold(scaffold):
  # An initializable iterator needs a Scaffold whose local_init_op runs its
  # initializer: the Scaffold's ready_op then checks every local variable.
  found, reports = {}, {}
  for which in (THEIRS, OURS):
    iterator = []

    def inputs():
      dataset = tf.data.Dataset.from_tensor_slices(_XS)
      iterator.append(
          tf.compat.v1.data.make_initializable_iterator(dataset) if scaffold
          else tf.compat.v1.data.make_one_shot_iterator(dataset))
      return iterator[0].get_next()

    program = _build(which, inputs=inputs)
    with program.graph.as_default():
      chosen = (tf.compat.v1.train.Scaffold(
          local_init_op=iterator[0].initializer) if scaffold else None)
      with tf.compat.v1.train.MonitoredTrainingSession(
          scaffold=chosen) as session:
        for _ in _XS:
          session.run(program.train_op)
        found[which] = session.run(program.reads)
        if which == OURS:
          reports[which] = monitoring.last_skip(program.opt, session)
  _same(found[OURS], found[THEIRS], f'scaffold={scaffold}')
  assert reports[OURS] == _expected_report(1, 8.0)


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('localhost', 0))
    return probe.getsockname()[1]


def _cluster() -> tf.train.ClusterSpec:
  """A parameter server and two workers, served in this process."""
  cluster = tf.train.ClusterSpec({
      'ps': [f'localhost:{_free_port()}'],
      'worker': [f'localhost:{_free_port()}' for _ in range(2)]})
  servers = [tf.distribute.Server(cluster, job, task)
             for job, task in (('ps', 0), ('worker', 0), ('worker', 1))]
  return cluster, servers[1:]


def test_each_worker_of_a_replica_device_setter_keeps_its_own_record():
  # The loss scale is a global variable on the parameter server, shared by
  # the workers as TensorFlow's is; the record is each worker's own.
  found = {}
  for which in (THEIRS, OURS):
    cluster, servers = _cluster()
    programs, sessions = [], []
    for task in range(2):
      program = _build(which, device=tf.compat.v1.train.replica_device_setter(
          worker_device=f'/job:worker/task:{task}', cluster=cluster))
      programs.append(program)
      sessions.append(tf.compat.v1.Session(servers[task].target,
                                           graph=program.graph))
    with programs[0].graph.as_default():
      sessions[0].run(tf.compat.v1.global_variables_initializer())
    # Worker 0 skips a step; worker 1 then trains, resetting its own
    # local variables as a metrics reset would.
    _run(programs[0], sessions[0], [1.0, INF])
    with programs[1].graph.as_default():
      sessions[1].run(tf.compat.v1.local_variables_initializer())
    found[which] = _run(programs[1], sessions[1], [1.0, 1.0])
    if which == OURS:
      skipped = [session.run(program.reads['skipped_steps'])
                 for program, session in zip(programs, sessions)]
      assert skipped == [1, 0], 'skipped steps on workers 0 and 1'
      assert monitoring.last_skip(programs[0].opt, sessions[0]) == (
          _expected_report(1, 8.0))
      assert monitoring.last_skip(programs[1].opt, sessions[1]) is None
    for session in sessions:
      session.close()
  _same(found[OURS], found[THEIRS], 'replica_device_setter')
  assert found[OURS]['global_step'] == 3


# --- LossScaleHook ------------------------------------------------------------------


class _Runs:
  """Counts `Session.run` calls, the hooks' included."""

  def __init__(self, monkeypatch):
    self.count = 0
    run = tf.compat.v1.Session.run

    def counted(session, *args, **kwargs):
      self.count += 1
      return run(session, *args, **kwargs)

    monkeypatch.setattr(tf.compat.v1.Session, 'run', counted)


def _skip_report_steps(log_dir: str) -> list:
  steps = []
  for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step for value in event.summary.value
                if value.tag == monitoring.SKIP_REPORT_TAG]
  return steps


def _runs_the_hook_adds(monkeypatch, tmp_path, build) -> int:
  """Session runs a `LossScaleHook` adds to a MonitoredTrainingSession's loop.

  `build()` returns (a graph, what the hook watches in it, the fetch, the
  placeholder fed each of `_XS`).
  """
  runs = {}
  for with_hook in (False, True):
    graph, watched, fetched, fed = build()
    with graph.as_default():
      tf.compat.v1.train.get_or_create_global_step()
      hooks = ([monitoring.LossScaleHook(watched, output_dir=str(tmp_path),
                                         every_n_steps=100)]
               if with_hook else [])
      counter = _Runs(monkeypatch)
      with tf.compat.v1.train.MonitoredTrainingSession(
          hooks=hooks, save_summaries_steps=None,
          log_step_count_steps=None) as session:
        for x in _XS:
          session.run(fetched, {fed: x})
      runs[with_hook] = counter.count
      monkeypatch.undo()
  return runs[True] - runs[False]


@pytest.mark.parametrize('fetch', ['op', 'group', 'name'])
def test_loss_scale_hook_costs_no_run_on_the_steps_it_does_not_log(
    fetch, monkeypatch, tmp_path):

  def build():
    program = _build(OURS)
    with program.graph.as_default():
      fetched = {'op': program.train_op,
                 'group': tf.group(program.train_op, tf.no_op()),
                 'name': program.train_op.name}[fetch]
    return program.graph, program.opt, fetched, program.x

  # Its own runs: the global step once it starts, the state at step 0 (the
  # one step it logs), and the report of the one skipped step.
  assert _runs_the_hook_adds(monkeypatch, tmp_path, build) == 3
  assert _skip_report_steps(str(tmp_path)) == [1]


def test_loss_scale_hook_reads_a_loss_scales_update_in_its_own_run(
    monkeypatch, tmp_path):

  def build():
    graph = tf.Graph()
    with graph.as_default():
      loss_scale = tf_loss_scale.DynamicLossScale(8.0, increment_period=2)
      grad = tf.compat.v1.placeholder(tf.float32, [])
      update_op, _ = loss_scale.update([grad])
    return graph, loss_scale, update_op, grad

  assert _runs_the_hook_adds(monkeypatch, tmp_path, build) == 3
  assert _skip_report_steps(str(tmp_path)) == [1]


# --- LossScale's protected API for subclasses -----------------------------------


def _subclass(base: type) -> type:
  """A loss scale written against TensorFlow's `LossScale`'s protected API."""

  class Stepped(base):

    def __init__(self):
      super().__init__()
      self._scale = self._add_weight('my_scale', 1024.0)
      self._count = self._add_weight(name='my_count', initial_value=0,
                                     dtype=tf.int64)

    def __call__(self):
      return tf.convert_to_tensor(self._scale)

    def update(self, grads):
      del grads
      return self._count.assign_add(1), True

    def get_config(self):
      return {}

  return Stepped


_BASES = {THEIRS: TF_V1.LossScale, OURS: tf_loss_scale.LossScale}


def test_a_subclass_adds_weights_eagerly_and_checkpoints_them(tmp_path):
  made = {which: _subclass(base)() for which, base in _BASES.items()}
  for which, loss_scale in made.items():
    assert sorted(_names(loss_scale._weights.values())) == [
        'my_count:0', 'my_scale:0'], which
    with pytest.raises(RuntimeError):
      loss_scale._add_weight('my_scale', 1.0)
  assert sorted(_names(made[OURS].variables)) == ['my_count:0', 'my_scale:0']
  keys = {}
  for writer, reader in ((THEIRS, OURS), (OURS, THEIRS)):
    made[writer]._scale.assign(64.0 if writer == THEIRS else 32.0)
    path = tf.train.Checkpoint(loss_scale=made[writer]).save(
        str(tmp_path / writer / 'ckpt'))
    keys[writer] = sorted(name for name, _ in tf.train.list_variables(path))
    tf.train.Checkpoint(loss_scale=made[reader]).restore(
        path).assert_consumed()
    assert float(made[reader]()) == float(made[writer]()), (writer, reader)
  assert keys[OURS] == keys[THEIRS]
  assert 'loss_scale/my_scale/.ATTRIBUTES/VARIABLE_VALUE' in keys[OURS]


def test_a_subclass_adds_weights_in_a_tf1_graph(tmp_path):
  found = {}
  for which, base in _BASES.items():
    graph = tf.Graph()
    with graph.as_default():
      w = tf.compat.v1.get_variable('w', initializer=1.0, use_resource=True)
      loss_scale = _subclass(base)()
      opt = _CLASSES[which][0](
          tf.compat.v1.train.GradientDescentOptimizer(0.5), loss_scale)
      train_op = opt.minimize(2.0 * w)
      scale = loss_scale()
      # The train op's collection differs by design: TensorFlow's wrapper
      # hands a loss scale that is not its DynamicLossScale's to the inner
      # optimizer unconsulted, ours runs its update(grads) with the step.
      found[which] = (sorted(_names(opt.variables())), {
          key: names for key, names in _collections(graph).items()
          if key != tf.compat.v1.GraphKeys.TRAIN_OP})
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(loss_scale._scale.assign(16.0))
        session.run(train_op)
        assert session.run(w) == 0.0, which
        tf.compat.v1.train.Saver().save(session, str(tmp_path / which))
    with graph.as_default(), tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, str(tmp_path / which))
      assert session.run(scale) == 16.0, which
  assert found[OURS] == found[THEIRS]
  assert found[OURS][0] == ['my_count:0', 'my_scale:0']
