"""A Keras 3 program's files are the same with and without `install()`.

A model under `mixed_float16` is compiled with Adam (which `compile` wraps
in a loss scale optimizer), with Adam and a `LearningRateSchedule`, or
with `keras.mixed_precision.LossScaleOptimizer(Adam)` made by the program,
and fitted through steps that overflow and finite ones, so that the loss
scale and its counter are not a fresh optimizer's; a
`tf.train.CheckpointManager` saves model and optimizer. Each
run is a fresh process, with `tf_loss_scale.compat.install()` or without
the library imported at all:

- the checkpoint written under `install()` holds the same names, shapes and
  values as the one written without it;
- each restores into the other kind of process with every optimizer value
  (inner step count, learning rate, Adam's moments, the scale and its
  counter) the writer's, and one more epoch lands on the writer's weights;
- `model.save` to `.h5` and `.keras` under `install()` loads without the
  library, into Keras's class (from `.h5`, with the scale and its counter
  only), and with it, into TF 2.4-2.15's class with every optimizer value.
"""

import json

import numpy as np
import pytest

import fresh_process
import versions

versions.KERAS_3.require()

# The full tier only (docs/testing.md).
pytestmark = pytest.mark.slow

_PROGRAM = '''
import json, os, sys
import numpy as np
import class_names
mode, install, maker, directory = sys.argv[1:5]
if install == '1':
  import tf_loss_scale.compat
  tf_loss_scale.compat.install()
import keras
import tensorflow as tf

keras.mixed_precision.set_global_policy('mixed_float16')
rng = np.random.RandomState(0)
X = rng.uniform(0, 0.5, (32, 4)).astype('float32')
# The first batch of each epoch (inputs up to 6) overflows float16 gradients
# at the scales it meets (2**15, then 2**14); the other three are finite.
X[:8] *= 12
Y = X.sum(axis=1, keepdims=True)


def make():
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                            keras.layers.Dense(1, dtype='float32')])
  if maker == 'schedule':
    inner = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(
        0.01, decay_steps=2, decay_rate=0.5))
  else:
    inner = keras.optimizers.Adam(0.01)
  if maker == 'named':
    inner = keras.mixed_precision.LossScaleOptimizer(inner)
  model.compile(optimizer=inner, loss=keras.losses.MeanSquaredError())
  return model


def fit(model):
  model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)


def state(model):
  optimizer = model.optimizer
  inner = optimizer.inner_optimizer
  return {'class': class_names.defining_name(type(optimizer)),
          'iterations': int(inner.iterations.numpy()),
          'learning_rate': float(np.asarray(inner.learning_rate)),
          'scale': float(optimizer.dynamic_scale.numpy()),
          'counter': int(optimizer.step_counter.numpy()),
          'inner_variables': [np.asarray(v.numpy()).tolist()
                              for v in inner.variables],
          'weights': [w.tolist() for w in model.get_weights()]}


def checkpoint(model):
  return tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model, optimizer=model.optimizer),
      os.path.join(directory, 'checkpoints'), max_to_keep=1)


# `.keras` first: saving to `.h5` takes the optimizer out of the model's
# compile config (Keras's bug), and a `.keras` file saved after it has none.
_FILES = ('m.keras', 'm.h5')
model = make()
result = {}
if mode == 'write':
  fit(model)
  fit(model)
  path = checkpoint(model).save()
  result['saved'] = state(model)
  result['variables'] = {
      name: np.asarray(tf.train.load_variable(path, name)).tolist()
      for name, _ in tf.train.list_variables(path)
      if name != '_CHECKPOINTABLE_OBJECT_GRAPH'}
  for name in _FILES:
    model.save(os.path.join(directory, name))
  fit(model)
  result['next'] = state(model)
elif mode == 'read':
  model.optimizer.build(model.trainable_variables)
  manager = checkpoint(model)
  manager.checkpoint.restore(manager.latest_checkpoint)
  result['restored'] = state(model)
  fit(model)
  result['next'] = state(model)
else:  # A file's name: load what the writer saved there.
  loaded = keras.models.load_model(os.path.join(directory, mode))
  result['loaded'] = state(loaded)
  try:
    fit(loaded)
    result['next'] = state(loaded)
  except ValueError as e:  # Keras's class after an `.h5` file: see the test.
    result['next'] = f'ValueError: {e}'
print(json.dumps(result))
'''

_MAKERS = ['compile', 'schedule', 'named']
# Keras's class, and the one install() puts under its name, which says it is
# Keras's (class_names.defining_name tells them apart).
_KERAS_CLASS = 'keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer'
_INSTALLED_CLASS = ('tf_loss_scale.keras.mixed_precision.shared_name.'
                    'LossScaleOptimizer')


def _run(mode, install, maker, directory):
  return fresh_process.run_json(
      ['-c', _PROGRAM, mode, str(int(install)), maker, str(directory)])


@pytest.fixture(scope='module', params=_MAKERS)
def written(request, tmp_path_factory):
  """Per maker: what each writer saved (with and without `install()`)."""
  maker = request.param
  runs = {}
  for install in (False, True):
    directory = tmp_path_factory.mktemp(f'{maker}_{int(install)}')
    runs[install] = directory, _run('write', install, maker, directory)
  return maker, runs


