"""Checkpoints of TF 2.4-2.15's `LossScaleOptimizer` on Keras 3, against tf_keras.

A model of two Dense layers trains in a custom loop with Adam or with SGD
and momentum (two slot lists, or one per variable), one step overflowing
and skipped; the model and the optimizer go in one `tf.train.Checkpoint`,
which a fresh model and optimizer restore, before or after the optimizer is
built, with or without a MirroredStrategy. After the restore the weights,
every slot of every variable (looked up by the variable), the loss scale,
its good steps and the step count are the writer's, and one more step
lands where the writer's own next step did.

The weights are saved by name (`kernel_1`, ...): tf_keras's and Keras 3's
models name their layers' dependencies differently, which is Keras's
business; the optimizer's part is this library's.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

import versions

versions.KERAS_TF_KERAS_CHECKPOINTS.require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import tf_keras
from tf_loss_scale.keras import keras3 as keras3_form
from tf_loss_scale.keras import mixed_precision
from tf_loss_scale.keras.mixed_precision import shared_name
# pylint: enable=g-import-not-at-top,wrong-import-order

INF = float('inf')
# What the loss is multiplied by at each step: the second step overflows
# any scale and is skipped; with a growth every 2 steps, the scale ends at
# 2**10 (halved, then doubled) after 1 good step, and 5 steps counted.
_FACTORS = (1.0, INF, 1.0, 0.5, 1.0)
_FINITE_FACTORS = (1.0, 0.5, 1.0)
_SCALE = dict(initial_scale=2.0**10, dynamic_growth_steps=2)
_X = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
_WEIGHTS = {
    'kernel_1': np.array([[0.5, -0.25, 0.75], [-0.5, 0.25, 1.0]]),
    'bias_1': np.array([0.1, -0.2, 0.3]),
    'kernel_2': np.array([[0.5, -1.0], [0.25, 0.5], [-0.75, 0.125]]),
    'bias_2': np.array([0.05, -0.05]),
}
_NAMES = tuple(_WEIGHTS)
# Each optimizer's slot lists, by the name both Keras give them.
_OPTIMIZERS = {
    'adam': (lambda k: k.optimizers.Adam(0.01), ('_momentums', '_velocities')),
    'sgd_momentum': (lambda k: k.optimizers.SGD(0.05, momentum=0.9),
                     ('momentums',)),
}


class _Run:
  """A two-layer model and an optimizer of one Keras, trained in a loop.

  `family` is 'tf_keras' (tf_keras's model and optimizer, wrapped in
  tf_keras's class) or 'ours' (Keras 3's, wrapped in this library's).
  """

  def __init__(self, family, optimizer, wrapped=True, strategy=None,
               start=None, scale=None,
               ours_class=mixed_precision.LossScaleOptimizer):
    self.family, self.wrapped = family, wrapped
    self.strategy = strategy or tf.distribute.get_strategy()
    k = tf_keras if family == 'tf_keras' else keras
    make_inner, self.slot_lists = _OPTIMIZERS[optimizer]
    with self.strategy.scope():
      self.model = k.Sequential([k.layers.Dense(3, activation='relu'),
                                 k.layers.Dense(2)])
      self.model(_X)
      inner = make_inner(k)
      if not wrapped:
        self.optimizer = inner
      elif family == 'tf_keras':
        self.optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
            inner, **(scale or _SCALE))
      else:
        self.optimizer = ours_class(inner, **(scale or _SCALE))
    self.inner = inner
    weights = self.model.trainable_variables
    self.weights = dict(zip(_NAMES, weights))
    for name, variable in self.weights.items():
      variable.assign((_WEIGHTS if start is None else start)[name])
    self._step = tf.function(self._replica_step)

  def checkpoint(self):
    return tf.train.Checkpoint(model=tf.train.Checkpoint(**self.weights),
                               optimizer=self.optimizer)

  def build(self):
    with self.strategy.scope():
      self.optimizer.build(list(self.weights.values()))

  def _replica_step(self, factor):

    def step():
      variables = list(self.weights.values())
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(self.model(_X)) * factor
        if self.wrapped:
          loss = self.optimizer.get_scaled_loss(loss)
      grads = tape.gradient(loss, variables)
      if self.wrapped:
        grads = self.optimizer.get_unscaled_gradients(grads)
      self.optimizer.apply_gradients(zip(grads, variables))

    self.strategy.run(step)

  def train(self, factors):
    for factor in factors:
      self._step(tf.constant(factor))

  def slot(self, slot_list, variable):
    """The slot of `variable` in `slot_list`, found by the variable."""
    if self.family == 'tf_keras':
      index = self.inner._index_dict[self.inner._var_key(variable)]  # pylint: disable=protected-access
    else:
      index = self.inner._get_variable_index(variable)  # pylint: disable=protected-access
    return getattr(self.inner, slot_list)[index]

  def state(self):
    """Weights, slots by variable, and the counters, as plain values."""
    state = {name: _value(v) for name, v in self.weights.items()}
    for slot_list in self.slot_lists:
      for name, variable in self.weights.items():
        state[f'{slot_list}[{name}]'] = _value(self.slot(slot_list, variable))
    state['iterations'] = int(_value(self.optimizer.iterations))
    if self.wrapped:
      state['loss_scale'] = float(_value(self.optimizer.loss_scale))
      state['good_steps'] = int(_value(self.optimizer.dynamic_counter))
    return state


def _value(x):
  if isinstance(x, keras.Variable):
    x = x.value  # Its tf.Variable.
  return np.asarray(tf.convert_to_tensor(x))


def _assert_same_state(actual, expected):
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(actual[name], value, rtol=1e-6, atol=1e-7,
                               err_msg=name)


def _zeros():
  return {name: np.zeros_like(value) for name, value in _WEIGHTS.items()}


def _write(run, directory):
  """Saves `run` and steps it once more; the saved state and the next."""
  path = run.checkpoint().write(str(directory / 'checkpoint'))
  saved = run.state()
  run.train([1.0])
  return path, saved, run.state()


def _restore(run, path, build_first):
  """Restores `path` into `run`, building its optimizer before or after."""
  if build_first:
    run.build()
  status = run.checkpoint().read(path)
  if not build_first:
    run.build()  # Restores the optimizer's values left for its variables.
  return status


def _status(status):
  """(all of this program's objects matched, all of the checkpoint used)."""
  verdicts = []
  for check in (status.assert_existing_objects_matched,
                status.assert_consumed):
    try:
      check()
      verdicts.append(True)
    except AssertionError:
      verdicts.append(False)
  status.expect_partial()
  return tuple(verdicts)


def _assert_whole(status):
  """Every value of the file is used, every object of the program matched.

  (Keras's layout holds the wrapper's own step count and learning rate,
  constants that tf_keras's file has no place for: a wrapper following
  tf_keras's class leaves them out of its checkpoints.)
  """
  status.assert_existing_objects_matched()
  status.assert_consumed()


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
@pytest.mark.parametrize('optimizer', list(_OPTIMIZERS))
@pytest.mark.parametrize('ours_class', [mixed_precision.LossScaleOptimizer,
                                        shared_name.LossScaleOptimizer],
                         ids=['tf24_class', 'under_keras_name'])
def test_tf_keras_checkpoint_restores_whole_into_ours(optimizer, build_first,
                                                      ours_class, tmp_path):
  source = _Run('tf_keras', optimizer)
  source.train(_FACTORS)
  path, saved, after_next_step = _write(source, tmp_path)
  assert (saved['loss_scale'], saved['good_steps'],
          saved['iterations']) == (1024.0, 1, 5)

  # The class under Keras's name, constructed as Keras's: reading tf_keras's
  # file makes it tf_keras's.
  target = _Run('ours', optimizer, start=_zeros(), ours_class=ours_class)
  status = _restore(target, path, build_first)
  _assert_whole(status)
  _assert_same_state(target.state(), saved)
  target.train([1.0])
  _assert_same_state(target.state(), after_next_step)


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
@pytest.mark.parametrize('optimizer', list(_OPTIMIZERS))
def test_tf_keras_checkpoint_restores_whole_under_a_mirrored_strategy(
    optimizer, build_first, mirrored_strategy, tmp_path):
  source = _Run('tf_keras', optimizer, strategy=mirrored_strategy)
  source.train(_FACTORS)
  path, saved, after_next_step = _write(source, tmp_path)
  assert (saved['loss_scale'], saved['good_steps'],
          saved['iterations']) == (1024.0, 1, 5)

  target = _Run('ours', optimizer, strategy=mirrored_strategy,
                start=_zeros())
  status = _restore(target, path, build_first)
  _assert_whole(status)
  _assert_same_state(target.state(), saved)
  target.train([1.0])
  _assert_same_state(target.state(), after_next_step)


def test_tf_keras_class_cannot_read_what_ours_writes(tmp_path):
  # Keras's layout, which this class writes: tf_keras's class reads its
  # float loss scale count (`step_counter`) where Keras saved an integer,
  # and fails (documented in docs/differences.md; users move forward).
  source = _Run('ours', 'adam')
  source.train(_FACTORS)
  path = source.checkpoint().write(str(tmp_path / 'checkpoint'))
  target = _Run('tf_keras', 'adam', start=_zeros())
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='optimizer/step_counter'):
    _restore(target, path, build_first=True)


@pytest.mark.parametrize('strategy', ['default', 'mirrored'])
@pytest.mark.parametrize('writer,wrapped,reader', [
    ('tf_keras', True, 'tf_keras'), ('tf_keras', True, 'ours'),
    ('ours', True, 'ours'), ('ours', False, 'ours')],
                         ids=['tf_keras', 'tf_keras_to_ours', 'ours',
                              'ours_bare'])
def test_the_scale_and_step_count_restore_before_the_first_step(
    writer, wrapped, reader, strategy, request, tmp_path):
  # As tf_keras's class, whose scale variables exist from its construction:
  # right after the restore, before any build or step, the scale and its
  # good steps are the checkpoint's (not the reader's initial 8), or, from
  # a bare optimizer's checkpoint, the reader's own fresh ones.
  strategy = (request.getfixturevalue('mirrored_strategy')
              if strategy == 'mirrored' else None)
  source = _Run(writer, 'sgd_momentum', wrapped=wrapped, strategy=strategy)
  # (Keras 3's bare optimizers cannot build inside a function under a
  # MirroredStrategy.)
  source.build()
  source.train(_FACTORS if wrapped else _FINITE_FACTORS)
  path = source.checkpoint().write(str(tmp_path / 'checkpoint'))
  target = _Run(reader, 'sgd_momentum', strategy=strategy, start=_zeros(),
                scale=dict(initial_scale=8.0, dynamic_growth_steps=2))
  target.checkpoint().read(path).expect_partial()
  opt = target.optimizer
  assert not hasattr(target.inner, 'momentums')  # Not built.
  restored = (float(_value(opt.loss_scale)),
              int(_value(opt.dynamic_counter)), int(_value(opt.iterations)))
  assert restored == ((1024.0, 1, 5) if wrapped else (8.0, 0, 3))


def _without_loss_scale(state):
  return {k: v for k, v in state.items()
          if k not in ('loss_scale', 'good_steps')}


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
@pytest.mark.parametrize('optimizer', list(_OPTIMIZERS))
@pytest.mark.parametrize('family', ['tf_keras', 'ours'])
def test_a_bare_optimizers_checkpoint_restores_into_the_wrapper(
    family, optimizer, build_first, tmp_path):
  # tf_keras's class restores its inner optimizer's checkpoint: slots and
  # step count, its loss scale starting afresh (which neither status check
  # accepts: the scale is not in the checkpoint). Ours, around Keras 3's
  # optimizer, does the same with Keras 3's.
  bare = _Run(family, optimizer, wrapped=False)
  bare.train(_FINITE_FACTORS)
  path, saved, after_next_step = _write(bare, tmp_path)

  wrapped = _Run(family, optimizer, start=_zeros())
  status = _restore(wrapped, path, build_first)
  assert _status(status) == (False, False)
  restored = wrapped.state()
  assert (restored['loss_scale'], restored['good_steps']) == (1024.0, 0)
  _assert_same_state(_without_loss_scale(restored), saved)
  # A finite step at a scale of 2**10 applies what the bare one applied.
  wrapped.train([1.0])
  stepped = wrapped.state()
  assert (stepped['loss_scale'], stepped['good_steps']) == (1024.0, 1)
  _assert_same_state(_without_loss_scale(stepped), after_next_step)


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
@pytest.mark.parametrize('optimizer', list(_OPTIMIZERS))
def test_tf_keras_wrappers_checkpoint_restores_into_its_bare_optimizer(
    optimizer, build_first, tmp_path):
  # tf_keras's own interchange, which the reading above follows: its bare
  # optimizer takes its slots and step count from its wrapper's checkpoint;
  # the loss scale stays unused (`assert_consumed` fails, every object of
  # the program is matched).
  wrapped = _Run('tf_keras', optimizer)
  wrapped.train(_FACTORS)
  path, saved, after_next_step = _write(wrapped, tmp_path)

  bare = _Run('tf_keras', optimizer, wrapped=False, start=_zeros())
  status = _restore(bare, path, build_first)
  assert _status(status) == (True, False)
  _assert_same_state(bare.state(), _without_loss_scale(saved))
  bare.train([1.0])
  _assert_same_state(bare.state(), _without_loss_scale(after_next_step))


def test_a_bare_tf_keras_optimizers_checkpoint_restores_into_ours(tmp_path):
  bare = _Run('tf_keras', 'adam', wrapped=False)
  bare.train(_FINITE_FACTORS)
  path, saved, after_next_step = _write(bare, tmp_path / 'bare')
  ours = _Run('ours', 'adam', start=_zeros())
  assert _status(_restore(ours, path, build_first=False)) == (False, False)
  _assert_same_state(_without_loss_scale(ours.state()), saved)
  ours.train([1.0])
  _assert_same_state(_without_loss_scale(ours.state()),
                     _without_loss_scale(after_next_step))


def _paths(path):
  """Every path of names to a saved value in a checkpoint's object graph."""
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor(
      '_CHECKPOINTABLE_OBJECT_GRAPH'))
  found, queue = set(), [(0, ())]
  while queue:
    node_id, names = queue.pop()
    node = graph.nodes[node_id]
    if node.attributes:
      found.add('/'.join(names))
    if len(names) < 4:  # Deep enough for these layouts; no cycles.
      queue.extend((child.node_id, names + (child.local_name,))
                   for child in node.children)
  return found


