"""TF 2.4-2.15's `LossScaleOptimizer` on Keras 3, against tf_keras's class.

tf_keras's `mixed_precision.LossScaleOptimizer` is that API as TensorFlow
shipped it; each custom-loop test feeds both classes the same losses and
compares weights and loss scale after every step. `model.fit` (Keras 3's
protocol: `scale_loss`, then scaled gradients) is compared with Keras's own
class. The step, skip report, guard and strategy tests shared by every front
end run it too (`front_ends.KERAS_MIXED_PRECISION`).
"""

import json
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_loss_scale
from tf_loss_scale import monitoring
import fresh_process
import versions

versions.KERAS_3.require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import tf_keras
from tf_loss_scale.keras import mixed_precision  # Refuses Keras 2.
# pylint: enable=g-import-not-at-top,wrong-import-order

INF = float('inf')
# Per step, what the loss multiplies each weight by. In float16, 2 and 4 at
# a scale of 2**15 overflow the scaled gradient; inf overflows any scale.
_DYNAMIC_STEPS = [1.0, 2.0, 1.0, 0.5, 0.5, 1.0, 4.0, 0.25]
_FIXED_STEPS = [1.0, 0.5, 1.0, INF]


def _custom_loop_step(opt, var, dtype):
  """TF 2.4-2.15's custom loop step, on a loss of `var * factor`."""

  def step(factor):
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(tf.reduce_sum(var * tf.cast(factor, dtype)))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))

  return step


def _train_pair(dtype, factors, mode, **options):
  """Trains ours and tf_keras's on the same losses; the trajectories."""
  ours = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                            **options)
  theirs = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.125), **options)
  start = np.array([1.0, -2.0], dtype)
  runs = [(ours, keras.Variable(start, dtype=dtype)),
          (theirs, tf.Variable(start))]
  trajectories = []
  for opt, var in runs:
    step = _custom_loop_step(opt, var, dtype)
    if mode != 'eager':
      step = tf.function(step, jit_compile=(mode == 'jit'))
    trajectory = []
    for factor in factors:
      step(tf.constant(factor))
      trajectory.append((np.asarray(var.numpy(), np.float32).tolist(),
                         float(opt.loss_scale)))
    trajectories.append(trajectory)
  return trajectories


@pytest.mark.parametrize('dtype,mode', [
    ('float32', 'eager'), ('float32', 'function'), ('float32', 'jit'),
    # float16 in a plain tf.function: see the next test.
    ('float16', 'eager'), ('float16', 'jit')])
def test_dynamic_scale_matches_tf_keras_step_for_step(dtype, mode):
  ours, theirs = _train_pair(dtype, _DYNAMIC_STEPS, mode,
                             dynamic_growth_steps=2)
  assert ours == theirs
  if dtype == 'float16':
    # Two overflows skipped (scale halved), growth after two finite steps.
    assert [s for _, s in ours] == [32768.0, 16384.0, 16384.0, 32768.0,
                                    32768.0, 65536.0, 32768.0, 32768.0]


def test_float16_in_a_tf_function_skips_as_eagerly_where_tf_keras_does_not():
  # Pins a peer difference: in a tf.function, Grappler's arithmetic
  # optimizer reassociates tf_keras's chain of multiplications (by the
  # scale, the loss's factor, the scale's reciprocal), so its float16
  # gradients of 2 * 2**15 and 4 * 2**15 are never formed: it applies steps
  # it skips eagerly. This class divides by the scale, which stays in place.
  ours, theirs = _train_pair('float16', _DYNAMIC_STEPS, 'function',
                             dynamic_growth_steps=2)
  _, theirs_eagerly = _train_pair('float16', _DYNAMIC_STEPS, 'eager',
                                  dynamic_growth_steps=2)
  assert ours == theirs_eagerly
  assert theirs[1] == ([0.625, -2.375], 65536.0)  # Applied, and grown.
  options = tf.config.optimizer.get_experimental_options()
  tf.config.optimizer.set_experimental_options(
      {'arithmetic_optimization': False})
  try:
    _, theirs_unoptimized = _train_pair('float16', _DYNAMIC_STEPS,
                                        'function', dynamic_growth_steps=2)
  finally:
    tf.config.optimizer.set_experimental_options(
        dict(options, arithmetic_optimization=options.get(
            'arithmetic_optimization', True)))
  assert theirs_unoptimized == ours


@pytest.mark.parametrize('mode', ['eager', 'function', 'jit'])
def test_fixed_scale_matches_tf_keras_and_applies_non_finite_steps(mode):
  ours, theirs = _train_pair('float32', _FIXED_STEPS, mode, dynamic=False,
                             initial_scale=64)
  np.testing.assert_array_equal(np.array([w for w, _ in ours]),
                                np.array([w for w, _ in theirs]))
  assert [s for _, s in ours] == [64.0] * 4
  assert ours[3][0] == [-INF, -INF]  # Applied, as tf_keras's fixed scale.


@pytest.mark.parametrize('mode', ['eager', 'function'])
def test_iterations_and_dynamic_counter_count_as_tf_keras(mode):
  # tf_keras counts a skipped step in the inner optimizer's `iterations`
  # (Keras 3's class does not); its counter is a tf.Variable.
  counts = []
  for opt, var in [
      (mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(0.125), initial_scale=4,
          dynamic_growth_steps=2), keras.Variable([1.0])),
      (tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.125), initial_scale=4,
          dynamic_growth_steps=2), tf.Variable([1.0]))]:
    step = _custom_loop_step(opt, var, 'float32')
    if mode == 'function':
      step = tf.function(step)
    trajectory = []
    for factor in [1.0, INF, 1.0, 1.0, INF]:
      step(tf.constant(factor))
      assert isinstance(opt.dynamic_counter, tf.Variable)
      trajectory.append((int(opt.iterations), int(opt.dynamic_counter),
                         float(opt.loss_scale)))
    counts.append(trajectory)
  assert counts[0] == counts[1] == [(1, 1, 4.0), (2, 0, 2.0), (3, 1, 2.0),
                                    (4, 0, 4.0), (5, 0, 2.0)]


def test_an_accumulating_inner_optimizer_counts_only_micro_steps():
  opt = mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(1.0, gradient_accumulation_steps=2),
      initial_scale=4)
  var = keras.Variable([1.0])
  for factor in [1.0, INF, 1.0]:
    _custom_loop_step(opt, var, 'float32')(tf.constant(factor))
  # As the bare optimizer fed the two finite micro-steps: one update, of
  # their mean (counting the skipped one would have left the weight at 1).
  bare = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
  bare_var = keras.Variable([1.0])
  for _ in range(2):
    bare.apply([tf.constant([1.0])], [bare_var])
  assert int(opt.iterations) == int(bare.iterations.numpy())
  assert var.numpy().tolist() == bare_var.numpy().tolist() == [0.0]


