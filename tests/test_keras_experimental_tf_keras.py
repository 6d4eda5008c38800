"""The experimental (TF 2.3) LossScaleOptimizer around Keras 2 optimizers.

Keras 2 is `tf.keras` on TensorFlow <= 2.15 and `tf_keras` on 2.16+
(`keras2` below). The reference is Keras 2's own
`mixed_precision.LossScaleOptimizer`
(the same update rule, and `iterations` counting skipped steps as TF 2.3
did): the same gradient sequences, with inf and NaN steps, go through both,
and variables, slots, loss scale and `iterations` must be equal after every
step. The TF 2.3 test file's cases are ported in test_experimental_tf23_spec.
"""

import numpy as np
import pytest
import tensorflow as tf

import fresh_process
import keras_families
import tf_loss_scale
import versions
from tf_loss_scale.keras import experimental

keras2 = keras_families.keras2()

INF = float('inf')
NAN = float('nan')

OPTIMIZERS = {
    'legacy_sgd_momentum':
        lambda: keras2.optimizers.legacy.SGD(0.1, momentum=0.9),
    'legacy_adam': lambda: keras2.optimizers.legacy.Adam(0.01),
    'sgd_momentum': lambda: keras2.optimizers.SGD(0.1, momentum=0.9),
    'adam': lambda: keras2.optimizers.Adam(0.01),
}


def _ours(inner, initial=32.0, period=3):
  return experimental.LossScaleOptimizer(
      inner, tf_loss_scale.DynamicLossScale(initial_loss_scale=initial,
                                            increment_period=period))


def _inner_values(opt):
  inner = opt.inner_optimizer
  variables = inner.variables() if callable(inner.variables) else inner.variables
  return [v.numpy() for v in variables]


def _assert_same_optimizer_state(ours, reference, where, iterations):
  """Our wrapper's state equals Keras 2's own wrapper's after a step."""
  for mine, theirs in zip(_inner_values(ours), _inner_values(reference)):
    np.testing.assert_array_equal(
        mine, theirs, err_msg=f'{where}: optimizer variables')
  assert float(ours.loss_scale()) == float(reference.loss_scale), (
      f'{where}: loss scale')
  assert int(ours.iterations.numpy()) == int(
      reference.iterations.numpy()) == iterations, f'{where}: iterations'


def test_path_follows_the_inner_optimizer_and_isinstance_holds():
  legacy = experimental.LossScaleOptimizer(keras2.optimizers.legacy.SGD(),
                                           'dynamic')
  new = experimental.LossScaleOptimizer(keras2.optimizers.SGD(), 'dynamic')
  assert isinstance(legacy, keras2.optimizers.legacy.Optimizer)
  assert isinstance(new, keras2.optimizers.Optimizer)
  for opt in (legacy, new):
    assert isinstance(opt, experimental.LossScaleOptimizer)
    assert isinstance(opt, keras2.mixed_precision.LossScaleOptimizer)
    assert isinstance(opt.loss_scale, tf_loss_scale.DynamicLossScale)
    assert opt.name == 'LossScaleOptimizer'
  assert not isinstance(keras2.optimizers.SGD(),
                        experimental.LossScaleOptimizer)


def test_wrapping_twice_or_a_keras2_loss_scale_optimizer_is_refused():
  inner = keras2.optimizers.legacy.SGD()
  _ = experimental.LossScaleOptimizer(inner, 'dynamic')
  with pytest.raises(ValueError, match='already wrapped'):
    experimental.LossScaleOptimizer(inner, 'dynamic')
  with pytest.raises(ValueError, match='already a loss scale optimizer'):
    experimental.LossScaleOptimizer(
        keras2.mixed_precision.LossScaleOptimizer(
            keras2.optimizers.SGD()), 'dynamic')


