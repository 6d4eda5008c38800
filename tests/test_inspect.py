"""Tests of `python -m tf_loss_scale inspect` on checkpoints of every kind.

Keras files and checkpoints come from the Keras families the installed
TensorFlow has: Keras 3 (2.16 and later) and Keras 2 (the `keras` 2.x of
2.15 and earlier, or `tf_keras`).
"""

import os
import subprocess
import sys

import numpy as np
import keras
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import __main__ as cli
from tf_loss_scale import inspect_checkpoint
import fresh_process
import versions

INF = float('inf')
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_LAYOUT = inspect_checkpoint.LAYOUTS[('current_loss_scale', 'good_steps')]
KERAS_LAYOUT = inspect_checkpoint.LAYOUTS[('dynamic_scale', 'step_counter')]


def _inspect(capsys, path):
  code = cli.main(['inspect', str(path)])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _check_printed(out, owner, scale, good_steps, layout):
  # The printed block for one loss scale, line by line.
  expected = [f'  {owner}:', f'    current loss scale: {scale}',
              f'    good steps:         {good_steps}',
              f'    layout:             {layout}']
  lines = out.splitlines()
  assert expected[0] in lines, out
  start = lines.index(expected[0])
  assert lines[start:start + 4] == expected, out


def _v1_saver_checkpoint(directory, optimizer_class):
  """Steps [inf, 1, 1] from the default 2**15 scale: 16384, 2 good steps."""
  with tf.Graph().as_default():
    var = tf.Variable(1.0)
    optimizer = optimizer_class(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
    grad = tf.compat.v1.placeholder(tf.float32, [])
    train_op = optimizer.minimize(var * grad)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for value in (INF, 1.0, 1.0):
        session.run(train_op, {grad: value})
      return tf.compat.v1.train.Saver().save(session, str(directory / 'model'))


@pytest.mark.parametrize('optimizer_class', [
    tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
    tf_loss_scale.MixedPrecisionLossScaleOptimizer,
], ids=['tensorflow', 'tf_loss_scale'])
def test_v1_saver_checkpoint(capsys, tmp_path, optimizer_class):
  path = _v1_saver_checkpoint(tmp_path, optimizer_class)
  code, out, err = _inspect(capsys, path)
  assert (code, err) == (0, '')
  assert out.splitlines()[0] == (
      f'{path}: name-based checkpoint (tf.compat.v1.train.Saver)')
  _check_printed(out, '(top level)', 16384, 2, TF_LAYOUT)


@pytest.mark.parametrize('make_pair', [
    lambda: (tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
             tf.compat.v1.mixed_precision.DynamicLossScale),
    lambda: (tf_loss_scale.MixedPrecisionLossScaleOptimizer,
             tf_loss_scale.DynamicLossScale),
], ids=['tensorflow', 'tf_loss_scale'])
def test_object_based_checkpoint_and_its_directory(capsys, tmp_path, make_pair):
  optimizer_class, loss_scale_class = make_pair()
  var = tf.Variable(1.0)
  optimizer = optimizer_class(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                              loss_scale_class(initial_loss_scale=64.0))
  for value in (INF, 1.0, 1.0):
    optimizer.minimize(lambda v=value: var * v, var_list=[var])
  path = tf.train.Checkpoint(optimizer=optimizer, var=var).save(
      str(tmp_path / 'ckpt'))
  for target in (path, tmp_path):
    code, out, err = _inspect(capsys, target)
    assert (code, err) == (0, '')
    assert out.splitlines()[0] == (
        f'{path}: object-based checkpoint (tf.train.Checkpoint)')
    _check_printed(out, 'optimizer/loss_scale', 32, 2, TF_LAYOUT)


def _fit_three_finite_steps(optimizer):
  """Three finite steps at scale 256 with growth after 5: 256, 3 good steps."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(optimizer=optimizer, loss='mse')
  model.fit(np.ones((3, 3)), np.ones((3, 2)), batch_size=1, verbose=0)
  return model


def _keras_3_class(owner):
  if owner == 'keras':
    return keras.optimizers.LossScaleOptimizer
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  return LossScaleOptimizer


@versions.KERAS_3.mark
@pytest.mark.parametrize('owner, layout', [
    ('keras', KERAS_LAYOUT),
    ('tf_loss_scale', KERAS_LAYOUT),  # the Keras 3 form stores as Keras does
])
def test_keras_file(capsys, tmp_path, owner, layout):
  model = _fit_three_finite_steps(_keras_3_class(owner)(
      keras.optimizers.SGD(0.01, momentum=0.9), initial_scale=256.0,
      dynamic_growth_steps=5, name='scaled'))
  path = tmp_path / 'model.keras'
  model.save(path)
  code, out, err = _inspect(capsys, path)
  assert (code, err) == (0, '')
  assert out.splitlines()[0] == f'{path}: Keras 3 .keras file'
  _check_printed(out, 'scaled', 256, 3, layout)


@versions.KERAS_3.mark
def test_keras_file_of_the_keras_3_form_from_a_fresh_command_line(tmp_path):
  # The command line imports the form's module itself (the package imports
  # it on first use), so the file's class name resolves.
  model = _fit_three_finite_steps(_keras_3_class('tf_loss_scale')(
      keras.optimizers.SGD(0.01), initial_scale=256.0,
      dynamic_growth_steps=5, name='scaled'))
  path = tmp_path / 'model.keras'
  model.save(path)
  result = fresh_process.run(['-m', 'tf_loss_scale', 'inspect', str(path)])
  assert result.returncode == 0, result.stderr
  _check_printed(result.stdout, 'scaled', 256, 3, KERAS_LAYOUT)


@versions.KERAS_3.mark
def test_object_based_checkpoint_of_keras_optimizer(capsys, tmp_path):
  optimizer = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.01), initial_scale=256.0, dynamic_growth_steps=5)
  _fit_three_finite_steps(optimizer)
  path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / 'ckpt'))
  code, out, _ = _inspect(capsys, path)
  assert code == 0
  _check_printed(out, 'optimizer', 256, 3, KERAS_LAYOUT)


def _keras_2_model_fitted_with_its_loss_scale_optimizer():
  """Three finite steps at scale 256 with growth after 5: 256, 3 good steps."""
  k2 = versions.keras_2()
  model = k2.Sequential([k2.layers.Dense(2, input_shape=(3,))])
  optimizer = k2.mixed_precision.LossScaleOptimizer(
      k2.optimizers.SGD(0.01), initial_scale=256.0, dynamic_growth_steps=5)
  model.compile(optimizer=optimizer, loss='mse')
  model.fit(np.ones((3, 3)), np.ones((3, 2)), batch_size=1, verbose=0)
  return model


@versions.KERAS_2.mark
def test_object_based_checkpoint_of_keras_2_optimizer(capsys, tmp_path):
  model = _keras_2_model_fitted_with_its_loss_scale_optimizer()
  path = tf.train.Checkpoint(optimizer=model.optimizer).save(
      str(tmp_path / 'ckpt'))
  code, out, _ = _inspect(capsys, path)
  assert code == 0
  # Keras 2's class keeps TensorFlow's names.
  _check_printed(out, 'optimizer/loss_scale', 256, 3, TF_LAYOUT)


@versions.KERAS_2.mark
def test_keras_2_file_holds_no_loss_scale_state(capsys, tmp_path):
  model = _keras_2_model_fitted_with_its_loss_scale_optimizer()
  path = tmp_path / 'model.keras'
  # Keras 2.12 writes the .keras format only when asked to.
  model.save(str(path), **({'save_format': 'keras_v3'}
                           if versions.TF < (2, 13) else {}))
  code, out, err = _inspect(capsys, path)
  assert (code, err) == (1, '')
  assert out.splitlines()[0] == f'{path}: Keras 2 .keras file'
  assert "Keras 2's LossScaleOptimizer in a .keras file save none" in out


def test_checkpoint_without_loss_scale_exits_1(capsys, tmp_path):
  path = tf.train.Checkpoint(var=tf.Variable(1.0)).save(str(tmp_path / 'ckpt'))
  code, out, _ = _inspect(capsys, path)
  assert code == 1
  assert 'no loss scale state found' in out


def _assert_one_line_error(capsys, path, fragment):
  code, out, err = _inspect(capsys, path)
  assert code == 2
  assert out == ''
  assert err.count('\n') == 1 and err.startswith('tf-loss-scale inspect: error:'), err
  assert fragment in err, err


def test_missing_checkpoint(capsys, tmp_path):
  _assert_one_line_error(capsys, tmp_path / 'nothing-here', 'nothing-here')
  _assert_one_line_error(capsys, tmp_path / 'nothing.keras', 'nothing.keras')
  _assert_one_line_error(capsys, tmp_path, 'no checkpoint found')


def test_corrupt_checkpoints(capsys, tmp_path):
  path = tf.train.Checkpoint(var=tf.Variable(1.0)).save(str(tmp_path / 'ckpt'))
  with open(path + '.index', 'wb') as index:
    index.write(b'not a checkpoint index')
  _assert_one_line_error(capsys, path, str(path))
  bad_keras = tmp_path / 'bad.keras'
  bad_keras.write_bytes(b'not a zip archive')
  _assert_one_line_error(capsys, bad_keras, 'bad.keras')


def test_v1_saver_checkpoint_with_two_loss_scales(capsys, tmp_path):
  # A GAN-like graph: two optimizers, two dynamic loss scales, the second
  # with the options that save counters. TF1 numbers the second's names.
  with tf.Graph().as_default():
    generator, discriminator = tf.Variable(1.0), tf.Variable(1.0)
    grad = tf.compat.v1.placeholder(tf.float32, [])
    first = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1),
        tf_loss_scale.DynamicLossScale(64.0))
    second = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1),
        tf_loss_scale.DynamicLossScale(8.0, hysteresis=3, on_collapse='warn'))
    train_first = first.minimize(generator * grad, var_list=[generator])
    train_second = second.minimize(discriminator * grad,
                                   var_list=[discriminator])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      # The first: one good step at 64. The second: two overflows in a row
      # (below its hysteresis of 3, so still 8).
      session.run(train_first, {grad: 1.0})
      for _ in range(2):
        session.run(train_second, {grad: INF})
      path = tf.compat.v1.train.Saver().save(session, str(tmp_path / 'gan'))
  inspection = inspect_checkpoint.inspect(path)
  assert [(s.scale, s.good_steps, s.variables, s.counters)
          for s in inspection.states] == [
              (64.0, 1, ('current_loss_scale', 'good_steps'), ()),
              (8.0, 0, ('current_loss_scale_1', 'good_steps_1',
                        'current_loss_scale_1/non_finite_streak',
                        'current_loss_scale_1/skips_at_floor'),
               (('non_finite_streak', 2), ('skips_at_floor', 0))),
          ]
  code, out, _ = _inspect(capsys, path)
  assert code == 0
  lines = out.splitlines()
  assert lines.count('  (top level):') == 2
  assert '    variables:          current_loss_scale, good_steps' in lines
  assert '    non finite streak:  2' in lines
  assert '    skips at floor:     0' in lines


def test_object_based_checkpoint_reports_option_counters(tmp_path):
  loss_scale = tf_loss_scale.DynamicLossScale(16.0, hysteresis=2)
  for value in (INF, 1.0, INF):
    loss_scale.update([tf.constant(value)])
  path = tf.train.Checkpoint(scale=loss_scale).save(str(tmp_path / 'ckpt'))
  state, = inspect_checkpoint.inspect(path).states
  assert (state.owner, state.scale, state.good_steps, state.counters) == (
      'scale', 16.0, 0, (('non_finite_streak', 1),))
  assert state.variables == ('scale/current_loss_scale', 'scale/good_steps',
                             'scale/non_finite_streak')


def test_command_line_errors_are_one_line_without_tensorflow_log(tmp_path):
  # A fresh process, TensorFlow's log level unset: its start-up lines would
  # reach stderr before the error unless the command keeps them off.
  bad_keras = tmp_path / 'bad.keras'
  bad_keras.write_bytes(b'not a zip archive')
  for path, fragment in ((tmp_path / 'nothing-here', 'nothing-here'),
                         (bad_keras, 'bad.keras')):
    environment = dict(os.environ, PYTHONPATH=_ROOT)
    environment.pop('TF_CPP_MIN_LOG_LEVEL', None)
    done = subprocess.run(
        [sys.executable, '-m', 'tf_loss_scale', 'inspect', str(path)],
        capture_output=True, text=True, timeout=300, env=environment,
        check=False)
    assert (done.returncode, done.stdout) == (2, ''), done
    assert done.stderr.startswith('tf-loss-scale inspect: error: '), (
        done.stderr)
    assert done.stderr.count('\n') == 1 and fragment in done.stderr, (
        done.stderr)
