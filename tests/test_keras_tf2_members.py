"""TF 2.x's members of both loss scale optimizers on Keras 3, beyond the traces.

What these members return after a step (`get_weights`, `weights`,
`get_slot`, `set_weights`, `minimize` with `grad_loss`, `add_slot`, `lr`,
`decay`, `variables()`) is compared with TF 2.3.4's and TF 2.15.1's own, as
CI records them in the originals' virtualenvs, by tests/test_traces.py (the
`members` scenarios). Here is what those records cannot show: which
variables `weights` and `variables()` hold, the Keras list `variables`,
TF 2.11-2.15's spellings, writes of `decay`, `add_weight`,
`get_gradients`/`get_updates` in a `tf.function` and an HDF5 round trip.
The expected values are worked out by hand from SGD with momentum: with
learning rate 0.1 and momentum 0.9, a step sets each momentum to 0.9 times
itself minus 0.1 times the gradient and adds it to the variable. So are
the slots of every TF 2.x optimizer that keeps them, read by TF 2.x's names
(and the inner optimizer's) after one step, from each optimizer's update
rule: tests/test_traces.py compares them with the originals' only where CI
has the originals.
"""

import os
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale.keras import experimental
import versions

versions.KERAS_3.require()

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
def test_weights_and_variables_are_the_inner_optimizers_but_learning_rate(
    form):
  opt = FORMS[form]()
  v = keras.Variable([1.0, 2.0], name='v')
  _step(opt, v)
  own = [x for x in opt.inner_optimizer.variables
         if x.name != 'learning_rate']
  assert len(own) == 2
  for members in (opt.weights, opt.variables()):
    assert [id(x) for x in members] == [id(x) for x in own]
  assert isinstance(opt.variables, list)


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
  # One step of the gradient 2v: v - 0.1 * 2v.
  _close(v, [0.8, 1.6])
  # As a TF 2.11-2.15 optimizer: the pairs as given, and a variable of the
  # initial value or of the shape asked for.
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
  opt.decay = 0.0
  assert float(opt.decay) == 0.0
  with pytest.raises(ValueError, match='InverseTimeDecay'):
    opt.decay = 0.01


@pytest.mark.parametrize('form', sorted(FORMS))
def test_add_weight_is_the_inner_optimizers(form):
  opt = FORMS[form]()
  made = opt.add_weight('counter', shape=(), dtype='int64')
  # The inner optimizer's Keras variable (Keras 3.3's refuse int()).
  assert made.numpy() == 0 and made.dtype == 'int64'
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
  # One step of SGD with momentum from zero: v - 0.1 * 2v.
  _close(v, [0.8, 1.6])


def _dense_model():
  model = keras.Sequential([
      keras.Input((3,)),
      keras.layers.Dense(2, kernel_initializer='ones')])
  return model


def test_experimental_h5_round_trip(tmp_path):
  # Inputs of ones and targets of zeros: each kernel entry and bias moves
  # alike. The first fit's two steps (gradients 3, then 1.8) leave each
  # momentum -0.45, the kernel 0.25 and the scale doubled to 16; the loaded
  # model's two more leave each momentum -0.2025 and the kernel -0.3575.
  # Ours keep the scale in the file (TF 2.3's started it afresh): 16, then
  # doubled to 32.
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


