"""Traces of TF 1.13-1.15's `tf.contrib.mixed_precision`, on TF 1.15 or ours.

Python 3.7 syntax: TensorFlow 1.15 runs it (through tests/originals/traces.py,
which records `scenarios(tf, tf.contrib.mixed_precision)`), and
tests/test_contrib_originals.py runs it on ours with `tf.compat.v1` and
`tf_loss_scale.contrib.mixed_precision`. Each scenario builds a `tf.Graph`:
a two-element weight `w` and a 4x2 embedding `emb` (its gradient an
`IndexedSlices`), a loss whose gradients are fed (finite, inf, NaN steps),
a loss scale manager, Momentum or Adam, and `minimize` or
`compute_gradients`/`apply_gradients` with a global step. After every step it
records every global variable's value by name (weights, slots, the manager's
state, `global_step`) and the loss scale; once, the graph's variable
collections. Checkpoints go through `tf.compat.v1.train.Saver`:

    python contrib_traces.py --resume CHECKPOINT OUT.json

restores CHECKPOINT (written by the other side after `SAVED_AFTER` steps of
the `saver` scenario) and writes the remaining steps' trace.
"""

import json
import os
import shutil
import sys
import tempfile

INF, NAN = float('inf'), float('nan')
# The gradient of the loss with respect to `w`, per step; the embedding's
# rows 1 and 3 get the second entry.
GRADIENTS = [[1.0, 1.0], [2.0, -1.0], [INF, 1.0], [1.0, 1.0], [NAN, 1.0],
             [1.0, 2.0], [0.5, 1.0], [INF, INF], [0.25, -1.0], [1.0, 0.5]]
SAVED_AFTER = 4
_COLLECTIONS = ('variables', 'trainable_variables', 'global_step',
                'local_variables', 'model_variables')


def _exponential(**options):
  def make(mp, tf1):
    del tf1
    return mp.ExponentialUpdateLossScaleManager(**options)
  return make


def _fixed(value):
  def make(mp, tf1):
    del tf1
    return mp.FixedLossScaleManager(value)
  return make


def _own(mp, tf1):
  """A user's own manager: quarters the scale on a skipped step, counts the
  finite verdicts it is given."""

  class Quartering(mp.LossScaleManager):

    def __init__(self):
      self._scale = tf1.Variable(1024.0, name='own_scale', trainable=False)
      self._finite = tf1.Variable(0, name='own_finite_steps',
                                  trainable=False)

    def get_loss_scale(self):
      return self._scale

    def update_loss_scale(self, finite_grads):
      return tf1.group(
          self._scale.assign(tf1.where(finite_grads, self._scale * 1.0,
                                       self._scale / 4.0)),
          self._finite.assign_add(tf1.cast(finite_grads, tf1.int32)))

  return Quartering()


def _momentum(tf1):
  return tf1.train.MomentumOptimizer(0.1, 0.9)


def _adam(tf1):
  return tf1.train.AdamOptimizer(0.01)


# name -> (manager, optimizer, minimize?, gradients)
SCENARIOS = {
    'exponential momentum minimize': (
        _exponential(init_loss_scale=2.0 ** 15, incr_every_n_steps=2),
        _momentum, True, GRADIENTS),
    'exponential adam compute_apply': (
        _exponential(init_loss_scale=2.0 ** 15, incr_every_n_steps=2,
                     decr_every_n_nan_or_inf=1, decr_ratio=0.5),
        _adam, False, GRADIENTS),
    'exponential ratios momentum compute_apply': (
        _exponential(init_loss_scale=1000.0, incr_every_n_steps=3,
                     decr_every_n_nan_or_inf=2, incr_ratio=3,
                     decr_ratio=0.7),
        _momentum, False, GRADIENTS),
    'exponential float32 max adam minimize': (
        _exponential(init_loss_scale=2.0 ** 126, incr_every_n_steps=1),
        _adam, True, [[1.0, 1.0]] * 3),
    'exponential floor momentum minimize': (
        _exponential(init_loss_scale=1.5, incr_every_n_steps=100,
                     decr_every_n_nan_or_inf=1),
        _momentum, True, [[INF, 1.0]] * 3 + [[1.0, 1.0]]),
    'exponential below one momentum minimize': (
        _exponential(init_loss_scale=0.25, incr_every_n_steps=100,
                     decr_every_n_nan_or_inf=1),
        _momentum, True, [[1.0, 1.0], [NAN, 1.0], [1.0, 1.0]]),
    'fixed momentum compute_apply': (_fixed(128.0), _momentum, False,
                                     GRADIENTS),
    'fixed adam minimize': (_fixed(96.0), _adam, True, GRADIENTS),
    'own momentum minimize': (_own, _momentum, True, GRADIENTS),
    'own adam compute_apply': (_own, _adam, False, GRADIENTS),
}
SAVER = 'exponential adam compute_apply'


