"""Keras 3 programs that write and read each kind of file, for the file matrix.

`python file_matrix_runs.py write INSTALL DIR` trains one small model per
case (optimizer x policy) and writes every kind of file below into
DIR/CASE/; `python file_matrix_runs.py read INSTALL DIR...` reads each kind
of file from each DIR into a fresh model and trains one step. Each calls
`tf_loss_scale.compat.install()` first if INSTALL is 1, and prints one JSON
line: case -> the optimizer's state after training (written) or after
reading (read, per directory and kind), and the state after the next
step (or the error reading or that step raised). The programs use no
legacy name: they are Keras 3 programs, which `install()` must leave as
they are.

Used by tests/test_file_matrix.py, which compares the runs value by value.
"""

import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Any, Callable, Dict, List

import numpy as np

import class_names
import tf_loss_scale.compat

OPTIMIZERS = ('adam', 'sgd_momentum', 'adamw_schedule', 'lion')
POLICIES = ('mixed_float16', 'float32')
KINDS = ('checkpoint', 'checkpoint_manager', 'backup_and_restore', 'keras',
         'h5', 'weights_h5', 'model_checkpoint')
CASES = tuple(f'{o}-{p}' for o in OPTIMIZERS for p in POLICIES)

# Inputs against their sum, in batches of 8: the first batch of each epoch
# (inputs up to 6) overflows float16 gradients scaled by 2**15, so that
# step is skipped and halves the scale; the other three (inputs up to 0.5)
# are finite, so each epoch ends with finite steps that the scale's counter
# counts. The step after the writer's file is the second batch's.
_RNG = np.random.RandomState(0)
_BATCH = 8
_X = _RNG.uniform(0, 0.5, (32, 4)).astype('float32')
_X[:_BATCH] *= 12
_Y = _X.sum(axis=1, keepdims=True)
_EPOCHS = 2


def _optimizer(keras: Any, name: str) -> Any:
  if name == 'adam':
    return keras.optimizers.Adam(0.01)
  if name == 'sgd_momentum':
    return keras.optimizers.SGD(0.001, momentum=0.9)
  if name == 'adamw_schedule':
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.01, decay_steps=2, decay_rate=0.9)
    return keras.optimizers.AdamW(schedule, weight_decay=0.004)
  return keras.optimizers.Lion(0.001)


def _model(keras: Any, case: str, seed: int) -> Any:
  """A compiled two-layer model; `seed` sets its starting weights."""
  name, policy = case.split('-')
  keras.backend.clear_session()
  keras.mixed_precision.set_global_policy(policy)
  model = keras.Sequential([
      keras.Input((4,)),
      keras.layers.Dense(8, activation='relu', name='hidden'),
      keras.layers.Dense(1, name='out'),
  ], name='model')
  rng = np.random.RandomState(seed)
  model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype('float32')
                     for w in model.get_weights()])
  # A loss object: Keras's .h5 loader cannot read back the string 'mse'.
  model.compile(optimizer=_optimizer(keras, name),
                loss=keras.losses.MeanSquaredError())
  return model


def _value(x: Any) -> Any:
  x = x.numpy() if hasattr(x, 'numpy') else np.asarray(x)
  return np.asarray(x).tolist()


def _first(obj: Any, names: tuple) -> Any:
  for name in names:
    value = getattr(obj, name, None)
    if value is not None:
      return _value(value)
  return None


def _state(model: Any) -> Dict[str, Any]:
  """The weights and every value of the optimizer, exactly."""
  opt = model.optimizer
  inner = getattr(opt, 'inner_optimizer', opt)
  return {
      # The classes themselves: the class `install()` names says it is
      # Keras's (class_names.defining_name).
      'optimizer': class_names.defining_name(type(opt)),
      'inner_optimizer': class_names.defining_name(type(inner)),
      # Keras's class's, until a TF 2.4-2.15 method is called.
      'iterations_type': class_names.defining_name(type(opt.iterations)),
      'weights': [w.tolist() for w in model.get_weights()],
      'iterations': _value(opt.iterations),
      'inner_iterations': _value(inner.iterations),
      # With a schedule, the rate at the optimizer's count.
      'learning_rate': _value(inner.learning_rate),
      # The inner optimizer's variables in order: its count, its rate (when
      # a variable) and its slots.
      'slots': [_value(v) for v in inner.variables],
      # Keras's names, then the TF 2.4-2.15 class's.
      'loss_scale': _first(opt, ('dynamic_scale', 'loss_scale')),
      'counter': _first(opt, ('step_counter', 'dynamic_counter')),
  }


def _next_step(model: Any) -> Dict[str, Any]:
  """The state after one more step, of finite gradients."""
  model.train_on_batch(_X[_BATCH:2 * _BATCH], _Y[_BATCH:2 * _BATCH])
  return _state(model)


