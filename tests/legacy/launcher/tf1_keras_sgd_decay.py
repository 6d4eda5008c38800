"""TF 1.15 Keras code whose learning rate decays by `iterations`.

`import tensorflow as tf` in graph mode, as TF 1.15 ran by default:
`tf.keras.mixed_precision.experimental.LossScaleOptimizer` around
`tf.keras.optimizers.SGD(0.1, decay=0.5)` (the rate is 0.1 / (1 + 0.5 *
iterations)) with a `DynamicLossScale` that starts at 2**15 and doubles
after every good step. One `fit` of 6 steps, one sample each; the third and
fifth samples are so large that the scaled loss overflows, and those steps
are skipped. TF 1.15's Keras counted applied steps only in `iterations`, so
the rate decays by those. Prints the loss scale, `iterations` and the
kernel. `tf-loss-scale run` reads TensorFlow 1 from
`tf.keras.backend.get_session`.
"""

import json

import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                          input_shape=(1,)),
])
optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    tf.keras.optimizers.SGD(0.1, decay=0.5),
    tf.train.experimental.DynamicLossScale(initial_loss_scale=2 ** 15,
                                           increment_period=1))
model.compile(optimizer=optimizer, loss='mse')
x = np.array([[1.0], [1.0], [1e20], [1.0], [1e20], [1.0]], np.float32)
y = np.full((6, 1), 1.5, np.float32)
model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
session = tf.keras.backend.get_session()
print(json.dumps({
    'loss_scale': float(session.run(optimizer.loss_scale())),
    'iterations': int(session.run(optimizer.iterations)),
    'kernel': float(model.get_weights()[0][0, 0])}))