def _keras_protocol_run(cls, factors):
  """Keras's custom loop (`scale_loss`, `apply`) with `cls`, Adam inside."""
  weights = {name: keras.Variable(value.astype(np.float32), name=name)
             for name, value in _WEIGHTS.items()}
  optimizer = cls(keras.optimizers.Adam(0.01), **_SCALE)
  _keras_protocol_steps(weights, optimizer, factors)
  return weights, optimizer


def _keras_protocol_steps(weights, optimizer, factors):
  variables = list(weights.values())
  for factor in factors:
    with tf.GradientTape() as tape:
      hidden = tf.nn.relu(tf.matmul(_X, weights['kernel_1']) +
                          weights['bias_1'])
      out = tf.matmul(hidden, weights['kernel_2']) + weights['bias_2']
      loss = optimizer.scale_loss(tf.reduce_sum(out) * factor)
    optimizer.apply(tape.gradient(loss, variables), variables)


def _adam_slot(optimizer, slots, variable):
  inner = optimizer.inner_optimizer
  return _value(getattr(inner, slots)[inner._get_variable_index(variable)])  # pylint: disable=protected-access


def test_the_layout_and_values_are_keras_s(tmp_path):
  # Every path Keras's class gives a value, ours gives it, with the same
  # value; nothing else.
  written = {}
  for family, cls in (('keras', keras.optimizers.LossScaleOptimizer),
                      ('ours', mixed_precision.LossScaleOptimizer)):
    weights, optimizer = _keras_protocol_run(cls, _FACTORS)
    written[family] = tf.train.Checkpoint(
        model=tf.train.Checkpoint(**weights), optimizer=optimizer).write(
            str(tmp_path / family))
  assert _paths(written['ours']) == _paths(written['keras'])
  assert {'optimizer/inner_optimizer/_iterations', 'optimizer/_iterations',
          'optimizer/dynamic_scale', 'optimizer/step_counter',
          'model/kernel_1'} <= _paths(written['ours'])
  listed = {family: dict(tf.train.list_variables(path))
            for family, path in written.items()}
  assert listed['ours'] == listed['keras']
  for name in listed['keras']:
    if name == '_CHECKPOINTABLE_OBJECT_GRAPH':
      continue
    np.testing.assert_array_equal(
        tf.train.load_variable(written['ours'], name),
        tf.train.load_variable(written['keras'], name), err_msg=name)
  assert tf.train.load_variable(
      written['ours'],
      'optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE') == 4


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
@pytest.mark.parametrize('writer,reader', [('keras', 'ours'),
                                           ('ours', 'keras')])
