"""Writes the public members of each original's classes as JSON.

Run with an original TensorFlow's own Python (TF 1.15 on Python 3.7, TF 2.3
on 3.8, TF 2.15 on 3.11), one at a time:

    python tests/originals/enumerate_originals.py OUT_DIR

It writes OUT_DIR/members-tfMAJOR.MINOR.json: for each subject (a class this
library reproduces, after one training step, or a function), the generation
it belongs to and `members.public_members` of it. Nothing is typed by hand
but the subjects: the member lists are read from the running original.
"""

import json
import os
import platform
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import members  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Deprecation notices of the originals' own names would bury the output.
tf.get_logger().setLevel('ERROR')


def _keras_step(opt, var):
  """One scaled step of `opt` on `var` (loss var * var), eagerly."""
  with tf.GradientTape() as tape:
    loss = opt.get_scaled_loss(var * var)
  grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
  opt.apply_gradients(zip(grads, [var]))


def _loss_scale_steps(loss_scales):
  """Updates each loss scale once with finite gradients, eagerly."""
  for loss_scale in loss_scales:
    loss_scale.update([tf.constant(1.0)])


def _tf23():
  mp = tf.keras.mixed_precision.experimental
  opt = mp.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                              'dynamic')
  _keras_step(opt, tf.Variable(1.0))
  lsx = tf.mixed_precision.experimental
  fixed, dynamic = lsx.FixedLossScale(128.0), lsx.DynamicLossScale()
  _loss_scale_steps([fixed, dynamic])
  return {
      'experimental.LossScaleOptimizer': (
          'TF 2.0-2.3', 'tf.keras.mixed_precision.experimental.'
          'LossScaleOptimizer', opt),
      'LossScale': ('TF 2.0-2.3', 'tf.mixed_precision.experimental.LossScale',
                    lsx.LossScale),
      'FixedLossScale': (
          'TF 2.0-2.3', 'tf.mixed_precision.experimental.FixedLossScale',
          fixed),
      'DynamicLossScale': (
          'TF 2.0-2.3', 'tf.mixed_precision.experimental.DynamicLossScale',
          dynamic),
  }, _rewrite_functions('TF 2.0-2.3', [
      'train.experimental', 'compat.v1.train.experimental',
      'compat.v1.mixed_precision'])


def _tf215():
  made = {}
  for label, inner in (
      ('legacy optimizer', tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)),
      ('TF 2.11+ optimizer', tf.keras.optimizers.SGD(0.1, momentum=0.9))):
    opt = tf.keras.mixed_precision.LossScaleOptimizer(inner)
    _keras_step(opt, tf.Variable(1.0))
    made['mixed_precision.LossScaleOptimizer(%s)' % label] = (
        'TF 2.4-2.15', 'tf.keras.mixed_precision.LossScaleOptimizer', opt)
  return made, _rewrite_functions('TF 2.4-2.15', ['compat.v1.mixed_precision'])


def _tf115():
  train = tf.train.experimental
  graph = tf.Graph()
  with graph.as_default():
    var = tf.Variable(1.0)
    opt = train.MixedPrecisionLossScaleOptimizer(
        tf.train.MomentumOptimizer(0.1, 0.9), 'dynamic')
    step = opt.minimize(var * var)
    fixed, dynamic = train.FixedLossScale(128.0), train.DynamicLossScale()
    updates = [s.update([tf.constant(1.0)])[0] for s in (fixed, dynamic)]
    contrib = tf.contrib.mixed_precision
    managers = (contrib.FixedLossScaleManager(128.0),
                contrib.ExponentialUpdateLossScaleManager(2.0 ** 15, 2))
    contrib_opts = [contrib.LossScaleOptimizer(
        tf.train.MomentumOptimizer(0.1, 0.9), manager) for manager in managers]
    contrib_steps = [opt.minimize(var * var) for opt in contrib_opts]
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      session.run([step] + updates)
      session.run(contrib_steps)
  contrib_subjects = {
      'contrib.' + name: (
          'TF 1.13-1.15 contrib', 'tf.contrib.mixed_precision.' + name, obj)
      for name, obj in (
          ('LossScaleManager', contrib.LossScaleManager),
          ('FixedLossScaleManager', managers[0]),
          ('ExponentialUpdateLossScaleManager', managers[1]),
          ('LossScaleOptimizer', contrib_opts[1]))}
  return dict({
      'MixedPrecisionLossScaleOptimizer': (
          'TF 1.14-1.15',
          'tf.train.experimental.MixedPrecisionLossScaleOptimizer', opt),
      'LossScale': ('TF 1.14-1.15', 'tf.train.experimental.LossScale',
                    train.LossScale),
      'FixedLossScale': ('TF 1.14-1.15',
                         'tf.train.experimental.FixedLossScale', fixed),
      'DynamicLossScale': ('TF 1.14-1.15',
                           'tf.train.experimental.DynamicLossScale', dynamic),
  }, **contrib_subjects), _rewrite_functions('TF 1.14-1.15',
                                             ['train.experimental'])


def _rewrite_functions(generation, modules):
  """The graph rewrite functions each of `modules` (under tf.) has."""
  found = {}
  for path in modules:
    module = tf
    for part in path.split('.'):
      module = getattr(module, part, None)
    for name in ('enable_mixed_precision_graph_rewrite',
                 'disable_mixed_precision_graph_rewrite'):
      if module is not None and hasattr(module, name):
        found['tf.%s.%s' % (path, name)] = {
            'generation': generation,
            'function': members.function(getattr(module, name))}
  return found


def _class_path(obj):
  cls = obj if isinstance(obj, type) else type(obj)
  return cls.__module__ + '.' + cls.__name__


def main(out_dir):
  version = tf.__version__
  major_minor = '.'.join(version.split('.')[:2])
  subjects, functions = {'1.15': _tf115, '2.3': _tf23,
                         '2.15': _tf215}[major_minor]()
  record = {
      'tensorflow': version,
      'python': platform.python_version(),
      'subjects': {
          name: {'generation': generation, 'public': public,
                 'class': _class_path(obj),
                 'members': members.public_members(obj)}
          for name, (generation, public, obj) in subjects.items()},
      'functions': functions,
  }
  if not os.path.isdir(out_dir):
    os.makedirs(out_dir)
  path = os.path.join(out_dir, 'members-tf%s.json' % major_minor)
  with open(path, 'w') as out:
    json.dump(record, out, indent=1, sort_keys=True)
  print('wrote %s: %d subjects, %d functions' % (
      path, len(subjects), len(functions)))


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: enumerate_originals.py OUT_DIR')
  main(sys.argv[1])