@pytest.mark.parametrize('use_function', [False, True])
@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_matches_keras2_loss_scale_optimizer_step_by_step(name,
                                                            use_function):
  ours = _ours(OPTIMIZERS[name]())
  reference = keras2.mixed_precision.LossScaleOptimizer(
      OPTIMIZERS[name](), initial_scale=32.0, dynamic_growth_steps=3)
  our_var = tf.Variable([1.0, -2.0, 0.5])
  ref_var = tf.Variable([1.0, -2.0, 0.5])

  def step(opt, var, grad):
    # The TF 2.3 guide's loop: scale, differentiate, unscale, apply.
    with tf.GradientTape() as tape:
      scaled_loss = opt.get_scaled_loss(tf.reduce_sum(var * grad))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
    opt.apply_gradients(zip(grads, [var]))

  # One function per optimizer: each creates its variables on its first call.
  # No AutoGraph (the step has no control flow): under TF_USE_LEGACY_KERAS=1
  # it may convert the enclosing test's source in the step's place.
  our_step = tf.function(step, autograph=False) if use_function else step
  ref_step = tf.function(step, autograph=False) if use_function else step
  rng = np.random.default_rng(7)
  for i in range(12):
    grad = rng.normal(size=3).astype(np.float32)
    if i in (2, 3, 8):
      grad[i % 3] = NAN if i == 3 else INF
    our_step(ours, our_var, tf.constant(grad))
    ref_step(reference, ref_var, tf.constant(grad))
    np.testing.assert_array_equal(our_var.numpy(), ref_var.numpy(),
                                  err_msg=f'{name} step {i}: variable')
    _assert_same_optimizer_state(ours, reference, f'{name} step {i}', i + 1)


def _gradient_sequence(steps=10):
  rng = np.random.default_rng(11)
  grads = []
  for i in range(steps):
    grad = rng.normal(size=3).astype(np.float32)
    if i in (2, 3, 7):
      grad[i % 3] = NAN if i == 3 else INF
    grads.append(grad)
  return grads


@pytest.mark.parametrize('name', ['legacy_sgd_momentum', 'legacy_adam'])
def test_matches_keras2_loss_scale_optimizer_in_a_tf1_graph(name):
  # TF 2.3's graph mode: each optimizer's minimize() op run by a Session,
  # fed the same gradients; every step compared.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    grad = tf.compat.v1.placeholder(tf.float32, [3])
    our_var = tf.compat.v1.Variable([1.0, -2.0, 0.5], use_resource=True)
    ref_var = tf.compat.v1.Variable([1.0, -2.0, 0.5], use_resource=True)
    ours = _ours(OPTIMIZERS[name]())
    reference = keras2.mixed_precision.LossScaleOptimizer(
        OPTIMIZERS[name](), initial_scale=32.0, dynamic_growth_steps=3)
    our_op = ours.minimize(lambda: tf.reduce_sum(our_var * grad), [our_var])
    ref_op = reference.minimize(lambda: tf.reduce_sum(ref_var * grad),
                                [ref_var])
    assert isinstance(our_op, tf.Operation)
    session.run(tf.compat.v1.global_variables_initializer())
    for i, value in enumerate(_gradient_sequence()):
      session.run([our_op, ref_op], {grad: value})
      np.testing.assert_array_equal(
          session.run(our_var), session.run(ref_var),
          err_msg=f'{name} step {i}: variable')
      for mine, theirs in zip(ours.inner_optimizer.variables(),
                              reference.inner_optimizer.variables()):
        np.testing.assert_array_equal(
            session.run(mine), session.run(theirs),
            err_msg=f'{name} step {i}: optimizer variable {mine.name}')
      assert session.run(ours.loss_scale()) == session.run(
          reference.loss_scale), f'{name} step {i}: loss scale'
      assert session.run(ours.iterations) == session.run(
          reference.iterations) == i + 1, f'{name} step {i}: iterations'


@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_matches_keras2_loss_scale_optimizer_on_two_replicas(
    mirrored_strategy, name):
  # Each replica computes its own gradient (the second one half the
  # first's, or inf/NaN only there): the step's verdict is about the sums.
  with mirrored_strategy.scope():
    our_var = tf.Variable([1.0, -2.0, 0.5])
    ref_var = tf.Variable([1.0, -2.0, 0.5])
    ours = _ours(OPTIMIZERS[name]())
    reference = keras2.mixed_precision.LossScaleOptimizer(
        OPTIMIZERS[name](), initial_scale=32.0, dynamic_growth_steps=3)

  def step_function(opt, var):
    # One function per optimizer: each creates its variables on its first
    # call.
    @tf.function
    def train(grad, second_replica_grad):
      def replica_step():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        replica_grad = tf.where(replica == 0, grad, second_replica_grad)
        with tf.GradientTape() as tape:
          scaled_loss = opt.get_scaled_loss(tf.reduce_sum(var * replica_grad))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
        opt.apply_gradients(zip(grads, [var]))
      mirrored_strategy.run(replica_step)
    return train

  our_step = step_function(ours, our_var)
  ref_step = step_function(reference, ref_var)
  local = mirrored_strategy.experimental_local_results
  for i, value in enumerate(_gradient_sequence()):
    first = np.where(np.isfinite(value), value, 1.0).astype(np.float32)
    our_step(tf.constant(first), tf.constant(value * 0.5))
    ref_step(tf.constant(first), tf.constant(value * 0.5))
    for replica, (mine, theirs) in enumerate(zip(local(our_var),
                                                 local(ref_var))):
      np.testing.assert_array_equal(
          mine.numpy(), theirs.numpy(),
          err_msg=f'{name} step {i}, replica {replica}: variable')
    _assert_same_optimizer_state(ours, reference, f'{name} step {i}', i + 1)


