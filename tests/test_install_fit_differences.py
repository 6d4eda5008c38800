"""What `fit` does under `install()` on Keras 3, beside tf_keras's class.

docs/differences.md (TF 2.4-2.15 Keras) says why TF 2.4-2.15 programs that
train with `fit` belong to `tf-loss-scale run`: under `install()` the class
under `tf.keras.mixed_precision.LossScaleOptimizer` is Keras's class to
`fit`. These tests pin that difference against tf_keras's class in the same
run: `fit` leaves skipped steps out of `iterations` (Adam's steps follow),
and a later `apply_gradients` of plain gradients divides them by the scale,
where tf_keras's applies them as given (with `dynamic=`, ours does too;
`fit` still counts as Keras 3's).
"""

import pytest

import fresh_process
import versions

# Before Keras 3.9, Keras's class counts `iterations` in a counter that stays
# 0 (docs/differences.md), so there is no count to compare with tf_keras's.
versions.keras_at_least(3, 9).require()

pytestmark = [versions.KERAS_3.mark, versions.TF_KERAS_INSTALLED.mark,
              pytest.mark.slow]

_CHILD = '''
import json
import numpy as np
import tensorflow as tf
import keras, tf_keras
import tf_loss_scale.compat
tf_loss_scale.compat.install()

x = np.array([[1.0], [1.0], [64.0], [1.0], [1.0], [1.0]], np.float32)
y = np.full((6, 1), 1.5, np.float32)

def trained(K, make, inner):
  K.mixed_precision.set_global_policy('mixed_float16')
  try:
    model = K.Sequential([K.Input((1,)), K.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros'),
        K.layers.Activation('linear', dtype='float32')])
    opt = make(K, inner(K))
    model.compile(opt, 'mse', steps_per_execution=3)
    model.fit(x, y, batch_size=1, epochs=2, verbose=0, shuffle=False)
    fit = [int(opt.iterations.numpy()), float(model.get_weights()[0][0, 0])]
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x[:1]) - y[:1]))
    grads = tape.gradient(loss, model.trainable_variables)
    before = float(model.get_weights()[0][0, 0])
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return fit + [float(model.get_weights()[0][0, 0]) - before]
  finally:
    K.mixed_precision.set_global_policy('float32')

adam = lambda K: K.optimizers.Adam(0.1)
sgd = lambda K: K.optimizers.SGD(0.1)
wrap = lambda K, inner: K.mixed_precision.LossScaleOptimizer(inner)
dynamic = lambda K, inner: K.mixed_precision.LossScaleOptimizer(
    inner, dynamic=True)
print(json.dumps({
    name: [trained(tf_keras, wrap, inner), trained(tf.keras, wrap, inner),
           trained(tf.keras, dynamic, inner)]
    for name, inner in (('adam', adam), ('sgd', sgd))}))
'''


@pytest.fixture(scope='module')
def runs():
  return fresh_process.run_json(['-c', _CHILD])


def test_fit_counts_iterations_as_keras_3_under_install(runs):
  tf_keras_class, install_class, with_dynamic = runs['adam']
  # 12 steps, 3 of them skipped: tf_keras's class counts them all.
  assert tf_keras_class[0] == 12
  assert install_class[0] == with_dynamic[0] == 9
  # Adam's steps follow the count.
  assert install_class[1] == with_dynamic[1] != tf_keras_class[1]
  # SGD's do not: the same weights after `fit`.
  assert runs['sgd'][0][0] == 12 and runs['sgd'][1][0] == 9
  assert runs['sgd'][0][1] == runs['sgd'][1][1]


def test_apply_gradients_after_fit_divides_plain_gradients_by_the_scale(runs):
  tf_keras_class, install_class, with_dynamic = runs['sgd']
  assert tf_keras_class[2] != 0.0
  # Divided by the scale, as Keras's class does: almost nothing moves.
  assert abs(install_class[2]) < abs(tf_keras_class[2]) / 1000
  # `dynamic=` makes it tf_keras's class.
  assert with_dynamic[2] == pytest.approx(tf_keras_class[2], rel=1e-6)
