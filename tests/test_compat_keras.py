"""`compat.install()` beside Keras's own machinery: programs that use no
legacy name run as without it, and `compile` and TF 2.4-2.15's class agree.

Every run is a fresh process (tests/compat_keras_runs.py, tests/legacy/):
install() and the mixed precision policy are process-wide.
"""

import io
import json
import os
import zipfile

import h5py
import numpy as np

import pytest

import fresh_process
import keras_families
import versions

_TESTS = os.path.dirname(os.path.abspath(__file__))
_RUNS = os.path.join(_TESTS, 'compat_keras_runs.py')
_LEGACY = os.path.join(_TESTS, 'legacy')

# Where tf.keras is Keras 3 without TF_USE_LEGACY_KERAS (TensorFlow 2.16+).
KERAS3_CHILD = pytest.mark.skipif(
    not keras_families.tf_keras_can_be_keras3(),
    reason='needs TensorFlow 2.16+, where tf.keras is Keras 3 (here Keras 2 '
    'is built in)')
# Each child's tf.keras: TensorFlow's default (Keras 3 on 2.16+, Keras 2
# before), and tf_keras on 2.16+.
KERAS_OF_CHILD = [
    pytest.param(False, id='default'),
    pytest.param(True, id='tf_keras', marks=[pytest.mark.skipif(
        not keras_families.tf_keras_can_be_keras3(),
        reason='TF_USE_LEGACY_KERAS=1 is for TensorFlow 2.16+ (tf.keras is '
        'Keras 2 already here)'), pytest.mark.skipif(
            not versions.TF_KERAS_CHILDREN_WANTED,
            reason='TF_LOSS_SCALE_TF_KERAS_CHILDREN=0: the newest '
            "TensorFlow's run runs the tf_keras children")]),
]

_COMPILE_AND_NAMES = '''
import json, tensorflow as tf, tf_loss_scale.compat as compat

def defining(name):
  return next(c for c in tf.keras.Model.__mro__ if name in vars(c))

owner = defining('compile')
before = {c: vars(c).get('compile') for c in tf.keras.Model.__mro__}
name_before = tf.keras.mixed_precision.LossScaleOptimizer
compat.install()
patched = vars(owner)['compile']
result = {
    'owner': owner.__module__ + '.' + owner.__qualname__,
    'only the owner changed': all(
        vars(c).get('compile') is before[c] for c in before if c is not owner),
    'owner patched': patched is not before[owner],
    # What Keras's loader compares: every model's compile is the owner's.
    'loader sees no custom compile': all(
        cls.compile is owner.compile for cls in (
            tf.keras.Model, tf.keras.Sequential, type(tf.keras.Sequential()))),
    'name replaced': tf.keras.mixed_precision.LossScaleOptimizer is not
        name_before,
}
compat.uninstall()
result['compile restored'] = all(
    vars(c).get('compile') is before[c] for c in before)
result['name restored'] = (
    tf.keras.mixed_precision.LossScaleOptimizer is name_before)
print(json.dumps(result))
'''


@pytest.mark.parametrize('legacy_keras', KERAS_OF_CHILD)
def test_install_patches_compile_on_the_class_defining_it_and_uninstall_restores(
    legacy_keras):
  result = fresh_process.run_json(['-c', _COMPILE_AND_NAMES], legacy_keras)
  keras3 = keras_families.tf_keras_can_be_keras3() and not legacy_keras
  # Keras 3 defines compile on its Trainer, Keras 2 on its Model (in
  # keras.engine on TensorFlow 2.12, keras.src.engine on 2.13-2.15).
  owner = result.pop('owner')
  assert owner.split('.')[0] == ('tf_keras' if legacy_keras else 'keras')
  assert owner.endswith('trainers.trainer.Trainer' if keras3
                        else 'engine.training.Model'), owner
  # On Keras 3 only, TF 2.4-2.15's class takes the mixed_precision name.
  assert result.pop('name replaced') == keras3
  assert result == {'only the owner changed': True, 'owner patched': True,
                    'loader sees no custom compile': True,
                    'compile restored': True, 'name restored': True}


