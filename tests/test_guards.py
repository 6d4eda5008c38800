"""One guard policy, on all four front ends (tf_loss_scale/guards.py).

Every rule is checked on the v1 wrapper, the Keras 3 form, and the
experimental form around a Keras 3 and around a Keras 2 optimizer:

- an optimizer is wrapped once (but by the Keras 3 form and the v1 wrapper,
  which take one another wrapper holds, as their peers do): not by two of
  ours
  (without searching the
  heap: the wrapper marks what it wraps), and a loss scale optimizer, ours
  or a peer's (Keras's, tf_keras's, TensorFlow's v1), is never wrapped;
- CentralStorageStrategy, ParameterServerStrategy and TPUStrategy are
  refused before anything is built, at construction and at each step;
- under a strategy, an inner optimizer made outside its scope is refused,
  at construction when the strategy is known, else at the step; a loss
  scale made outside it trains, as TensorFlow's did;
- a wrong optimizer type names what each form takes.

Messages start with the peer's words (tf_keras's for wrapping, TF 2.3's for
strategies, TensorFlow's v1 wrapper's for its type) and say what to do.
"""

import copy
import gc
import re
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import front_ends
import versions
import tf_loss_scale
from tf_loss_scale import guards

_ARGUMENT = {'v1': 'opt', 'keras3': 'inner_optimizer',
             'keras_mixed_precision': 'inner_optimizer',
             'experimental_keras3': 'optimizer',
             'experimental_keras2': 'optimizer'}
_WRAPPED_TWICE = ('^"{argument}" is already wrapped by a LossScaleOptimizer. '
                  'An optimizer can only be wrapped by a single '
                  'LossScaleOptimizer: .* holds .*Keep using that wrapper, or '
                  'create a new optimizer for this one.$')
_WRAPS_A_WRAPPER = ('^LossScaleOptimizer cannot wrap another '
                    'LossScaleOptimizer, but got: .* It is already a loss '
                    'scale optimizer: use it as it is, or pass .* a new '
                    'optimizer.$')
_UNSUPPORTED = ('^Loss scaling is not supported with the '
                'tf.distribute.Strategy: {name}. Try using a different '
                'Strategy, e.g. a MirroredStrategy \\(.*MirroredStrategy, '
                'MultiWorkerMirroredStrategy, OneDeviceStrategy and no '
                'strategy work\\).$')
_TPU = ('^Loss scaling is not supported with TPUStrategy. Loss scaling is '
        'unnecessary with TPUs, since they support bfloat16 instead of '
        'float16 and bfloat16 does not require loss scaling. You should '
        'remove the use of the LossScaleOptimizer when TPUs are used. .*'
        "'mixed_bfloat16' policy")
_OUTSIDE_SCOPE = ('the variables .* were created outside the scope of the '
                  'MirroredStrategy in use, so the replicas would not share '
                  'them. Create the inner optimizer inside '
                  '`with strategy.scope\\(\\):`')


def _wrap(front_end, inner):
  return front_end.wrap(inner, 8.0, 2)


# --- what is wrapped ----------------------------------------------------------


@pytest.mark.parametrize('first,second', [
    pytest.param(first, second, id=f'{first.name}-{second.name}',
                 marks=[first.needs.mark, second.needs.mark])
    for first, second in (
        (front_ends.KERAS3, front_ends.EXPERIMENTAL_KERAS3),
        (front_ends.KERAS3, front_ends.KERAS_MIXED_PRECISION),
        (front_ends.EXPERIMENTAL_KERAS3, front_ends.EXPERIMENTAL_KERAS3),
        (front_ends.EXPERIMENTAL_KERAS2, front_ends.EXPERIMENTAL_KERAS2))
])
def test_an_optimizer_one_of_ours_holds_is_refused(first, second):
  # As TF 2.3's experimental class (a ValueError of its own) and tf_keras's
  # refused it.
  inner = first.inner(0.1)
  holder = _wrap(first, inner)
  with pytest.raises(ValueError, match=_WRAPPED_TWICE.format(
      argument=_ARGUMENT[second.name])) as refused:
    _wrap(second, inner)
  assert type(holder).__name__ in str(refused.value)


@pytest.mark.parametrize('first', front_ends.params(
    front_ends.KERAS3, front_ends.EXPERIMENTAL_KERAS3))
def test_the_drop_in_wraps_an_optimizer_another_wrapper_holds_as_keras(first):
  # Keras's class takes it: each wrapper trains the optimizer as it would
  # alone.
  inner = first.inner(0.1)
  holder = _wrap(first, inner)
  keras.optimizers.LossScaleOptimizer(inner)
  assert _wrap(front_ends.KERAS3, inner).inner_optimizer is inner
  assert holder.inner_optimizer is inner


