"""TF 2.3 code, as OpenNMT-tf's trainer: the loss scale made outside the scope.

The optimizer is wrapped in the experimental `LossScaleOptimizer(opt,
"dynamic")` before the strategy exists; inside `strategy.scope()` only its
`iterations` and the model are made. Each step runs `get_gradients` and
`apply_gradients` in `strategy.run` on two replicas (the two logical CPUs):
at the fourth step the second replica's gradients overflow, so both skip.
Prints the loss scale, `iterations` and the kernel after each step.
"""

import json

import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

try:
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:
  pass  # Set up already, with two logical CPUs.

mixed_precision.set_policy('mixed_float16')
optimizer = mixed_precision.LossScaleOptimizer(
    tf.keras.optimizers.Adam(0.1), 'dynamic')
strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
with strategy.scope():
  _ = optimizer.iterations
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='ones',
                            input_shape=(2,)),
      tf.keras.layers.Activation('linear', dtype='float32'),
  ])


@tf.function
def train(overflow):

  def step():
    replica = tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group,
        tf.float32)
    big = tf.logical_and(overflow, replica > 0)
    x = tf.fill((4, 2), 0.5 + replica) * tf.where(big, 1000.0, 1.0)
    y = tf.fill((4, 1), 0.25)
    loss = tf.reduce_mean(tf.square(model(x) - y)) / 2.0
    grads = optimizer.get_gradients(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

  strategy.run(step)


scales, iterations, kernels = [], [], []
for i in range(6):
  train(tf.constant(i == 3))
  scales.append(float(optimizer.loss_scale()))
  iterations.append(int(optimizer.iterations.numpy()))
  kernels.append([float(v) for v in model.get_weights()[0][:, 0]])
print(json.dumps({'loss_scale': scales, 'iterations': iterations,
                  'kernel': kernels}))