def _checkpoint(tf: Any, model: Any) -> Any:
  return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def write(keras: Any, tf: Any, directory: str) -> Dict[str, Any]:
  results = {}
  for case in CASES:
    out = os.path.join(directory, case)
    os.makedirs(out)
    model = _model(keras, case, seed=1)
    model.fit(_X, _Y, batch_size=_BATCH, epochs=_EPOCHS, shuffle=False,
              verbose=0, callbacks=[
                  keras.callbacks.ModelCheckpoint(
                      os.path.join(out, 'model_checkpoint.keras')),
                  keras.callbacks.BackupAndRestore(
                      os.path.join(out, 'backup'), delete_checkpoint=False)])
    state = _state(model)
    _checkpoint(tf, model).write(os.path.join(out, 'checkpoint', 'ckpt'))
    tf.train.CheckpointManager(_checkpoint(tf, model),
                               os.path.join(out, 'manager'),
                               max_to_keep=1).save()
    model.save(os.path.join(out, 'model.keras'))
    model.save(os.path.join(out, 'model.h5'))
    model.save_weights(os.path.join(out, 'model.weights.h5'))
    results[case] = {'state': state, 'next': _next_step(model)}
  return results


def _built(keras: Any, case: str) -> Any:
  # Other starting weights, so that what is read shows; the optimizer built,
  # so that what is read has variables to go to.
  model = _model(keras, case, seed=2)
  model.optimizer.build(model.trainable_variables)
  return model


def _readers(keras: Any, tf: Any) -> Dict[str, Callable[[str, str], Any]]:
  """Kind -> reads that kind of file from a case's directory into a model."""

  def checkpoint(case, out):
    model = _built(keras, case)
    _checkpoint(tf, model).read(os.path.join(out, 'checkpoint', 'ckpt'))
    return model

  def checkpoint_manager(case, out):
    model = _built(keras, case)
    ckpt = _checkpoint(tf, model)
    manager = tf.train.CheckpointManager(ckpt, os.path.join(out, 'manager'),
                                         max_to_keep=1)
    ckpt.restore(manager.latest_checkpoint)
    return model

  def backup_and_restore(case, out):
    model = _model(keras, case, seed=2)
    # A copy: resuming writes to the backup directory.
    backup = os.path.join(tempfile.mkdtemp(), 'backup')
    shutil.copytree(os.path.join(out, 'backup'), backup)
    # The backup is of the last epoch: fit resumes after it, with no epoch
    # left to run.
    model.fit(_X, _Y, batch_size=_BATCH, epochs=_EPOCHS, shuffle=False,
              verbose=0, callbacks=[keras.callbacks.BackupAndRestore(
                  backup, delete_checkpoint=False)])
    return model

  def load(name):
    def read(case, out):
      del case  # The file says.
      return keras.models.load_model(os.path.join(out, name))
    return read

  def weights_h5(case, out):
    model = _built(keras, case)
    model.load_weights(os.path.join(out, 'model.weights.h5'))
    return model

  return {'checkpoint': checkpoint, 'checkpoint_manager': checkpoint_manager,
          'backup_and_restore': backup_and_restore,
          'keras': load('model.keras'), 'h5': load('model.h5'),
          'weights_h5': weights_h5,
          'model_checkpoint': load('model_checkpoint.keras')}


def _error(e: Exception) -> str:
  # The message's first line of its own: Keras wraps an error raised in a
  # layer's call in lines that name the layer and list its arguments.
  text = re.sub(r'\x1b\[[0-9;]*m', '', str(e))  # Keras's bold, and back.
  lines = [line for line in text.splitlines() if line.strip() and not (
      line.startswith(('Exception encountered', 'Arguments received')) or
      line.lstrip().startswith('\u2022'))]
  return f'{type(e).__name__}: {lines[0] if lines else ""}'[:300]


def read(keras: Any, tf: Any, directories: List[str]) -> Dict[str, Any]:
  readers = _readers(keras, tf)
  results = {}
  for directory in directories:
    for case in CASES:
      for kind in KINDS:
        policy = case.split('-')[1]
        result = results[f'{directory}|{case}|{kind}'] = {}
        # What raises is reported as what was read, for the test to name:
        # the error if reading raised, else the state read and then the
        # state after the next step or its error.
        try:
          keras.mixed_precision.set_global_policy(policy)
          model = readers[kind](case, os.path.join(directory, case))
          result['state'] = _state(model)
          result['next'] = _next_step(model)
        except Exception as e:  # pylint: disable=broad-except
          stage = 'next_error' if 'state' in result else 'error'
          result[stage] = _error(e)
          result['traceback'] = traceback.format_exc()[-1500:]
  return results


def main(argv: List[str]) -> None:
  program, install, *directories = argv
  if install == '1':
    tf_loss_scale.compat.install()
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if program == 'write':
    result = write(keras, tf, directories[0])
  else:
    result = read(keras, tf, directories)
  print(json.dumps(result))


if __name__ == '__main__':
  main(sys.argv[1:])
