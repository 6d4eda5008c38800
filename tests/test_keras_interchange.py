"""State moves between ours and `keras.optimizers.LossScaleOptimizer`.

For every way Keras stores an optimizer's state (`.keras` files,
`model.load_weights`, `save_own_variables`/`load_own_variables`, state trees,
`tf.train.Checkpoint`, the stateless value lists) a model trained with one
class restores into the other, in both directions, with every optimizer
variable equal, and training continues from it. Both classes are those of
the installed Keras (3.3.3 to 3.15).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import versions

versions.KERAS_3.require()

from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top,g-bad-import-order

CLASSES = {'ours': LossScaleOptimizer,
           'keras': keras.optimizers.LossScaleOptimizer}
DIRECTIONS = [('keras', 'ours'), ('ours', 'keras')]


def _model(kind, compile_it=True):
  keras.utils.set_random_seed(11)
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                            keras.layers.Dense(1)])
  if compile_it:
    # State trees key variables by path, so both optimizers get one name.
    model.compile(optimizer=CLASSES[kind](
        keras.optimizers.Adam(0.01, name='adam'), initial_scale=2.0**22,
        dynamic_growth_steps=3, name='lso'), loss='mse')
  return model


def _trained(kind):
  """A model fitted for 5 batches; the scale grew once (2**22 -> 2**23)."""
  model = _model(kind)
  rng = np.random.default_rng(1)
  model.fit(rng.normal(size=(10, 3)).astype(np.float32),
            rng.normal(size=(10, 1)).astype(np.float32), batch_size=2,
            verbose=0)
  return model


def _values(optimizer):
  return [np.asarray(v.numpy()) for v in optimizer.variables]


def _assert_same_optimizer_state(source, target, how):
  saved, restored = _values(source.optimizer), _values(target.optimizer)
  assert len(saved) == len(restored), how
  for i, (a, b) in enumerate(zip(saved, restored)):
    np.testing.assert_array_equal(
        a, b, err_msg=f'{how}: variable {i} '
        f'({target.optimizer.variables[i].path}) not restored')
  assert float(target.optimizer.dynamic_scale.numpy()) == 2.0**23, how
  assert int(target.optimizer.inner_optimizer.iterations.numpy()) == 5, how


def _build_optimizer(model):
  # As Model.fit builds it: in the optimizer's name scope, so slot paths
  # (which state trees match on) read 'lso/adam/...'.
  with keras.name_scope(model.optimizer.name, caller=model.optimizer):
    model.optimizer.build(model.trainable_variables)


def _built_target(kind):
  model = _model(kind)
  _build_optimizer(model)
  return model


@pytest.mark.parametrize('file_name', ['model.keras', 'model.weights.h5'])
@pytest.mark.parametrize('source_kind,target_kind', DIRECTIONS)
def test_load_weights_from_a_file(tmp_path, source_kind, target_kind,
                                  file_name):
  source = _trained(source_kind)
  path = str(tmp_path / file_name)
  if file_name.endswith('.weights.h5'):
    source.save_weights(path)
  else:
    source.save(path)
  target = _built_target(target_kind)
  target.load_weights(path)
  _assert_same_optimizer_state(source, target, f'load_weights({file_name})')


@pytest.mark.parametrize('source_kind,target_kind', DIRECTIONS)
def test_own_variables_store(source_kind, target_kind):
  source = _trained(source_kind)
  store = {}
  source.optimizer.save_own_variables(store)
  target = _built_target(target_kind)
  target.optimizer.load_own_variables(store)
  _assert_same_optimizer_state(source, target, 'load_own_variables')


# Models have state trees from Keras 3.6 on.
_STATE_TREES = versions.Condition(
    hasattr(keras.Model, 'get_state_tree'),
    f'needs Model.get_state_tree, which Keras {keras.__version__} lacks')


@_STATE_TREES.mark
@pytest.mark.parametrize('source_kind,target_kind', DIRECTIONS)
def test_state_tree_of_the_same_model_recompiled(source_kind, target_kind):
  # State trees key optimizer variables by path, and slot paths name the
  # model's variables: the tree moves between optimizers of one model.
  model = _trained(source_kind)
  tree = model.get_state_tree()
  saved = _values(model.optimizer)
  model.compile(optimizer=CLASSES[target_kind](
      keras.optimizers.Adam(0.01, name='adam'), initial_scale=1.0,
      dynamic_growth_steps=3, name='lso'), loss='mse')
  _build_optimizer(model)
  model.set_state_tree(tree)
  assert type(model.optimizer) is CLASSES[target_kind]
  for i, (a, b) in enumerate(zip(saved, _values(model.optimizer))):
    np.testing.assert_array_equal(a, b, err_msg=f'state tree: variable {i}')
  assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**23


@pytest.mark.parametrize('source_kind,target_kind', DIRECTIONS)
def test_tf_train_checkpoint(tmp_path, source_kind, target_kind):
  source = _trained(source_kind)
  path = tf.train.Checkpoint(optimizer=source.optimizer,
                             model=source).write(str(tmp_path / 'ckpt'))
  target = _built_target(target_kind)
  status = tf.train.Checkpoint(optimizer=target.optimizer,
                               model=target).read(path)
  status.assert_existing_objects_matched()
  _assert_same_optimizer_state(source, target, 'tf.train.Checkpoint')


def test_keras_file_of_keras_class_loads_and_keeps_training_with_ours(
    tmp_path):
  source = _trained('keras')
  path = str(tmp_path / 'keras_class.keras')
  source.save(path)
  target = _built_target('ours')
  target.load_weights(path)
  x = np.ones((2, 3), np.float32)
  y = np.zeros((2, 1), np.float32)
  for model in (source, target):
    model.fit(x, y, batch_size=2, verbose=0)
  _assert_same_weights(source, target)
  assert int(target.optimizer.inner_optimizer.iterations.numpy()) == 6


def _assert_same_weights(a, b):
  for i, (x, y) in enumerate(zip(a.get_weights(), b.get_weights())):
    np.testing.assert_allclose(x, y, rtol=1e-6, err_msg=f'weight {i}')


def test_stateless_values_of_keras_class_feed_ours_and_back():
  # Keras's class cannot run stateless_apply on TensorFlow; its value lists
  # are the same as ours, so ours can step from them and hand them back.
  source = _trained('keras')
  ours = _built_target('ours')
  grads = [tf.ones_like(v) * 2.0**23 for v in source.trainable_variables]
  new_model, new_optimizer = ours.optimizer.stateless_apply(
      [v.value for v in source.optimizer.variables], grads,
      [v.value for v in source.trainable_variables])
  for variable, value in zip(source.optimizer.variables, new_optimizer):
    variable.assign(value)
  for variable, value in zip(source.trainable_variables, new_model):
    variable.assign(value)
  assert int(source.optimizer.inner_optimizer.iterations.numpy()) == 6
  assert int(source.optimizer.step_counter.numpy()) == 0
  assert float(source.optimizer.dynamic_scale.numpy()) == 2.0**24


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_load_model_of_ours_in_a_fresh_model_under_mirrored_strategy(
    tmp_path, mirrored_strategy):
  with mirrored_strategy.scope():
    source = _trained('ours')
  path = str(tmp_path / 'mirrored.keras')
  source.save(path)
  with mirrored_strategy.scope():
    target = _built_target('keras')
  target.load_weights(path)
  _assert_same_optimizer_state(source, target, 'mirrored .keras')
