"""A training library's helper that wraps an optimizer by name (TF 2.4-2.15).

Libraries built on tf.keras wrapped in one place and branched on the type in
their generic train step, as below; the user code only passes
`use_fp16=True`. The first step overflows in float16 at 2**15 and is
skipped, the next five apply.
"""
# Runs after: compat.install()
# Keras: yes

import json

import numpy as np
import tensorflow as tf


def maybe_wrap(opt, use_fp16):
  if use_fp16:
    return tf.keras.mixed_precision.LossScaleOptimizer(opt)
  return opt


def make_train_step(model, optimizer, loss_fn):
  fp16 = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
      if fp16:
        loss_for_grads = optimizer.get_scaled_loss(loss)
      else:
        loss_for_grads = loss
    grads = tape.gradient(loss_for_grads, model.trainable_variables)
    if fp16:
      grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return train_step


def train(model, optimizer, dataset, loss_fn, epochs):
  step = make_train_step(model, optimizer, loss_fn)
  losses = []
  for _ in range(epochs):
    for x, y in dataset:
      losses.append(float(step(x, y)))
  return losses


# The user's side.
tf.keras.mixed_precision.set_global_policy('mixed_float16')
model = tf.keras.Sequential([
    tf.keras.Input(shape=(1,)),
    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
optimizer = maybe_wrap(tf.keras.optimizers.SGD(0.1), use_fp16=True)
data = tf.data.Dataset.from_tensors(
    (tf.ones((4, 1)), tf.fill((4, 1), 1.5))).repeat(3)
losses = train(model, optimizer, data, tf.keras.losses.MeanSquaredError(),
               epochs=2)

kernel = float(model.get_weights()[0][0, 0])
assert losses[0] == losses[1] == 2.25, losses
np.testing.assert_allclose(kernel, 1.5 * (1 - 0.8 ** 5), rtol=1e-3)
assert float(optimizer.loss_scale) == 16384.0
print(json.dumps({'loss_scale': 16384.0, 'skipped': 1, 'kernel': kernel,
                  'losses': losses,
                  'optimizer_class': (f'{type(optimizer).__module__}.'
                                      f'{type(optimizer).__qualname__}')}))
