"""TF 2.3 code: the policy first, then the model compiled in a strategy scope.

`set_policy('mixed_float16')` makes the policy's dynamic loss scale (2**15)
before the strategy exists; the model is built and compiled inside
`MirroredStrategy.scope()` on two replicas (the two logical CPUs), so
`compile` wraps the optimizer with that loss scale. The first steps
overflow at 2**15 and are skipped. Prints, after each epoch (one step
each), the loss scale, `iterations` and the kernel.
"""

import json

import numpy as np
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision

try:
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:
  pass  # Set up already, with two logical CPUs.

mixed_precision.set_policy('mixed_float16')
strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
with strategy.scope():
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='ones',
                            input_shape=(2,)),
      tf.keras.layers.Activation('linear', dtype='float32'),
  ])
  model.compile(tf.keras.optimizers.SGD(0.01), 'mse')

record = {'loss_scale': [], 'iterations': [], 'kernel': []}


class Record(tf.keras.callbacks.Callback):

  def on_epoch_end(self, epoch, logs=None):
    optimizer = self.model.optimizer
    record['loss_scale'].append(float(optimizer.loss_scale()))
    record['iterations'].append(int(optimizer.iterations.numpy()))
    record['kernel'].append(
        [float(v) for v in self.model.get_weights()[0][:, 0]])


x = np.full((8, 2), 2.0, np.float32)
y = np.full((8, 1), 0.25, np.float32)
model.fit(x, y, batch_size=8, epochs=6, verbose=0, shuffle=False,
          callbacks=[Record()])
print(json.dumps(record))