def test_arguments_defaults_and_properties_are_tf_24s():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
  assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == (
      True, 2.0**15, 2000)
  assert float(opt.loss_scale) == 2.0**15
  opt.build([keras.Variable(1.0)])
  assert int(opt.dynamic_counter.numpy()) == 0
  opt.learning_rate = 0.25
  assert float(opt.inner_optimizer.learning_rate.numpy()) == 0.25
  fixed = mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.5), dynamic=False, initial_scale=8)
  assert (fixed.dynamic, fixed.dynamic_growth_steps,
          fixed.dynamic_counter) == (False, None, None)
  # tf_keras's messages, which its tests pin.
  with pytest.raises(ValueError, match='"initial_scale" must be specified if '
                     '"dynamic" is False'):
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                       dynamic=False)
  with pytest.raises(ValueError, match='"dynamic_growth_steps" must be None if '
                     '"dynamic" is False, but got: 10'):
    mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), dynamic=False, initial_scale=8,
        dynamic_growth_steps=10)
  with pytest.raises(TypeError, match='"dynamic" argument to LossScaleOptimizer'
                     r"\.__init__ must be a bool, but got: 'dynamic'"):
    mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5), 'dynamic')


def _fit(make_optimizer, steps=4):
  """Five-ish float32 steps whose gradients stay finite at every scale."""
  keras.utils.set_random_seed(1)
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  opt = make_optimizer(keras.optimizers.SGD(0.01))
  model.compile(opt, 'mse')
  x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
  y = np.array([[1e4, 0.0]] * 4, np.float32)  # Large, finite in float32.
  model.fit(x, y, batch_size=4, epochs=steps, verbose=0)
  return model, opt


def _scale_of(opt):
  """The current scale of any of the three forms, as a Python float."""
  scale = getattr(opt, 'loss_scale', None)  # None on Keras's own class.
  scale = opt.dynamic_scale if scale is None else scale
  return float(np.asarray(scale() if callable(scale) else scale))


def _fit_float16(make_optimizer, run_eagerly):
  """`fit` of a float16-compute model whose scaled gradients overflow.

  Two `mixed_float16` Dense layers (float32 variables, float16 compute)
  and a float32 output; mean squared error against targets 20 and -5 away
  from the outputs. The gradient reaching the float16 output is about
  `error / 4 * scale`, over float16's 65504 at 2**15 and at 4096 while the
  errors are large: those steps overflow and are skipped.

  Returns:
    The model, the optimizer, and after each of the ten steps (5 epochs of
    2 batches) the weights, the scale, and the `iterations` of the wrapper
    and of the inner optimizer.
  """
  keras.utils.set_random_seed(1)
  model = keras.Sequential([
      keras.Input((3,)),
      keras.layers.Dense(4, dtype='mixed_float16'),
      keras.layers.Dense(2, dtype='mixed_float16'),
      keras.layers.Activation('linear', dtype='float32')])
  opt = make_optimizer(keras.optimizers.SGD(0.01))
  model.compile(opt, 'mse', run_eagerly=run_eagerly, jit_compile=False)
  assert model.layers[0].compute_dtype == 'float16'
  trajectory = []

  class Record(keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      trajectory.append((model.get_weights(), _scale_of(opt),
                         int(np.asarray(opt.iterations)),
                         int(opt.inner_optimizer.iterations.numpy())))

  x = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
  y = np.array([[20.0, -5.0]] * 8, np.float32)
  model.fit(x, y, batch_size=4, epochs=5, shuffle=False, verbose=0,
            callbacks=[Record()])
  return model, opt, trajectory


# After each step of `_fit_float16` (growth after 2 finite steps): four
# overflows from 2**15 down to 2048, two applied steps that double it, an
# overflow, two applied, an overflow.
_FIT_FLOAT16_SCALES = [16384.0, 8192.0, 4096.0, 2048.0, 2048.0, 4096.0,
                       2048.0, 2048.0, 4096.0, 2048.0]
_FIT_FLOAT16_SKIPPED = [True, True, True, True, False, False, True, False,
                        False, True]


@pytest.mark.parametrize('run_eagerly', [True, False],
                         ids=['eager', 'function'])
def test_fit_takes_scaled_gradients_as_keras_does(run_eagerly):
  # Keras 3's fit calls scale_loss and hands apply the scaled gradients;
  # float16's overflow of those gradients is what skips a step.
  expected, keras_opt, keras_trajectory = _fit_float16(
      lambda inner: keras.optimizers.LossScaleOptimizer(
          inner, initial_scale=2.0**15, dynamic_growth_steps=2),
      run_eagerly)
  assert [s for _, s, _, _ in keras_trajectory] == _FIT_FLOAT16_SCALES
  # A skipped step changes no weight; an applied one changes every one.
  start = None
  for (weights, _, _, _), skipped in zip(keras_trajectory,
                                         _FIT_FLOAT16_SKIPPED):
    if start is not None:
      changed = [not np.array_equal(a, b) for a, b in zip(weights, start)]
      assert changed == [not skipped] * len(weights)
    start = weights
  # Keras's own class counts applied steps only, in its inner optimizer
  # (its own counter moves from Keras 3.9 on only).
  applied = np.cumsum([not s for s in _FIT_FLOAT16_SKIPPED]).tolist()
  assert [i for _, _, _, i in keras_trajectory] == applied
  assert int(keras_opt.inner_optimizer.iterations.numpy()) == 4
  # TF 2.4-2.15's form under fit (Keras 3's protocol) counts as Keras's
  # class, in the inner optimizer (its `iterations` is the inner count, as
  # tf_keras's); TF 2.3's counts skipped steps too, in the inner
  # optimizer's counter, as TF 2.3's fit did.
  every_step = list(range(1, 11))
  for make, own_counts, counts in (
      (lambda inner: mixed_precision.LossScaleOptimizer(
          inner, initial_scale=2.0**15, dynamic_growth_steps=2),
       applied, applied),
      (lambda inner: tf_loss_scale.keras.experimental.LossScaleOptimizer(
          inner, tf_loss_scale.DynamicLossScale(initial_loss_scale=2.0**15,
                                                increment_period=2)),
       every_step, every_step)):
    model, opt, trajectory = _fit_float16(make, run_eagerly)
    assert model.optimizer is opt  # compile kept it.
    for (ours, our_scale, _, _), (theirs, their_scale, _, _) in zip(
        trajectory, keras_trajectory):
      assert our_scale == their_scale
      for our_weight, their_weight in zip(ours, theirs):
        np.testing.assert_array_equal(our_weight, their_weight)
    assert [i for _, _, i, _ in trajectory] == own_counts
    assert [i for _, _, _, i in trajectory] == counts
    for ours, theirs in zip(model.get_weights(), expected.get_weights()):
      np.testing.assert_array_equal(ours, theirs)


def test_keras_file_round_trips_the_optimizer_and_its_state(tmp_path):
  model, opt = _fit(lambda inner: mixed_precision.LossScaleOptimizer(
      inner, initial_scale=2.0**12, dynamic_growth_steps=3), steps=5)
  path = str(tmp_path / 'model.keras')
  model.save(path)
  loaded = keras.models.load_model(path)
  again = loaded.optimizer
  assert type(again) is mixed_precision.LossScaleOptimizer
  assert again.get_config() == opt.get_config()
  state = lambda o: (float(o.loss_scale), int(o.dynamic_counter.numpy()),
                     int(o.inner_optimizer.iterations.numpy()))
  assert state(again) == state(opt)
  assert int(again.iterations.numpy()) == int(opt.iterations.numpy())
  # Five finite steps: doubled after three, two counted since.
  assert state(opt) == (8192.0, 2, 5)
  for ours, saved in zip(loaded.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(ours, saved)
  # The next step from either is the same.
  x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
  y = np.array([[1e4, 0.0]] * 4, np.float32)
  for m in (model, loaded):
    m.fit(x, y, batch_size=4, epochs=1, verbose=0)
  assert state(again) == state(opt)
  for ours, saved in zip(loaded.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(ours, saved)


@pytest.mark.parametrize('form', ['mixed_precision', 'experimental'])
def test_apply_gradients_follows_the_latest_scaling_call_in_its_graph(form):
  var = keras.Variable(np.float32(1.0))
  if form == 'mixed_precision':
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                             initial_scale=4)
  else:
    opt = tf_loss_scale.keras.experimental.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), 4)
  with tf.GradientTape() as tape:
    loss = opt.scale_loss(var * 3.0)
  grads = tape.gradient(loss, [var])
  assert float(grads[0]) == 12.0
  # Every apply after scale_loss (eagerly, as it was) unscales: an apply
  # consumes nothing.
  opt.apply_gradients(zip(grads, [var]))
  opt.apply_gradients(zip(grads, [var]))
  assert float(var.numpy()) == 1.0 - 3.0 - 3.0
  # TensorFlow's protocol: the apply takes the unscaled gradients as given.
  with tf.GradientTape() as tape:
    loss = opt.get_scaled_loss(var * 2.0)
  unscaled = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
  assert float(unscaled[0]) == 2.0
  opt.apply_gradients(zip(unscaled, [var]))
  assert float(var.numpy()) == -5.0 - 2.0
  # A scale_loss traced in a function (as `fit` traces it) is followed by
  # the apply in that function, not by an eager one.
  @tf.function
  def keras3_step():
    with tf.GradientTape() as tape:
      loss = opt.scale_loss(var * 1.0)
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

  keras3_step()
  assert float(var.numpy()) == -7.0 - 1.0
  opt.apply_gradients([(tf.constant(1.0), var)])
  assert float(var.numpy()) == -8.0 - 1.0