def test_keras_s_class_and_ours_read_each_others_checkpoints_whole(
    writer, reader, build_first, tmp_path):
  # Keras's layout in both: the inner step count, learning rate, Adam's
  # moments, the scale and its counter come back, and the next step lands
  # where the writer's did. (Before, `_iterations` and `_learning_rate` of
  # Keras's file, the wrapper's constants, were read as the inner's: 0.)
  classes = {'keras': keras.optimizers.LossScaleOptimizer,
             'ours': mixed_precision.LossScaleOptimizer}
  weights, source = _keras_protocol_run(classes[writer], _FACTORS)
  path = tf.train.Checkpoint(model=tf.train.Checkpoint(**weights),
                             optimizer=source).write(str(tmp_path / 'ck'))

  target_weights, target = _keras_protocol_run(classes[reader], ())
  if build_first:
    target.build(list(target_weights.values()))
  status = tf.train.Checkpoint(model=tf.train.Checkpoint(**target_weights),
                               optimizer=target).read(path)
  if not build_first:
    target.build(list(target_weights.values()))
  status.assert_consumed()
  inner = target.inner_optimizer
  assert int(_value(inner.iterations)) == 4
  assert float(_value(inner.learning_rate)) == pytest.approx(0.01)
  assert (float(_value(target.dynamic_scale)),
          int(_value(target.step_counter))) == (1024.0, 1)
  for name, variable in target_weights.items():
    np.testing.assert_array_equal(_value(variable), _value(weights[name]))
    for slots in ('_momentums', '_velocities'):
      np.testing.assert_array_equal(
          _adam_slot(target, slots, variable),
          _adam_slot(source, slots, weights[name]), err_msg=slots)
  for weights_of, optimizer in ((weights, source), (target_weights, target)):
    _keras_protocol_steps(weights_of, optimizer, [1.0])
  for name, variable in target_weights.items():
    np.testing.assert_array_equal(_value(variable), _value(weights[name]))


