"""Both Keras loss scale optimizers under MirroredStrategy (two CPU replicas).

The promise: if the gradients of any one replica are not finite, every
replica skips the step and the loss scale halves once. Keras 3.15's own
LossScaleOptimizer trusts the first replica's verdict instead; a test below
reproduces its failure to document the difference.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import collectives
from tf_loss_scale import keras as tls_keras

import versions

versions.KERAS_SUMS_ACROSS_REPLICAS.require()

INF = float('inf')


def _ours(inner):
  return tls_keras.LossScaleOptimizer(inner, initial_scale=8.0)


def _experimental(inner):
  return tls_keras.experimental.LossScaleOptimizer(
      inner, {'class_name': 'DynamicLossScale',
              'config': {'initial_loss_scale': 8.0, 'increment_period': 2000,
                         'multiplier': 2.0}})


def _keras_reference(inner):
  return keras.optimizers.LossScaleOptimizer(inner, initial_scale=8.0)


def _scale_of(opt):
  if isinstance(opt, tls_keras.experimental.LossScaleOptimizer):
    return float(opt.loss_scale())
  return float(tf.convert_to_tensor(opt.dynamic_scale))


def _replica_values(strategy, variable):
  return [np.asarray(v.numpy())
          for v in strategy.experimental_local_results(variable.value)]


def _run_custom_loop(strategy, make_optimizer, bad_replica_steps, eager):
  """Trains one variable; on the given steps replica 1's gradient is inf."""
  with strategy.scope():
    opt = make_optimizer(keras.optimizers.SGD(0.5, momentum=0.5))
    var = keras.Variable(np.array([1.0, 2.0], np.float32))
    opt.build([var])
  experimental = isinstance(opt, tls_keras.experimental.LossScaleOptimizer)

  def replica_step(poison):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    grad = tf.constant([1.0, -1.0])
    grad = tf.where(tf.logical_and(poison, tf.equal(replica, 1)),
                    grad * INF, grad)
    if experimental:
      opt.apply_gradients([(grad, var)])  # gradients of an unscaled loss
    else:
      opt.apply([grad * opt.dynamic_scale], [var])

  def step(poison):
    strategy.run(replica_step, args=(poison,))

  if not eager:
    step = tf.function(step)
  history = []
  for i in range(4):
    step(tf.constant(i in bad_replica_steps))
    history.append((_replica_values(strategy, var), _scale_of(opt),
                    int(opt.iterations.numpy())))
  return history