def _mirrored_trajectory(strategy, make, mode):
  """Three steps on two replicas, replica 1's gradients inf in the second.

  The optimizer is made in the strategy's scope and first builds its
  variables (SGD's momentum too) inside the first step, as the loops of
  TF 2.4-2.15 did: in a `tf.function` too when `mode` is 'function'.
  """
  with strategy.scope():
    opt, var, step = make()

  def replica_step(poison):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    step(tf.where(tf.logical_and(poison, tf.equal(replica, 1)), INF, 1.0))

  train = lambda poison: strategy.run(replica_step, (poison,))
  if mode == 'function':
    train = tf.function(train)
  trajectory = []
  for poison in (False, True, False):
    train(tf.constant(poison))
    scale = getattr(opt, 'loss_scale', None)  # None on the Keras 3 form.
    scale = opt.dynamic_scale if scale is None else scale
    scale = scale() if callable(scale) else scale
    trajectory.append(
        ([np.asarray(v).tolist() for v in strategy.experimental_local_results(
            var.value if isinstance(var, keras.Variable) else var)],
         float(tf.convert_to_tensor(scale))))
  return trajectory


def _tf_keras_on_replicas():
  opt = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=8)
  var = tf.Variable(np.array([1.0, 2.0], np.float32))
  return opt, var, _custom_loop_step(opt, var, 'float32')


def _ours_on_replicas(form):
  """Each form, with its own custom loop, on the same problem."""
  inner = keras.optimizers.SGD(0.5, momentum=0.5)
  var = keras.Variable(np.array([1.0, 2.0], np.float32))
  if form == 'mixed_precision':
    opt = mixed_precision.LossScaleOptimizer(inner, initial_scale=8)
  elif form == 'experimental':
    opt = tf_loss_scale.keras.experimental.LossScaleOptimizer(
        inner, tf_loss_scale.DynamicLossScale(initial_loss_scale=8))
  else:
    opt = tf_loss_scale.keras.LossScaleOptimizer(inner, initial_scale=8)

    def keras3_step(factor):  # Keras 3's loop: apply takes scaled gradients.
      with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(var * factor))
      opt.apply(tape.gradient(loss, [var]), [var])

    return opt, var, keras3_step
  return opt, var, _custom_loop_step(opt, var, 'float32')


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
@pytest.mark.parametrize('mode', ['eager', 'function'])
@pytest.mark.parametrize('form', ['mixed_precision', 'experimental',
                                  'keras3'])
def test_one_replica_overflowing_skips_every_replica_as_tf_keras(
    mirrored_strategy, form, mode):
  # In a tf.function, Keras 3's own class fails here (its variables, made
  # while the function runs, are never initialised); tf_keras's builds
  # outside the function, as ours do.
  ours = _mirrored_trajectory(mirrored_strategy,
                              lambda: _ours_on_replicas(form), mode)
  theirs = _mirrored_trajectory(mirrored_strategy, _tf_keras_on_replicas,
                                mode)
  assert ours == theirs
  # Step 2 skipped everywhere (scale halved); steps 1 and 3 apply the two
  # replicas' sum (2) with momentum 0.5: -1, then -(0.5 * 1 + 1).
  assert ours == [([[0.0, 1.0]] * 2, 8.0), ([[0.0, 1.0]] * 2, 4.0),
                  ([[-1.5, -0.5]] * 2, 4.0)]


