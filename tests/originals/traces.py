"""Training traces through overflow and NaN steps, on an original or on ours.

    python tests/originals/traces.py OUT.json          # an original's venv
    python tests/originals/traces.py --ours OUT.json   # TF 2.21, this library

Runs the same short scenarios on whichever TensorFlow runs it (Python 3.7
syntax: the originals run it too): a two-element weight, SGD with momentum
0.9 and a dynamic loss scale starting at 2**15 that doubles after 2 good
steps, fed gradients that are finite, then inf, then NaN. After every step
it records the loss scale, the optimizer's iteration count and the weights.
With --ours the scenarios use this library's classes in their place (Keras 3,
or tf_keras under TF_USE_LEGACY_KERAS=1). The `members` scenarios record
what TF 2.x's optimizer members return after a step (`members()`). The JSON
maps each scenario to its trace; tests/test_traces.py compares ours with the
originals'. On TensorFlow 1.15 (and with --ours, but under tf_keras) it also
holds the JSON line of each TF1 program of tests/legacy/ compared with
TensorFlow's wrapper (`tf1_programs`), and the `contrib` scenarios of
tf.contrib.mixed_precision (contrib_traces.py; tests/test_traces.py runs
ours of them in its own process).
"""

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_HERE = os.path.dirname(os.path.abspath(__file__))

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Deprecation notices of the originals' own names would bury the output.
tf.get_logger().setLevel('ERROR')

INF, NAN = float('inf'), float('nan')
# The gradient of the loss with respect to the weights, per step.
GRADIENTS = [[1.0, 1.0], [2.0, -1.0], [INF, 1.0], [1.0, 1.0], [NAN, 1.0],
             [1.0, 2.0], [0.5, 1.0]]
INITIAL_WEIGHTS = [1.0, 2.0]
INITIAL_SCALE, GROWTH_STEPS = 2.0 ** 15, 2


def _scale_of(opt):
  scale = opt.loss_scale
  return float(scale() if callable(scale) else scale)


def _record(scale, iterations, weights):
  return {'scale': float(scale), 'iterations': int(iterations),
          'weights': [float(x) for x in weights]}


def keras_loop(make_opt, make_var, in_function):
  """A custom loop: get_scaled_loss, get_unscaled_gradients, apply."""
  var = make_var()
  opt = make_opt()

  def step(gradient):
    with tf.GradientTape() as tape:
      scaled = opt.get_scaled_loss(tf.reduce_sum(var * gradient))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var]))

  if in_function:
    step = tf.function(step)
  trace = []
  for gradient in GRADIENTS:
    step(tf.constant(gradient))
    trace.append(_record(_scale_of(opt), opt.iterations.numpy(),
                         var.numpy()))
  return trace


def keras_fit(keras, opt):
  """`fit` of a one-kernel model whose inputs are the gradients."""
  model = keras.Sequential([keras.layers.Dense(
      1, use_bias=False, input_shape=(2,),
      kernel_initializer=keras.initializers.Constant(
          [[w] for w in INITIAL_WEIGHTS]))])
  model.compile(optimizer=opt, loss=lambda y_true, y_pred: tf.reduce_sum(
      y_pred))
  return _fit_trace(keras, model)


def _fit_trace(keras, model):
  """Fits `model` one batch (one gradient) at a time, recording each step."""
  trace = []

  class Record(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      del batch, logs
      opt = model.optimizer
      trace.append(_record(_scale_of(opt), opt.iterations.numpy(),
                           model.get_weights()[0].reshape(-1)))

  model.fit(tf.constant(GRADIENTS), tf.zeros([len(GRADIENTS), 1]),
            batch_size=1, shuffle=False, epochs=1, verbose=0,
            callbacks=[Record()])
  return trace


def policy_fit():
  """TF 2.1-2.3's way: a mixed_float16 `Policy` with a loss scale, `fit`.

  `compile` wraps the optimizer in the policy's loss scale. In float16 a
  gradient of 2 times the scale 2**15 overflows by itself (65536 > 65504).
  The code is TF 2.3's as written; ours runs it after `compat.install()`.
  """
  mp = tf.keras.mixed_precision.experimental
  mp.set_policy(mp.Policy('mixed_float16',
                          loss_scale=_dynamic(tf.mixed_precision.experimental)))
  try:
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Dense(
            1, use_bias=False, input_shape=(2,),
            kernel_initializer=keras.initializers.Constant(
                [[w] for w in INITIAL_WEIGHTS])),
        keras.layers.Activation('linear', dtype='float32')])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=lambda y_true, y_pred: tf.reduce_sum(y_pred))
  finally:
    mp.set_policy('float32')
  return _fit_trace(keras, model)


