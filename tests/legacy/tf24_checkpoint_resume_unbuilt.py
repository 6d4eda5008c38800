"""TF 2.4-2.15 Keras: resuming with the optimizer not yet built.

The first run trains `LossScaleOptimizer(Adam(), initial_scale=256,
dynamic_growth_steps=3)` seven steps (the scale doubles twice, to 1024),
writes a `tf.train.Checkpoint` of the model's variables and the optimizer,
trains three more and keeps what it reached. The second run builds its
model, not the optimizer, reads the checkpoint
(`assert_existing_objects_matched`), and must hold the file's loss scale,
counter and step count before its first step, as tf_keras's class does,
and after three steps the first run's weights, Adam's moments included.
Run it twice in one directory, first with tf_keras (or TensorFlow 2.15).
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later
# Resumes: yes

import json
import os

import numpy as np
import tensorflow as tf

X = tf.constant([[1.0, 2.0], [-1.0, 0.5], [0.5, -2.0]])
Y = tf.constant([[2.0], [-2.0], [1.0]])
WEIGHTS = [np.array([[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]], np.float32),
           np.array([0.1, -0.2, 0.3], np.float32),
           np.array([[1.0], [-0.5], [0.25]], np.float32),
           np.array([0.5], np.float32)]

model = tf.keras.Sequential([tf.keras.Input(shape=(2,)),
                             tf.keras.layers.Dense(3),
                             tf.keras.layers.Dense(1)])
model.set_weights(WEIGHTS)
opt = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.Adam(0.01), initial_scale=256,
    dynamic_growth_steps=3)


@tf.function
def train_step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(X) - Y))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(
      tape.gradient(scaled_loss, model.trainable_variables))
  opt.apply_gradients(zip(grads, model.trainable_variables))


def state():
  return {'scale': float(opt.loss_scale), 'counter': int(opt.dynamic_counter),
          'iterations': int(opt.iterations)}


def reached():
  # Adam's moments by position: the model's variables' order in both Keras.
  return {'weights': [w.tolist() for w in model.get_weights()],
          'inner': [np.asarray(v).tolist()
                    for v in opt.inner_optimizer.variables
                    if v.shape.rank and v.shape.rank > 0], **state()}


prefix = os.path.join('resume', 'ckpt')
resumed = os.path.exists('reached.json')
if not resumed:
  for _ in range(7):
    train_step()
  tf.train.Checkpoint(weights=model.trainable_variables,
                      optimizer=opt).write(prefix)
  saved = state()
  assert saved == {'scale': 1024.0, 'counter': 1, 'iterations': 7}, saved
else:
  tf.train.Checkpoint(weights=model.trainable_variables, optimizer=opt).read(
      prefix).assert_existing_objects_matched()
  before = state()
  assert before == {'scale': 1024.0, 'counter': 1, 'iterations': 7}, before
for _ in range(3):
  train_step()
now = reached()
assert (now['scale'], now['counter'], now['iterations']) == (2048.0, 1, 10)
if resumed:
  with open('reached.json') as f:
    expected = json.load(f)
  assert len(now['inner']) == len(expected['inner']) == 8
  for got, want in zip(now['weights'] + now['inner'],
                       expected['weights'] + expected['inner']):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
else:
  with open('reached.json', 'w') as f:
    json.dump(now, f)
print(json.dumps({'resumed': resumed, **state(),
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