def test_a_skipped_step_is_reported():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                           initial_scale=8)
  var = keras.Variable(np.array([1.0, 2.0], np.float32), name='w')
  opt.apply_gradients([(tf.constant([1.0, -INF]), var)])
  assert monitoring.last_skip(opt) == monitoring.SkipReport(
      step=0, loss_scale=8.0, nan=(), inf=('w',), cause='overflow')
  assert int(opt.skipped_steps) == 1


def _unnamed(config):
  inner = dict(config['inner_optimizer'])
  inner['config'] = dict(inner['config'], name=None)
  return dict(config, inner_optimizer=inner, name=None)


@pytest.mark.parametrize('options', [
    {}, {'dynamic': False, 'initial_scale': 64.0},
    {'initial_scale': 256.0, 'dynamic_growth_steps': 7}])
def test_config_is_keras_s_and_tf_keras_configs_load(options):
  # Keras's config (with `name`: Keras's `from_config` needs it); a fixed
  # scale, which Keras's class has not, adds `dynamic: False`.
  inner = keras.optimizers.SGD(0.25, momentum=0.5, name='sgd')
  opt = mixed_precision.LossScaleOptimizer(inner, name='lso', **options)
  theirs = tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(0.25, momentum=0.5), **options)
  config = opt.get_config()
  if options.get('dynamic', True):
    keras_class = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.25, momentum=0.5, name='sgd'), name='lso',
        **options)
    assert config == keras_class.get_config()
    loaded = keras.optimizers.LossScaleOptimizer.from_config(
        json.loads(json.dumps(config)))
    assert loaded.get_config() == config
  else:
    assert {k: config[k] for k in ('name', 'dynamic', 'initial_scale',
                                   'dynamic_growth_steps')} == {
                                       'name': 'lso', 'dynamic': False,
                                       'initial_scale': 64.0,
                                       'dynamic_growth_steps': None}
  for config in (opt.get_config(), theirs.get_config()):
    copy = json.loads(json.dumps(config))
    restored = mixed_precision.LossScaleOptimizer.from_config(copy)
    assert copy == json.loads(json.dumps(config))  # Not modified.
    assert _unnamed(restored.get_config()) == _unnamed(opt.get_config())
    assert (restored.dynamic, restored.initial_scale) == (
        options.get('dynamic', True), options.get('initial_scale', 2.0**15))
  assert keras.optimizers.deserialize(
      keras.optimizers.serialize(opt)).get_config() == opt.get_config()


def test_a_tf_keras_config_with_a_schedule_loads_the_schedule():
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(0.5, 4, 0.5)
  config = json.loads(json.dumps(tf_keras.mixed_precision.LossScaleOptimizer(
      tf_keras.optimizers.SGD(schedule, momentum=0.5),
      initial_scale=8).get_config()))
  assert config['inner_optimizer']['config']['learning_rate']['config'][
      'name'] is None  # tf_keras's default, which Keras 3 refuses.
  opt = mixed_precision.LossScaleOptimizer.from_config(config)
  learning_rate = opt.inner_optimizer._learning_rate  # pylint: disable=protected-access
  assert isinstance(learning_rate,
                    keras.optimizers.schedules.ExponentialDecay)
  # 0.5 * 0.5 ** (step / 4), read at the inner optimizer's count.
  assert [float(learning_rate(step)) for step in (0, 4, 8)] == [
      0.5, 0.25, 0.125]
  assert float(opt.inner_optimizer.learning_rate) == 0.5
  assert float(opt.loss_scale) == 8.0


def test_config_refuses_a_base_optimizer_setting():
  config = mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.25)).get_config()
  config['clipnorm'] = 1.0
  with pytest.raises(ValueError, match='does not support `clipnorm`'):
    mixed_precision.LossScaleOptimizer.from_config(config)


def test_tf_keras_refuses_this_class_s_config_as_it_refuses_keras_s():
  # The config is Keras 3's, whose optimizers take settings tf_keras's do
  # not: tf_keras cannot deserialize Keras's class's config either, and
  # fails the same way (tf_keras's behaviour, pinned).
  errors = []
  for cls in (mixed_precision.LossScaleOptimizer,
              keras.optimizers.LossScaleOptimizer):
    config = cls(keras.optimizers.SGD(0.25), name='lso').get_config()
    with pytest.raises(TypeError) as raised:
      tf_keras.optimizers.deserialize(
          {'class_name': 'LossScaleOptimizer', 'config': config})
    errors.append(str(raised.value))
  assert errors[0] == errors[1]
  assert 'weight_decay' in errors[0]


# The problems of the checkpoint tests, run here on Keras 3 and in a child
# on tf_keras: `make(k, kind, wrap)` gives the optimizer `wrap` makes around
# the kind's inner optimizer of Keras module `k`, the variables (one, or two
# Dense layers' four), and TF 2.4-2.15's custom loop step on them.
_CHECKPOINT_PROBLEM = """
import numpy as np
import tensorflow as tf

INNER = {'sgd': lambda k: k.optimizers.SGD(0.5),
         'momentum': lambda k: k.optimizers.SGD(0.05, momentum=0.9),
         'adam': lambda k: k.optimizers.Adam(0.05)}
X = tf.constant([[1.0, 2.0], [-1.0, 0.5], [0.25, -2.0], [1.5, 1.0]])
Y = tf.constant([[1.0], [-1.0], [2.0], [0.5]])
WEIGHTS = [np.array([[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]], np.float32),
           np.array([0.1, -0.2, 0.3], np.float32),
           np.array([[1.0], [-0.5], [0.25]], np.float32),
           np.array([0.5], np.float32)]


def make(k, kind, wrap):
  opt = wrap(INNER[kind](k))
  if kind == 'sgd':  # One variable, the loss var * factor.
    var = (k.Variable if hasattr(k, 'Variable') else tf.Variable)(
        np.array([1.0], np.float32))
    variables, loss_of = [var], lambda f: tf.reduce_sum(var * f)
  else:
    model = k.Sequential([k.Input((2,)), k.layers.Dense(3),
                          k.layers.Dense(1)])
    model.set_weights(WEIGHTS)
    variables = model.trainable_variables
    loss_of = lambda f: tf.reduce_mean(tf.square(model(X) - Y * f))

  def step(factor):
    with tf.GradientTape() as tape:
      loss = opt.get_scaled_loss(loss_of(tf.constant(factor)))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
    opt.apply_gradients(zip(grads, variables))

  return opt, variables, step


def state(opt, variables):
  return {'state': [float(opt.loss_scale), int(opt.dynamic_counter.numpy()),
                    int(opt.iterations.numpy())],
          'weights': [np.asarray(v.numpy()).tolist() for v in variables]}
"""
_CHECKPOINT_WRAP = dict(initial_scale=64, dynamic_growth_steps=3)

