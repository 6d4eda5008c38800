"""Checkpoints interchange with TensorFlow's own loss scaling classes.

A run is interrupted by a checkpoint written by one implementation and
continued by another; the continuation must follow exactly the trajectory of
an uninterrupted run of TensorFlow's `tf.compat.v1.mixed_precision` classes.
Both checkpoint formats are covered: a `tf.compat.v1.train.Saver` in a TF1
session (keys are variable names) and `tf.train.Checkpoint` object
checkpoints, eagerly and in a tf.function (keys are dependency paths).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
import v1_training
from v1_training import OURS, THEIRS

TFDynamicLossScale = tf.compat.v1.mixed_precision.DynamicLossScale
DIRECTIONS = {
    'tensorflow-to-ours': (THEIRS, OURS),
    'ours-to-tensorflow': (OURS, THEIRS),
    'ours-to-ours': (OURS, OURS),
}
SPLIT = 8  # steps before the checkpoint


def _loss_scale(classes):
  # A period of 3 leaves the good-step count mid-period at the checkpoint.
  return classes[1](2.0**15, increment_period=3)


def _check_restored(restored, saved, what):
  """Asserts the values present in `restored` equal those in `saved`."""
  for key in ('w', 'embedding', 'unused', 'global_step'):
    np.testing.assert_array_equal(restored[key], saved[key],
                                  err_msg=f'{what}: {key} after restore')
  for base_name in ('current_loss_scale', 'good_steps'):
    assert (v1_training.named(restored, base_name) ==
            v1_training.named(saved, base_name)), f'{what}: {base_name}'


def _interrupted_run(writer, reader, optimizer_name, mode, tmp_path):
  """Trains SPLIT steps with `writer`, then the rest with `reader`.

  Returns:
    `(uninterrupted, continued)`: TensorFlow's uninterrupted records for the
    steps after the checkpoint, and the reader's records for the same steps.
  """
  steps = v1_training.random_steps(seed=14)
  make_inner = v1_training.OPTIMIZERS[optimizer_name]
  uninterrupted = v1_training.train(THEIRS, make_inner, _loss_scale, steps,
                                    mode)
  with v1_training.Trainer(writer, make_inner, _loss_scale, mode) as trainer:
    saved = trainer.run(steps[:SPLIT])[-1]
    path = trainer.save(str(tmp_path / 'ckpt'))
  assert v1_training.named(saved, 'good_steps') > 0, 'split mid-period'
  v1_training.assert_same_trajectory([saved], [uninterrupted[SPLIT - 1]])
  with v1_training.Trainer(reader, make_inner, _loss_scale, mode) as trainer:
    status = trainer.restore(path)
    if status is not None:
      status.assert_existing_objects_matched()
    _check_restored(trainer.read(), saved, 'right after restore')
    continued = [trainer.step(*steps[SPLIT])]
    if status is not None:
      status.assert_consumed()  # slots, created by the first step, restored
    continued += trainer.run(steps[SPLIT + 1:])
  applied = v1_training.applied_steps(uninterrupted)[SPLIT:]
  assert any(applied) and not all(applied), 'the continuation must skip too'
  return uninterrupted[SPLIT:], continued


@pytest.mark.parametrize('optimizer_name', ['momentum', 'adam'])
@pytest.mark.parametrize('direction', list(DIRECTIONS))
def test_saver_checkpoints_continue_on_tensorflows_trajectory(
    direction, optimizer_name, tmp_path):
  writer, reader = DIRECTIONS[direction]
  uninterrupted, continued = _interrupted_run(writer, reader, optimizer_name,
                                              'graph', tmp_path)
  v1_training.assert_same_trajectory(continued, uninterrupted)


@pytest.mark.parametrize('mode', ['eager', 'function'])
@pytest.mark.parametrize('direction', list(DIRECTIONS))
def test_object_checkpoints_continue_on_tensorflows_trajectory(
    direction, mode, tmp_path):
  writer, reader = DIRECTIONS[direction]
  uninterrupted, continued = _interrupted_run(writer, reader, 'adam', mode,
                                              tmp_path)
  v1_training.assert_same_trajectory(continued, uninterrupted)


def _checkpoint_keys(classes, mode, tmp_path):
  with v1_training.Trainer(classes, v1_training.OPTIMIZERS['adam'],
                           _loss_scale, mode) as trainer:
    trainer.run(v1_training.random_steps(seed=0, count=2))
    path = trainer.save(str(tmp_path / classes[0].__module__ / 'ckpt'))
  return dict(tf.train.list_variables(path))


@pytest.mark.parametrize('mode', ['graph', 'eager'])
def test_checkpoint_keys_and_shapes_match_tensorflow(mode, tmp_path):
  ours = _checkpoint_keys(OURS, mode, tmp_path)
  theirs = _checkpoint_keys(THEIRS, mode, tmp_path)
  # The object graph proto names Python classes; every other key must match.
  ours.pop('_CHECKPOINTABLE_OBJECT_GRAPH', None)
  theirs.pop('_CHECKPOINTABLE_OBJECT_GRAPH', None)
  assert ours == theirs
  if mode == 'graph':
    expected = {'current_loss_scale': [], 'good_steps': []}
  else:
    prefix = 'optimizer/loss_scale/'
    suffix = '/.ATTRIBUTES/VARIABLE_VALUE'
    expected = {f'{prefix}current_loss_scale{suffix}': [],
                f'{prefix}good_steps{suffix}': []}
    assert any(k.startswith('optimizer/base_optimizer/') for k in ours), ours
    assert any('.OPTIMIZER_SLOT/optimizer/base_optimizer/m/' in k
               for k in ours), ours
  for key, shape in expected.items():
    assert ours.get(key) == shape, (key, sorted(ours))


# --- The loss scale on its own ------------------------------------------------


def _grads(finite):
  return [tf.constant([1.0, 2.0 if finite else np.inf])]


@pytest.mark.parametrize('direction', list(DIRECTIONS))
def test_dynamic_loss_scale_object_checkpoints_interchange(direction,
                                                           tmp_path):
  writer_classes, reader_classes = DIRECTIONS[direction]
  verdicts = [True, True, False, True, True, True, True, False, True, True,
              True, True, True]
  make = lambda classes: classes[1](8, increment_period=3, multiplier=2)
  uninterrupted = make(THEIRS)
  expected = []
  for finite in verdicts:
    uninterrupted.update(_grads(finite))
    expected.append(float(uninterrupted()))
  writer = make(writer_classes)
  for finite in verdicts[:5]:
    writer.update(_grads(finite))
  path = tf.train.Checkpoint(loss_scale=writer).save(str(tmp_path / 'ckpt'))
  reader = make(reader_classes)
  tf.train.Checkpoint(loss_scale=reader).restore(path).assert_consumed()
  assert float(reader()) == expected[4] == 4.0
  scales = []
  for finite in verdicts[5:]:
    reader.update(_grads(finite))
    scales.append(float(reader()))
  # The restored good-step count (2 of 3) decides when the scale next grows.
  assert scales == expected[5:], f'{scales} != {expected[5:]}'


def test_dynamic_loss_scale_checkpoint_keys_match_tensorflow(tmp_path):
  keys = {}
  for name, loss_scale in (('ours', tf_loss_scale.DynamicLossScale()),
                           ('theirs', TFDynamicLossScale())):
    path = tf.train.Checkpoint(loss_scale=loss_scale).save(
        str(tmp_path / name / 'ckpt'))
    keys[name] = {k: s for k, s in tf.train.list_variables(path)
                  if k != '_CHECKPOINTABLE_OBJECT_GRAPH'}
  assert keys['ours'] == keys['theirs'] == {
      'loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE': [],
      'loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE': [],
      'save_counter/.ATTRIBUTES/VARIABLE_VALUE': [],
  }


def test_saved_model_of_a_function_updating_the_loss_scale(tmp_path):
  # The skip counter is kept out of checkpoints, but a SavedModel must track
  # every variable its functions capture.
  class Trainer(tf.Module):

    def __init__(self):
      super().__init__()
      self.loss_scale = tf_loss_scale.DynamicLossScale(
          initial_loss_scale=8, increment_period=2)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(self, grad):
      self.loss_scale.update([grad])
      return self.loss_scale()

  trainer = Trainer()
  trainer.step(tf.constant(1.0))
  tf.saved_model.save(trainer, str(tmp_path))
  loaded = tf.saved_model.load(str(tmp_path))
  # Saved after one good step at 8: one more doubles it, an inf halves it.
  assert float(loaded.step(tf.constant(1.0))) == 16.0
  assert float(loaded.step(tf.constant(float('inf')))) == 8.0