_SAME_ORDER = [
    ('Adadelta', {}), ('Adagrad', {}), ('Adam', {}), ('Adam', {'amsgrad': True}),
    ('AdamW', {}), ('AdamW', {'amsgrad': True}), ('Adamax', {}), ('Ftrl', {}),
    ('Lion', {}), ('Nadam', {}), ('RMSprop', {'momentum': 0.9}),
    ('RMSprop', {'centered': True}), ('SGD', {'momentum': 0.9})]


@pytest.mark.parametrize('name,options', _SAME_ORDER)
def test_keras_3_optimizers_read_by_position_order_slots_as_tf_keras(
    name, options):
  # The library reads tf_keras's `_variables/{i}` into these by position:
  # each slot there must be the same (list, variable) in both Keras.
  from tf_loss_scale.keras.mixed_precision import tf_keras_checkpoints  # pylint: disable=g-import-not-at-top
  assert name in tf_keras_checkpoints._SAME_ORDER_AS_TF_KERAS  # pylint: disable=protected-access
  shapes = [(2, 3), (3,), (3, 2), (2,)]
  orders = []
  for k, make in ((tf_keras, tf.Variable), (keras, keras.Variable)):
    optimizer = getattr(k.optimizers, name)(**options)
    optimizer.build([make(tf.zeros(shape)) for shape in shapes])
    where = {}
    for list_name, child in optimizer._trackable_children().items():  # pylint: disable=protected-access
      if list_name in ('_variables', '_trainable_variables'):
        continue
      entries = child if isinstance(child, (list, tuple)) else [child]
      for index, entry in enumerate(entries):
        where.setdefault(id(entry), (list_name.lstrip('_'), index))
    counters = (optimizer.iterations, getattr(optimizer, '_learning_rate',
                                              None))
    orders.append([where.get(id(v)) for v in optimizer.variables
                   if not any(v is c for c in counters)])
  assert orders[0] == orders[1][:len(orders[0])]
  assert None not in orders[0]