def v1_session(tf1, make_opt, make_loss_scale):
  """TF 1's graph and Session: minimize with a global step."""
  graph = tf1.Graph()
  with graph.as_default():
    var = tf1.Variable(INITIAL_WEIGHTS)
    gradient = tf1.placeholder(tf1.float32, [2])
    global_step = tf1.train.get_or_create_global_step()
    loss_scale = make_loss_scale()
    opt = make_opt(loss_scale)
    train = opt.minimize(tf1.reduce_sum(var * gradient),
                         global_step=global_step)
    trace = []
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      for value in GRADIENTS:
        session.run(train, {gradient: value})
        trace.append(_record(*session.run([loss_scale(), global_step, var])))
  return trace


def v1_eager(make_opt, make_loss_scale, in_function):
  """TF 2's eager form of the same: minimize(callable) with a global step."""
  var = tf.Variable(INITIAL_WEIGHTS)
  global_step = tf.Variable(0, dtype=tf.int64)
  loss_scale = make_loss_scale()
  opt = make_opt(loss_scale)

  def step(gradient):
    opt.minimize(lambda: tf.reduce_sum(var * gradient), var_list=[var],
                 global_step=global_step)

  if in_function:
    step = tf.function(step)
  trace = []
  for value in GRADIENTS:
    step(tf.constant(value))
    trace.append(_record(loss_scale(), global_step.numpy(), var.numpy()))
  return trace


def configs(make_opts, loss_scale_module):
  """{what: get_config()} of optimizers (inner one by class) and loss scales.

  `make_opts` maps a label to a function making the optimizer.
  """
  made = {}
  for label, make in sorted(make_opts.items()):
    config = dict(make().get_config())
    for key in ('optimizer', 'inner_optimizer'):
      if key in config:  # Keras 2's and Keras 3's configs of it differ.
        config[key] = config[key]['class_name']
    made[label] = config
  if loss_scale_module is not None:
    made['FixedLossScale'] = loss_scale_module.FixedLossScale(
        128.0).get_config()
    made['DynamicLossScale'] = _dynamic(loss_scale_module).get_config()
  return made


def _dynamic(module):
  return module.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                 increment_period=GROWTH_STEPS, multiplier=2.0)


def _plain(value):
  """`value` (a tensor, variable, array or a list of them) as JSON values."""
  if isinstance(value, (list, tuple)):
    return [_plain(x) for x in value]
  if isinstance(value, str):
    return value
  if hasattr(value, 'numpy'):
    value = value.numpy()
  return np.asarray(value).tolist()


def _short_name(variable):
  """A variable's name after its last '/', without the ':0'.

  Keras 2's optimizers name their variables in a scope of their own, and
  TF 2.3's and TF 2.15's legacy ones name a slot `variable/slot`:
  `SGD/iter:0` and `SGD/v/momentum:0` become `iter` and `momentum`. TF
  2.15's new optimizers name a slot `slot/variable` (`m/v:0`: `v`), Keras
  3's `variable_slot` (`v_momentum`), and their count is `iteration`.
  """
  return variable.name.split('/')[-1].split(':')[0]


