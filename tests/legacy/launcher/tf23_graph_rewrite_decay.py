"""TF 2.3 Keras code: the graph rewrite around an SGD that decays.

`tf.train.experimental.enable_mixed_precision_graph_rewrite` (TF 1.14-2.3)
wraps `tf.keras.optimizers.SGD(0.1, decay=0.5)` (the rate is 0.1 / (1 + 0.5
* iterations), an argument TF 2.11's optimizers dropped) with a
`DynamicLossScale` that starts at 2**15 and doubles after every good step.
One `fit` of 6 steps, one sample each; the third and fifth samples are so
large that the scaled loss overflows, and those steps are skipped (TF 2.3
counts them in `iterations`). Prints the loss scale, `iterations` and the
kernel. `tf-loss-scale run` reads TensorFlow 2.3 from the graph rewrite.
"""

import json

import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros',
                          input_shape=(1,)),
])
optimizer = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD(0.1, decay=0.5),
    loss_scale=tf.mixed_precision.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 15, increment_period=1))
model.compile(optimizer=optimizer, loss='mse')
x = np.array([[1.0], [1.0], [1e20], [1.0], [1e20], [1.0]], np.float32)
y = np.full((6, 1), 1.5, np.float32)
model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
print(json.dumps({
    'loss_scale': float(optimizer.loss_scale()),
    'iterations': int(optimizer.iterations.numpy()),
    'kernel': float(model.get_weights()[0][0, 0])}))