def test_the_v1_wrapper_wraps_an_optimizer_another_wrapper_holds():
  # As TensorFlow's v1 wrapper (TF 1.15 and 2.x) takes it.
  inner = front_ends.V1.inner(0.1)
  holder = _wrap(front_ends.V1, inner)
  tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(inner,
                                                                 'dynamic')
  second = _wrap(front_ends.V1, inner)
  assert second._optimizer is holder._optimizer is inner  # pylint: disable=protected-access


@pytest.mark.parametrize('front_end', front_ends.ALL)
def test_an_optimizer_whose_wrapper_was_dropped_can_be_wrapped_again(
    front_end):
  inner = front_end.inner(0.1)
  _wrap(front_end, inner)  # Dropped at once.
  assert _wrap(front_end, inner).inner_optimizer is inner


@pytest.mark.parametrize('front_end', front_ends.params(
    front_ends.KERAS_MIXED_PRECISION, front_ends.EXPERIMENTAL_KERAS3,
    front_ends.EXPERIMENTAL_KERAS2))
def test_construction_does_not_search_the_heap(front_end, monkeypatch):
  def refuse(*args):
    raise AssertionError(f'the heap was searched: {args!r:.80}')

  inner = front_end.inner(0.1)
  monkeypatch.setattr(gc, 'get_referrers', refuse)
  monkeypatch.setattr(gc, 'collect', refuse)
  holder = _wrap(front_end, inner)
  with pytest.raises(ValueError, match=_WRAPPED_TWICE.format(
      argument=_ARGUMENT[front_end.name])):
    _wrap(front_end, inner)
  assert holder.inner_optimizer is inner


@pytest.mark.parametrize('front_end', front_ends.ALL)
@pytest.mark.parametrize('make_wrapper', ['ours', 'peer'])
def test_a_loss_scale_optimizer_is_never_wrapped(front_end, make_wrapper):
  inner = front_end.inner(0.1)
  wrapper = (_wrap(front_end, inner) if make_wrapper == 'ours' else
             front_end.peer(inner))
  with pytest.raises(ValueError, match=_WRAPS_A_WRAPPER):
    _wrap(front_end, wrapper)


@(versions.KERAS_3 & versions.KERAS_2).mark
def test_each_form_names_what_it_takes_and_where_to_go():
  tf_keras = versions.keras_2()
  v1_optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  experimental = tf_loss_scale.keras.experimental.LossScaleOptimizer
  with pytest.raises(TypeError) as refused:
    experimental(v1_optimizer, 'dynamic')
  assert str(refused.value).startswith(
      '"optimizer" must be an instance of OptimizerV2, but got: ')
  for expected in ('wraps a Keras 3 optimizer (keras.optimizers.*) or a '
                   'Keras 2 optimizer', 'GradientDescentOptimizer',
                   'use tf_loss_scale.MixedPrecisionLossScaleOptimizer'):
    assert expected in str(refused.value)

  with pytest.raises(TypeError) as refused:
    tf_loss_scale.keras.LossScaleOptimizer(v1_optimizer)
  assert str(refused.value).startswith(
      '"inner_optimizer" must be a Keras 3 optimizer, but got: ')
  assert ('For a tf.compat.v1.train.Optimizer use '
          'tf_loss_scale.MixedPrecisionLossScaleOptimizer(opt, loss_scale)'
          in str(refused.value))
  with pytest.raises(TypeError, match='For a Keras 2 optimizer use '
                     'tf_loss_scale.keras.experimental.LossScaleOptimizer'):
    tf_loss_scale.keras.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD())

  v1_wrapper = tf_loss_scale.MixedPrecisionLossScaleOptimizer
  with pytest.raises(ValueError) as refused:
    v1_wrapper(keras.optimizers.SGD(), 'dynamic')
  assert str(refused.value).startswith(
      '"opt" must be an instance of Optimizer, but got: <class ')
  assert ('For a Keras 3 optimizer use tf_loss_scale.keras.LossScaleOptimizer'
          in str(refused.value))
  with pytest.raises(ValueError, match='For a Keras 2 optimizer use '
                     'tf_loss_scale.keras.experimental.LossScaleOptimizer'):
    v1_wrapper(tf_keras.optimizers.legacy.SGD(), 'dynamic')
  with pytest.raises(ValueError, match="got: <class 'str'>"):
    v1_wrapper('sgd', 'dynamic')


# --- where a step may run -----------------------------------------------------