def _build(tf1, mp, scenario):
  """Builds `scenario` in the current graph: (train op, feed, manager)."""
  make_manager, make_opt, minimize, _ = SCENARIOS[scenario]
  w = tf1.Variable([1.0, 2.0], name='w')
  emb = tf1.Variable([[0.5, -0.5], [1.0, 2.0], [3.0, -1.0], [0.0, 1.5]],
                     name='emb')
  gradient = tf1.placeholder(tf1.float32, [2], name='gradient')
  global_step = tf1.train.get_or_create_global_step()
  loss = (tf1.reduce_sum(w * gradient) + gradient[1] *
          tf1.reduce_sum(tf1.nn.embedding_lookup(emb, [1, 3])))
  manager = make_manager(mp, tf1)
  opt = mp.LossScaleOptimizer(make_opt(tf1), manager)
  if minimize:
    train = opt.minimize(loss, global_step=global_step)
  else:
    grads_and_vars = opt.compute_gradients(loss)
    train = opt.apply_gradients(grads_and_vars, global_step=global_step)
  return train, gradient, manager


def _state(tf1, session, manager):
  names = [v.op.name for v in tf1.global_variables()]
  values = session.run(tf1.global_variables() + [manager.get_loss_scale()])
  record = {name: value.tolist() for name, value in zip(names, values)}
  record['scale'] = float(values[-1])
  return record


def _steps(tf1, session, train, feed, manager, gradients):
  trace = []
  for gradient in gradients:
    session.run(train, {feed: gradient})
    trace.append(_state(tf1, session, manager))
  return trace


def run(tf1, mp, scenario, save_to=None, restore_from=None):
  """One scenario's trace (from step `SAVED_AFTER` on when restoring)."""
  gradients = SCENARIOS[scenario][3]
  graph = tf1.Graph()
  with graph.as_default():
    train, feed, manager = _build(tf1, mp, scenario)
    saver = tf1.train.Saver()
    collections = {key: [getattr(item, 'op', item).name
                         for item in graph.get_collection(key)]
                   for key in _COLLECTIONS}
    with tf1.Session() as session:
      if restore_from is None:
        session.run(tf1.global_variables_initializer())
        trace = _steps(tf1, session, train, feed, manager,
                       gradients[:SAVED_AFTER])
        if save_to is not None:
          saver.save(session, save_to)
      else:
        saver.restore(session, restore_from)
        trace = []
      trace += _steps(tf1, session, train, feed, manager,
                      gradients[SAVED_AFTER:])
  return {'trace': trace, 'collections': collections}


def monitored(tf1, mp, checkpoint_dir):
  """A `MonitoredTrainingSession` that stops at global step 5.

  The global step stays on a skipped step, so the hook lets more runs pass.
  """
  graph = tf1.Graph()
  with graph.as_default():
    train, feed, manager = _build(tf1, mp, 'exponential momentum minimize')
    hooks = [tf1.train.StopAtStepHook(last_step=5)]
    trace = []
    with tf1.train.MonitoredTrainingSession(
        checkpoint_dir=checkpoint_dir, hooks=hooks,
        save_summaries_steps=None, save_summaries_secs=None) as session:
      step = 0
      while not session.should_stop():
        session.run(train, {feed: GRADIENTS[step % len(GRADIENTS)]})
        trace.append(session.run_step_fn(
            lambda step_context: _state(tf1, step_context.session, manager)))
        step += 1
  graph = tf1.Graph()
  with graph.as_default():
    _build(tf1, mp, 'exponential momentum minimize')
    with tf1.Session() as session:
      tf1.train.Saver().restore(
          session, tf1.train.latest_checkpoint(checkpoint_dir))
      restored = {v.op.name: session.run(v).tolist()
                  for v in tf1.global_variables()}
  return {'trace': trace, 'restored': restored}


def scenarios(tf1, mp, directory):
  """{'contrib NAME': ...} for every scenario; checkpoints in `directory`
  (emptied first: a `MonitoredTrainingSession` resumes what it finds)."""
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  found = {}
  for name in SCENARIOS:
    found['contrib ' + name] = run(
        tf1, mp, name,
        save_to=(os.path.join(directory, 'saver') if name == SAVER else None))
  found['contrib saver resume'] = run(
      tf1, mp, SAVER, restore_from=os.path.join(directory, 'saver'))
  found['contrib monitored session'] = monitored(
      tf1, mp, os.path.join(directory, 'monitored'))
  return found


def _modules():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.__version__.startswith('1.'):
    return tf, tf.contrib.mixed_precision
  from tf_loss_scale.contrib import mixed_precision  # pylint: disable=g-import-not-at-top
  return tf.compat.v1, mixed_precision


def main(argv):
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  tf1, mp = _modules()
  tf1.get_logger().setLevel('ERROR')
  if argv[1:2] == ['--resume']:
    result = run(tf1, mp, SAVER, restore_from=argv[2])
    out = argv[3]
  else:
    out = argv[1]
    result = scenarios(tf1, mp, tempfile.mkdtemp())
  with open(out, 'w') as f:
    json.dump(result, f, indent=1, sort_keys=True)


if __name__ == '__main__':
  main(sys.argv)