def _assert_close(actual, expected, what):
  np.testing.assert_allclose(np.asarray(actual, np.float64),
                             np.asarray(expected, np.float64), rtol=1e-6,
                             atol=0, err_msg=what)


def _assert_same_state(actual, expected):
  for name in ('iterations', 'scale', 'counter'):
    assert actual[name] == expected[name], (
        f'{name}: {actual[name]}, where the writer has {expected[name]}')
  _assert_close(actual['learning_rate'], expected['learning_rate'],
                'learning_rate')
  assert len(actual['inner_variables']) == len(expected['inner_variables'])
  for i, (a, b) in enumerate(zip(actual['inner_variables'],
                                 expected['inner_variables'])):
    _assert_close(a, b, f'inner optimizer variable {i}')
  for i, (a, b) in enumerate(zip(actual['weights'], expected['weights'])):
    _assert_close(a, b, f'weight {i}')


def _assert_same_next_epoch(read, wrote):
  # Every value, after one more epoch (whose first step overflows).
  _assert_same_state(read['next'], wrote['next'])


def test_the_checkpoint_is_the_same_with_and_without_install(written):
  maker, runs = written
  without, under = runs[False][1], runs[True][1]
  assert without['saved']['class'] == _KERAS_CLASS
  assert under['saved']['class'] == _INSTALLED_CLASS
  assert sorted(under['variables']) == sorted(without['variables'])
  # Keras's layout: the inner optimizer's step count (Keras 3 before 3.9
  # names it `iterations`).
  step = '_iterations' if versions.keras_at_least(3, 9) else 'iterations'
  assert f'optimizer/inner_optimizer/{step}/.ATTRIBUTES/VARIABLE_VALUE' in (
      under['variables'])
  for name, value in without['variables'].items():
    _assert_close(under['variables'][name], value, name)
  # Two epochs of four steps, each opening with an overflow (skipped, so
  # not counted, and halving the scale): 6 applied, the scale 2**15 / 2**2,
  # and the 3 finite steps since the last overflow counted.
  saved = without['saved']
  assert (saved['iterations'], saved['scale'], saved['counter']) == (
      6, 2.0**13, 3), maker


@pytest.mark.parametrize('install_writes', [False, True],
                         ids=['written_without', 'written_under_install'])
def test_the_checkpoint_restores_whole_into_the_other_process(
    written, install_writes):
  maker, runs = written
  directory, wrote = runs[install_writes]
  read = _run('read', not install_writes, maker, directory)
  _assert_same_state(read['restored'], wrote['saved'])
  _assert_same_next_epoch(read, wrote)


def _load_saved_under_install(written, name, install):
  """What loading file `name` of the writer under install() read, and what
  that writer saved."""
  maker, runs = written
  directory, wrote = runs[True]
  return _run(name, install, maker, directory), wrote


@pytest.mark.parametrize('name', ['m.keras', 'm.h5'])
def test_a_file_saved_under_install_loads_without_the_library(written, name):
  # The file names Keras's class
  # (tf_loss_scale/keras/mixed_precision/shared_name.py), which
  # loads it; a `.keras` file keeps every optimizer value.
  read, wrote = _load_saved_under_install(written, name, False)
  loaded = read['loaded']
  assert loaded['class'] == _KERAS_CLASS
  for i, (a, b) in enumerate(zip(loaded['weights'],
                                 wrote['saved']['weights'])):
    _assert_close(a, b, f'weight {i} loaded')
  if name == 'm.keras':
    _assert_same_state(loaded, wrote['saved'])
    _assert_same_next_epoch(read, wrote)
  else:
    # Keras's own `.h5` round trip: of the optimizer's state only the
    # wrapper's own variables are read back (the scale and its counter),
    # not the inner optimizer's count or slots, and the next step raises
    # (Keras's class does the same with `.h5` files it wrote itself:
    # tests/test_file_matrix.py pins it).
    assert loaded['iterations'] == 0
    assert (loaded['scale'], loaded['counter']) == (
        wrote['saved']['scale'], wrote['saved']['counter'])
    assert 'Unknown variable' in read['next'], read


@pytest.mark.parametrize('name', ['m.keras', 'm.h5'])
def test_a_file_saved_under_install_loads_back_under_install(written, name):
  # Into TF 2.4-2.15's class, with every optimizer value: TF 2.4-2.15
  # programs' `.h5` files kept the optimizer's state.
  read, wrote = _load_saved_under_install(written, name, True)
  loaded = read['loaded']
  assert loaded['class'] == _INSTALLED_CLASS
  if name == 'm.keras':
    _assert_same_state(loaded, wrote['saved'])
  else:
    # Read from `.h5`, the inner optimizer's slots are made, with the
    # file's values, by the first step, which lands on the writer's.
    for key in ('iterations', 'scale', 'counter', 'learning_rate'):
      assert loaded[key] == wrote['saved'][key], key
  _assert_same_next_epoch(read, wrote)