def test_tf_keras_adafactor_by_position_is_refused_with_nothing_restored(
    tmp_path):
  # Keras 3's Adafactor keeps other variables than tf_keras's (its factored
  # moments of 1-D variables): positions cannot be mapped, and nothing of
  # the checkpoint is restored.
  source_weights = [tf.Variable(tf.fill(shape, 0.5))
                    for shape in ((2, 3), (3,))]
  source = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.Adafactor())
  source.build(source_weights)
  path = tf.train.Checkpoint(weights=source_weights, optimizer=source).write(
      str(tmp_path / 'adafactor'))
  for build_first in (True, False):
    weights = [keras.Variable(np.zeros(shape, np.float32))
               for shape in ((2, 3), (3,))]
    ours = mixed_precision.LossScaleOptimizer(keras.optimizers.Adafactor())
    checkpoint = tf.train.Checkpoint(weights=weights, optimizer=ours)
    with pytest.raises(ValueError, match=r'Adafactor.*optimizer/_variables/'
                       r'1.*wrong variables.*Restore the checkpoint with '
                       r'tf_keras'):
      if build_first:
        ours.build(weights)
        checkpoint.read(path)
      else:
        checkpoint.read(path)
        ours.build(weights)
    if build_first:
      assert all(not np.any(_value(w)) for w in weights)
    assert int(_value(ours.iterations)) == 0


