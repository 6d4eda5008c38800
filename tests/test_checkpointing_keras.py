"""The private hooks the experimental form's checkpoints need, pinned.

`tf_loss_scale/private_api.py` answers TensorFlow's and Keras 2's
underscore hooks so that the experimental form keeps TF 2.3's checkpoint
layout. If a TensorFlow or Keras release stops calling one of them, these
tests fail naming it, before checkpoints silently stop interchanging.
A SavedModel of a training function, which needs the monitoring record
tracked for it alone (`checkpointing.SavedModelOnlyChildren`), is compared
with Keras's own class.
"""

import collections
import inspect

import numpy as np
import pytest
import tensorflow as tf

import keras_families
from keras_families import value
import tf_loss_scale
from tf_loss_scale import private_api
from tf_loss_scale.keras import experimental

FAMILIES = ['keras3', 'keras2_legacy', 'keras2']


def _sgd(family):
  if family == 'keras3':
    return keras_families.keras3().optimizers.SGD(0.5, momentum=0.5)
  optimizers = keras_families.keras2().optimizers
  if family == 'keras2_legacy':
    optimizers = optimizers.legacy
  return optimizers.SGD(0.5, momentum=0.5)


@pytest.fixture
def calls(monkeypatch):
  """Counts the calls TensorFlow and Keras make to each hook."""
  counts = collections.Counter()

  def count(cls, name):
    original = vars(cls)[name]
    if isinstance(original, property):
      def getter(self):
        counts[name] += 1
        return original.fget(self)
      monkeypatch.setattr(cls, name, property(getter))
      return

    def counted(self, *args, **kwargs):
      counts[name] += 1
      return original(self, *args, **kwargs)
    monkeypatch.setattr(cls, name, counted)

  for name in ('_trackable_children', '_lookup_dependency',
               '_deferred_dependencies'):
    count(private_api.DelegatesCheckpointToInner, name)
  for name in ('_create_or_restore_slot_variable', '_create_all_weights'):
    count(private_api.ForwardsLegacySlotRestoration, name)
  count(private_api.HidesForwardedSlots, '__dir__')
  return counts


def _assert_called(calls, *names):
  missing = [name for name in names if not calls[name]]
  assert not missing, (
      f'TensorFlow no longer calls {missing} on the optimizer: the '
      "experimental form's checkpoint interchange needs another hook there.")


@pytest.mark.parametrize('family', FAMILIES)
def test_restoring_before_the_first_step_goes_through_the_hooks(
    family, calls, tmp_path):
  var = tf.Variable([1.0, 2.0])
  opt = experimental.LossScaleOptimizer(
      _sgd(family), tf_loss_scale.DynamicLossScale(8.0, increment_period=2))
  for grad in ([1.0, 1.0], [np.inf, 1.0], [0.5, -1.0]):
    opt.apply_gradients([(tf.constant(grad), var)])
  path = tf.train.Checkpoint(var=var, optimizer=opt).save(
      str(tmp_path / 'ckpt'))
  _assert_called(calls, '_trackable_children')
  if family != 'keras2_legacy':
    # Its slots are dependencies of the inner optimizer: TensorFlow must not
    # also claim them as slot variables of the wrapper.
    _assert_called(calls, '__dir__')
  calls.clear()

  restored_var = tf.Variable([0.0, 0.0])
  restored = experimental.LossScaleOptimizer(
      _sgd(family), tf_loss_scale.DynamicLossScale(1.0, increment_period=2))
  status = tf.train.Checkpoint(var=restored_var, optimizer=restored).restore(
      path)
  _assert_called(calls, '_trackable_children')
  if family == 'keras2_legacy':
    # Its hyperparameters and slots do not exist before its first step:
    # their values wait in its deferred dependencies and slot restorations.
    _assert_called(calls, '_deferred_dependencies',
                   '_create_or_restore_slot_variable')
  assert float(restored.loss_scale()) == 4.0
  restored.apply_gradients([(tf.constant([0.0, 0.0]), restored_var)])
  status.assert_existing_objects_matched()
  assert int(value(restored.iterations)) == 4
  # Momentum m = 0.5 * m_saved - 0.5 * 0: half the saved slot.
  np.testing.assert_allclose(
      restored.get_slot(restored_var, restored.get_slot_names()[0]).numpy(),
      opt.get_slot(var, opt.get_slot_names()[0]).numpy() * 0.5)


