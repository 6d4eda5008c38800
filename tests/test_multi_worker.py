"""Loss scaling across processes on 127.0.0.1.

MultiWorkerMirroredStrategy with two and with three worker processes, for
every front end (`tests/workers/multi_worker_training.py` trains them one
after another in each process): the v1 optimizer inside `strategy.run` in a
`tf.function`, the experimental Keras wrapper in a TF 2.3-style custom loop,
TF 2.4-2.15's form in its custom loop (built in the first step), and the
Keras 3 form in a custom loop; the Keras 3 form in `model.fit` on
one worker with two replicas (Keras 3's `model.fit` itself fails under
MultiWorkerMirroredStrategy: keras-team/keras#20585). In step 2 one
replica's input overflows. The forms share one step, so TF 2.4-2.15's form
is also compared with references that do not use it: the same training on
one machine over the global batch, computed by hand in NumPy and by Keras's
own class. Also: the refusal of ParameterServerStrategy.
"""

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import local_cluster

_WORKER = os.path.join(os.path.dirname(__file__), 'workers',
                       'multi_worker_training.py')
_TOY = os.path.join(os.path.dirname(__file__), 'workers', 'toy_training.py')
_ROWS = 2  # per replica per step, as in the worker script
_PARAMETER_SERVER = os.path.join(os.path.dirname(__file__), 'workers',
                                 'parameter_server_refusal.py')
_FRONT_ENDS = ('v1', 'experimental', 'mixed_precision', 'keras')
_STEPS = 5
_OVERFLOW_STEP = 2
_TIMEOUT = 480  # all layouts together; a hang is what it bounds

# layout -> (workers, replicas per worker, global replica that overflows,
# front ends).
_LAYOUTS = {
    '2 workers': (2, 1, 1, _FRONT_ENDS),
    '3 workers': (3, 1, 2, _FRONT_ENDS),
    '1 worker x 2 replicas': (1, 2, 1, _FRONT_ENDS + ('keras_fit',)),
}

# DynamicLossScale(initial_loss_scale=16, increment_period=2), step by step:
# two finite steps double it, the overflow in step 2 halves it.
_SCALES = [16.0, 32.0, 16.0, 16.0, 32.0]
_GOOD_STEPS = [1, 0, 0, 1, 0]
# The step counters after 5 steps, one of them skipped: TF1's global_step and
# Keras 3's iterations count applied steps; TF 2.3's and TF 2.4-2.15's
# count every step, skipped ones too.
_STEP_COUNTERS = {'v1': ('global_step', 4),
                  'experimental': ('iterations', 5),
                  'mixed_precision': ('iterations', 5),
                  'keras': ('iterations', 4),
                  'keras_fit': ('iterations', 4)}


def _run_layout(layout):
  """Trains every front end in `layout`: one result dict per worker."""
  workers, local_replicas, overflow_replica, front_ends = _LAYOUTS[layout]
  ports = local_cluster.free_ports(workers) if workers > 1 else []

  def command_of(index):
    config = {'ports': ports, 'index': index, 'local_replicas': local_replicas,
              'steps': _STEPS, 'overflow': [_OVERFLOW_STEP, overflow_replica],
              'front_ends': list(front_ends)}
    return [sys.executable, _WORKER, json.dumps(config)]

  outputs = local_cluster.run_workers(command_of, workers, _TIMEOUT)
  results = []
  for output in outputs:
    records = [json.loads(l) for l in output.splitlines() if l.startswith('{')]
    results.append({r['front_end']: r for r in records})
  return results


@pytest.fixture(scope='module')
def runs():
  """Every layout's results, the layouts trained at the same time."""
  with concurrent.futures.ThreadPoolExecutor(len(_LAYOUTS)) as pool:
    futures = {layout: pool.submit(_run_layout, layout) for layout in _LAYOUTS}
    return {layout: future.result() for layout, future in futures.items()}


def _assert_skipped_only_the_overflow(result, front_end, where):
  steps = result['steps']
  assert [s['scale'] for s in steps] == _SCALES, where
  assert [s['good_steps'] for s in steps] == _GOOD_STEPS, where
  for step in range(1, _STEPS):
    unchanged = steps[step]['weights'] == steps[step - 1]['weights']
    assert unchanged == (step == _OVERFLOW_STEP), (
        f'{where}: step {step} {"skipped" if unchanged else "applied"}')
  counter, value = _STEP_COUNTERS[front_end]
  values = {c['value'] for c in result['final'][counter]}
  assert values == {value}, f'{where}: {counter} is {values}, not {value}'


def _assert_same_final_state(expected, actual, who):
  """Every value of `actual` equals `expected`'s bit for bit."""
  assert sorted(actual) == sorted(expected), f'{who}: other variables'
  for name, copies in actual.items():
    reference = expected[name][0]
    for replica, copy in enumerate(copies):
      assert copy['hex'] == reference['hex'], (
          f'{who}, replica {replica}: {name} is {copy["value"]}, expected '
          f'{reference["value"]} (bit for bit)')


