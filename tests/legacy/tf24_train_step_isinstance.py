"""TF 2.4-2.15 Keras: a `train_step` that asks whether `compile` wrapped.

Under `mixed_float16`, `compile` wraps the optimizer in a
`LossScaleOptimizer`, and TF 2.4-2.15's guide has `train_step` scale the
loss and unscale the gradients only if `self.optimizer` is an instance of
`tf.keras.mixed_precision.LossScaleOptimizer`. The branch must be taken:
unscaled gradients given to a wrapper that expects scaled ones would be
divided by 2**15 and train on nothing. A kernel of ones and inputs up to 6
make the first float16 gradients overflow: 6 of 24 steps are skipped (the
scale halves from 2**15 to 2**9), `iterations` counts all 24 (TensorFlow's
protocol counts skipped steps), and the loss falls.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy('mixed_float16')


class Model(tf.keras.Model):

  def train_step(self, data):
    x, y = data
    scaling = isinstance(self.optimizer,
                         tf.keras.mixed_precision.LossScaleOptimizer)
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = tf.reduce_mean(tf.square(tf.cast(y_pred, tf.float32) - y))
      scaled_loss = self.optimizer.get_scaled_loss(loss) if scaling else loss
    grads = tape.gradient(scaled_loss, self.trainable_variables)
    if scaling:
      grads = self.optimizer.get_unscaled_gradients(grads)
    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
    # Not 'loss': Keras 3 would log its own (never updated) loss metric.
    return {'squared_error': loss}


inputs = tf.keras.Input(shape=(4,))
hidden = tf.keras.layers.Dense(8, activation='relu')(inputs)
model = Model(inputs, tf.keras.layers.Dense(1)(hidden))
rng = np.random.RandomState(0)
model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype('float32')
                   for w in model.get_weights()])
model.compile(optimizer=tf.keras.optimizers.SGD(0.002))
x = rng.uniform(0, 6, (64, 4)).astype('float32')
y = x.sum(axis=1, keepdims=True)
history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)

opt = model.optimizer
assert isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer), type(opt)
losses = history.history['squared_error']
scale = float(opt.loss_scale)
iterations = int(opt.iterations)
assert (scale, iterations) == (512.0, 24), (scale, iterations)
assert losses[-1] < losses[0] / 10, losses
print(json.dumps({'loss_scale': scale, 'iterations': iterations,
                  'losses': losses,
                  'weights': [w.ravel().tolist() for w in model.get_weights()],
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