def _fake_strategy(monkeypatch, strategy_type):
  # No TPU or parameter servers here: an uninitialised instance stands in
  # for the current strategy; the guards must refuse it by type alone.
  fake = object.__new__(strategy_type)
  monkeypatch.setattr(tf.distribute, 'has_strategy', lambda: True)
  monkeypatch.setattr(tf.distribute, 'get_strategy', lambda: fake)


_REFUSED_TYPES = {
    'central_storage': tf.distribute.experimental.CentralStorageStrategy,
    'parameter_server': tf.distribute.experimental.ParameterServerStrategy,
    'tpu': tf.distribute.TPUStrategy,
}


@pytest.mark.parametrize('front_end', front_ends.ALL)
@pytest.mark.parametrize('strategy_name', sorted(_REFUSED_TYPES))
def test_unsupported_strategies_are_refused_at_construction(
    front_end, strategy_name, monkeypatch):
  inner = front_end.inner(0.1)
  loss_scale = tf_loss_scale.DynamicLossScale()
  strategy_type = _REFUSED_TYPES[strategy_name]
  _fake_strategy(monkeypatch, strategy_type)
  expected = (_TPU if strategy_name == 'tpu' else
              _UNSUPPORTED.format(name=strategy_type.__name__))
  with pytest.raises(ValueError, match=expected):
    if front_end.keras_state:
      front_end.wrap(inner, 2.0**15, 2000)
    elif front_end is front_ends.V1:
      tf_loss_scale.MixedPrecisionLossScaleOptimizer(inner, loss_scale)
    else:
      tf_loss_scale.keras.experimental.LossScaleOptimizer(inner, loss_scale)


@pytest.mark.parametrize('front_end', front_ends.ALL)
def test_central_storage_is_refused_at_the_step_before_anything_runs(
    front_end):
  opt = _wrap(front_end, front_end.inner(1.0))
  var = front_end.variable([1.0, 2.0], np.float32)
  front_end.apply(opt, [tf.constant([1.0, 1.0])], [var])
  before = front_end.state(opt)
  strategy = tf.distribute.experimental.CentralStorageStrategy()
  with strategy.scope():
    with pytest.raises(ValueError, match=_UNSUPPORTED.format(
        name='CentralStorageStrategy')):
      strategy.run(lambda: front_end.apply(opt, [tf.constant([1.0, 1.0])],
                                           [var]))
  assert front_end.state(opt) == before
  assert var.numpy().tolist() == [0.0, 1.0]


def _replica_step(front_end, opt, var, overflow):
  """One step in `strategy.run`: [1, 1] per replica, inf on the second if
  `overflow`."""
  replica = tf.distribute.get_replica_context().replica_id_in_sync_group
  grad = tf.where(tf.logical_and(overflow, replica > 0),
                  tf.constant([np.inf, 1.0]), tf.constant([1.0, 1.0]))
  front_end.apply(opt, [grad], [var])


@pytest.mark.parametrize('front_end', front_ends.params(
    front_ends.V1, front_ends.EXPERIMENTAL_KERAS3,
    front_ends.EXPERIMENTAL_KERAS2, on_replicas=True))
@pytest.mark.parametrize('in_function', [False, True],
                         ids=['eager', 'tf_function'])
def test_a_loss_scale_made_outside_the_scope_trains_as_one_made_inside(
    front_end, in_function, mirrored_strategy):
  # As TensorFlow's loss scales trained there (TF 2.3's experimental
  # wrapper and TensorFlow's v1 wrapper): its variables are read and
  # assigned in the cross-replica context, one value for every replica.
  def train(loss_scale):
    with mirrored_strategy.scope():
      inner = front_end.inner(1.0)
      if front_end is front_ends.V1:
        opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(inner,
                                                             loss_scale)
      else:
        opt = tf_loss_scale.keras.experimental.LossScaleOptimizer(
            inner, loss_scale)
      var = front_end.variable([1.0, 2.0], np.float32)
    step = lambda overflow: mirrored_strategy.run(
        _replica_step, args=(front_end, opt, var, overflow))
    step = tf.function(step) if in_function else step
    states = []
    for overflow in (True, False, False):
      step(tf.constant(overflow))
      states.append((front_end.state(opt), var.numpy().tolist()))
    return states

  outside = train(tf_loss_scale.DynamicLossScale(8.0, 2))
  with mirrored_strategy.scope():
    inside = train(tf_loss_scale.DynamicLossScale(8.0, 2))
  assert outside == inside
  # Skipped (one replica overflowed), then [1, 1] per replica, summed.
  assert [(s['scale'], s['good_steps']) for s, _ in outside] == [
      (4.0, 0), (4.0, 1), (8.0, 0)]
  assert [v for _, v in outside] == [[1.0, 2.0], [-1.0, 0.0], [-3.0, -2.0]]