def members(make, sgd, make_variable):
  """What TF 2.x's optimizer members return, one member at a time.

  `make(inner)` wraps the optimizer `sgd(0.1, momentum=0.9)` in a dynamic
  loss scale optimizer. A variable `v = [1., 2.]`, the loss `sum(v * v)`:
  after one step, reads `get_weights()`, the names of `weights`, the
  momentum slot and slot names; `set_weights` with the slot replaced, a
  second step, `minimize` with `grad_loss`, `add_slot`; `lr` and `decay`,
  a write of `lr`, `momentum` and a write of it. Then, on a fresh optimizer
  after one step, the names of `variables()`, and the loss scale,
  iterations and learning rate after each of those variables is set to
  zero. A member that fails records
  {'error': the exception's class name}, and the next ones still run.
  """
  record = {}

  def entry(name, read):
    try:
      record[name] = read()
    except Exception as e:  # pylint: disable=broad-except
      record[name] = {'error': type(e).__name__}

  def step(opt, var):
    with tf.GradientTape() as tape:
      scaled = opt.get_scaled_loss(tf.reduce_sum(var * var))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var]))

  inner = sgd(0.1, momentum=0.9)
  opt = make(inner)
  v = make_variable(INITIAL_WEIGHTS, name='v')
  step(opt, v)
  entry('get_weights', lambda: _plain(opt.get_weights()))
  entry('weights names', lambda: [_short_name(x) for x in opt.weights])
  entry('get_slot momentum', lambda: _plain(opt.get_slot(v, 'momentum')))
  entry('get_slot_names', lambda: list(opt.get_slot_names()))

  def set_slot():
    weights = opt.get_weights()
    weights[-1] = np.array([0.5, 0.25], 'float32')
    opt.set_weights(weights)
    return _plain(opt.get_slot(v, 'momentum'))

  entry('set_weights then get_slot momentum', set_slot)

  def second_step():
    step(opt, v)
    return {'v': _plain(v), 'iterations': int(opt.iterations.numpy())}

  entry('second step', second_step)

  def minimize():
    opt.minimize(lambda: v * v, [v], grad_loss=tf.constant([1.0, 0.5]),
                 name='m')
    return _plain(v)

  entry('minimize with grad_loss', minimize)

  def add_slot():
    opt.add_slot(v, 'extra', 'ones')
    return {'extra': _plain(opt.get_slot(v, 'extra')),
            'slot names': sorted(opt.get_slot_names())}

  entry('add_slot', add_slot)
  entry('lr', lambda: float(_plain(opt.lr)))
  entry('decay', lambda: float(_plain(opt.decay)))

  def write_lr():
    opt.lr = 0.05
    return float(_plain(inner.learning_rate))

  entry('lr = 0.05, then the learning rate', write_lr)
  entry('momentum', lambda: float(_plain(opt.momentum)))

  def write_momentum():
    opt.momentum = 0.5
    return {'wrapper': float(_plain(opt.momentum)),
            'inner': float(_plain(inner.momentum))}

  entry('momentum = 0.5, then the momentum', write_momentum)

  inner = sgd(0.1, momentum=0.9)
  fresh = make(inner)
  v = make_variable(INITIAL_WEIGHTS, name='v')
  step(fresh, v)
  entry('variables() names',
        lambda: [_short_name(x) for x in fresh.variables()])

  def reset():
    for variable in fresh.variables():
      variable.assign(tf.zeros_like(variable))
    return {'scale': _scale_of(fresh),
            'iterations': int(fresh.iterations.numpy()),
            'learning rate': float(_plain(inner.learning_rate))}

  entry('variables() set to zero', reset)
  return record


# TF 2.x's optimizers with slots, each as a program made it.
SLOTTED = (('SGD', {'momentum': 0.9}), ('Adam', {'amsgrad': True}),
           ('Adamax', {}), ('Nadam', {}),
           ('RMSprop', {'momentum': 0.9, 'centered': True}), ('Adagrad', {}),
           ('Adadelta', {}), ('Ftrl', {}))


def slots(make, optimizers, make_variable):
  """Each optimizer's slot names and slots, by name, after one step.

  `make(inner)` wraps `optimizers.NAME(**arguments)` (SLOTTED) in a dynamic
  loss scale optimizer; one step of the loss `sum(v * v)` from
  `v = [1., 2.]`. Records {name: {'names': get_slot_names(), slot name:
  its value}}.
  """
  record = {}
  for name, arguments in SLOTTED:
    opt = make(getattr(optimizers, name)(**arguments))
    v = make_variable(INITIAL_WEIGHTS, name='v')
    with tf.GradientTape() as tape:
      scaled = opt.get_scaled_loss(tf.reduce_sum(v * v))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [v]))
    opt.apply_gradients(zip(grads, [v]))
    names = list(opt.get_slot_names())
    record[name] = dict({'names': names},
                        **{slot: _plain(opt.get_slot(v, slot))
                           for slot in names})
  return record