# Two replicas each contribute [1, -1]: the summed gradient is [2, -2].
# SGD(0.5, momentum=0.5): step 0 moves by [-1, 1]; step 1 is skipped; step 2
# moves by momentum 0.5 * [-1, 1] plus [-1, 1]; step 3 by 0.75 * ... + [-1, 1].
_EXPECTED_WEIGHTS = [[0.0, 3.0], [0.0, 3.0], [-1.5, 4.5], [-3.25, 6.25]]
_EXPECTED_SCALES = [8.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize('eager', [False, True])
@pytest.mark.parametrize('make_optimizer', [_ours, _experimental],
                         ids=['keras3_form', 'experimental_form'])
def test_overflow_on_one_replica_skips_on_all_and_halves_once(
    mirrored_strategy, make_optimizer, eager):
  history = _run_custom_loop(mirrored_strategy, make_optimizer, {1}, eager)
  experimental = make_optimizer is _experimental
  for step, (replica_weights, scale, iterations) in enumerate(history):
    for replica, weights in enumerate(replica_weights):
      np.testing.assert_allclose(
          weights, _EXPECTED_WEIGHTS[step],
          err_msg=f'step {step}: weights on replica {replica}')
    assert scale == _EXPECTED_SCALES[step], f'step {step}: scale {scale}'
    # The experimental form counts skipped steps (TF 2.3); Keras 3 does not.
    expected_iterations = step + 1 if experimental else step + (step < 1)
    assert iterations == expected_iterations, (
        f'step {step}: iterations {iterations}')


def test_keras_reference_applies_an_overflow_on_replica_1(mirrored_strategy):
  """Documents the Keras 3.15 bug this library fixes (see module docstring)."""
  history = _run_custom_loop(mirrored_strategy, _keras_reference, {1},
                             eager=False)
  replica_weights, scale, _ = history[1]
  for replica, weights in enumerate(replica_weights):
    assert np.all(np.isinf(weights)), (
        f'replica {replica}: expected Keras to apply the inf step, got '
        f'{weights}')
  assert scale == 8.0  # and its loss scale did not react


def test_keras3_form_matches_reference_when_every_step_is_finite(
    mirrored_strategy):
  ours = _run_custom_loop(mirrored_strategy, _ours, set(), eager=False)
  reference = _run_custom_loop(mirrored_strategy, _keras_reference, set(),
                               eager=False)
  for step, (mine, theirs) in enumerate(zip(ours, reference)):
    for replica, (a, b) in enumerate(zip(mine[0], theirs[0])):
      np.testing.assert_allclose(
          a, b, err_msg=f'step {step}: weights on replica {replica}')
    assert mine[1:] == theirs[1:], f'step {step}: {mine[1:]} vs {theirs[1:]}'


def test_check_finite_agrees_across_replicas(mirrored_strategy):
  with mirrored_strategy.scope():
    opt = _ours(keras.optimizers.SGD(0.1))

  @tf.function
  def verdicts():
    def replica_fn():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      grad = tf.where(tf.equal(replica, 1), INF, 1.0)
      return opt.check_finite([grad, None])
    return mirrored_strategy.experimental_local_results(
        mirrored_strategy.run(replica_fn))

  assert [bool(v) for v in verdicts()] == [False, False]


def _fit_with_overflow_on_replica_1(strategy, make_optimizer):
  """Two batches of 4 rows; row 3 (replica 1's half of batch 0) is inf."""
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(1, kernel_initializer='ones', use_bias=False)
    ])
    opt = make_optimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss='mse')
  x = np.array([[1, 0], [0, 1], [1, 1], [1, 2], [1, 0], [0, 1], [1, 1], [2, 1]],
               np.float32)
  y = np.zeros((8, 1), np.float32)
  y[3] = INF
  history = []

  class Record(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      history.append((model.layers[0].kernel.numpy().ravel().copy(),
                      _scale_of(model.optimizer),
                      int(model.optimizer.iterations.numpy())))

  model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
            callbacks=[Record()])
  return model, history


# The experimental form refuses Keras 3's fit (its scale_loss raises; see
# test_keras_experimental.py): fit is the Keras 3 form's.
@pytest.mark.parametrize('make_optimizer', [
    _ours,
    # TF 2.4-2.15's form hands its inner optimizer the sums: the same steps.
    lambda inner: tls_keras.mixed_precision.LossScaleOptimizer(
        inner, initial_scale=8.0)], ids=['keras3_form', 'tf24_form'])
def test_fit_skips_a_batch_that_overflows_on_one_replica(
    mirrored_strategy, make_optimizer):
  model, history = _fit_with_overflow_on_replica_1(mirrored_strategy,
                                                   make_optimizer)
  assert model.optimizer.inner_optimizer is not None
  (w0, s0, i0), (w1, s1, i1) = history
  np.testing.assert_array_equal(w0, [1.0, 1.0], err_msg='batch 0 was applied')
  assert s0 == 4.0, f'batch 0: scale {s0}'
  # Batch 1: predictions [1, 1, 2, 3], mse gradient 2/4 * sum(pred * x)
  # = [0.5 * (1 + 2 + 6), 0.5 * (1 + 2 + 3)] = [4.5, 3]; SGD(0.05).
  np.testing.assert_allclose(w1, [0.775, 0.85], rtol=1e-6,
                             err_msg='batch 1 weights')
  assert s1 == 4.0
  assert (i0, i1) == (0, 1)  # Keras 3 counts applied steps only


def test_keras_reference_fit_applies_the_overflow(mirrored_strategy):
  _, history = _fit_with_overflow_on_replica_1(mirrored_strategy,
                                               _keras_reference)
  weights, scale, _ = history[0]
  assert not np.all(np.isfinite(weights)), (
      f'expected Keras 3.15 to apply replica 1 overflow, got {weights}')
  assert scale == 8.0