def test_fixed_loss_scale_never_skips():
  opt = experimental.LossScaleOptimizer(keras2.optimizers.legacy.SGD(1.0),
                                        4)
  var = tf.Variable([1.0])
  opt.apply_gradients([(tf.constant([INF]), var)])
  assert var.numpy().tolist() == [-INF]
  assert float(opt.loss_scale()) == 4.0 and int(opt.iterations) == 1


def _model():
  return keras2.Sequential([
      keras2.layers.Dense(1, use_bias=False, kernel_initializer='ones',
                            input_shape=(2,))
  ])


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_compile_under_mixed_float16_keeps_it_and_scales_the_loss_once(
    family):
  inner = (keras2.optimizers.legacy.SGD(0.1) if family == 'legacy' else
           keras2.optimizers.SGD(0.1))
  opt = experimental.LossScaleOptimizer(
      inner, tf_loss_scale.DynamicLossScale(initial_loss_scale=1024.0))
  keras2.mixed_precision.set_global_policy('mixed_float16')
  try:
    model = _model()
    model.compile(optimizer=opt, loss='mse')
    assert model.optimizer is opt
    x = np.array([[1.0, 2.0], [1.0, 1.0]], np.float32)
    y = np.array([[0.0], [INF]], np.float32)
    model.fit(x, y, batch_size=1, shuffle=False, verbose=0)
    evaluated = model.evaluate(x[:1], y[:1], verbose=0)
  finally:
    keras2.mixed_precision.set_global_policy('float32')
  # Batch 0: prediction 3, loss 9, gradient [6, 12]; SGD(0.1) once (a loss
  # scaled twice or not unscaled would move it by 1024 times as much).
  # Batch 1 overflows and is skipped, halving the scale and counting.
  np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(),
                             [0.4, -0.2], rtol=1e-3)
  assert float(opt.loss_scale()) == 512.0 and int(opt.iterations) == 2
  # The new weights predict 0.4 - 0.4 = 0: loss 0.
  assert evaluated == pytest.approx(0.0, abs=1e-3)


def _fit_save_load(path, optimizer, fmt):
  model = _model()
  model.compile(optimizer=optimizer, loss='mse')
  x = np.array([[1.0, 2.0], [1.0, 1.0]], np.float32)
  model.fit(x, np.array([[0.0], [0.5]], np.float32), batch_size=1,
            shuffle=False, verbose=0)
  model.save(path, save_format='tf' if fmt == 'tf' else None)
  return model, keras2.models.load_model(path)


@pytest.mark.parametrize('fmt', ['keras', 'h5', 'tf'])
@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_model_save_and_load_model_keep_the_optimizer(tmp_path, family, fmt):
  make = {'legacy': lambda: keras2.optimizers.legacy.Adam(0.01),
          'new': lambda: keras2.optimizers.Adam(0.01)}[family]
  name = 'model' if fmt == 'tf' else f'model.{fmt}'
  (tmp_path / 'ours').mkdir()
  (tmp_path / 'bare').mkdir()
  model, loaded = _fit_save_load(str(tmp_path / 'ours' / name),
                                 _ours(make(), 8.0, 1000), fmt)
  _, bare_loaded = _fit_save_load(str(tmp_path / 'bare' / name), make(), fmt)
  assert isinstance(loaded.optimizer, experimental.LossScaleOptimizer)
  assert type(loaded.optimizer) is type(model.optimizer)
  assert loaded.optimizer.get_config() == model.optimizer.get_config()
  np.testing.assert_array_equal(loaded.layers[0].kernel.numpy(),
                                model.layers[0].kernel.numpy())
  # The optimizer state comes back exactly as much as Keras 2 restores
  # for the bare optimizer in this format (legacy optimizers lose it in
  # .keras files; SavedModels restore it only once the slots exist).
  assert int(loaded.optimizer.iterations) == int(
      bare_loaded.optimizer.iterations)