def originals(out_dir):
  """{scenario: trace} on the original TensorFlow running this.

  On TF 1.15 the `contrib` scenarios (contrib_traces.py) leave their
  checkpoints in OUT_DIR/contrib-tf1.15/, for ours to restore.
  """
  version = '.'.join(tf.__version__.split('.')[:2])
  if version == '1.15':
    sys.path.insert(0, _HERE)
    import contrib_traces  # pylint: disable=g-import-not-at-top
    return dict({'configs tf1.15': configs({}, tf.train.experimental),
                 'v1 session': v1_session(
        tf, lambda ls: tf.train.experimental.MixedPrecisionLossScaleOptimizer(
            tf.train.MomentumOptimizer(0.1, 0.9), ls),
        lambda: _dynamic(tf.train.experimental))}, **dict(
            tf1_programs(False), **contrib_traces.scenarios(
                tf, tf.contrib.mixed_precision,
                os.path.join(out_dir, 'contrib-tf1.15'))))
  keras = tf.keras
  if version == '2.3':
    def make():
      return keras.mixed_precision.experimental.LossScaleOptimizer(
          keras.optimizers.SGD(0.1, momentum=0.9),
          _dynamic(tf.mixed_precision.experimental))
    traces = _keras_scenarios('experimental', keras, make, tf.Variable)
    traces['experimental policy fit'] = policy_fit()
    traces['configs tf2.3'] = configs({'experimental': make},
                                      tf.mixed_precision.experimental)
    traces['members experimental'] = members(
        lambda inner: keras.mixed_precision.experimental.LossScaleOptimizer(
            inner, 'dynamic'), keras.optimizers.SGD, tf.Variable)
    traces['slots experimental'] = slots(
        lambda inner: keras.mixed_precision.experimental.LossScaleOptimizer(
            inner, 'dynamic'), keras.optimizers, tf.Variable)
    return traces
  if version == '2.15':
    traces, makes = {}, {}
    for label, sgd in (('legacy', keras.optimizers.legacy.SGD),
                       ('new', keras.optimizers.SGD)):
      def make(sgd=sgd):
        return keras.mixed_precision.LossScaleOptimizer(
            sgd(0.1, momentum=0.9), initial_scale=INITIAL_SCALE,
            dynamic_growth_steps=GROWTH_STEPS)
      traces.update(_keras_scenarios('mixed_precision ' + label, keras, make,
                                     tf.Variable))
      makes['mixed_precision ' + label] = make
      traces['members mixed_precision ' + label] = members(
          keras.mixed_precision.LossScaleOptimizer, sgd, tf.Variable)
    traces['slots mixed_precision legacy'] = slots(
        keras.mixed_precision.LossScaleOptimizer, keras.optimizers.legacy,
        tf.Variable)
    traces['configs tf2.15'] = configs(makes, None)
    return traces
  raise SystemExit('not an original: TensorFlow %s' % tf.__version__)


def _keras_scenarios(prefix, keras, make, make_variable):
  return {
      prefix + ' eager': keras_loop(
          make, lambda: make_variable(INITIAL_WEIGHTS), False),
      prefix + ' tf.function': keras_loop(
          make, lambda: make_variable(INITIAL_WEIGHTS), True),
      prefix + ' fit': keras_fit(keras, make()),
  }


