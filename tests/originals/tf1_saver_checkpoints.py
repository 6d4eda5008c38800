"""Saver checkpoints of TF1 programs with TF1 control flow, on either side.

    python tests/originals/tf1_saver_checkpoints.py write WHICH DIR
    python tests/originals/tf1_saver_checkpoints.py read WHICH DIR

Runs on TensorFlow 1.15 itself (Python 3.7 syntax: the original runs it,
WHICH `theirs`) and on TF 2.21 with `disable_v2_behavior()` (WHICH `theirs`
for `tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer`,
`ours` for this library's under the same names, as `compat.install()` maps
them). Each case (`CASES`: Momentum, Adam, RMSProp, Adagrad, each with a
fixed and a dynamic loss scale) builds, in a graph of its own, a dense and
a gathered weight trained with `minimize` and a global step, then a `cond`
of the program's own.

`write` trains `WRITTEN_STEPS` steps (one overflows: with a fixed scale it
is left out), saves a `tf.train.Saver`
checkpoint into DIR/CASE/ and prints, as the JSON last line, per case: the
graph's names (`names`: variables, collections, the train op, the program's
own later `cond`) and every global variable's value after the steps
(`written`). `read` builds the same graph, restores DIR/CASE/ with a
`tf.train.Saver` and prints every value restored (`restored`) and after
`RESUMED_STEPS` more steps (`resumed`).
"""

import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1
if not tf.__version__.startswith('1.'):
  tf1.disable_v2_behavior()
tf1.get_logger().setLevel('ERROR')

INF = float('inf')
OPTIMIZERS = {
    'momentum': lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    'adam': lambda: tf1.train.AdamOptimizer(0.1),
    'rmsprop': lambda: tf1.train.RMSPropOptimizer(0.1, momentum=0.5),
    'adagrad': lambda: tf1.train.AdagradOptimizer(0.1),
}
SCALES = ('fixed', 'dynamic')
CASES = ['%s-%s' % (o, s) for o in sorted(OPTIMIZERS) for s in SCALES]
# (x, y): the gradients of the dense weight and of the two gathered rows.
WRITTEN_STEPS = [([1.0, -2.0], [0.5, 1.0]), ([INF, 1.0], [1.0, 1.0]),
                 ([0.5, 1.5], [-1.0, 2.0]), ([1.0, 1.0], [0.25, 0.5]),
                 ([-0.5, 2.0], [1.0, -1.0])]
RESUMED_STEPS = [([2.0, 1.0], [0.5, -0.5]), ([1.0, INF], [1.0, 1.0]),
                 ([0.5, -1.0], [2.0, 1.0])]


def _classes(which):
  if which == 'ours':
    import tf_loss_scale  # pylint: disable=g-import-not-at-top
    return (tf_loss_scale.MixedPrecisionLossScaleOptimizer,
            tf_loss_scale.DynamicLossScale, tf_loss_scale.FixedLossScale)
  experimental = tf1.train.experimental
  return (experimental.MixedPrecisionLossScaleOptimizer,
          experimental.DynamicLossScale, experimental.FixedLossScale)


def _names(items):
  return [getattr(item, 'name', repr(item)) for item in items]


class _Program(object):
  """One case's graph: the model, the wrapped optimizer, a cond after it."""

  def __init__(self, which, case):
    wrapper, dynamic, fixed = _classes(which)
    optimizer, scale = case.split('-')
    self.fixed = scale == 'fixed'
    self.graph = tf.Graph()
    with self.graph.as_default():
      global_step = tf1.train.get_or_create_global_step()
      w = tf1.get_variable('w', initializer=[1.0, 2.0])
      embedding = tf1.get_variable(
          'embedding', initializer=np.arange(6, dtype=np.float32).reshape(3, 2))
      self.x = tf1.placeholder(tf.float32, [2], name='x')
      self.y = tf1.placeholder(tf.float32, [2], name='y')
      rows = tf.gather(embedding, [0, 2])
      loss = (tf.reduce_sum(w * self.x) +
              tf.reduce_sum(rows * tf.expand_dims(self.y, 1)))
      loss_scale = (dynamic(initial_loss_scale=8.0, increment_period=2)
                    if scale == 'dynamic' else fixed(128.0))
      opt = wrapper(OPTIMIZERS[optimizer](), loss_scale)
      self.train_op = opt.minimize(loss, global_step=global_step)
      later = tf1.cond(self.x[0] > 0, lambda: self.x + 1.0,
                       lambda: self.x - 1.0)
      self.variables = tf1.global_variables()
      self.saver = tf1.train.Saver()
      self.names = {
          'train_op': self.train_op.name, 'later_cond': later.name,
          'variables': _names(self.variables),
          'collections': {key: _names(self.graph.get_collection(key))
                          for key in self.graph.get_all_collection_keys()},
      }

  def values(self, session):
    return {v.op.name: np.asarray(value, np.float64).tolist()
            for v, value in zip(self.variables, session.run(self.variables))}

  def train(self, session, steps):
    for x, y in steps:
      if self.fixed and not np.all(np.isfinite(x + y)):
        continue  # A fixed scale applies it: the weights would be NaN.
      session.run(self.train_op, {self.x: x, self.y: y})


def write(which, directory):
  found = {}
  for case in CASES:
    program = _Program(which, case)
    with program.graph.as_default(), tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      program.train(session, WRITTEN_STEPS)
      if not os.path.isdir(os.path.join(directory, case)):
        os.makedirs(os.path.join(directory, case))
      program.saver.save(session, os.path.join(directory, case, 'model'))
      found[case] = {'names': program.names,
                     'written': program.values(session)}
  return found


def read(which, directory):
  found = {}
  for case in CASES:
    program = _Program(which, case)
    with program.graph.as_default(), tf1.Session() as session:
      program.saver.restore(session, os.path.join(directory, case, 'model'))
      restored = program.values(session)
      program.train(session, RESUMED_STEPS)
      found[case] = {'restored': restored, 'resumed': program.values(session)}
  return found


if __name__ == '__main__':
  command, which_, directory_ = sys.argv[1:4]
  print(json.dumps({'write': write, 'read': read}[command](which_,
                                                            directory_)))