_LOAD_IN_A_FRESH_PROCESS = '''
import json, sys
import keras_families
keras2 = keras_families.keras2()
from tf_loss_scale.keras import experimental
model = keras2.models.load_model(sys.argv[1])
print(json.dumps([type(model.optimizer).__name__,
                  type(model.optimizer.inner_optimizer).__name__,
                  int(model.optimizer.iterations.numpy()),
                  float(model.optimizer.loss_scale())]))
'''


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_hdf5_model_loads_in_a_fresh_process_that_imports_the_form(
    tmp_path, family):
  # Keras 2 finds the optimizer class by its registered name: importing
  # tf_loss_scale.keras.experimental registers it, before anything is
  # wrapped in that process.
  make = {'legacy': lambda: keras2.optimizers.legacy.Adam(0.01),
          'new': lambda: keras2.optimizers.Adam(0.01)}[family]
  path = str(tmp_path / 'model.h5')
  model, _ = _fit_save_load(path, _ours(make(), 8.0, 1000), 'h5')
  loaded = fresh_process.run_json(['-c', _LOAD_IN_A_FRESH_PROCESS, path],
                                  legacy_keras=keras_families.legacy_keras_env())
  assert loaded == [type(model.optimizer).__name__,
                    type(model.optimizer.inner_optimizer).__name__,
                    int(model.optimizer.iterations.numpy()), 8.0]


def test_tf1_graph_minimize_apply_gradients_and_get_updates():
  with tf.Graph().as_default():
    var = tf.compat.v1.Variable([1.0, 2.0], use_resource=True)
    bad = tf.compat.v1.placeholder(tf.bool, ())
    opt = _ours(keras2.optimizers.legacy.SGD(0.5, momentum=0.5), 8.0, 2)
    grad = tf.where(bad, tf.constant([INF, 1.0]), tf.constant([1.0, -1.0]))
    apply_op = opt.apply_gradients([(grad, var)])
    minimize_op = opt.minimize(lambda: tf.reduce_sum(var * grad), [var])
    updates = opt.get_updates(tf.reduce_sum(var * grad), [var])
    assert isinstance(apply_op, tf.Operation)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      expected = [
          # (op, bad, variable, momentum slot, scale, iterations)
          (apply_op, False, [0.5, 2.5], [-0.5, 0.5], 8.0, 1),
          (minimize_op, True, [0.5, 2.5], [-0.5, 0.5], 4.0, 2),
          (updates, False, [-0.25, 3.25], [-0.75, 0.75], 4.0, 3),
          (apply_op, False, [-1.125, 4.125], [-0.875, 0.875], 8.0, 4),
          (updates, True, [-1.125, 4.125], [-0.875, 0.875], 4.0, 5),
      ]
      slot = opt.get_slot(var, 'momentum')
      for i, (op, is_bad, value, momentum, scale, iterations) in enumerate(
          expected):
        sess.run(op, {bad: is_bad})
        np.testing.assert_allclose(sess.run(var), value,
                                   err_msg=f'step {i}: variable')
        np.testing.assert_allclose(sess.run(slot), momentum,
                                   err_msg=f'step {i}: momentum')
        assert sess.run(opt.loss_scale()) == scale, f'step {i}: scale'
        assert sess.run(opt.iterations) == iterations, f'step {i}: iterations'


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_mirrored_one_replica_overflowing_skips_everywhere(
    mirrored_strategy, family):
  with mirrored_strategy.scope():
    var = tf.Variable([1.0, 1.0])
    inner = (keras2.optimizers.legacy.SGD(1.0, momentum=0.5)
             if family == 'legacy' else keras2.optimizers.SGD(1.0,
                                                              momentum=0.5))
    opt = _ours(inner, 8.0, 1000)

  @tf.function
  def train(second_replica_grad):
    def replica_step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      grad = tf.where(replica == 0, tf.constant([1.0, 1.0]),
                      second_replica_grad)
      with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.reduce_sum(var * grad))
      grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
      opt.apply_gradients(zip(grads, [var]))
    mirrored_strategy.run(replica_step)

  train(tf.constant([INF, 1.0]))
  for i, local in enumerate(mirrored_strategy.experimental_local_results(var)):
    assert local.numpy().tolist() == [1.0, 1.0], f'replica {i} applied'
  assert float(opt.loss_scale()) == 4.0
  assert int(opt.iterations.numpy()) == 1
  train(tf.constant([3.0, 1.0]))
  # Summed gradient [4, 2]; momentum slot -[4, 2]; variable 1 - [4, 2].
  for i, local in enumerate(mirrored_strategy.experimental_local_results(var)):
    assert local.numpy().tolist() == [-3.0, -1.0], f'replica {i}'
  assert float(opt.loss_scale()) == 4.0
  assert int(opt.iterations.numpy()) == 2