@pytest.mark.parametrize('build_first', [True, False],
                         ids=['built', 'deferred'])
def test_checkpoints_of_the_earlier_layout_still_restore(build_first,
                                                         tmp_path):
  # Before it took tf_keras's layout this class saved Keras 3's (the inner
  # optimizer under `inner_optimizer`, `dynamic_scale`, `step_counter`)
  # with tf_keras's loss scale names and the inner count at `_iterations`
  # added: made here from the Keras 3 form, as that class was.
  from tf_loss_scale import private_api  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras import keras3  # pylint: disable=g-import-not-at-top
  source = _Run('ours', 'adam', wrapped=False)
  earlier = keras3.LossScaleOptimizer(source.inner, **_SCALE)
  variables = list(source.weights.values())
  for factor in _FACTORS:
    with tf.GradientTape() as tape:
      loss = earlier.scale_loss(tf.reduce_sum(source.model(_X)) * factor)
    earlier.apply(tape.gradient(loss, variables), variables)
  names = tf.Module()
  names.current_loss_scale = earlier.dynamic_scale
  names.good_steps = earlier.step_counter
  private_api.name_dependencies(earlier, loss_scale=names,
                                _iterations=source.inner.iterations)
  path = tf.train.Checkpoint(model=tf.train.Checkpoint(**source.weights),
                             optimizer=earlier).write(str(tmp_path / 'ck'))
  saved = source.state()  # Keras 3's protocol counts applied steps: 4.
  assert saved['iterations'] == 4

  target = _Run('ours', 'adam', start=_zeros())
  _restore(target, path, build_first).assert_existing_objects_matched()
  _assert_same_state(_without_loss_scale(target.state()), saved)
  assert (target.state()['loss_scale'], target.state()['good_steps']) == (
      1024.0, 1)