@pytest.fixture(scope='module')
def fit_and_save(tmp_path_factory):
  """(install, legacy_keras) -> the fit-and-save program's file and report.

  One run per setting, shared by the tests.
  """
  runs = {}

  def run(install, legacy_keras):
    if (install, legacy_keras) not in runs:
      path = str(tmp_path_factory.mktemp('keras_file') / 'model.keras')
      runs[install, legacy_keras] = path, fresh_process.run_json(
          [_RUNS, 'fit', str(int(install)), path], legacy_keras)
    return runs[install, legacy_keras]

  return run


# The optimizer class Keras's compile makes under mixed_float16, after the
# package name.
_KERAS3_WRAPPER = '.src.optimizers.loss_scale_optimizer.LossScaleOptimizer'
_KERAS2_WRAPPER = 'mixed_precision.loss_scale_optimizer.LossScaleOptimizerV3'
_OURS = 'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'


@pytest.mark.parametrize('legacy_keras', KERAS_OF_CHILD)
def test_keras_file_saved_with_or_without_install_loads_with_or_without_it(
    fit_and_save, legacy_keras):
  saved = {install: fit_and_save(install, legacy_keras)
           for install in (False, True)}
  # The models trained alike (what the files hold: the next test).
  assert saved[True][1]['weights'] == saved[False][1]['weights']
  assert (saved[True][1]['optimizer_variables'] ==
          saved[False][1]['optimizer_variables'])
  loads = {(save, load): fresh_process.run_json(
      [_RUNS, 'load', str(int(load)), saved[save][0]], legacy_keras)
           for save in (False, True) for load in (False, True)}
  keras3 = keras_families.tf_keras_can_be_keras3() and not legacy_keras
  for (save, load), run in loads.items():
    state, loaded = saved[save][1], run['loaded']
    where = f'saved with install() {save}, loaded with it {load}'
    # Keras's loader compiled the model: no "compile() was not called".
    assert run['warnings'] == [], where
    assert loaded['weights'] == state['weights'], where
    assert loaded['inner_optimizer'] == state['inner_optimizer'], where
    # Under install() on Keras 3, compile made TF 2.4-2.15's class.
    wrapper = loaded['optimizer']
    if keras3:
      assert wrapper == (_OURS if load else 'keras' + _KERAS3_WRAPPER), where
    else:
      assert wrapper.endswith(_KERAS2_WRAPPER), where
    if not (keras3 or legacy_keras):
      # TensorFlow 2.12-2.15's own Keras 2: what its files restore is its
      # own affair; install() changes none of it (compared below).
      continue
    # The iteration count and Adam's slots come back exactly.
    assert loaded['iterations'] == state['iterations'] == (10 if keras3
                                                           else 16), where
    assert (loaded['optimizer_variables'] == state['optimizer_variables']
           ), where
    # Keras 3's class saves its scale (tf_keras's .keras files do not: it
    # restarts at 2**15, with or without install()).
    assert loaded['loss_scale'] == (512.0 if keras3 else 32768.0), where
  for save in (False, True):
    without, with_install = (dict(loads[save, load]['loaded'], optimizer=None)
                             for load in (False, True))
    assert with_install == without
  # Training goes on identically whichever way it was saved and loaded.
  continued = [(run['continued']['weights'], run['continued']['losses'],
                run['continued']['iterations'],
                run['continued']['loss_scale'],
                run['continued']['optimizer_variables'])
               for run in loads.values()]
  assert all(c == continued[0] for c in continued), 'runs differ'


def _without_object_ids(config):
  """The config without `shared_object_id`s: the id() of a shared object in
  the process that saved, which differs from process to process."""
  if isinstance(config, dict):
    return {k: _without_object_ids(v) for k, v in config.items()
            if k != 'shared_object_id'}
  if isinstance(config, list):
    return [_without_object_ids(v) for v in config]
  return config


def _h5_contents(h5):
  """Every array and attribute of an open HDF5 file, by its path there."""
  contents = {}

  def visit(name, item):
    for key, value in item.attrs.items():
      value = value.decode() if isinstance(value, bytes) else value
      contents[f'{name}@{key}'] = (value.tolist() if hasattr(value, 'tolist')
                                   else value)
    if isinstance(item, h5py.Dataset):
      contents[name] = item[()].tolist()

  visit('', h5)
  h5.visititems(visit)
  return contents