@pytest.mark.parametrize('family', [
    'legacy', 'new',
    pytest.param('keras3', marks=versions.KERAS_SUMS_ACROSS_REPLICAS.mark)])
def test_float16_sum_overflowing_across_two_replicas_is_skipped(
    mirrored_strategy, family):
  # Each replica's float16 gradient (40000) is finite; their sum (80000) is
  # not. The verdict is taken on what is applied, the sum: skipped.
  keras = keras_families.keras3() if family == 'keras3' else keras2
  make = {'legacy': lambda: keras2.optimizers.legacy.SGD(1.0),
          'new': lambda: keras2.optimizers.SGD(1.0),
          'keras3': lambda: keras.optimizers.SGD(1.0)}[family]
  with mirrored_strategy.scope():
    var = tf.Variable([1.0, 1.0], dtype=tf.float16)
    opt = _ours(make(), 1.0, 1000)
    bare_var = tf.Variable([1.0, 1.0], dtype=tf.float16)
    bare = make()

  def step_function(optimizer, variable):
    # One function per optimizer: each creates its variables on its first
    # call.
    @tf.function
    def train(grad):
      def replica_step():
        optimizer.apply_gradients([(tf.cast(grad, tf.float16), variable)])
      mirrored_strategy.run(replica_step)
    return train

  train, train_bare = step_function(opt, var), step_function(bare, bare_var)
  train(tf.constant([40000.0, 1.0]))
  for i, local in enumerate(mirrored_strategy.experimental_local_results(var)):
    assert local.numpy().tolist() == [1.0, 1.0], f'replica {i} applied'
  assert int(opt.loss_scale.good_steps.numpy()) == 0
  assert int(tf_loss_scale.DynamicLossScale.skipped_steps.fget(
      opt.loss_scale).numpy()) == 1
  # A finite step is applied as the bare optimizer applies it: the summed
  # gradient [2, 2] (Keras 3.3 averages across replicas instead: [1, 1]).
  train(tf.constant([1.0, 1.0]))
  train_bare(tf.constant([1.0, 1.0]))
  expected = mirrored_strategy.experimental_local_results(bare_var)[0]
  if family != 'keras3':
    assert expected.numpy().tolist() == [-1.0, -1.0]
  for i, local in enumerate(mirrored_strategy.experimental_local_results(var)):
    assert local.numpy().tolist() == expected.numpy().tolist(), (
        f'replica {i}')


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_gradients_the_caller_summed_are_decided_on_as_they_are(
    mirrored_strategy, family):
  # Each replica gets the sum already made (a finite float16 40000) and the
  # optimizer is told not to sum it again: the verdict is about that
  # gradient, which Keras 2's class applies, and not about a sum of the
  # replicas' copies (80000) that nothing computes.
  make = {'legacy': lambda: keras2.optimizers.legacy.SGD(2.0**-10),
          'new': lambda: keras2.optimizers.SGD(2.0**-10)}[family]
  summed = ({'experimental_aggregate_gradients': False} if family == 'legacy'
            else {'skip_gradients_aggregation': True})
  with mirrored_strategy.scope():
    our_var = tf.Variable([1.0, 1.0], dtype=tf.float16)
    ref_var = tf.Variable([1.0, 1.0], dtype=tf.float16)
    ours = _ours(make(), 4.0, 1000)
    reference = keras2.mixed_precision.LossScaleOptimizer(
        make(), initial_scale=4.0, dynamic_growth_steps=1000)

  def step_function(opt, var):
    # One function per optimizer: each creates its variables on its first
    # call.
    @tf.function
    def train(grad):
      mirrored_strategy.run(lambda: opt.apply_gradients(
          [(tf.cast(grad, tf.float16), var)], **summed))
    return train

  our_step, ref_step = step_function(ours, our_var), step_function(
      reference, ref_var)
  local = mirrored_strategy.experimental_local_results
  # 1 - 40000 / 1024 and 1 - 1 / 1024, exact in float16; then an inf skips.
  for i, (grad, expected, scale) in enumerate((
      ([40000.0, 1.0], [-38.0625, 0.9990234375], 4.0),
      ([INF, 1.0], [-38.0625, 0.9990234375], 2.0))):
    our_step(tf.constant(grad))
    ref_step(tf.constant(grad))
    for replica, (mine, theirs) in enumerate(zip(local(our_var),
                                                 local(ref_var))):
      assert mine.numpy().tolist() == theirs.numpy().tolist() == expected, (
          f'step {i}, replica {replica}')
    _assert_same_optimizer_state(ours, reference, f'step {i}', i + 1)
    assert float(ours.loss_scale()) == scale, f'step {i}'
    if i == 0:
      assert tf_loss_scale.monitoring.last_skip(ours) is None
  report = tf_loss_scale.monitoring.last_skip(ours)
  assert (report.step, report.loss_scale, report.inf, report.nan) == (
      1, 4.0, (our_var.name,), ()), report


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_checkpoint_moves_between_wrapper_and_bare_inner(tmp_path, family):
  make = (lambda: keras2.optimizers.legacy.Adam(0.25)) if (
      family == 'legacy') else (lambda: keras2.optimizers.Adam(0.25))
  var = tf.Variable([1.0, 2.0])
  opt = _ours(make(), 8.0, 2)
  for grad in ([1.0, 1.0], [INF, 1.0], [0.5, -1.0]):
    opt.apply_gradients([(tf.constant(grad), var)])
  saved = tf.train.Checkpoint(var=var, optimizer=opt).save(
      str(tmp_path / 'wrapped'))

  bare_var = tf.Variable([0.0, 0.0])
  bare = make()
  bare.apply_gradients([(tf.constant([0.0, 0.0]), bare_var)])
  tf.train.Checkpoint(var=bare_var, optimizer=bare).restore(
      saved).assert_existing_objects_matched()
  assert int(bare.iterations) == 3
  for mine, theirs in zip(_inner_values(opt), [
      v.numpy() for v in (bare.variables() if callable(bare.variables) else
                          bare.variables)]):
    np.testing.assert_array_equal(mine, theirs, err_msg='wrapper -> bare')

  saved_bare = tf.train.Checkpoint(var=bare_var, optimizer=bare).save(
      str(tmp_path / 'bare'))
  back_var = tf.Variable([0.0, 0.0])
  back = _ours(make(), 16.0, 2)
  back.apply_gradients([(tf.constant([0.0, 0.0]), back_var)])
  tf.train.Checkpoint(var=back_var, optimizer=back).restore(
      saved_bare).assert_nontrivial_match()
  assert int(back.iterations) == 3
  assert float(back.loss_scale()) == 16.0  # not in the bare checkpoint
  for mine, theirs in zip(_inner_values(back), _inner_values(opt)):
    np.testing.assert_array_equal(mine, theirs, err_msg='bare -> wrapper')


