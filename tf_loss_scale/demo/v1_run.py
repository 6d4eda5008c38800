"""One demo run as TF1 code: a graph, a session and `MixedPrecisionLossScaleOptimizer`."""

import os
import time
from typing import List, Optional, TextIO

import numpy as np
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import monitoring
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import record
from tf_loss_scale.demo import results as results_lib

CHECKPOINT_PREFIX = 'scaled'


def train(kind: str, name: str, config: config_lib.DemoConfig,
          digits: data_lib.Digits, batches: np.ndarray, log_dir: str,
          checkpoint_dir: Optional[str],
          stream: TextIO) -> results_lib.RunResult:
  """Trains and evaluates one run in a fresh graph; saves with a `Saver`.

  The arguments and result are those of every API module (see
  `tf_loss_scale.demo`).
  """
  compute_dtype = tf.float32 if kind == config_lib.FLOAT32 else tf.float16
  with tf.Graph().as_default():
    strategy = (tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
                if config.strategy == 'mirrored' else tf.distribute.get_strategy())
    with strategy.scope():
      params = _make_params(config.hidden_units, config.seed)
      global_step = tf.compat.v1.train.get_or_create_global_step()
      optimizer = tf.compat.v1.train.MomentumOptimizer(
          config.learning_rate / config.loss_weight, 0.9)
      if kind == config_lib.SCALED:
        optimizer = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
            optimizer, tf_loss_scale.DynamicLossScale(
                config.initial_scale, config.growth_steps))
    x = tf.compat.v1.placeholder(tf.float32, [config.batch_size, 64])
    y = tf.compat.v1.placeholder(tf.int32, [config.batch_size])

    def replica_step():
      context = tf.distribute.get_replica_context()
      mine = tf.range(context.replica_id_in_sync_group, config.batch_size,
                      context.num_replicas_in_sync)
      loss = _loss(params, tf.gather(x, mine), tf.gather(y, mine),
                   compute_dtype)
      return loss, optimizer.minimize(config.loss_weight * loss, global_step,
                                      var_list=params)

    losses, train_ops = strategy.extended.call_for_each_replica(replica_step)
    loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)
    train_op = strategy.group(train_ops)
    probe = None
    if kind != config_lib.FLOAT32:
      probe = _probe(params, digits, optimizer, compute_dtype,
                     config.loss_weight)
    x_test = tf.constant(digits.x_test)
    predictions = tf.argmax(_logits(params, x_test, compute_dtype), axis=1,
                            output_type=tf.int32)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions, digits.y_test),
                                      tf.float32))

    saver = tf.compat.v1.train.Saver() if checkpoint_dir else None
    hooks = []
    if kind == config_lib.SCALED:
      hook = monitoring.LossScaleHook(optimizer, output_dir=log_dir,
                                      every_n_steps=1)
      hooks.append(hook)
    start = time.perf_counter()
    with tf.compat.v1.train.MonitoredTrainingSession(
        hooks=hooks, log_step_count_steps=None) as session:
      probe_fn = None
      if probe is not None:
        probe_fn = lambda: _run_without_hooks(session, probe)
      recorder = record.Recorder(name, config, log_dir, stream, probe_fn)
      for step, indices in enumerate(batches):
        _, step_loss = session.run(
            [train_op, loss],
            {x: digits.x_train[indices], y: digits.y_train[indices]})
        if hooks:
          state = hooks[0].latest
          recorder.step(step, step_loss, state[monitoring.SCALE],
                        state[monitoring.SKIPPED_STEPS])
        else:
          recorder.step(step, step_loss)
      wall_time = time.perf_counter() - start
      test_accuracy = float(_run_without_hooks(session, accuracy))
      skip_report = None
      if hooks:
        skip_report = session.run_step_fn(
            lambda step_context: monitoring.last_skip(optimizer,
                                                      step_context.session))
      checkpoint = None
      if saver:
        checkpoint = session.run_step_fn(lambda step_context: saver.save(
            step_context.session, os.path.join(checkpoint_dir,
                                               CHECKPOINT_PREFIX)))
  # Out of the graph: the recorder writes its event file eagerly.
  return recorder.finish(test_accuracy, wall_time, checkpoint, skip_report)


def _make_params(hidden: int, seed: int) -> List[tf.Variable]:
  """Glorot-uniform float32 weights and zero biases, the same in every run."""
  rng = np.random.default_rng(seed)
  sizes = [64, hidden, hidden, 10]
  params = []
  for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    kernel = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
    params.append(tf.Variable(kernel, name=f'kernel_{index}'))
    params.append(tf.Variable(np.zeros(fan_out, np.float32),
                              name=f'bias_{index}'))
  return params


def _logits(params: List[tf.Variable], x: tf.Tensor,
            dtype: tf.DType) -> tf.Tensor:
  """The network, computed in `dtype` from float32 weights; float32 out."""
  hidden = tf.cast(x, dtype)
  layers = list(zip(params[::2], params[1::2]))
  for index, (kernel, bias) in enumerate(layers):
    hidden = tf.matmul(hidden, tf.cast(kernel, dtype)) + tf.cast(bias, dtype)
    if index < len(layers) - 1:
      hidden = tf.nn.relu(hidden)
  return tf.cast(hidden, tf.float32)


def _loss(params: List[tf.Variable], x: tf.Tensor, y: tf.Tensor,
          dtype: tf.DType) -> tf.Tensor:
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=_logits(params, x, dtype)))


def _probe(params: List[tf.Variable], digits: data_lib.Digits,
           optimizer: tf.compat.v1.train.Optimizer, dtype: tf.DType,
           loss_weight: float) -> List[tf.Tensor]:
  """Fetches for `record.Probe`, on a fixed batch at the current weights."""
  x = tf.constant(digits.x_train[:config_lib.PROBE_EXAMPLES])
  y = tf.constant(digits.y_train[:config_lib.PROBE_EXAMPLES])
  scale: Optional[tf.Tensor] = None
  if isinstance(optimizer, tf_loss_scale.MixedPrecisionLossScaleOptimizer):
    scale = optimizer.loss_scale()
  mixed_loss = loss_weight * _loss(params, x, y, dtype)
  if scale is not None:
    mixed_loss = mixed_loss * scale
  reference_grads = tf.gradients(
      loss_weight * _loss(params, x, y, tf.float32), params)
  flushed, nonzero = measure.flushed_counts(tf.gradients(mixed_loss, params),
                                            reference_grads)
  return [flushed, nonzero, measure.flat(reference_grads)]


def _run_without_hooks(session: tf.compat.v1.train.MonitoredSession,
                       fetches):
  # Probes and evaluation are not training steps: the hooks must not see them.
  return session.run_step_fn(
      lambda step_context: step_context.session.run(fetches))