def _keras_file(path):
  """What a .keras file holds: its config, its metadata but the time it was
  saved, and every array of its weights file by its path there."""
  if h5py.is_hdf5(path):
    # Keras 2.12 writes a .keras path as an HDF5 file: config, training
    # config and weights as its attributes and arrays.
    with h5py.File(path, 'r') as h5:
      return {'config': {}, 'metadata': {}, 'arrays': _h5_contents(h5)}
  with zipfile.ZipFile(path) as archive:
    config = _without_object_ids(json.loads(archive.read('config.json')))
    metadata = json.loads(archive.read('metadata.json'))
    weights = archive.read('model.weights.h5')
  metadata.pop('date_saved', None)
  with h5py.File(io.BytesIO(weights), 'r') as h5:
    arrays = _h5_contents(h5)
  return {'config': config, 'metadata': metadata, 'arrays': arrays}


@pytest.mark.parametrize('legacy_keras', KERAS_OF_CHILD)
def test_keras_file_saved_with_install_holds_what_it_holds_without(
    fit_and_save, legacy_keras):
  files = {install: _keras_file(fit_and_save(install, legacy_keras)[0])
           for install in (False, True)}
  for part in ('metadata', 'arrays', 'config'):
    assert files[True][part] == files[False][part], part


@pytest.mark.parametrize('legacy_keras', KERAS_OF_CHILD)
def test_fit_without_legacy_names_is_bit_identical_with_install(
    fit_and_save, legacy_keras):
  # compile under mixed_float16 (Keras wraps the optimizer), fit through
  # overflowing steps that are skipped.
  runs = {install: dict(fit_and_save(install, legacy_keras)[1])
          for install in (False, True)}
  keras3 = keras_families.tf_keras_can_be_keras3() and not legacy_keras
  for run in runs.values():
    # 16 steps, 6 of them skipped: the scale halved 6 times from 2**15.
    # Keras 3 counts applied steps (as Keras's class), Keras 2 every step.
    assert (run['iterations'], run['loss_scale']) == (
        (10 if keras3 else 16), 512.0)
    assert run['losses'][-1] < run['losses'][0]
  assert runs[True].pop('optimizer') == (
      _OURS if keras3 else runs[False]['optimizer'])
  runs[False].pop('optimizer')
  assert runs[True] == runs[False]


@KERAS3_CHILD
def test_isinstance_train_step_trains_after_install_as_tf_keras_class_does():
  # tests/legacy/tf24_train_step_isinstance.py: a TF 2.4-2.15 train_step
  # that scales only if the compiled optimizer is an instance of
  # tf.keras.mixed_precision.LossScaleOptimizer. On Keras 3 after install()
  # compile made that class; the oracle is the program run as written for
  # tf_keras (TF_USE_LEGACY_KERAS=1), without install(), where compile made
  # tf_keras's own class.
  program = os.path.join(_LEGACY, 'tf24_train_step_isinstance.py')
  # The runner prints the program's JSON line, then its own (the classes
  # made).
  run = fresh_process.run([os.path.join(_LEGACY, 'run_program.py'), program])
  assert run.returncode == 0, run.stderr[-4000:]
  *_, keras3, made = map(json.loads, run.stdout.strip().splitlines())
  tf_keras = fresh_process.run_json([program], legacy_keras=True)
  # The class install() puts under the name is named as Keras's own.
  assert (keras3.pop('optimizer_class'), tf_keras.pop('optimizer_class')) == (
      'keras.optimizers.LossScaleOptimizer',
      'tf_keras.src.mixed_precision.loss_scale_optimizer.LossScaleOptimizerV3')
  # Keras's compile makes its class, which install() replaces.
  assert made['made'] == [
      'keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer in '
      'compile',
      'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer in compile']
  if versions.keras_at_least(3, 15):
    # Bit for bit (seen on Keras 3.15): the same float16 arithmetic in both
    # Keras families.
    assert keras3 == tf_keras
  else:
    # Keras 3.3's float16 layers round apart from tf_keras's (by up to 3e-5
    # in these losses and weights): within float16's resolution of them.
    for key in ('losses', 'weights'):
      np.testing.assert_allclose(np.concatenate(keras3.pop(key), axis=None),
                                 np.concatenate(tf_keras.pop(key), axis=None),
                                 rtol=1e-3, atol=1e-4, err_msg=key)
    assert keras3 == tf_keras
  assert (keras3['loss_scale'], keras3['iterations']) == (512.0, 24)