def ours():
  """{scenario: trace} with this library's classes in the originals' place."""
  # pylint: disable=g-import-not-at-top
  import tf_loss_scale
  import tf_loss_scale.compat
  from tf_loss_scale.keras import experimental
  # pylint: enable=g-import-not-at-top
  legacy = os.environ.get('TF_USE_LEGACY_KERAS') == '1'
  if legacy:
    keras = tf.keras
    make_variable = tf.Variable
  else:
    import keras  # pylint: disable=g-import-not-at-top
    make_variable = keras.Variable

  def make_experimental():
    return experimental.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), _dynamic(tf_loss_scale))

  traces = _keras_scenarios('experimental', keras, make_experimental,
                            make_variable)
  if not legacy:  # Under tf_keras the TF 2.4-2.15 form is tf_keras's own.
    # pylint: disable-next=g-import-not-at-top
    from tf_loss_scale.keras import mixed_precision

    def make_mixed():
      return mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(0.1, momentum=0.9),
          initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS)

    traces.update(_keras_scenarios('mixed_precision', keras, make_mixed,
                                   make_variable))

  def make_v1(loss_scale):
    return tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), loss_scale)

  for in_function in (False, True):
    traces['v1 ' + ('tf.function' if in_function else 'eager')] = v1_eager(
        make_v1, lambda: _dynamic(tf_loss_scale), in_function)
  traces['members experimental'] = members(
      lambda inner: experimental.LossScaleOptimizer(inner, 'dynamic'),
      keras.optimizers.SGD, make_variable)
  traces['slots experimental'] = slots(
      lambda inner: experimental.LossScaleOptimizer(inner, 'dynamic'),
      keras.optimizers, make_variable)
  if not legacy:
    traces['members mixed_precision'] = members(
        mixed_precision.LossScaleOptimizer, keras.optimizers.SGD,
        make_variable)
    traces['slots mixed_precision'] = slots(
        mixed_precision.LossScaleOptimizer, keras.optimizers, make_variable)
  makes = {'experimental': make_experimental}
  if not legacy:
    makes['mixed_precision'] = make_mixed
  traces['configs'] = configs(makes, tf_loss_scale)
  # Last: it installs TF 2.3's names, for the rest of this process.
  tf_loss_scale.compat.install()
  traces['experimental policy fit'] = policy_fit()
  return traces


def tf1_programs(through_ours):
  """{'tf1 program NAME': its JSON line} for the TF1 programs compared.

  Runs each program of tests/legacy/ whose header says
  "# Compared: TensorFlow's wrapper" in a fresh process, in a scratch
  directory: as it is, or with `through_ours` under this library's names
  (run_program.py, `install(override=True)`).
  """
  legacy = os.path.join(os.path.dirname(_HERE), 'legacy')
  found = {}
  for name in sorted(os.listdir(legacy)):
    path = os.path.join(legacy, name)
    if not (name.startswith('tf1_') and name.endswith('.py')):
      continue  # Not a TF1 program (the launcher's are in a folder).
    with open(path) as f:
      header = f.read().splitlines()
    if not (name.startswith('tf1_') and
            "# Compared: TensorFlow's wrapper" in header):
      continue
    if '# Needs: tf.estimator' in header and not hasattr(tf, 'estimator'):
      continue  # Gone from TensorFlow 2.16 on.
    args = [sys.executable] + ([os.path.join(legacy, 'run_program.py'),
                                '--override'] if through_ours else []) + [path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(_HERE)] + [os.environ.get('PYTHONPATH', '')]))
    with tempfile.TemporaryDirectory() as scratch:
      run = subprocess.run(args, cwd=scratch, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    if run.returncode != 0:
      raise RuntimeError('%s failed:\n%s' % (name, run.stderr[-4000:]))
    # run_program.py prints the classes it saw last.
    lines = run.stdout.strip().splitlines()
    found['tf1 program ' + name] = json.loads(
        lines[-2] if through_ours else lines[-1])
  return found


def main(argv):
  if argv[1:2] == ['--ours']:
    traces, out = ours(), argv[2]
    if os.environ.get('TF_USE_LEGACY_KERAS') != '1':  # Once: no Keras there.
      traces.update(tf1_programs(True))
  else:
    traces, out = originals(os.path.dirname(os.path.abspath(argv[1]))), argv[1]
  record = {'tensorflow': tf.__version__, 'traces': traces}
  with open(out, 'w') as f:
    json.dump(record, f, indent=1, sort_keys=True)
  print('wrote %s: %s' % (out, ', '.join(sorted(traces))))


if __name__ == '__main__':
  main(sys.argv)