# tf_keras's side: trains two steps (the first skipped: scale 32, counter
# 1) and writes; then reports the state and takes one more step.
_TF_KERAS_CHECKPOINT = _CHECKPOINT_PROBLEM + """
import sys, json
import tf_keras
path, kind = sys.argv[1:3]
opt, variables, step = make(tf_keras, kind, lambda inner: (
    tf_keras.mixed_precision.LossScaleOptimizer(
        inner, initial_scale=64, dynamic_growth_steps=3)))
opt.build(variables)
for factor in (float('inf'), 1.0):
  step(factor)
tf.train.Checkpoint(optimizer=opt, variables=variables).write(path)
result = state(opt, variables)
step(1.0)
result['next_weights'] = state(opt, variables)['weights']
print(json.dumps(result))
"""
_problem = {}
exec(_CHECKPOINT_PROBLEM, _problem)  # pylint: disable=exec-used


def _assert_all_bound(status, what, kind):
  """What tf_keras's reads of its own files guarantee, for this kind.

  Every variable is bound to the file's value (having read tf_keras's file,
  the wrapper leaves Keras's constants out of its checkpoints); with
  momentum or Adam every value of tf_keras's file is used too
  (`assert_consumed`). tf_keras's SGD keeps momentum buffers even at
  momentum 0, which Keras 3's SGD has not.
  """
  del what  # The assertions name what is unbound.
  status.assert_existing_objects_matched()
  if kind != 'sgd':
    status.assert_consumed()


def _assert_same_weights(ours, theirs, kind):
  for our_weight, their_weight in zip(ours, theirs):
    if kind == 'adam':  # Keras 3's and tf_keras's Adam round differently.
      np.testing.assert_allclose(our_weight, their_weight, rtol=1e-6,
                                 atol=1e-7)
    else:
      np.testing.assert_array_equal(our_weight, their_weight)


@versions.KERAS_TF_KERAS_CHECKPOINTS.mark
@pytest.mark.parametrize('kind', ['sgd', 'momentum', 'adam'])
def test_tf_keras_checkpoints_restore_whole_into_this_class(tmp_path, kind):
  # One variable with SGD, or two Dense layers with SGD(momentum=0.9) or
  # Adam, whose slots must move too: the next step from a restored state is
  # the writer's next step.
  theirs = str(tmp_path / 'theirs')
  written = fresh_process.run_json(
      ['-c', _TF_KERAS_CHECKPOINT, theirs, kind], legacy_keras=True)
  assert written['state'] == [32.0, 1, 2]
  statuses = []
  for build_first in (True, False):
    opt, variables, step = _problem['make'](
        keras, kind, lambda inner: mixed_precision.LossScaleOptimizer(
            inner, **_CHECKPOINT_WRAP))
    if build_first:
      opt.build(variables)
    status = tf.train.Checkpoint(optimizer=opt, variables=variables).read(
        theirs)
    if not build_first:
      opt.build(variables)  # Restores what the checkpoint holds for it.
    statuses.append((status, f'build_first={build_first}'))
    restored = _problem['state'](opt, variables)
    # The skipped step counted, as tf_keras counts it.
    assert restored['state'] == [32.0, 1, 2]
    _assert_same_weights(restored['weights'], written['weights'], kind)
    step(1.0)
    # The counter reaches 3 only after two more finite steps.
    after = _problem['state'](opt, variables)
    assert after['state'] == [32.0, 2, 3]
    _assert_same_weights(after['weights'], written['next_weights'], kind)
  # This class's files are Keras's layout, which tf_keras's class cannot
  # read (tests/test_keras_mixed_precision_checkpoints.py).
  for status, what in statuses:
    _assert_all_bound(status, what, kind)


@versions.TF_KERAS_IS_KERAS_3.mark
def test_install_maps_the_keras_3_name_and_leaves_keras_its_own():
  import tf_loss_scale.compat  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras.mixed_precision import shared_name  # pylint: disable=g-import-not-at-top
  before = tf.keras.mixed_precision.LossScaleOptimizer
  keras_own = keras.optimizers.LossScaleOptimizer
  tf_loss_scale.compat.install()
  try:
    assert tf.keras.mixed_precision.LossScaleOptimizer is (
        shared_name.LossScaleOptimizer)
    assert keras.mixed_precision.LossScaleOptimizer is (
        shared_name.LossScaleOptimizer)
    assert keras.optimizers.LossScaleOptimizer is keras_own is before
    assert issubclass(shared_name.LossScaleOptimizer,
                      mixed_precision.LossScaleOptimizer)
  finally:
    tf_loss_scale.compat.uninstall()
  assert tf.keras.mixed_precision.LossScaleOptimizer is before


def _minimize_step(opt, var, dtype, loss_kind):
  """One step by `minimize`, the loss a callable or a tensor with its tape."""

  def step(factor):
    loss_fn = lambda: tf.reduce_sum(var * tf.cast(factor, dtype))
    if loss_kind == 'callable':
      opt.minimize(loss_fn, [var])
    else:
      with tf.GradientTape() as tape:
        loss = loss_fn()
      opt.minimize(loss, [var], tape=tape)

  return step


@pytest.mark.parametrize('loss_kind', ['callable', 'tensor'])
@pytest.mark.parametrize('dtype,mode', [
    ('float32', 'eager'), ('float32', 'function'), ('float16', 'eager')])
def test_minimize_scales_and_unscales_inside_as_tf_keras(dtype, mode,
                                                         loss_kind):
  trajectories = []
  for opt, var in [
      (mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.125),
                                          dynamic_growth_steps=2),
       keras.Variable(np.array([1.0, -2.0], dtype), dtype=dtype)),
      (tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.125), dynamic_growth_steps=2),
       tf.Variable(np.array([1.0, -2.0], dtype)))]:
    step = _minimize_step(opt, var, dtype, loss_kind)
    if mode == 'function':
      step = tf.function(step)
    trajectory = []
    for factor in _DYNAMIC_STEPS:
      step(tf.constant(factor))
      trajectory.append((np.asarray(var.numpy(), np.float32).tolist(),
                         float(opt.loss_scale), int(opt.iterations)))
    trajectories.append(trajectory)
  assert trajectories[0] == trajectories[1]
  if dtype == 'float16':
    # The scaled loss overflows at factors 2 and 4: skipped, scale halved,
    # and counted in iterations as tf_keras counts them.
    assert [s for _, s, _ in trajectories[0]] == [
        32768.0, 16384.0, 16384.0, 32768.0, 32768.0, 65536.0, 32768.0,
        32768.0]
    assert trajectories[0][1][0] == [0.875, -2.125]
  assert [i for _, _, i in trajectories[0]] == list(range(1, 9))