@pytest.mark.slow
@pytest.mark.parametrize('front_end', _FRONT_ENDS)
@pytest.mark.parametrize('layout', ['2 workers', '3 workers'])
def test_one_workers_overflow_makes_every_worker_skip_and_agree(
    runs, layout, front_end):
  results = [worker[front_end] for worker in runs[layout]]
  overflowing = _LAYOUTS[layout][2]
  for index, result in enumerate(results):
    _assert_skipped_only_the_overflow(
        result, front_end,
        f'{front_end}, worker {index} of {layout} (replica {overflowing} '
        f'overflows in step {_OVERFLOW_STEP})')
    _assert_same_final_state(results[0]['final'], result['final'],
                             f'{front_end}: worker {index} against worker 0')


@pytest.mark.slow
@pytest.mark.parametrize('front_end', _FRONT_ENDS)
def test_two_replicas_end_alike_on_one_worker_or_two(runs, front_end):
  # Each replica computes the same gradients in either layout, and a sum of
  # two values does not depend on its order, so the states match bit for bit.
  (one_worker,) = runs['1 worker x 2 replicas']
  result = one_worker[front_end]
  _assert_skipped_only_the_overflow(result, front_end,
                                    f'{front_end}, 1 worker x 2 replicas')
  _assert_same_final_state(
      runs['2 workers'][0][front_end]['final'], result['final'],
      f'{front_end}: 1 worker x 2 replicas against 2 workers x 1 replica')


@pytest.mark.slow
@pytest.mark.parametrize('other', ['keras', 'experimental'])
@pytest.mark.parametrize('layout', list(_LAYOUTS))
def test_tf_24s_form_trains_as_the_other_keras_forms(runs, layout, other):
  # The same gradients, divided once by the same scale (in
  # get_unscaled_gradients, or in apply), summed the same way: the same
  # weights after every step, bit for bit. (The counters' dtypes and copies
  # differ; every copy equals the first, as other tests check.)
  for index, worker in enumerate(runs[layout]):
    ours, theirs = worker['mixed_precision'], worker[other]
    assert ours['steps'] == theirs['steps'], f'worker {index} of {layout}'
    for name in ('kernel', 'bias', 'loss_scale', 'good_steps'):
      assert (ours['final'][name][0]['value'] ==
              theirs['final'][name][0]['value']), (
                  f'{name} on worker {index} of {layout}')


def _toy():
  """tests/workers/toy_training.py: the workers' model and data."""
  spec = importlib.util.spec_from_file_location('toy_training', _TOY)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _global_batches(toy, layout):
  """Each step's rows of every replica of `layout`, as one batch."""
  workers, local_replicas, overflow_replica, _ = _LAYOUTS[layout]
  replicas = workers * local_replicas
  x, y = toy.data(_STEPS, replicas, _ROWS, [_OVERFLOW_STEP, overflow_replica])
  return [(x[step].reshape(-1, 3), y[step].reshape(-1, 2))
          for step in range(_STEPS)]


def _by_hand(toy, layout):
  """The run on one machine, in NumPy float32: [(weights, scale, good)].

  Mean squared error over the global batch; its scaled gradient is checked
  for overflow; momentum SGD as Keras writes it (m = momentum * m - lr * g,
  w += m) on finite steps; the scale doubles after 2 finite steps in a row
  and halves on a skipped one.
  """
  kernel = np.array(toy.KERNEL, np.float32)
  bias = np.array(toy.BIAS, np.float32)
  kernel_m, bias_m = np.zeros_like(kernel), np.zeros_like(bias)
  scale, good, trajectory = np.float32(16.0), 0, []
  for x, y in _global_batches(toy, layout):
    with np.errstate(all='ignore'):
      error = x @ kernel + bias - y
      factor = np.float32(2.0) * scale / np.float32(error.size)
      scaled = [factor * (x.T @ error), factor * error.sum(axis=0)]
    if all(np.isfinite(g).all() for g in scaled):
      kernel_g, bias_g = (g / scale for g in scaled)
      kernel_m = np.float32(toy.MOMENTUM) * kernel_m - np.float32(
          toy.LEARNING_RATE) * kernel_g
      bias_m = np.float32(toy.MOMENTUM) * bias_m - np.float32(
          toy.LEARNING_RATE) * bias_g
      kernel, bias = kernel + kernel_m, bias + bias_m
      good += 1
      if good == 2:
        scale, good = scale * 2, 0
    else:
      scale, good = scale / 2, 0
    trajectory.append((np.concatenate([kernel.ravel(), bias]), float(scale),
                       good))
  return trajectory