# --- float16 variables: float32 sums, as under Keras's class -----------------
# Each replica's float16 gradient is 40000 (finite: float16 tops out at
# 65504). Both classes unscale it into float32, and the all-reduced sum,
# 80000, is finite in float32; SGD would cast it back to the variable's
# float16, where it is inf. Keras's class applies it (the weight becomes
# -inf: a peer bug, pinned here); ours reads the sum as the variable will
# receive it and skips the step.


def _float16_sum_loop(strategy, make_optimizer):
  with strategy.scope():
    opt = make_optimizer(keras.optimizers.SGD(1e-4))
    var = keras.Variable(np.array([1.0, 1.0], np.float16), dtype='float16')
    opt.build([var])

  @tf.function
  def train_step(value):
    def replica_fn():
      grad = tf.stack([tf.cast(value, tf.float16), tf.constant(1.0, tf.float16)])
      opt.apply([grad * tf.cast(opt.dynamic_scale, tf.float16)], [var])
    strategy.run(replica_fn)

  history = []
  for value in (1000.0, 40000.0):
    train_step(tf.constant(value))
    history.append((_replica_values(strategy, var), _scale_of(opt),
                    int(opt.iterations.numpy())))
  return history


def test_a_float32_sum_past_a_float16_variable_is_skipped_not_applied(
    mirrored_strategy):
  ours = _float16_sum_loop(
      mirrored_strategy,
      lambda inner: tls_keras.LossScaleOptimizer(inner, initial_scale=1.0))
  keras_class = _float16_sum_loop(
      mirrored_strategy,
      lambda inner: keras.optimizers.LossScaleOptimizer(inner,
                                                        initial_scale=1.0))
  # Step 0 moves by 1e-4 * [2000, 2] (the sum over two replicas).
  for history, expected, counts in (
      (ours, [[0.8, 0.9998], [0.8, 0.9998]], [1, 1]),
      (keras_class, [[0.8, 0.9998], [-INF, 0.9996]], [1, 2])):
    for step, (replica_weights, scale, iterations) in enumerate(history):
      for weights in replica_weights:
        np.testing.assert_allclose(weights.astype(np.float32),
                                   expected[step], rtol=1e-3)
      # The scale stays at its floor of 1 on the skipped step.
      assert (scale, iterations) == (1.0, counts[step])


def test_float32_sums_that_would_overflow_are_skipped_at_a_scale_below_2(
    mirrored_strategy):
  # At scale 1.5 each replica's quotient is 3e38 / 1.5 = 2e38, finite; their
  # sum, 4e38, is past float32's largest value (3.4e38). Below twice the
  # replicas the scale does not bound the sums: the quotients' magnitudes
  # must, and the step is skipped everywhere.
  with mirrored_strategy.scope():
    opt = tls_keras.LossScaleOptimizer(keras.optimizers.SGD(1e-39),
                                       initial_scale=1.5)
    var = keras.Variable(np.array([1.0], np.float32))
    opt.build([var])

  @tf.function
  def step():
    mirrored_strategy.run(lambda: opt.apply([tf.constant([3e38])], [var]))

  step()
  for weights in _replica_values(mirrored_strategy, var):
    np.testing.assert_array_equal(weights, [1.0])
  assert _scale_of(opt) == 1.0  # Halved to 0.75, held at the floor of 1.
  assert int(opt.skipped_steps) == 1


# --- wrong use ------------------------------------------------------------------


def test_optimizer_built_outside_the_scope_is_refused_before_anything_runs(
    mirrored_strategy):
  opt = tls_keras.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                     initial_scale=8.0)
  var = keras.Variable(np.array([1.0], np.float32))
  opt.build([var])
  with pytest.raises(ValueError,
                     match=r'created outside the scope of the '
                     r'MirroredStrategy.*inside `with strategy.scope\(\):`'):
    mirrored_strategy.run(lambda: opt.apply([tf.constant([8.0])], [var]))
  assert var.numpy().tolist() == [1.0]
  assert float(opt.dynamic_scale.numpy()) == 8.0
  assert int(opt.step_counter.numpy()) == 0
  assert int(opt.iterations.numpy()) == 0


