"""A checkpointed training run that may SIGKILL itself, and resume.

Usage: kill_and_resume.py DIRECTORY KILLS_JSON

Trains three front ends one after another, each checkpointing after every
step into its own subdirectory of DIRECTORY and resuming from its latest
checkpoint there when started again:
  tf1: MixedPrecisionLossScaleOptimizer in a MonitoredTrainingSession, a
    Saver checkpoint after every step;
  experimental: the TF 2.3 Keras wrapper in a custom loop, with a
    tf.train.CheckpointManager;
  keras_fit: the Keras 3 form in model.fit (one step per epoch), with
    keras.callbacks.BackupAndRestore.
KILLS_JSON maps a front end to the steps after which the process kills
itself with SIGKILL, once that step's checkpoint is written; a kill only
fires in a process that ran the step itself, so a restarted run goes on.
Step 4 overflows (its input is multiplied by 1e30) and is skipped. After
each step is checkpointed the process prints a JSON line with `front_end`
and `ran` (the step); each front end that finishes prints one with
`front_end` and `final`, from each variable's name to its bytes (hex) and
its value.
"""

import json
import os
import signal
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import toy_training as toy  # pylint: disable=g-import-not-at-top
import tf_loss_scale  # pylint: disable=g-import-not-at-top
from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top

DIRECTORY = sys.argv[1]
KILLS = json.loads(sys.argv[2])
STEPS, OVERFLOW_STEP, ROWS = 6, 4, 2
# Scale 8, doubling after 2 finite steps: 8 16 16 32, halved to 16 by the
# overflow, then 16: restored state differs from a fresh one at every step.
INITIAL_SCALE, GROWTH_STEPS = 8.0, 2
X, Y = (a[:, 0] for a in toy.data(STEPS, 1, ROWS, (OVERFLOW_STEP, 0)))


def _loss(kernel, bias, x, y):
  return toy.squared_error(kernel, bias, x, y, float(ROWS * 2))


def _step_done(front_end, step):
  """Says that `step` ran and is checkpointed; dies there if told to.

  The kill is a SIGKILL, as a machine failure would be: no handler runs.
  """
  print(json.dumps({'front_end': front_end, 'ran': step}), flush=True)
  if step in KILLS.get(front_end, []):
    os.kill(os.getpid(), signal.SIGKILL)


def _print_final(front_end, values):
  print(json.dumps({'front_end': front_end, 'final': toy.record(
      {name: [v] for name, v in values.items()})}), flush=True)


def _directory(front_end):
  path = os.path.join(DIRECTORY, front_end)
  os.makedirs(path, exist_ok=True)
  return path


def run_tf1():
  """A TF1 graph, a MonitoredTrainingSession and a Saver."""
  directory = _directory('tf1')
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    # Counts every step, skipped or not (global_step counts applied ones).
    data_step = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                      name='data_step')
    kernel = tf.compat.v1.Variable(toy.KERNEL, name='kernel')
    bias = tf.compat.v1.Variable(toy.BIAS, name='bias')
    optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.MomentumOptimizer(toy.LEARNING_RATE, toy.MOMENTUM),
        tf_loss_scale.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                       increment_period=GROWTH_STEPS))
    loss = _loss(kernel, bias, tf.gather(X, data_step),
                 tf.gather(Y, data_step))
    train = optimizer.minimize(loss, global_step, var_list=[kernel, bias])
    with tf.control_dependencies([train]):
      train_op = data_step.assign_add(1)
    saver = tf.compat.v1.train.Saver()

    class CheckpointEveryStep(tf.compat.v1.train.SessionRunHook):

      def after_run(self, run_context, run_values):
        if run_context.original_args.fetches is not train_op:
          return
        done = run_context.session.run(data_step)
        saver.save(run_context.session, os.path.join(directory, 'model'),
                   global_step=done)
        _step_done('tf1', int(done) - 1)

    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=directory,
        scaffold=tf.compat.v1.train.Scaffold(saver=saver),
        hooks=[CheckpointEveryStep()],
        save_checkpoint_secs=None, save_checkpoint_steps=None,
        save_summaries_steps=None, save_summaries_secs=None,
        log_step_count_steps=None) as session:
      while session.run(data_step) < STEPS:
        session.run(train_op)
      _print_final('tf1', session.run(
          {v.op.name: v for v in tf.compat.v1.global_variables()}))


def run_experimental():
  """The TF 2.3 wrapper in a custom loop, with a CheckpointManager."""
  kernel, bias = keras.Variable(toy.KERNEL), keras.Variable(toy.BIAS)
  data_step = tf.Variable(0, dtype=tf.int64)
  optimizer = tls_keras.experimental.LossScaleOptimizer(
      keras.optimizers.SGD(toy.LEARNING_RATE, momentum=toy.MOMENTUM),
      tf_loss_scale.DynamicLossScale(initial_loss_scale=INITIAL_SCALE,
                                     increment_period=GROWTH_STEPS))
  optimizer.build([kernel, bias])
  checkpoint = tf.train.Checkpoint(kernel=kernel, bias=bias,
                                   optimizer=optimizer, data_step=data_step)
  manager = tf.train.CheckpointManager(
      checkpoint, _directory('experimental'), max_to_keep=2)
  manager.restore_or_initialize()

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      scaled_loss = optimizer.get_scaled_loss(_loss(kernel, bias, x, y))
    grads = optimizer.get_unscaled_gradients(
        tape.gradient(scaled_loss, [kernel, bias]))
    optimizer.apply_gradients(zip(grads, [kernel, bias]))

  for step in range(int(data_step.numpy()), STEPS):
    train_step(X[step], Y[step])
    data_step.assign_add(1)
    manager.save()
    _step_done('experimental', step)
  _print_final('experimental', {
      'kernel': kernel, 'bias': bias, 'data_step': data_step,
      **toy.keras_optimizer_state(optimizer)})


class _StepInput(keras.layers.Layer):
  """Multiplies the input by this step's factor (1e30 makes it overflow).

  model.fit trains one step per epoch on the same batch; the factor, set at
  the start of each epoch from the epoch number (which BackupAndRestore
  restores), makes the steps differ.
  """

  def build(self, input_shape):
    self.factor = self.add_weight(shape=(), initializer='ones',
                                  trainable=False, name='factor')

  def call(self, inputs):
    return inputs * self.factor


def run_keras_fit():
  """The Keras 3 form in model.fit, with BackupAndRestore."""
  step_input = _StepInput()
  model = toy.keras_model(step_input)
  optimizer = toy.keras_form(INITIAL_SCALE, GROWTH_STEPS)
  model.compile(optimizer=optimizer, loss='mean_squared_error')
  factors = [1.0, 0.5, -1.0, 2.0, 1e30, 0.25]

  class StepData(keras.callbacks.Callback):

    def on_epoch_begin(self, epoch, logs=None):
      step_input.factor.assign(factors[epoch])

    def on_epoch_end(self, epoch, logs=None):
      # After BackupAndRestore (listed first) has saved this epoch.
      _step_done('keras_fit', epoch)

  backup = keras.callbacks.BackupAndRestore(_directory('keras_fit'),
                                            delete_checkpoint=False)
  model.fit(X[0], Y[0], batch_size=ROWS, epochs=STEPS, shuffle=False,
            verbose=0, callbacks=[backup, StepData()])
  _print_final('keras_fit', {
      **{f'model/{v.path}': v for v in model.variables},
      **toy.keras_optimizer_state(optimizer)})


run_tf1()
run_experimental()
run_keras_fit()