_COMPILE_MADE = '''
import json, keras, tensorflow as tf, tf_loss_scale.compat as compat
from tf_loss_scale.keras.mixed_precision import shared_name as tf24

def compiled(optimizer, **kwargs):
  model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
  model.compile(optimizer=optimizer, loss='mse', **kwargs)
  return model.optimizer

tf.keras.mixed_precision.set_global_policy('mixed_float16')
compat.install()
inner = keras.optimizers.SGD(0.1)
made = compiled(inner)
own = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), 256.0)
result = {
    'made': type(made) is tf24.LossScaleOptimizer,
    'same inner': made.inner_optimizer is inner,
    'settings': [made.name, made.initial_scale, made.dynamic_growth_steps],
    'isinstance': isinstance(made, tf.keras.mixed_precision.LossScaleOptimizer),
    'a wrapper passed is kept': compiled(own) is own,
    'no scaling asked, none added': type(
        compiled(keras.optimizers.SGD(0.1), auto_scale_loss=False)
    ) is keras.optimizers.SGD,
}
# Keras 3 wraps the optimizer anew on every compile, the first wrapper
# still held or not.
again = compiled(inner)
result['recompiled around the same inner'] = [
    type(again) is tf24.LossScaleOptimizer, again.inner_optimizer is inner,
    again is not made]
compat.uninstall()
result['Keras made after uninstall'] = type(
    compiled(keras.optimizers.SGD(0.1))) is keras.optimizers.LossScaleOptimizer
print(json.dumps(result))
'''


@KERAS3_CHILD
def test_compile_made_keras_wrapper_is_replaced_only_while_installed():
  result = fresh_process.run_json(['-c', _COMPILE_MADE])
  assert result == {
      'made': True, 'same inner': True,
      # Keras's name and defaults for the wrapper compile makes.
      'settings': ['loss_scale_optimizer', 32768.0, 2000],
      'isinstance': True, 'a wrapper passed is kept': True,
      'no scaling asked, none added': True,
      'recompiled around the same inner': [True, True, True],
      'Keras made after uninstall': True}


_TF_KERAS_V3_CONFIG = '''
import json, tensorflow as tf, tf_keras, tf_loss_scale.compat as compat
import class_names
config = tf_keras.optimizers.serialize(tf_keras.mixed_precision.
    LossScaleOptimizer(tf_keras.optimizers.Adam(0.5), initial_scale=64.0,
                       dynamic_growth_steps=7))

def read():
  opt = tf.keras.optimizers.deserialize(json.loads(json.dumps(config)))
  if isinstance(opt, str):
    return opt
  return [class_names.class_name(type(opt)), float(opt.initial_scale),
          opt.dynamic_growth_steps, type(opt.inner_optimizer).__name__,
          float(opt.inner_optimizer.learning_rate.numpy())]

result = {'class_name': config['class_name'], 'before': read()}
compat.install()
result['installed'] = read()
compat.uninstall()
result['after uninstall'] = read()
print(json.dumps(result))
'''


@(versions.TF_KERAS_IS_KERAS_3 & versions.TF_KERAS_INSTALLED).mark
def test_tf_keras_loss_scale_optimizer_config_deserializes_while_installed():
  result = fresh_process.run_json(['-c', _TF_KERAS_V3_CONFIG])
  # Keras's deserializer does not know tf_keras's class name: it hands the
  # name back as a string (Keras's behaviour, pinned) unless install() maps
  # the name to TF 2.4-2.15's class.
  assert result == {
      'class_name': 'LossScaleOptimizerV3',
      'before': 'LossScaleOptimizerV3',
      'installed': ['tf_loss_scale.keras.mixed_precision.LossScaleOptimizer',
                    64.0, 7, 'Adam', 0.5],
      'after uninstall': 'LossScaleOptimizerV3'}