@pytest.mark.parametrize('kind', ['lion', 'schedule'])
def test_tf_keras_lion_and_a_schedule_restore_whole(kind, tmp_path):
  # tf_keras's Lion names its slot list `momentums`, Keras 3's `_momentums`;
  # with a schedule tf_keras saves `_current_learning_rate`, which Keras 3
  # computes and does not keep (left unused, as the status says).
  make = {'lion': lambda k: k.optimizers.Lion(0.01),
          'schedule': lambda k: k.optimizers.Adam(
              k.optimizers.schedules.ExponentialDecay(0.01, 2, 0.5))}[kind]
  source_weights = [tf.Variable(np.array([1.0, -2.0], np.float32))]
  source = tf_keras.mixed_precision.LossScaleOptimizer(make(tf_keras),
                                                       initial_scale=8.0)
  for _ in range(3):
    with tf.GradientTape() as tape:
      loss = source.get_scaled_loss(tf.reduce_sum(
          source_weights[0] * np.array([1.0, 3.0], np.float32)))
    source.apply_gradients(zip(source.get_unscaled_gradients(
        tape.gradient(loss, source_weights)), source_weights))
  path = tf.train.Checkpoint(w=source_weights, optimizer=source).write(
      str(tmp_path / kind))
  weights = [keras.Variable(np.zeros(2, np.float32))]
  ours = mixed_precision.LossScaleOptimizer(make(keras), initial_scale=8.0)
  ours.build(weights)
  tf.train.Checkpoint(w=weights, optimizer=ours).read(path).expect_partial()
  theirs = [_value(v) for v in source.inner_optimizer.variables]
  inner = ours.inner_optimizer
  restored = [_value(v) for v in inner.variables
              if v is not getattr(inner, '_learning_rate', None)]
  assert len(restored) == len(theirs) == (2 if kind == 'lion' else 3)
  assert int(restored[0]) == 3
  for a, b in zip(restored[1:], theirs[1:]):
    assert np.any(b)
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(_value(weights[0]), _value(source_weights[0]))


# The resume idiom, for every Keras 3 form: what wrote the file, what reads
# it, and the loop each trains with (the scaling calls of its generation).
_WRITERS = {
    'tf_keras_class': ('tf_keras', lambda inner: (
        tf_keras.mixed_precision.LossScaleOptimizer(inner, **_SCALE)), 'tf24'),
    'keras_class': ('keras', lambda inner: (
        keras.optimizers.LossScaleOptimizer(inner, **_SCALE)), 'keras3'),
    'ours': ('keras', lambda inner: (
        mixed_precision.LossScaleOptimizer(inner, **_SCALE)), 'tf24'),
}
_READERS = {
    'tf24_class': (mixed_precision.LossScaleOptimizer, 'tf24'),
    # As under `install()`: a TF 2.4-2.15 program and a Keras 3 one.
    'under_keras_name': (shared_name.LossScaleOptimizer, 'tf24'),
    'under_keras_name_keras3_loop': (shared_name.LossScaleOptimizer,
                                     'keras3'),
    'keras3_form': (keras3_form.LossScaleOptimizer, 'keras3'),
}


class _Resume:
  """A model and a wrapped Adam trained in a `tf.function` step, as programs
  resume: the model made, the optimizer made and not built (unless asked),
  the checkpoint read, then training, whose first step builds it."""

  def __init__(self, family, make_wrapper, loop, start=None):
    self.k = tf_keras if family == 'tf_keras' else keras
    self.model = self.k.Sequential([self.k.layers.Dense(3, activation='relu'),
                                    self.k.layers.Dense(2)])
    self.model(_X)
    for variable, name in zip(self.model.trainable_variables, _NAMES):
      variable.assign((_WEIGHTS if start is None else start)[name])
    self.optimizer = make_wrapper(self.k.optimizers.Adam(0.01))
    self.loop = loop
    self.step = tf.function(self._step)

  def _step(self, factor):
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(self.model(_X)) * factor
      if self.loop == 'tf24':
        loss = self.optimizer.get_scaled_loss(loss)
      else:
        loss = self.optimizer.scale_loss(loss)
    grads = tape.gradient(loss, variables)
    if self.loop == 'tf24':
      grads = self.optimizer.get_unscaled_gradients(grads)
    self.optimizer.apply_gradients(zip(grads, variables))

  def checkpoint(self):
    return tf.train.Checkpoint(weights=self.model.trainable_variables,
                               optimizer=self.optimizer)

  def state(self):
    """Weights, Adam's moments of each weight, step count and scale."""
    opt = self.optimizer
    inner = opt.inner_optimizer
    state = {name: _value(v) for name, v in zip(
        _NAMES, self.model.trainable_variables)}
    for slots in ('_momentums', '_velocities'):
      for name, variable in zip(_NAMES, self.model.trainable_variables):
        if self.k is tf_keras:
          index = inner._index_dict[inner._var_key(variable)]  # pylint: disable=protected-access
        else:
          index = inner._get_variable_index(variable)  # pylint: disable=protected-access
        state[f'{slots}[{name}]'] = _value(getattr(inner, slots)[index])
    state['iterations'] = int(_value(inner.iterations))
    if self.k is tf_keras:
      scale, counter = opt.loss_scale, opt.dynamic_counter
    else:
      scale, counter = opt.dynamic_scale, opt.step_counter
    state['loss_scale'] = float(_value(scale))
    state['good_steps'] = int(_value(counter))
    return state


