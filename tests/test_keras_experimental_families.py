"""The experimental form is one class across Keras families.

`experimental.LossScaleOptimizer(optimizer, loss_scale)` builds the class
for the inner optimizer's family: Keras 3, Keras 2 legacy (OptimizerV2) or
Keras 2 new. These tests hold for every family present in this process
(Keras 2 is `tf.keras` on TensorFlow <= 2.15, `tf_keras` on 2.16+; Keras 3
needs 2.16+); an absent family's cases skip saying so.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_families
from keras_families import value
import tf_loss_scale
from tf_loss_scale.keras import experimental

LossScaleOptimizer = experimental.LossScaleOptimizer
FAMILIES = ['keras3', 'keras2_legacy', 'keras2']


def _keras(family):
  return keras_families.keras3() if family == 'keras3' else (
      keras_families.keras2())


def _sgd(family, *args, **kwargs):
  keras = _keras(family)
  optimizers = (keras.optimizers.legacy if family == 'keras2_legacy' else
                keras.optimizers)
  return optimizers.SGD(*args, **kwargs)


def _peer_class(family):
  keras = _keras(family)
  return (keras.optimizers.LossScaleOptimizer if family == 'keras3' else
          keras.mixed_precision.LossScaleOptimizer)


def _every_option():
  return tf_loss_scale.DynamicLossScale(
      initial_loss_scale=64.0, increment_period=7, multiplier=4.0,
      min_loss_scale=0.5, max_loss_scale=2.0**20, hysteresis=2,
      on_collapse='raise', collapse_patience=3)


@pytest.mark.parametrize('family', FAMILIES)
def test_isinstance_and_issubclass_agree(family):
  # Before: a metaclass made isinstance hold for every path, but the tf_keras
  # classes were not subclasses: issubclass said False.
  opt = LossScaleOptimizer(_sgd(family), 'dynamic')
  cls = type(opt)
  assert isinstance(opt, LossScaleOptimizer)
  assert issubclass(cls, LossScaleOptimizer)
  # The peer's loss scale optimizer: its compile keeps ours as it is.
  assert isinstance(opt, _peer_class(family))
  assert issubclass(cls, _peer_class(family))
  bare = _sgd(family)
  assert not isinstance(bare, LossScaleOptimizer)
  assert not issubclass(type(bare), LossScaleOptimizer)


def test_a_subclass_of_the_public_class_is_refused_saying_what_to_do():
  class MyLossScaleOptimizer(LossScaleOptimizer):
    pass

  with pytest.raises(TypeError, match="subclass the family's class"):
    MyLossScaleOptimizer(_sgd('keras2'), 'dynamic')


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('loss_scale', ['every_option', 'fixed'])
def test_config_round_trips_through_the_public_class_in_its_family(
    family, loss_scale):
  # Before: a tf_keras legacy wrapper's config came back as a Keras 3
  # wrapper around a Keras 3 SGD, and a new tf_keras wrapper's raised.
  scale = _every_option() if loss_scale == 'every_option' else 12.0
  opt = LossScaleOptimizer(_sgd(family, 0.25, momentum=0.5), scale)
  config = opt.get_config()
  assert config['optimizer_family'] == family
  clone = LossScaleOptimizer.from_config(config)
  assert type(clone) is type(opt)
  assert type(clone.inner_optimizer) is type(opt.inner_optimizer)
  assert clone.get_config() == config
  assert clone.inner_optimizer is not opt.inner_optimizer
  if loss_scale == 'every_option':
    assert clone.loss_scale.get_config() == {
        'initial_loss_scale': 64.0, 'increment_period': 7, 'multiplier': 4.0,
        'min_loss_scale': 0.5, 'max_loss_scale': 2.0**20, 'hysteresis': 2,
        'on_collapse': 'raise', 'collapse_patience': 3}
  else:
    assert float(clone.loss_scale()) == 12.0
  assert float(value(clone.learning_rate)) == 0.25


def test_tf23_config_without_a_family_is_of_the_keras_tf_keras_is():
  # TF 2.3 wrote {'optimizer', 'loss_scale'}; its code built the optimizer
  # from tf.keras, and a Keras 2 optimizer config without
  # is_legacy_optimizer is a legacy one (what TF 2.3 wrapped).
  config = {
      'optimizer': {'class_name': 'SGD',
                    'config': {'learning_rate': 0.5, 'momentum': 0.25}},
      'loss_scale': {'class_name': 'DynamicLossScale',
                     'config': {'initial_loss_scale': 128.0,
                                'increment_period': 5, 'multiplier': 2.0}},
  }
  opt = LossScaleOptimizer.from_config(config)
  if keras_families.tf_keras_is_keras3():
    expected = keras_families.keras3().optimizers.SGD
  else:
    expected = tf.keras.optimizers.legacy.SGD
  assert type(opt.inner_optimizer) is expected
  assert float(value(opt.momentum)) == 0.25
  assert float(opt.loss_scale()) == 128.0
  assert opt.loss_scale.increment_period == 5


@pytest.mark.parametrize('family', FAMILIES)
def test_the_wrapper_holds_no_state_the_inner_optimizer_holds(family):
  inner = _sgd(family, 0.5, momentum=0.5)
  opt = LossScaleOptimizer(inner, 4)
  var = tf.Variable([1.0, 2.0])
  opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
  opt.learning_rate = 0.25
  assert float(value(inner.learning_rate)) == 0.25
  held = {name: value for name, value in vars(opt).items()
          if not name.startswith('_self_')}  # TensorFlow's tracking records
  assert held.pop('_inner_optimizer') is inner
  assert isinstance(held.pop('_loss_scale'), tf_loss_scale.FixedLossScale)
  assert 'learning_rate' in held.pop('_forwarded_names')
  slot_table = held.pop('_slots', None)
  assert held == {}, f'state of its own: {sorted(held)}'
  if slot_table is not None:
    # An index of the inner optimizer's own slot variables, by variable.
    slot = opt.get_slot(var, next(iter(opt.get_slot_names())))
    assert any(slot is v for v in inner.variables)


@pytest.mark.parametrize('kind', ['keras2_legacy', 'keras2'])
def test_every_member_keras2_classes_offer_is_defined_or_forwarded(kind):
  opt = LossScaleOptimizer(_sgd(kind), 'dynamic')
  ours = [c for c in type(opt).__mro__
          if c.__module__.startswith('tf_loss_scale.')]
  inherited = []
  for keras_class in type(opt).__mro__:
    if keras_class in ours or keras_class is object:
      continue
    for name in vars(keras_class):
      if name.startswith('_'):
        continue
      if not any(name in vars(c) for c in ours) and (
          name not in opt._forwarded_names):  # pylint: disable=protected-access
        inherited.append(f'{keras_class.__name__}.{name}')
  assert not inherited, f'run Keras code on the wrapper: {inherited}'


def test_keras2_loss_scale_optimizer_properties_describe_our_loss_scale():
  dynamic = LossScaleOptimizer(_sgd('keras2_legacy'), _every_option())
  assert dynamic.dynamic is True
  assert dynamic.initial_scale == 64.0
  assert dynamic.dynamic_growth_steps == 7
  assert dynamic.dynamic_counter is dynamic.loss_scale.good_steps
  fixed = LossScaleOptimizer(_sgd('keras2'), 8)
  assert fixed.dynamic is False and fixed.initial_scale == 8.0
  assert fixed.dynamic_growth_steps is None and fixed.dynamic_counter is None


def test_keras2_new_slots_are_found_by_variable_when_built_in_another_order():
  opt = LossScaleOptimizer(_sgd('keras2', 1.0, momentum=0.5), 1)
  first = tf.Variable([1.0], name='w')
  second = tf.Variable([1.0, 1.0, 1.0], name='w')
  opt.build([second, first])
  opt.apply_gradients([(tf.constant([2.0]), first),
                       (tf.constant([1.0, 2.0, 3.0]), second)])
  # Keras 2's momentum slot m: m = 0.5 * 0 - 1.0 * g.
  assert opt.get_slot(first, 'm').numpy().tolist() == [-2.0]
  assert opt.get_slot(second, 'm').numpy().tolist() == [-1.0, -2.0, -3.0]
  assert opt.get_slot_names() == ['momentum']  # TF 2.x's name for it.
  assert opt.get_slot(first, 'momentum') is opt.get_slot(first, 'm')
  with pytest.raises(KeyError, match='not a variable this optimizer'):
    opt.get_slot(tf.Variable([1.0]), 'm')
  extra = opt.add_slot(first, 'extra', initializer='ones')
  assert opt.get_slot(first, 'extra') is extra
  np.testing.assert_array_equal(extra.numpy(), [1.0])


def test_keras2_new_slot_whose_name_two_variables_fit_is_the_longer_names():
  # Keras 2 names the slots 'm/kernel:0' and 'm/dense/kernel:0': the second
  # also reads as a slot 'm/dense' of 'kernel'.
  opt = LossScaleOptimizer(_sgd('keras2', 1.0, momentum=0.5), 1)
  short = tf.Variable([1.0, 1.0], name='kernel')
  long = tf.Variable([1.0, 1.0], name='dense/kernel')
  opt.apply_gradients([(tf.constant([1.0, 2.0]), short),
                       (tf.constant([3.0, 4.0]), long)])
  assert opt.get_slot(short, 'm').numpy().tolist() == [-1.0, -2.0]
  assert opt.get_slot(long, 'm').numpy().tolist() == [-3.0, -4.0]
  assert opt.get_slot_names() == ['momentum']


def test_keras2_new_optimizer_with_ema_keeps_one_copy_of_it(tmp_path):
  # Only the inner optimizer keeps the moving averages.
  inner = _sgd('keras2', 0.5, use_ema=True)
  opt = LossScaleOptimizer(inner, 'dynamic')
  var = tf.Variable(np.ones((32, 32), np.float32))
  opt.apply_gradients([(tf.ones((32, 32)), var)])

  def saved(optimizer, name):
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / name))
    return {key for key, _ in tf.train.list_variables(path)
            if key.startswith('optimizer/')}

  assert sorted(saved(opt, 'wrapped') - saved(inner, 'bare')) == [
      'optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE',
      'optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE']