def test_checkpoint_interchanges_with_keras2_loss_scale_optimizer(tmp_path):
  # Keras 2's own wrapper of legacy optimizers kept TF 2.3's format too.
  var = tf.Variable([1.0, 2.0])
  theirs = keras2.mixed_precision.LossScaleOptimizer(
      keras2.optimizers.legacy.SGD(0.5, momentum=0.5), initial_scale=8.0,
      dynamic_growth_steps=2)
  for grad in ([1.0, 1.0], [INF, 1.0], [0.5, -1.0]):
    theirs.apply_gradients([(tf.constant(grad), var)])
  saved = tf.train.Checkpoint(var=var, optimizer=theirs).save(
      str(tmp_path / 'theirs'))
  our_var = tf.Variable([0.0, 0.0])
  ours = _ours(keras2.optimizers.legacy.SGD(0.5, momentum=0.5), 1.0, 2)
  # The slots do not exist yet: they are restored when the first step
  # creates them (TF 2.3's deferred slot restoration).
  tf.train.Checkpoint(var=our_var, optimizer=ours).restore(
      saved).assert_existing_objects_matched()
  assert our_var.numpy().tolist() == var.numpy().tolist()
  # Scale 8, halved by the skip, then one good step of the two to grow.
  assert float(ours.loss_scale()) == 4.0
  assert int(ours.loss_scale.good_steps.numpy()) == 1
  assert int(ours.iterations) == 3
  ours.apply_gradients([(tf.constant([0.0, 0.0]), our_var)])
  np.testing.assert_array_equal(ours.get_slot(our_var, 'momentum').numpy(),
                                theirs.get_slot(var, 'momentum').numpy() * 0.5)
  assert float(ours.loss_scale()) == 8.0