def test_compute_gradients_returns_unscaled_pairs_as_tf_keras():
  results = []
  for opt, var, other in [
      (mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                          initial_scale=8),
       keras.Variable([1.0, 2.0]), keras.Variable(3.0, trainable=False)),
      (tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(1.0), initial_scale=8),
       tf.Variable([1.0, 2.0]), tf.Variable(3.0, trainable=False))]:
    unused = tf.Variable(0.0)
    loss_fn = lambda: tf.reduce_sum(var * var) * other
    # Listed variables are watched: the non-trainable one gets its
    # gradient, an unused one None.
    pairs = opt.compute_gradients(loss_fn, [var, other, unused])
    # A callable var_list is called after the loss, and nothing is watched.
    pairs += opt.compute_gradients(loss_fn, lambda: [var, other])
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(var) * 0.5
    pairs += opt.compute_gradients(loss, [var], tape=tape)
    assert [p[1] for p in pairs] == [var, other, unused, var, other, var]
    results.append(([None if g is None else g.numpy().tolist()
                     for g, _ in pairs], float(opt.loss_scale)))
  assert results[0] == results[1] == (
      [[6.0, 12.0], 5.0, None, [6.0, 12.0], None, [0.5, 0.5]], 8.0)


def test_compute_gradients_of_a_layers_variables_as_tf_keras():
  # A layer's variables are watched as any others (on Keras 3.3 they are
  # not instances of `keras.Variable`, which `tape.watch` refuses).
  results = []
  for k, make in ((keras, mixed_precision.LossScaleOptimizer),
                  (tf_keras, tf_keras.mixed_precision.LossScaleOptimizer)):
    opt = make(k.optimizers.SGD(1.0), initial_scale=8)
    layer = k.layers.Dense(1, use_bias=False, kernel_initializer='ones')
    layer.build((None, 2))
    x = tf.constant([[1.0, 2.0]])
    pairs = opt.compute_gradients(lambda: tf.reduce_sum(layer(x)) * 3.0,  # pylint: disable=cell-var-from-loop
                                  layer.trainable_variables)
    results.append([g.numpy().tolist() for g, _ in pairs])
  assert results[0] == results[1] == [[[3.0], [6.0]]]


def test_compute_gradients_of_a_tensor_without_its_tape_says_what_to_do():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0))
  var = keras.Variable(1.0)
  with pytest.raises(ValueError, match=r'tape=None: pass the tf.GradientTape '
                     'that computed the loss as tape='):
    opt.compute_gradients(var * 2.0, [var])


def test_minimize_follows_tensorflows_protocol_for_its_step():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                           initial_scale=4)
  var = keras.Variable(1.0)
  opt.scale_loss(var * 1.0)
  opt.apply_gradients([(tf.constant(4.0), var)])  # Of the scaled loss: 4 / 4.
  # minimize scales, differentiates and unscales: 3 is applied, and so is
  # the next plain gradient.
  opt.minimize(lambda: var * 3.0, [var])
  opt.apply_gradients([(tf.constant(4.0), var)])
  assert float(var.numpy()) == 1.0 - 1.0 - 3.0 - 4.0


def _minimize_on_replicas(make_opt, make_var, loss_kind):
  def make():
    opt, var = make_opt(), make_var(np.array([1.0, 2.0], np.float32))
    step = _minimize_step(opt, var, 'float32', loss_kind)
    return opt, var, step
  return make


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
@pytest.mark.parametrize('mode', ['eager', 'function'])
@pytest.mark.parametrize('loss_kind', ['callable', 'tensor'])
def test_minimize_on_replicas_skips_an_overflow_everywhere_as_tf_keras(
    mirrored_strategy, loss_kind, mode):
  ours = _mirrored_trajectory(mirrored_strategy, _minimize_on_replicas(
      lambda: mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=8),
      keras.Variable, loss_kind), mode)
  theirs = _mirrored_trajectory(mirrored_strategy, _minimize_on_replicas(
      lambda: tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=8),
      tf.Variable, loss_kind), mode)
  assert ours == theirs == [([[0.0, 1.0]] * 2, 8.0), ([[0.0, 1.0]] * 2, 4.0),
                            ([[-1.5, -0.5]] * 2, 4.0)]


def _train_by_setting(opt, var, settings, factors=(1.0, 2.0, 1.0, INF, 1.0)):
  """Sets `settings` on the wrapper, then trains; the weights per step."""
  for name, value in settings.items():
    setattr(opt, name, value)
  step = _custom_loop_step(opt, var, 'float32')
  weights = []
  for factor in factors:
    step(tf.constant([factor, 3.0 * factor]))
    weights.append(var.numpy().tolist())
  return weights


def _pair(tf_keras_inner, keras_inner, start=(1.0, -2.0)):
  return [(mixed_precision.LossScaleOptimizer(keras_inner, initial_scale=8),
           keras.Variable(np.array(start, np.float32))),
          (tf_keras.mixed_precision.LossScaleOptimizer(tf_keras_inner,
                                                       initial_scale=8),
           tf.Variable(np.array(start, np.float32)))]


@pytest.mark.parametrize('settings', [
    {'learning_rate': 0.25}, {'use_ema': True, 'ema_momentum': 0.5}])
def test_settings_tf_keras_forwards_reach_the_inner_optimizer(settings):
  # tf_keras's class around a tf_keras optimizer (TF 2.11-2.15's) forwards
  # these three; each is set after construction and the steps use it.
  results = []
  for opt, var in _pair(tf_keras.optimizers.SGD(0.125),
                        keras.optimizers.SGD(0.125)):
    weights = _train_by_setting(opt, var, settings)
    for name, value in settings.items():
      if name != 'learning_rate':  # A variable: compared below.
        assert getattr(opt, name) == getattr(opt.inner_optimizer,
                                             name) == value
    opt.finalize_variable_values([var])  # The average, with EMA.
    results.append((weights, var.numpy().tolist(),
                    float(tf.convert_to_tensor(opt.learning_rate))))
  assert results[0][0] == results[1][0]  # The steps.
  if 'use_ema' in settings:
    # Both inner optimizers average the weights of the four applied steps
    # (the skipped one is not averaged), momentum 0.5: the weights were
    # [.875, -2.375], [.625, -3.125], [.5, -3.5], [.375, -3.875]. Keras 3's
    # average starts from the first step's weights, tf_keras's from the
    # weights before it ([1, -2]), as their bare optimizers do.
    assert results[0][1] == [0.5, -3.5]
    assert results[1][1] == [0.5078125, -3.4765625]
  else:
    assert results[0] == results[1]
    assert results[0][0][0] == [0.75, -2.75]  # 1 - 0.25 * 1, -2 - 0.25 * 3.


