"""TF 2.4-2.15 code whose training runs in processes it starts itself.

The same few steps of `keras.mixed_precision.LossScaleOptimizer` (Keras 2's:
`get_scaled_loss`, `dynamic_growth_steps=2`) run in a `multiprocessing`
child started with 'spawn' and in a `subprocess` of `sys.executable` running
this file with `child`; each imports `keras` itself and sends back the loss
scale, `iterations` and the kernel after each step. The parent prints both.
`tf-loss-scale run` sets its children up as it set up the program.
"""

import json
import multiprocessing
import subprocess
import sys


def train(_=None):
  """Returns the loss scales, iterations and kernels of 5 steps."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras.mixed_precision.set_global_policy('mixed_float16')
  model = keras.Sequential([
      keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                         input_shape=(1,)),
      keras.layers.Activation('linear', dtype='float32'),
  ])
  optimizer = keras.mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.05, momentum=0.9), dynamic_growth_steps=2)
  x = tf.ones((4, 1))
  y = tf.fill((4, 1), 1.5)
  trace = {'loss_scale': [], 'iterations': [], 'kernel': []}
  for _ in range(5):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - y))
      scaled_loss = optimizer.get_scaled_loss(loss)
    gradients = optimizer.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    trace['loss_scale'].append(float(optimizer.loss_scale))
    trace['iterations'].append(int(optimizer.iterations))
    trace['kernel'].append(float(model.get_weights()[0][0, 0]))
  return trace


if __name__ == '__main__':
  if sys.argv[1:] == ['child']:
    print(json.dumps(train()))
  else:
    with multiprocessing.get_context('spawn').Pool(1) as pool:
      spawned = pool.map(train, [None])[0]
    done = subprocess.run([sys.executable, __file__, 'child'],
                          stdout=subprocess.PIPE, check=True)
    subprocess_trace = json.loads(done.stdout.decode().splitlines()[-1])
    print(json.dumps({'spawn': spawned, 'subprocess': subprocess_trace}))