def _resumes():
  """(writer, reader, built) of every resume, the fast tier's a few.

  Not here: a reader of Keras 3's loop resuming a file of TensorFlow's,
  whose step count counted skipped steps (Keras's protocol counts applied
  ones, as Keras's class), and the Keras 3 form reading tf_keras's file
  (`test_the_keras_3_form_fails_on_tf_keras_s_file_as_keras_class`).
  """
  fast = {('tf_keras_class', 'under_keras_name', False),
          ('keras_class', 'keras3_form', False)}
  for writer, (_, _, writer_loop) in _WRITERS.items():
    for reader, (reader_class, reader_loop) in _READERS.items():
      if reader_loop == 'keras3' and writer_loop == 'tf24':
        continue
      if (writer == 'tf_keras_class' and
          reader_class is keras3_form.LossScaleOptimizer):
        continue
      for built in (False, True):
        yield pytest.param(
            writer, reader, built,
            marks=() if (writer, reader, built) in fast else pytest.mark.slow,
            id=f'{writer}-{reader}-{"built" if built else "unbuilt"}')


@pytest.mark.parametrize('writer,reader,built', list(_resumes()))
def test_a_resume_ends_where_the_writers_own_run_goes_on(writer, reader,
                                                         built, tmp_path):
  # The writer trains 5 steps (one skipped) and saves. The reader reads
  # that file into a fresh model and optimizer, unbuilt (the first step of
  # its training builds it) or built; one of TF 2.4-2.15's loop holds the
  # file's scale, counter and step count at once, as tf_keras's class. Each
  # trains 2 more steps in its own loop: the scale, its counter, Adam's
  # moments and step count, and the weights are where the writer's own 2
  # more steps take it.
  reader_class, reader_loop = _READERS[reader]
  family, make_writer, writer_loop = _WRITERS[writer]
  source = _Resume(family, make_writer, writer_loop)
  for factor in _FACTORS:
    source.step(tf.constant(factor))
  path = source.checkpoint().write(str(tmp_path / 'checkpoint'))
  saved = source.state()
  assert (saved['loss_scale'], saved['good_steps']) == (1024.0, 1)

  target = _Resume('keras', lambda inner: reader_class(
      inner, initial_scale=8.0, dynamic_growth_steps=2), reader_loop,
                   start=_zeros())
  if built:
    target.optimizer.build(target.model.trainable_variables)
  target.checkpoint().read(path).assert_existing_objects_matched()
  if reader_loop == 'tf24':
    # As under tf_keras's class, before the first step.
    opt = target.optimizer
    assert (float(_value(opt.loss_scale)), int(_value(opt.dynamic_counter)),
            int(_value(opt.iterations))) == (
                1024.0, 1, saved['iterations'])
  for factor in (1.0, 0.5):
    source.step(tf.constant(factor))
    target.step(tf.constant(factor))
  _assert_same_state(target.state(), source.state())


def test_the_keras_3_form_fails_on_tf_keras_s_file_as_keras_class(tmp_path):
  # Keras's class cannot read tf_keras's layout: the first step, which
  # builds it, raises on the file's float where its counter is an integer.
  # The drop-in fails there with it, not silently.
  family, make_writer, writer_loop = _WRITERS['tf_keras_class']
  source = _Resume(family, make_writer, writer_loop)
  for factor in _FACTORS:
    source.step(tf.constant(factor))
  path = source.checkpoint().write(str(tmp_path / 'checkpoint'))
  for reader_class in (keras.optimizers.LossScaleOptimizer,
                       keras3_form.LossScaleOptimizer):
    target = _Resume('keras', lambda inner, cls=reader_class: cls(inner),
                     'keras3', start=_zeros())
    target.checkpoint().read(path).expect_partial()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match='optimizer/_variables/2'):
      target.step(tf.constant(1.0))
