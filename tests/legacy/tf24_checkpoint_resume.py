"""TF 2.4-2.15 Keras: training that saves a checkpoint and resumes from it.

Each run restores the latest `tf.train.Checkpoint` in ./checkpoints (if
any), trains three steps with `LossScaleOptimizer(opt)` in a custom loop and
saves. The first run's first step overflows in float16 at 2**15 and is
skipped; the second run must resume at 2**14 with two finite steps counted
(at 2**15 its steps would not overflow, and the scale and counter would
end elsewhere), and every variable must be bound to the checkpoint's
value. Run it twice in one directory, e.g. first with TensorFlow
2.15 or tf_keras, then with the TensorFlow to move to (not back: tf_keras's
class cannot read what the class under the name writes on Keras 3).
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later
# Resumes: yes

import json

import numpy as np
import tensorflow as tf

w = tf.Variable([[0.0]], name='w')
opt = tf.keras.mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1))
checkpoint = tf.train.Checkpoint(w=w, optimizer=opt)
manager = tf.train.CheckpointManager(checkpoint, 'checkpoints', max_to_keep=2)
resumed = manager.latest_checkpoint is not None
status = checkpoint.restore(manager.latest_checkpoint)


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


@tf.function
def train_step(x, y):
  with tf.GradientTape() as tape:
    prediction = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
    loss = tf.reduce_mean(tf.square(tf.cast(prediction, tf.float32) - y))
    scaled_loss = opt.get_scaled_loss(loss)
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [w]))
  opt.apply_gradients(zip(grads, [w]))


for _ in range(3):
  train_step(tf.ones((4, 1)), tf.fill((4, 1), 1.5))
manager.save()

state = (float(opt.loss_scale), int(opt.dynamic_counter), int(opt.iterations))
applied = 5 if resumed else 2
assert state == ((16384.0, 5, 6) if resumed else (16384.0, 2, 3)), state
# Float16 products round the weight by less than 1e-3.
np.testing.assert_allclose(w.numpy()[0, 0], 1.5 * (1 - 0.8 ** applied),
                           rtol=1e-3)
if resumed:
  # Last, so that a wrong value above fails as itself: every variable of
  # the resumed program took its value from the checkpoint.
  assert_bound(status)
print(json.dumps({'resumed': resumed, 'loss_scale': state[0],
                  'dynamic_counter': state[1], 'iterations': state[2],
                  'w': float(w.numpy()[0, 0]),
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