@pytest.mark.parametrize('settings', [
    {'clipnorm': 1.0}, {'clipvalue': 1.5}, {'global_clipnorm': 2.0},
    {'momentum': 0.75}, {'lr': 0.25}])
def test_hyperparameters_reach_the_inner_optimizer_as_tf_24s_did(settings):
  # TF 2.4-2.10's class around an OptimizerV2 (tf_keras's legacy ones)
  # forwarded the clipping settings and every hyperparameter.
  results = []
  for opt, var in _pair(tf_keras.optimizers.legacy.SGD(0.5, momentum=0.25),
                        keras.optimizers.SGD(0.5, momentum=0.25)):
    weights = _train_by_setting(opt, var, settings)
    name, value = next(iter(settings.items()))
    assert float(tf.convert_to_tensor(getattr(opt, name))) == value
    results.append(weights)
  np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
  # The first step, from the gradient [1, 3] (norm 3.16...).
  first = {'clipnorm': [0.841886, -2.474342], 'clipvalue': [0.5, -2.75],
           'global_clipnorm': [0.683772, -2.948683],
           'momentum': [0.5, -3.5], 'lr': [0.75, -2.75]}[name]
  np.testing.assert_allclose(results[0][0], first, rtol=1e-6)


@pytest.mark.parametrize('settings', [
    {'weight_decay': 0.5}, {'use_ema': True, 'ema_overwrite_frequency': 2}])
def test_keras_3_only_settings_reach_the_inner_optimizer(settings):
  # Settings tf_keras's class had no counterpart for: as on the bare
  # optimizer given them.
  opt, var = _pair(tf_keras.optimizers.SGD(0.125),
                   keras.optimizers.SGD(0.125))[0]
  weights = _train_by_setting(opt, var, settings, factors=(1.0, 1.0, 1.0))
  bare = keras.optimizers.SGD(0.125, **settings)
  bare_var = keras.Variable(np.array([1.0, -2.0], np.float32))
  expected = []
  for _ in range(3):
    bare.apply([tf.constant([1.0, 3.0])], [bare_var])
    expected.append(bare_var.numpy().tolist())
  assert weights == expected
  # The setting changed the steps.
  assert expected != [[0.875, -2.375], [0.75, -2.75], [0.625, -3.125]]


def test_forwarded_settings_make_no_copy_of_the_model_on_the_wrapper():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
  opt.use_ema = True
  opt.gradient_accumulation_steps = 2
  var = keras.Variable(np.zeros([3], np.float32))
  opt.build([var])
  inner = opt.inner_optimizer
  assert (inner.use_ema, inner.gradient_accumulation_steps) == (True, 2)
  own = [v for v in opt.variables if not any(v is w for w in inner.variables)]
  # Keras's iteration and learning rate, the counter and the scale: no
  # average or accumulator of `var` on the wrapper.
  assert sorted(v.name for v in own) == [
      'dynamic_scale', 'iteration', 'learning_rate', 'step_counter']
  assert len(inner.variables) == 4  # Iterations, rate, average, accumulator.


def test_loss_scale_factor_is_refused_and_other_names_stay_on_the_wrapper():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
  with pytest.raises(ValueError, match=r'loss_scale_factor cannot be set to '
                     r'4.0: .* Construct the wrapper with dynamic=False and '
                     r'initial_scale=4.0'):
    opt.loss_scale_factor = 4.0
  assert opt.inner_optimizer.loss_scale_factor is None
  opt.loss_scale_factor = None  # Its value already: accepted.
  opt.note = 'mine'
  assert opt.note == 'mine' and not hasattr(opt.inner_optimizer, 'note')


def test_flags_stay_on_the_wrapper_as_tf_keras_and_a_warning_says_so(
    caplog):
  # Neither tf_keras's class (TF 2.4-2.15, around either kind of optimizer)
  # nor Keras 3's forwards a flag such as `nesterov`: set on the wrapper, it
  # stays there and the steps are plain momentum. Ours says so.
  caplog.set_level(logging.WARNING)
  weights = []
  for opt, var in _pair(tf_keras.optimizers.SGD(0.125, momentum=0.5),
                        keras.optimizers.SGD(0.125, momentum=0.5)):
    with pytest.raises(AttributeError,
                       match="object has no attribute 'nesterov'"):
      opt.nesterov  # pylint: disable=pointless-statement
    caplog.clear()
    weights.append(_train_by_setting(opt, var, {'nesterov': True}))
    assert (opt.nesterov, opt.inner_optimizer.nesterov) == (True, False)
    warned = [r.getMessage() for r in caplog.records if 'nesterov' in
              r.getMessage()]
    if isinstance(opt, mixed_precision.LossScaleOptimizer):
      assert warned == [
          'LossScaleOptimizer.nesterov = True is set on the wrapper, where '
          'nothing reads it (as on tf_keras\'s class): the inner optimizer '
          'keeps nesterov=False. Set inner_optimizer.nesterov to change its '
          'steps.']
  assert weights[0] == weights[1]
  # Momentum 0.5 without Nesterov: the second step moves by
  # 0.125 * (0.5 * 1 + 2) = 0.3125 (Nesterov's would be 0.375).
  assert weights[0][:2] == [[0.875, -2.375], [0.5625, -3.3125]]


def test_a_non_optimizer_is_refused_in_tf_keras_words():
  for make in (tf_keras.mixed_precision.LossScaleOptimizer,
               mixed_precision.LossScaleOptimizer):
    with pytest.raises(TypeError) as refused:
      make(1)
    assert str(refused.value).startswith(
        '"inner_optimizer" must be an instance of '
        '`tf.keras.optimizers.Optimizer` or '
        '`tf.keras.optimizers.experimental.Optimizer`, but got: 1')


def _reduce_clip_apply(make_opt, make_var, apply_kwargs):
  """TF 2.2+'s loop: all-reduce, clip the sums, then apply them as sums."""

  def make():
    opt = make_opt()
    var = make_var(np.array([1.0, 2.0], np.float32))

    def step(factor):
      with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * [factor, 3.0]))
      grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
      sums = tf.distribute.get_replica_context().all_reduce('sum', grads)
      clipped, _ = tf.clip_by_global_norm(sums, 5.0)
      opt.apply_gradients(zip(clipped, [var]), **apply_kwargs)

    return opt, var, step

  return make


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
@pytest.mark.parametrize('mode', ['eager', 'function'])
@pytest.mark.parametrize('apply_kwargs', [
    {'skip_gradients_aggregation': True},
    {'experimental_aggregate_gradients': False, 'name': 'step'}])