def _keras_on_one_machine(toy, layout):
  """Keras's own LossScaleOptimizer on the global batches, no strategy."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  kernel, bias = keras.Variable(toy.KERNEL), keras.Variable(toy.BIAS)
  optimizer = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(toy.LEARNING_RATE, momentum=toy.MOMENTUM),
      initial_scale=16.0, dynamic_growth_steps=2)
  optimizer.build([kernel, bias])
  trajectory = []
  for x, y in _global_batches(toy, layout):
    with tf.GradientTape() as tape:
      loss = toy.squared_error(kernel, bias, tf.constant(x), tf.constant(y),
                               float(y.size))
      scaled_loss = optimizer.scale_loss(loss)
    optimizer.apply(tape.gradient(scaled_loss, [kernel, bias]),
                    [kernel, bias])
    trajectory.append((
        np.concatenate([np.ravel(kernel.numpy()), bias.numpy()]),
        float(optimizer.dynamic_scale.numpy()),
        int(optimizer.step_counter.numpy())))
  return trajectory


@pytest.mark.slow
@pytest.mark.parametrize('layout', list(_LAYOUTS))
def test_tf_24s_form_trains_as_one_machine_on_the_global_batch(runs, layout):
  # Independent of the library's step: weights computed by hand, and by
  # Keras's own class without a strategy, on each step's rows of every
  # replica together. Sums in another order: equal to float32 rounding.
  toy = _toy()
  references = {'by hand': _by_hand(toy, layout),
                "Keras's class": _keras_on_one_machine(toy, layout)}
  assert [s for _, s, _ in references['by hand']] == _SCALES
  for index, worker in enumerate(runs[layout]):
    steps = worker['mixed_precision']['steps']
    for who, reference in references.items():
      assert [(s['scale'], s['good_steps']) for s in steps] == [
          (s, g) for _, s, g in reference], (who, index, layout)
      for step, (record, (weights, _, _)) in enumerate(zip(steps,
                                                           reference)):
        np.testing.assert_allclose(
            np.frombuffer(bytes.fromhex(record['weights']), np.float32),
            weights, rtol=1e-6, atol=1e-7,
            err_msg=f'{who}, step {step}, worker {index} of {layout}')


@pytest.mark.slow
@pytest.mark.parametrize('layout', list(_LAYOUTS))
def test_every_worker_reports_the_same_skipped_step(runs, layout):
  # In step 2 one replica's inputs are 1e30 times larger: the kernel's
  # gradient (inputs times errors, both near 1e30) is not finite there, the
  # bias's (errors only) is. Computed at the scale of after step 1.
  for front_end in _LAYOUTS[layout][3]:
    reports = [worker[front_end]['skip_report'] for worker in runs[layout]]
    where = f'{front_end} on {layout}'
    assert all(r == reports[0] for r in reports), f'{where}: {reports}'
    report = reports[0]
    assert (report['step'], report['loss_scale']) == (
        _OVERFLOW_STEP, _SCALES[_OVERFLOW_STEP - 1]), f'{where}: {report}'
    assert 'kernel' in report['nan'] + report['inf'], f'{where}: {report}'
    assert 'bias' not in report['nan'] + report['inf'], f'{where}: {report}'
    assert report['cause'] == ('nan' if report['nan'] else 'overflow'), where


@pytest.mark.slow
def test_model_fit_skips_like_the_custom_loop_on_two_replicas(runs):
  (one_worker,) = runs['1 worker x 2 replicas']
  fit = one_worker['keras_fit']
  _assert_skipped_only_the_overflow(fit, 'keras_fit',
                                    'keras_fit, 1 worker x 2 replicas')
  _assert_same_final_state(fit['final'], fit['final'],
                           'keras_fit: replica copies')
  # Keras's mean squared error divides by the outputs, the rows and the
  # replicas one after another, the custom loop once by their product: the
  # losses may differ in the last bit, so the states agree to float32
  # rounding, not bit for bit.
  loop = one_worker['keras']['final']
  for name in ('kernel', 'bias'):
    np.testing.assert_allclose(
        fit['final'][f'model/sequential/dense/{name}'][0]['value'],
        loop[name][0]['value'], rtol=1e-6, atol=1e-7,
        err_msg=f'model.fit against the custom loop: {name}')


def test_parameter_server_strategy_is_refused_at_construction_and_apply():
  result = subprocess.run([sys.executable, _PARAMETER_SERVER],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=''))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if ': ' in l]
  attempts = [l.split(': ')[0] for l in lines]
  assert attempts == ['keras construction', 'keras apply',
                      'experimental construction', 'experimental apply']
  for line in lines:
    assert 'ValueError: ' in line, line
    # TF 2.3's first words, then why and what works.
    assert ('Loss scaling is not supported with the tf.distribute.Strategy: '
            'ParameterServerStrategy' in line), line
    assert 'MirroredStrategy, MultiWorkerMirroredStrategy' in line, line