def test_hyperparameters_read_and_write_the_inner_optimizers():
  inner = keras2.optimizers.legacy.Adam(learning_rate=1.0, beta_1=0.5)
  inner.my_attribute = 123
  opt = experimental.LossScaleOptimizer(inner, 'dynamic')
  assert float(opt.beta_1) == 0.5
  opt.beta_1 = 0.25
  assert float(inner.beta_1) == 0.25
  assert opt.epsilon == inner.epsilon
  opt.lr = 2.0
  assert float(inner.learning_rate) == 2.0
  with pytest.raises(AttributeError, match="no attribute 'my_attribute'"):
    _ = opt.my_attribute
  with pytest.raises(AttributeError):
    opt.not_an_attr += 3


_BFLOAT16_SCRIPT = '''
import warnings
import keras_families
from tf_loss_scale.keras import experimental
keras = keras_families.{family}()
keras.mixed_precision.set_global_policy('mixed_bfloat16')
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter('always')
  experimental.LossScaleOptimizer(keras.optimizers.{optimizer}, 'dynamic')
  experimental.LossScaleOptimizer(keras.optimizers.{optimizer}, 'dynamic')
print(sum('bfloat16' in str(w.message) for w in caught))
'''


@pytest.mark.parametrize('family,optimizer', [
    ('keras3', 'SGD()'),
    # Both Keras 2 classes warn from the constructor they share.
    ('keras2', 'legacy.SGD()'),
    ('keras2', 'SGD()'),
])
def test_wrapping_under_mixed_bfloat16_warns_once(family, optimizer):
  if family == 'keras3' and keras_families.keras3_or_none() is None:
    pytest.skip(keras_families.KERAS3_ABSENT)
  # A fresh process: the policy is global, and the warning once per process.
  result = fresh_process.run(
      ['-c', _BFLOAT16_SCRIPT.format(family=family, optimizer=optimizer)],
      legacy_keras=keras_families.legacy_keras_env())
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split()[-1] == '1', result.stdout


@pytest.mark.parametrize('family', ['legacy', 'new'])
def test_no_reduction_beyond_the_bare_optimizers(mirrored_strategy, family):
  # The verdict is taken on the sums the inner optimizer applies, so a step
  # launches exactly the cross-replica reductions of a bare step.
  make = {'legacy': lambda: keras2.optimizers.legacy.SGD(1.0),
          'new': lambda: keras2.optimizers.SGD(1.0)}[family]
  extended = type(mirrored_strategy.extended)

  def reductions_in_one_step(wrap):
    with mirrored_strategy.scope():
      var = tf.Variable([1.0, 2.0])
      opt = _ours(make()) if wrap else make()
    calls = []

    def replica_step():
      opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])

    step = tf.function(lambda: mirrored_strategy.run(replica_step))
    originals = {name: getattr(extended, name)
                 for name in ('reduce_to', 'batch_reduce_to')}

    def counting(name):
      def wrapper(*args, **kwargs):
        calls.append(name)
        return originals[name](*args, **kwargs)
      return wrapper

    try:
      for name in originals:
        setattr(extended, name, counting(name))
      step.get_concrete_function()
    finally:
      for name, original in originals.items():
        setattr(extended, name, original)
    return calls

  bare = reductions_in_one_step(wrap=False)
  ours = reductions_in_one_step(wrap=True)
  assert bare, 'the bare optimizer launched no reduction: nothing counted'
  assert ours == bare, f'ours {ours}, bare {bare}'
