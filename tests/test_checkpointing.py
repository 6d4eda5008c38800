"""The private TensorFlow hooks in tf_loss_scale/private_api.py still work.

Each hook is TensorFlow's, not public, and may change with a release: these
tests fail, saying which hook moved, before checkpoints silently stop
interchanging with TensorFlow's own classes.
"""

import inspect

import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import private_api


def _checkpoint_keys(tmp_path, **objects):
  path = tf.train.Checkpoint(**objects).save(str(tmp_path / 'ckpt'))
  return {name for name, _ in tf.train.list_variables(path)}


def test_trackable_children_is_still_tensorflows_per_save_type_hook():
  hook = getattr(tf.Module, '_trackable_children', None)
  assert hook is not None, (
      'TensorFlow no longer has Trackable._trackable_children: '
      'private_api.SavedModelOnlyChildren must find another hook.')
  parameter = list(inspect.signature(hook).parameters.values())[1]
  assert (parameter.name, parameter.default) == ('save_type', 'checkpoint'), (
      'Trackable._trackable_children changed its save_type parameter: '
      f'{inspect.signature(hook)}')


def test_a_saved_model_tracks_the_record_and_a_checkpoint_does_not(tmp_path):
  seen = []

  class Holder:  # A plain object: no checkpoint sees what it holds.

    def __init__(self):
      self.record = tf.Variable(3.0)

  class Spy(private_api.SavedModelOnlyChildren, tf.Module):

    def __init__(self):
      super().__init__()
      self._hidden = Holder()

    def _saved_model_only_children(self):
      return {'record': self._hidden.record}

    def _trackable_children(self, save_type='checkpoint', **kwargs):
      seen.append(getattr(save_type, 'value', save_type))
      return super()._trackable_children(save_type, **kwargs)

  spy = Spy()
  spy.read = tf.function(lambda: spy._hidden.record + 1.0,
                         input_signature=[])
  tf.saved_model.save(spy, str(tmp_path / 'model'))
  assert 'savedmodel' in seen, (
      f'A SavedModel save asked for children with save types {seen}: '
      "TensorFlow no longer says 'savedmodel'.")
  assert float(tf.saved_model.load(str(tmp_path / 'model')).read()) == 4.0
  assert not any('record' in key
                 for key in _checkpoint_keys(tmp_path, spy=spy))


def test_dynamic_loss_scale_checkpoints_hold_tensorflows_two_variables(
    tmp_path):
  keys = _checkpoint_keys(tmp_path, scale=tf_loss_scale.DynamicLossScale())
  assert {k for k in keys if k.startswith('scale/')} == {
      'scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE',
      'scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE'}


def test_track_trackable_still_names_v1_optimizer_dependencies(tmp_path):
  assert hasattr(tf.compat.v1.train.Optimizer, '_track_trackable'), (
      'TensorFlow no longer has Trackable._track_trackable: '
      'private_api.name_dependencies must find another hook.')
  loss_scale = tf_loss_scale.DynamicLossScale()
  wrapper = tf.compat.v1.train.GradientDescentOptimizer(1.0)
  private_api.name_dependencies(wrapper, loss_scale=loss_scale)
  keys = _checkpoint_keys(tmp_path, optimizer=wrapper)
  assert 'optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE' in keys


def test_the_v1_wrapper_names_its_dependencies_as_tensorflows(tmp_path):
  ours = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(1.0), 'dynamic')
  theirs = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(1.0), 'dynamic')
  assert (_checkpoint_keys(tmp_path / 'ours', optimizer=ours) ==
          _checkpoint_keys(tmp_path / 'theirs', optimizer=theirs))