def test_summed_gradients_are_applied_as_given_on_replicas_as_tf_keras(
    mirrored_strategy, apply_kwargs, mode):
  ours = _mirrored_trajectory(mirrored_strategy, _reduce_clip_apply(
      lambda: mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=8),
      keras.Variable, apply_kwargs), mode)
  theirs = _mirrored_trajectory(mirrored_strategy, _reduce_clip_apply(
      lambda: tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=8),
      tf.Variable, {k: v for k, v in apply_kwargs.items() if k != 'name'}),
                                 mode)
  assert ours == theirs
  # The sums [2, 6] clipped to norm 5 ([1.58..., 4.74...]) applied once,
  # not summed again; the step with replica 1's inf skipped everywhere.
  first = [1.0 - 0.5 * 2.0 * 5.0 / np.sqrt(40.0),
           2.0 - 0.5 * 6.0 * 5.0 / np.sqrt(40.0)]
  np.testing.assert_allclose(ours[0][0], [first] * 2, rtol=1e-6)
  assert [s for _, s in ours] == [8.0, 4.0, 4.0]
  assert ours[1][0] == ours[0][0]


def test_apply_gradients_refuses_an_unknown_keyword_naming_it():
  opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0))
  var = keras.Variable(1.0)
  with pytest.raises(TypeError, match=r"unexpected keyword arguments "
                     r"\['aggregate'\]: it takes name, "
                     'skip_gradients_aggregation and '
                     'experimental_aggregate_gradients'):
    opt.apply_gradients([(tf.constant(1.0), var)], aggregate=False)
  # Without a strategy the sums are the gradients: the same step.
  opt.apply_gradients([(tf.constant(1.0), var)], name='step',
                      skip_gradients_aggregation=True)
  assert float(var.numpy()) == 0.0


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
@pytest.mark.parametrize('mode', ['eager', 'function'])
@pytest.mark.parametrize('clipping', [
    {'clipnorm': 1.0}, {'global_clipnorm': 1.0}, {'clipvalue': 1.0}])
def test_on_replicas_the_inner_optimizer_clips_the_sums_as_tf_keras(
    mirrored_strategy, clipping, mode):
  # Each replica's gradient is [1, 3] (3.0 on the second step on replica 1):
  # clipped per replica and then summed, Keras 3's way, the update would be
  # twice the clipped one.
  def make(make_opt, make_var):
    def made():
      opt, var = make_opt(), make_var(np.array([1.0, 2.0], np.float32))
      def step(factor):
        with tf.GradientTape() as tape:
          loss = opt.get_scaled_loss(tf.reduce_sum(var * [1.0, 3.0]) *
                                     tf.minimum(factor, 3.0))
        opt.apply_gradients(zip(
            opt.get_unscaled_gradients(tape.gradient(loss, [var])), [var]))
      return opt, var, step
    return made

  ours = _mirrored_trajectory(mirrored_strategy, make(
      lambda: mixed_precision.LossScaleOptimizer(
          keras.optimizers.SGD(1.0, **clipping), initial_scale=8),
      keras.Variable), mode)
  theirs = _mirrored_trajectory(mirrored_strategy, make(
      lambda: tf_keras.mixed_precision.LossScaleOptimizer(
          tf_keras.optimizers.SGD(1.0, **clipping), initial_scale=8),
      tf.Variable), mode)
  np.testing.assert_allclose(np.array([w for w, _ in ours]),
                             np.array([w for w, _ in theirs]), rtol=1e-6)
  assert [s for _, s in ours] == [s for _, s in theirs] == [8.0, 8.0, 8.0]
  # The first step applies the sum [2, 6] clipped once.
  first = {'clipvalue': [0.0, 1.0]}.get(
      next(iter(clipping)), [1.0 - 2.0 / np.sqrt(40.0),
                             2.0 - 6.0 / np.sqrt(40.0)])
  np.testing.assert_allclose(ours[0][0], [first] * 2, rtol=1e-6)


def _float16_on_replicas(strategy, make):
  """float16 weights on two replicas at a scale of 1: each replica's
  gradient (40000) is finite in float16, their sum (80000) is not."""
  with strategy.scope():
    opt, var, step = make()
  trajectory = []
  for factor in (40000.0, 1.0):
    strategy.run(step, (tf.constant(factor, tf.float16),))
    trajectory.append(([np.asarray(v).tolist()
                        for v in strategy.experimental_local_results(
                            var.value if isinstance(var, keras.Variable)
                            else var)], float(opt.loss_scale)))
  return trajectory


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
@pytest.mark.parametrize('protocol', ['tensorflow', 'keras3'])
def test_a_float16_sum_past_its_range_skips_as_tf_keras(mirrored_strategy,
                                                       protocol):
  def ours():
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                             initial_scale=1)
    var = keras.Variable(np.array([1.0, 2.0], np.float16), dtype='float16')
    if protocol == 'tensorflow':
      return opt, var, _custom_loop_step(opt, var, 'float16')

    def keras3_step(factor):  # Scaled gradients, divided into float32.
      with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(var * factor))
      opt.apply(tape.gradient(loss, [var]), [var])

    return opt, var, keras3_step

  def theirs():
    opt = tf_keras.mixed_precision.LossScaleOptimizer(
        tf_keras.optimizers.SGD(0.5), initial_scale=1)
    var = tf.Variable(np.array([1.0, 2.0], np.float16))
    return opt, var, _custom_loop_step(opt, var, 'float16')

  expected = [([[1.0, 2.0]] * 2, 1.0),  # Skipped: the float16 sum is inf.
              ([[0.0, 1.0]] * 2, 1.0)]  # The sum 2, at a rate of 0.5.
  assert _float16_on_replicas(mirrored_strategy, theirs) == expected
  # TF 2.4-2.15's class: its dynamic scale stays at its floor of 1.
  assert _float16_on_replicas(mirrored_strategy, ours) == expected


@versions.KERAS_SUMS_ACROSS_REPLICAS.mark
def test_sums_for_variables_overwritten_with_their_gradient_are_refused(
    mirrored_strategy):
  with mirrored_strategy.scope():
    opt = mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    var = keras.Variable(np.float32(1.0), name='amax')
    var.overwrite_with_gradient = True
    opt.build([var])

  def replica_step():
    opt.apply_gradients([(tf.constant(2.0), var)])

  with pytest.raises(ValueError, match=r"variables \['amax'\] have "
                     'overwrite_with_gradient=True .* Train them with '
                     'tf_loss_scale.keras.LossScaleOptimizer'):
    mirrored_strategy.run(replica_step)