def test_apply_in_the_cross_replica_context_says_where_to_call_it(
    mirrored_strategy):
  with mirrored_strategy.scope():
    opt = tls_keras.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    var = keras.Variable(np.array([1.0], np.float32))
    with pytest.raises(ValueError,
                       match=r'must be called in a replica context.*'
                       r'strategy.run'):
      opt.apply([tf.constant([1.0])], [var])


# --- collectives per step -------------------------------------------------------


def _reductions_per_step(strategy, opt, variables):
  """Counts the cross-replica reduction ops of one traced training step.

  Gradient batches are all-reduced with CollectiveReduceV2 (one op per
  replica); a value reduced to one device on CPUs is summed by an AddN
  whose inputs come from several devices (an AddN on one replica's values
  is no reduction across replicas). Counted: what a finite step runs, the
  apply side of a cond included and its skip side (a cond's else branch,
  where the skip report sums the replicas' flags) left out.
  """

  @tf.function
  def train_step():
    def replica_fn():
      opt.apply([tf.ones_like(v) for v in variables], variables)
    strategy.run(replica_fn)

  graph = train_step.get_concrete_function().graph.as_graph_def()
  functions = {f.signature.name: f for f in graph.library.function}
  skip_sides = {node.attr['else_branch'].func.name
                for f in [graph.node, *[f.node_def for f in functions.values()]]
                for node in f if node.op in ('If', 'StatelessIf')}
  nodes = list(graph.node)
  for name, function in functions.items():
    if name not in skip_sides:
      nodes.extend(function.node_def)
  device_of = {n.name: n.device for n in nodes}
  return {'gradient collectives': sum(n.op == 'CollectiveReduceV2'
                                      for n in nodes),
          'scalar reductions': sum(
              n.op == 'AddN' and
              len(collectives.input_devices(n, device_of)) > 1
              for n in nodes)}


def test_gradient_collectives_per_step_equal_a_bare_optimizers(
    mirrored_strategy):
  counts = {}
  for name, make in [
      ('bare', lambda: keras.optimizers.SGD(0.1)),
      ('keras', lambda: keras.optimizers.LossScaleOptimizer(
          keras.optimizers.SGD(0.1))),
      ('ours', lambda: tls_keras.LossScaleOptimizer(
          keras.optimizers.SGD(0.1)))]:
    with mirrored_strategy.scope():
      variables = [keras.Variable(np.ones((3, 2), np.float32)),
                   keras.Variable(np.zeros((2,), np.float32))]
      opt = make()
      opt.build(variables)
    counts[name] = _reductions_per_step(mirrored_strategy, opt, variables)
  # One batch of gradients, one collective op per replica, for all three.
  assert counts['bare'] == {'gradient collectives': 2, 'scalar reductions': 0}
  assert counts['keras'] == counts['bare'], counts
  # Ours adds the one scalar that lets every replica agree on the sums that
  # Keras's optimizer computes inside apply (see tf_loss_scale/step.py).
  assert counts['ours'] == {'gradient collectives': 2,
                            'scalar reductions': 1}, counts


def test_why_ours_reduces_one_scalar_keras_apply_needs_a_replica_context(
    mirrored_strategy):
  """Pins Keras 3.15: its apply fails in the cross-replica context.

  That is why the Keras forms cannot hand already-summed gradients to the
  inner optimizer and spend one scalar reduction instead (see step.py). If a
  later Keras applies there, this test skips: the scalar can then go.
  """
  with mirrored_strategy.scope():
    sgd = keras.optimizers.SGD(0.1)
    var = keras.Variable(np.array([1.0], np.float32))
    sgd.build([var])

  def merge_fn(strategy, grad):
    del strategy
    sgd.apply([grad], [var])

  try:
    mirrored_strategy.run(lambda: tf.distribute.get_replica_context(
    ).merge_call(merge_fn, args=(tf.constant([1.0]),)))
  except AttributeError as error:
    assert 'merge_call' in str(error)
  else:
    pytest.skip('Keras applies in the cross-replica context now: the step '
                'could decide on the sums without the scalar reduction.')
