"""TF 2.x's members of both loss scale optimizers on Keras 3, against the originals.

The expected values were recorded by running the same scenario on TF 2.3.4's
`mixed_precision.experimental.LossScaleOptimizer` and on TF 2.15.1's
`mixed_precision.LossScaleOptimizer` (around `optimizers.legacy.SGD` and
around `optimizers.SGD`), each with `SGD(0.1, momentum=0.9)` and a variable
`v = [1., 2.]`, loss `sum(v * v)`. Keras 3's inner optimizer also keeps its
learning rate in a variable, which, as TF 2.x's hyperparameters, is in
neither `weights` nor `variables()`.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale.keras import experimental
import versions

versions.KERAS_3_12.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
from tf_loss_scale.keras import mixed_precision  # Refuses Keras 2.
# pylint: enable=g-import-not-at-top,wrong-import-order


def _experimental():
  return experimental.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9), 'dynamic')


def _tf24():
  return mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9))


FORMS = {'experimental': _experimental, 'tf24': _tf24}


def _step(opt, v):
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(tf.reduce_sum(v * v))
  grads = opt.get_unscaled_gradients(tape.gradient(scaled, [v]))
  opt.apply_gradients(zip(grads, [v]))


def _close(actual, expected):
  np.testing.assert_allclose(np.asarray(actual, dtype=float),
                             np.asarray(expected, dtype=float), rtol=1e-6)


@pytest.mark.parametrize('form', sorted(FORMS))
def test_weights_slots_and_minimize_as_tf2(form):
  opt = FORMS[form]()
  v = keras.Variable([1.0, 2.0], name='v')
  _step(opt, v)
  # TF 2.3.4 and TF 2.15.1 (legacy SGD): get_weights() == [1, [-0.2, -0.4]],
  # get_slot(v, 'momentum') == [-0.2, -0.4], get_slot_names() == ['momentum'].
  weights = opt.get_weights()
  assert len(weights) == 2
  _close(weights[0], 1)
  _close(weights[1], [-0.2, -0.4])
  assert [w.name for w in opt.weights] == ['iteration', 'v_momentum']
  _close(opt.get_slot(v, 'momentum'), [-0.2, -0.4])
  assert opt.get_slot_names() == ['momentum']
  # set_weights(get_weights()) with the slot changed; both recorded
  # [0.5, 0.25], and after one more step v == [1.09, 1.505], iterations 2.
  weights[-1] = np.array([0.5, 0.25], 'float32')
  opt.set_weights(weights)
  _close(opt.get_slot(v, 'momentum'), [0.5, 0.25])
  _step(opt, v)
  _close(v, [1.09, 1.505])
  assert int(opt.iterations) == 2
  # minimize(loss, var_list, grad_loss=, name=) of a vector loss: recorded
  # v == [1.133, 1.269].
  opt.minimize(lambda: v * v, [v], grad_loss=tf.constant([1.0, 0.5]),
               name='m')
  _close(v, [1.133, 1.269])
  # add_slot: recorded [1., 1.] and names ['extra', 'momentum'].
  opt.add_slot(v, 'extra', 'ones')
  _close(opt.get_slot(v, 'extra'), [1.0, 1.0])
  assert sorted(opt.get_slot_names()) == ['extra', 'momentum']


@pytest.mark.parametrize('form', sorted(FORMS))
def test_resetting_variables_leaves_the_scale(form):
  opt = FORMS[form]()
  v = keras.Variable([1.0, 2.0], name='v')
  _step(opt, v)
  called = opt.variables()
  # TF 2.3.4 and 2.15.1 (both kinds of inner optimizer): variables() is the
  # inner optimizer's, [iterations, momentum].
  assert [x.name for x in called] == ['iteration', 'v_momentum']
  assert isinstance(opt.variables, list)
  for x in opt.variables():
    x.assign(tf.zeros_like(x))
  # Recorded after the loop: scale 32768, iterations 0 (and the learning
  # rate, a hyperparameter, 0.1).
  scale = opt.loss_scale() if callable(opt.loss_scale) else opt.loss_scale
  assert float(scale) == 32768.0
  assert int(opt.iterations) == 0
  _close(opt.inner_optimizer.learning_rate, 0.1)


def test_tf24_variables_attribute_is_keras_list():
  opt = _tf24()
  v = keras.Variable([1.0, 2.0], name='v')
  _step(opt, v)
  reference = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9))
  reference.build([keras.Variable([1.0, 2.0], name='v')])
  assert [x.name for x in opt.variables] == [
      x.name for x in reference.variables]
  assert 'dynamic_scale' in [x.name for x in opt.variables]


def test_tf24_tf211_spellings():
  opt = _tf24()
  v = keras.Variable([1.0, 2.0], name='v')
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(v * v)
  opt.minimize(loss, [v], tape)  # TF 2.11-2.15's third positional argument.
  # TF 2.15.1 (new SGD): v == [0.8, 1.6].
  _close(v, [0.8, 1.6])
  # TF 2.15.1's wrapper raised AttributeError ('_mesh') for these two; its
  # inner optimizer returned [1., 2.] and [3., 4.]: ours gives those.
  pairs = opt.aggregate_gradients([(tf.constant([1.0, 2.0]), v)])
  _close(pairs[0][0], [1.0, 2.0])
  assert pairs[0][1] is v
  made = opt.add_variable_from_reference(
      model_variable=v, variable_name='extra',
      initial_value=tf.constant([3.0, 4.0]))
  _close(made, [3.0, 4.0])
  shaped = opt.add_variable_from_reference(v, 'shaped', shape=(3,))
  _close(shaped, [0.0, 0.0, 0.0])
  with pytest.raises(TypeError, match='reference_variable= and model_var'):
    opt.add_variable_from_reference(v, model_variable=v)


def test_tf24_decay():
  opt = _tf24()
  # TF 2.15.1 (legacy SGD): decay reads 0.0.
  assert float(opt.decay) == 0.0
  opt.decay = 0.0
  with pytest.raises(ValueError, match='InverseTimeDecay'):
    opt.decay = 0.01


@pytest.mark.parametrize('form', sorted(FORMS))
def test_add_weight_is_the_inner_optimizers(form):
  opt = FORMS[form]()
  made = opt.add_weight('counter', shape=(), dtype='int64')
  assert int(made) == 0
  assert any(x is made for x in opt.inner_optimizer.variables)
  with pytest.raises(ValueError, match='trainable=True'):
    opt.add_weight('w', shape=(), trainable=True)


@pytest.mark.parametrize('form', sorted(FORMS))
def test_get_gradients_and_get_updates_in_a_graph(form):
  opt = FORMS[form]()
  v = keras.Variable([1.0, 2.0], name='v')
  with pytest.raises(RuntimeError, match='tf.function'):
    opt.get_gradients(tf.reduce_sum(v * v), [v])

  @tf.function
  def graph_step():
    loss = tf.reduce_sum(v * v)
    grads = opt.get_gradients(loss, [v])
    opt.get_updates(loss, [v])
    return grads[0]

  grads = graph_step()
  _close(grads, [2.0, 4.0])
  # One step of SGD with momentum, as TF 2.3.4 took it: v == [0.8, 1.6].
  _close(v, [0.8, 1.6])


def _dense_model():
  model = keras.Sequential([
      keras.Input((3,)),
      keras.layers.Dense(2, kernel_initializer='ones')])
  return model


def test_experimental_h5_round_trip(tmp_path):
  # TF 2.3.4's run of this program (with `loss='mse'`, which Keras 3's HDF5
  # loader cannot read back): after the first fit, scale 16, iterations 2,
  # each momentum -0.45, kernel 0.25; the loaded model's second fit gave
  # iterations 4, each momentum -0.2025, kernel -0.3575 (and scale 16:
  # TF 2.3's files did not keep the scale, which restarted at 8; ours keep
  # it: 16, doubled to 32).
  opt = experimental.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9),
      tf_loss_scale.DynamicLossScale(initial_loss_scale=8.,
                                     increment_period=2))
  model = _dense_model()
  model.compile(opt, keras.losses.MeanSquaredError())
  x = np.ones((4, 3), 'float32')
  y = np.zeros((4, 2), 'float32')
  model.fit(x, y, batch_size=2, epochs=1, verbose=0)
  assert float(opt.loss_scale()) == 16.0
  assert int(opt.iterations) == 2
  _close(opt.get_weights()[1], np.full((3, 2), -0.45))
  path = os.path.join(tmp_path, 'm.h5')
  model.save(path)
  loaded = keras.models.load_model(path)
  restored = loaded.optimizer
  assert type(restored) is type(opt)
  assert float(restored.loss_scale()) == 16.0
  assert int(restored.iterations) == 2
  loaded.fit(x, y, batch_size=2, epochs=1, verbose=0)
  assert int(restored.iterations) == 4
  _close(restored.get_weights()[1], np.full((3, 2), -0.2025))
  _close(restored.get_weights()[2], np.full((2,), -0.2025))
  _close(loaded.layers[0].kernel, np.full((3, 2), -0.3575))
  assert float(restored.loss_scale()) == 32.0