@pytest.mark.parametrize('front_end', front_ends.params(
    front_ends.KERAS3, front_ends.EXPERIMENTAL_KERAS3))
def test_an_optimizer_made_outside_the_scope_is_refused_at_construction(
    front_end, mirrored_strategy):
  inner = front_end.inner(0.1)  # Keras 3 optimizers make variables at once.
  with mirrored_strategy.scope():
    with pytest.raises(ValueError, match=_OUTSIDE_SCOPE):
      _wrap(front_end, inner)


@pytest.mark.parametrize('front_end', front_ends.params(
    front_ends.KERAS3, front_ends.KERAS_MIXED_PRECISION,
    front_ends.EXPERIMENTAL_KERAS3))
def test_an_inner_optimizer_made_outside_the_scope_is_refused_at_the_step(
    front_end, mirrored_strategy):
  # Keras 3's optimizers make their variables at once, and refuse such a
  # step themselves ("Mixing different tf.distribute.Strategy objects").
  opt = _wrap(front_end, front_end.inner(1.0))
  with mirrored_strategy.scope():
    var = front_end.variable([1.0, 2.0], np.float32)
  front_end.build(opt, [var])
  before = front_end.state(opt)

  @tf.function
  def train_step():
    mirrored_strategy.run(
        lambda: front_end.apply(opt, [tf.constant([1.0, 1.0])], [var]))

  with pytest.raises(ValueError, match=_OUTSIDE_SCOPE):
    train_step()
  assert front_end.state(opt) == before
  assert var.numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize('front_end', front_ends.ON_REPLICAS)
def test_state_made_in_the_scope_trains(front_end, mirrored_strategy):
  with mirrored_strategy.scope():
    opt = _wrap(front_end, front_end.inner(1.0))
    var = front_end.variable([1.0, 2.0], np.float32)
    front_end.build(opt, [var])

  @tf.function
  def train_step():
    mirrored_strategy.run(
        lambda: front_end.apply(opt, [tf.constant([1.0, 1.0])], [var]))

  train_step()
  # [1, 1] on each replica, summed over two.
  assert var.numpy().tolist() == [-1.0, 0.0]
  assert front_end.state(opt)['good_steps'] == 1


def test_check_step_without_a_strategy_checks_nothing():
  guards.check_step('step()', [tf.Variable(1.0)])


def test_check_step_names_the_variables_made_outside_the_scope(
    mirrored_strategy):
  outside = tf.Variable(1.0, name='made_outside')
  with mirrored_strategy.scope():
    inside = tf.Variable(1.0, name='made_inside')
    with pytest.raises(ValueError) as refused:
      guards.check_step('step()', [inside, outside, 'ignored', None])
  assert str(refused.value).startswith(
      "step(): the variables ['made_outside:0'] were created outside the "
      'scope of the MirroredStrategy in use')


@versions.KERAS_3.mark
def test_check_step_reads_the_variables_of_optimizers(mirrored_strategy):
  keras_optimizer = keras.optimizers.SGD()
  with mirrored_strategy.scope():
    with pytest.raises(ValueError) as refused:
      guards.check_step('step()', [keras_optimizer])
  names = re.search(r'\[(.*)\]', str(refused.value)).group(1)
  assert 'iteration' in names


@versions.KERAS_3.mark
def test_a_dead_wrapper_in_a_reference_cycle_holds_until_collected():
  inner = keras.optimizers.SGD()
  gc.disable()
  try:
    wrapper = tf_loss_scale.keras.mixed_precision.LossScaleOptimizer(inner)
    wrapper.itself = wrapper
    dead = weakref.ref(wrapper)
    del wrapper  # Unreachable, but not freed until the collector runs.
    with pytest.raises(ValueError, match=_WRAPPED_TWICE.format(
        argument='inner_optimizer')):
      tf_loss_scale.keras.mixed_precision.LossScaleOptimizer(inner)
    gc.collect()
    assert dead() is None
    assert tf_loss_scale.keras.mixed_precision.LossScaleOptimizer(
        inner).inner_optimizer is inner
  finally:
    gc.enable()


@versions.KERAS_3.mark
def test_a_copy_of_a_wrapped_optimizer_is_not_held():
  inner = keras.optimizers.SGD()
  holder = tf_loss_scale.keras.LossScaleOptimizer(inner)
  twin = copy.deepcopy(inner)
  assert tf_loss_scale.keras.LossScaleOptimizer(twin).inner_optimizer is twin
  assert holder.inner_optimizer is inner