# ---- slots by TF 2.x's names ---------------------------------------------
#
# Each TF 2.x optimizer that keeps slots (tests/originals/traces.py's
# SLOTTED), one step of the loss sum(v * v) from v = [1, 2] (gradient
# g = 2v = [2, 4]) from zero slots (Adagrad's and Ftrl's accumulators from
# 0.1). Per optimizer: its arguments, then per slot in TF 2.x's order its
# TF 2.x name, the inner optimizer's name for it, and its value after the
# step, worked out from the update rule (one rule for TF 2.x and Keras 3):
#   SGD:      momentum = 0.9 * 0 - lr * g
#   Adam:     m = 0.1 * g; v = 0.001 * g**2; vhat = max(0, v) (amsgrad)
#   Adamax:   m = 0.1 * g; v = max(0.999 * 0, |g|)
#   Nadam:    m and v as Adam's (1 - 0.999 in float32, 0.99998713e-3)
#   RMSprop:  rms = 0.1 * g**2; mg = 0.1 * g (centered);
#             momentum = 0.9 * 0 + lr * g / sqrt(rms - mg**2 + 1e-7)
#   Adagrad:  accumulator = 0.1 + g**2
#   Adadelta: accum_grad = 0.05 * g**2;
#             accum_var = 0.05 * (sqrt(0 + 1e-7) / sqrt(accum_grad + 1e-7)
#                                 * g)**2
#   Ftrl:     accumulator = 0.1 + g**2;
#             linear = g - (sqrt(accumulator) - sqrt(0.1)) / lr * v
_V = np.array([1.0, 2.0])
_G = 2 * _V
_RMS, _MG = 0.1 * _G**2, 0.1 * _G
_ACCUM_GRAD = 0.05 * _G**2
SLOTS = {
    'SGD': ({'learning_rate': 0.1, 'momentum': 0.9},
            [('momentum', 'momentum', -0.1 * _G)]),
    'Adam': ({'learning_rate': 0.01, 'amsgrad': True},
             [('m', 'momentum', 0.1 * _G), ('v', 'velocity', 0.001 * _G**2),
              ('vhat', 'velocity_hat', 0.001 * _G**2)]),
    'Adamax': ({'learning_rate': 0.01},
               [('m', 'momentum', 0.1 * _G), ('v', 'norm', np.abs(_G))]),
    'Nadam': ({'learning_rate': 0.01},
              [('m', 'momentum', 0.1 * _G),
               ('v', 'velocity', (1 - np.float32(0.999)) * _G**2)]),
    'RMSprop': ({'learning_rate': 0.01, 'momentum': 0.9, 'centered': True},
                [('rms', 'velocity', _RMS),
                 ('momentum', 'momentum',
                  0.01 * _G / np.sqrt(_RMS - _MG**2 + 1e-7)),
                 ('mg', 'average_gradient', _MG)]),
    'Adagrad': ({'learning_rate': 0.01, 'initial_accumulator_value': 0.1},
                [('accumulator', 'accumulator', 0.1 + _G**2)]),
    'Adadelta': ({'learning_rate': 0.01, 'rho': 0.95, 'epsilon': 1e-7},
                 [('accum_grad', 'accumulated_grad', _ACCUM_GRAD),
                  ('accum_var', 'accumulated_delta_var', 0.05 * (
                      np.sqrt(1e-7) / np.sqrt(_ACCUM_GRAD + 1e-7) * _G)**2)]),
    'Ftrl': ({'learning_rate': 0.01, 'initial_accumulator_value': 0.1},
             [('accumulator', 'accumulator', 0.1 + _G**2),
              ('linear', 'linear',
               _G - (np.sqrt(0.1 + _G**2) - np.sqrt(0.1)) / 0.01 * _V)]),
}
# Float32 rounding (2.4e-7 at most); any other slot, or a slot of another
# variable, is off by far more.
_SLOT_RTOL = 1e-6


def _slotted(form: str, name: str) -> Any:
  inner = getattr(keras.optimizers, name)(**SLOTS[name][0])
  if form == 'experimental':
    return experimental.LossScaleOptimizer(inner, 'dynamic')
  return mixed_precision.LossScaleOptimizer(inner)


@pytest.mark.parametrize('name', sorted(SLOTS))
@pytest.mark.parametrize('form', sorted(FORMS))
def test_each_slot_by_tf2_name_after_one_step(form, name):
  opt = _slotted(form, name)
  # A second variable whose gradient is zero: a slot of the wrong variable
  # holds its initial value.
  v = keras.Variable(_V.tolist(), name='v')
  other = keras.Variable([3.0, 4.0], name='other')
  with tf.GradientTape() as tape:
    scaled = opt.get_scaled_loss(tf.reduce_sum(v * v) + 0.0 * tf.reduce_sum(
        other))
  grads = opt.get_unscaled_gradients(tape.gradient(scaled, [v, other]))
  opt.apply_gradients(zip(grads, [v, other]))
  slots = SLOTS[name][1]
  assert opt.get_slot_names() == [tf2 for tf2, _, _ in slots], name
  inner_variables = [id(x) for x in opt.inner_optimizer.variables]
  for tf2, own, expected in slots:
    slot = opt.get_slot(v, tf2)
    # The inner optimizer's variable itself, which its steps update.
    assert id(slot) in inner_variables, (name, tf2)
    assert opt.get_slot(v, own) is slot, (name, tf2, own)
    assert opt.get_slot(other, tf2) is not slot, (name, tf2)
    np.testing.assert_allclose(
        np.asarray(slot, np.float64), expected, rtol=_SLOT_RTOL, atol=0,
        err_msg=f'{form} {name}: slot {tf2!r} of v after one step')


@pytest.mark.parametrize('form', sorted(FORMS))
def test_adam_vhat_keeps_the_largest_v(form):
  # After the step above, a zero gradient: v decays to 0.999 v, vhat keeps
  # the v of the first step; m decays to 0.9 m.
  opt = _slotted(form, 'Adam')
  v = keras.Variable(_V.tolist(), name='v')
  _step(opt, v)
  opt.apply_gradients([(tf.zeros(2), v)])
  for slot, expected in (('m', 0.9 * 0.1 * _G), ('v', 0.999 * 0.001 * _G**2),
                         ('vhat', 0.001 * _G**2)):
    np.testing.assert_allclose(
        np.asarray(opt.get_slot(v, slot), np.float64), expected,
        rtol=_SLOT_RTOL, atol=0, err_msg=f'{form}: slot {slot!r} after two '
        'steps')
