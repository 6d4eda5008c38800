"""TF 2.4-2.15: `optimizer.iterations = tf.compat.v1.train.get_or_create_global_step()`.

Code of that era made the global step the optimizer's step count, so that
summaries and `tf.compat.v1` hooks saw it move. Keras 2's class (TensorFlow
2.15 and earlier, tf_keras) hands the variable to its inner optimizer,
which counts in it: three applies leave the global step at 3. On Keras 3
after `compat.install()`, TF 2.4-2.15's class refuses: the Keras 3
optimizer it wraps owns its count. The AttributeError says to assign a
value and to use `optimizer.iterations` where the step is needed; done so,
the count reaches 3 too.
"""
# Runs after: compat.install()
# Keras: yes
# Needs: Keras 2, or Keras 3.12 or later for int() of a Keras variable

import json

import tensorflow as tf

opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1))
global_step = tf.compat.v1.train.get_or_create_global_step()
var = tf.Variable([1.0])
keras3 = hasattr(tf.keras.optimizers.Optimizer, 'stateless_apply')
refusal = None
try:
  opt.iterations = global_step
except AttributeError as e:
  refusal = str(e)

if keras3:
  assert refusal is not None, 'Keras 3: replacing iterations was accepted'
  assert 'optimizer.iterations.assign(step)' in refusal, refusal
  assert 'tf.summary.experimental.set_step(optimizer.iterations)' in refusal
  counter = opt.iterations
else:
  assert refusal is None, refusal
  counter = global_step
for _ in range(3):
  with tf.GradientTape() as tape:
    loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
  grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
  opt.apply_gradients(zip(grads, [var]))

assert int(opt.iterations) == 3, int(opt.iterations)
assert int(counter) == 3, int(counter)
assert int(global_step) == (0 if keras3 else 3), int(global_step)
# x <- x - 0.1 * 2x, three times.
assert abs(float(var[0]) - 0.8 ** 3) < 1e-6, float(var[0])
print(json.dumps({'refused': refusal is not None,
                  'global_step': int(global_step),
                  'iterations': int(opt.iterations),
                  'optimizer_class': (f'{type(opt).__module__}.'
                                      f'{type(opt).__qualname__}')}))
