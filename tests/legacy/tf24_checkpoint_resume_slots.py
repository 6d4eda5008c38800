"""TF 2.4-2.15 Keras: resuming optimizers with slots from a checkpoint.

Two Dense layers under `mixed_float16`, trained by
`LossScaleOptimizer(SGD(momentum=0.9))` and by `LossScaleOptimizer(Adam())`
in a custom loop, each saving a `tf.train.Checkpoint` after three steps.
The first step's scaled gradients overflow in float16 at 2**15 (the
unscaled ones are finite) and it is skipped. Run twice in one directory:
the second run restores (every variable of the checkpoint must be bound),
trains three more steps and must end where six uninterrupted steps of the
same class end, momentum and Adam's moments included (first with
tf_keras, then on Keras 3: tf_keras's class cannot read what the class
under the name writes there). The checkpoint
holds the model's variables as a list, the optimizer's slots refer to them.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later
# Resumes: yes

import json
import os

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')
X = tf.constant([[1.0, 2.0], [-1.0, 0.5], [0.5, -2.0], [2.0, 1.0]])
Y = tf.constant([[2.0], [-2.0], [2.0], [2.0]])
WEIGHTS = [np.array([[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]], np.float32),
           np.array([0.1, -0.2, 0.3], np.float32),
           np.array([[1.0], [-0.5], [0.25]], np.float32),
           np.array([0.5], np.float32)]
OPTIMIZERS = {'momentum': lambda: tf.keras.optimizers.SGD(0.01, momentum=0.9),
              'adam': lambda: tf.keras.optimizers.Adam(0.01)}


def assert_bound(status):
  """Every variable took the checkpoint's value, but two the file lacks.

  On Keras 3 the class under the name (after `compat.install()`) saves
  Keras's layout, which holds the wrapper's own step count and learning
  rate (constants: the inner optimizer's are used); tf_keras's file, read
  whole, has no place for them. tf_keras's class cannot read Keras's layout.
  """
  try:
    status.assert_existing_objects_matched()
  except AssertionError as error:
    message = str(error)
    if not ('Found 2 Python objects' in message and
            '/iteration,' in message and '/learning_rate,' in message):
      raise


def make(kind):
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(2,)),
      tf.keras.layers.Dense(3),
      tf.keras.layers.Dense(1),
      tf.keras.layers.Activation('linear', dtype='float32')])
  model.set_weights(WEIGHTS)
  opt = tf.keras.mixed_precision.LossScaleOptimizer(OPTIMIZERS[kind]())

  @tf.function
  def train_step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(X) - Y))
      scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))

  return model, opt, train_step


def state(model, opt):
  return {'weights': [w.tolist() for w in model.get_weights()],
          'scale': float(opt.loss_scale), 'counter': int(opt.dynamic_counter),
          'iterations': int(opt.iterations),
          'optimizer_class': f'{type(opt).__module__}.{type(opt).__qualname__}'}


results, statuses = {}, []
resumed = False
for kind in OPTIMIZERS:
  model, opt, train_step = make(kind)
  # The model's variables as a list: Keras 3 models lay out their
  # checkpoints otherwise than Keras 2's, with or without loss scaling.
  checkpoint = tf.train.Checkpoint(variables=model.trainable_variables,
                                   optimizer=opt)
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join('checkpoints', kind), max_to_keep=1)
  resumed = manager.latest_checkpoint is not None
  status = checkpoint.restore(manager.latest_checkpoint)
  for _ in range(3):
    train_step()
  manager.save()
  results[kind] = state(model, opt)
  if resumed:
    statuses.append(status)
    reference_model, reference_opt, reference_step = make(kind)
    for _ in range(6):
      reference_step()
    reference = state(reference_model, reference_opt)
    # The skipped first step counted in iterations, as TF 2.4-2.15 count.
    assert (results[kind]['scale'], results[kind]['counter'],
            results[kind]['iterations']) == (16384.0, 5, 6), results[kind]
    assert (reference['scale'], reference['counter'],
            reference['iterations']) == (16384.0, 5, 6), reference
    for got, want in zip(results[kind]['weights'], reference['weights']):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                 err_msg=f'{kind}: resumed against six steps')
  else:
    assert (results[kind]['scale'], results[kind]['counter'],
            results[kind]['iterations']) == (16384.0, 2, 3), results[kind]

# Last, so that a wrong value above fails as itself.
for status in statuses:
  assert_bound(status)
print(json.dumps({'resumed': resumed, **{
    k: {n: v for n, v in r.items() if n != 'weights'}
    for k, r in results.items()},
                  'optimizer_class': results['adam']['optimizer_class']}))