def test_keras2_hdf5_loading_creates_legacy_slots_through_the_hook(
    calls, tmp_path):
  keras2 = keras_families.keras2()
  model = keras2.Sequential([keras2.layers.Dense(1, input_shape=(2,))])
  model.compile(optimizer=experimental.LossScaleOptimizer(
      keras2.optimizers.legacy.SGD(0.1, momentum=0.5), 8.0), loss='mse')
  model.fit(np.ones((2, 2), np.float32), np.zeros((2, 1), np.float32),
            verbose=0)
  path = str(tmp_path / 'model.h5')
  model.save(path)
  loaded = keras2.models.load_model(path)
  _assert_called(calls, '_create_all_weights')
  assert int(value(loaded.optimizer.iterations)) == 1


def test_tensorflows_trackable_protocol_still_has_the_hooks():
  trackable = tf.__internal__.tracking.Trackable
  children = inspect.signature(trackable._trackable_children)  # pylint: disable=protected-access
  assert 'save_type' in children.parameters, children
  lookup = inspect.signature(trackable._lookup_dependency)  # pylint: disable=protected-access
  assert list(lookup.parameters)[:2] == ['self', 'name'], lookup
  assert isinstance(
      inspect.getattr_static(trackable, '_deferred_dependencies'), property)


def _keras3_trainer(form):
  """A `tf.Module` holding a variable, an optimizer and a training function."""
  keras = keras_families.keras3()

  class Trainer(tf.Module):

    def __init__(self):
      super().__init__()
      self.var = keras.Variable([1.0, 2.0])
      inner = keras.optimizers.SGD(0.5, momentum=0.5)
      if form == 'experimental':
        self.opt = experimental.LossScaleOptimizer(
            inner, tf_loss_scale.DynamicLossScale(8.0, increment_period=2))
      else:
        self.opt = {'keras': keras.optimizers.LossScaleOptimizer,
                    'keras3_form': tf_loss_scale.keras.LossScaleOptimizer}[
                        form](inner, initial_scale=8.0, dynamic_growth_steps=2)
      self.opt.build([self.var])

    @tf.function(input_signature=[tf.TensorSpec([2], tf.float32)])
    def train(self, x):
      # The gradient of the loss is x.
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(self.var * x)
        if form == 'experimental':
          scaled = self.opt.get_scaled_loss(loss)
        else:
          scaled = self.opt.scale_loss(loss)
      grads = tape.gradient(scaled, [self.var])
      if form == 'experimental':
        self.opt.apply_gradients(
            zip(self.opt.get_unscaled_gradients(grads), [self.var]))
        return self.opt.loss_scale()
      self.opt.apply(grads, [self.var])
      return tf.convert_to_tensor(self.opt.dynamic_scale)

  return Trainer()


@pytest.mark.parametrize('form', ['keras3_form', 'experimental'])
def test_a_saved_model_of_a_training_function_loads_and_trains(form, tmp_path):
  trajectories = {}
  for name in ('keras', form):
    trainer = _keras3_trainer(name)
    trainer.train(tf.constant([1.0, 1.0]))
    tf.saved_model.save(trainer, str(tmp_path / name))
    loaded = tf.saved_model.load(str(tmp_path / name))
    trajectories[name] = [
        (float(loaded.train(tf.constant(x))), loaded.var.numpy().tolist())
        for x in ([1.0, 1.0], [np.inf, 1.0], [2.0, -2.0])]
  # SGD, learning rate 0.5, momentum 0.5, scale 8 growing every 2 steps;
  # saved after one step: momentum -0.5, variable [0.5, 1.5].
  assert trajectories[form] == trajectories['keras'] == [
      (16.0, [-0.25, 0.75]),  # momentum -0.75; the scale grows
      (8.0, [-0.25, 0.75]),  # skipped; the scale halves
      (8.0, [-1.625, 1.375]),  # momentum [-1.375, 0.625]
  ]
  if form == 'keras3_form':
    # The monitoring record is in the SavedModel but not in checkpoints.
    keys = {}
    for name in ('keras', form):
      trainer = _keras3_trainer(name)
      path = tf.train.Checkpoint(var=trainer.var, optimizer=trainer.opt).write(
          str(tmp_path / 'ckpt' / name))
      keys[name] = {key for key, _ in tf.train.list_variables(path)}
    assert keys[form] == keys['keras']
