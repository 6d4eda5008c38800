"""The Keras 3 form across the Keras 3 releases of TensorFlow 2.16 to 2.21.

Keras's own `LossScaleOptimizer` changed between Keras 3.3.3 (TensorFlow
2.16's) and 3.15: `iterations` (3.9), the inner `loss_scale_factor` (3.10),
base optimizer arguments, config and build (3.12). Ours follows the
installed Keras where the two can be told apart only by what they store or
report, and differs on purpose where the older class dropped a user's
setting without a word. A Keras 3 older than 3.3.3 is refused at import.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fresh_process
import keras_release_smoke
import versions

INF = float('inf')

_KERAS_3 = versions.KERAS_3.mark


def _count(variable):
  # Keras 3.3's variables have no __int__.
  return int(np.asarray(variable.numpy()))


@_KERAS_3
def test_iterations_follow_the_installed_keras_class():
  # Before Keras 3.9 the class's own counter, which never advances; from 3.9
  # the inner optimizer's, which counts applied steps only.
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  counts = []
  for make in (LossScaleOptimizer, keras.optimizers.LossScaleOptimizer):
    opt = make(keras.optimizers.SGD(0.25), initial_scale=4.0)
    var = keras.Variable([1.0])
    for grad in (4.0, INF, 4.0):
      opt.apply([tf.constant([grad])], [var])
    counts.append((_count(opt.iterations),
                   _count(opt.inner_optimizer.iterations)))
  expected = 2 if versions.keras_at_least(3, 9) else 0
  assert counts == [(expected, 2), (expected, 2)], f'(ours, Keras): {counts}'


@_KERAS_3
def test_a_base_optimizer_argument_is_refused_where_keras_ignored_it():
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='set `clipnorm` on the'):
    LossScaleOptimizer(keras.optimizers.SGD(1.0), clipnorm=1e-3)
  if versions.keras_at_least(3, 12):
    return
  # Keras's class before 3.12 took it and never clipped.
  theirs = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(1.0), initial_scale=1.0, clipnorm=1e-3)
  var = keras.Variable([0.0])
  theirs.apply([tf.constant([3.0])], [var])
  assert var.numpy().tolist() == [-3.0]


@_KERAS_3
def test_config_of_a_keras_3_3_file_loads():
  # What Keras 3.3's class writes: its own arguments and the base
  # optimizer's at their defaults.
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  config = {
      'name': 'loss_scale_optimizer', 'weight_decay': None, 'clipnorm': None,
      'global_clipnorm': None, 'clipvalue': None, 'use_ema': False,
      'ema_momentum': 0.99, 'ema_overwrite_frequency': None,
      'loss_scale_factor': None, 'gradient_accumulation_steps': None,
      'inner_optimizer': {
          'module': 'keras.optimizers', 'class_name': 'SGD',
          'config': {'name': 'SGD', 'learning_rate': 0.5, 'momentum': 0.0,
                     'nesterov': False},
          'registered_name': None},
      'initial_scale': 64.0, 'dynamic_growth_steps': 7}
  opt = LossScaleOptimizer.from_config(config)
  assert (opt.name, opt.initial_scale, opt.dynamic_growth_steps) == (
      'loss_scale_optimizer', 64.0, 7)
  assert float(np.asarray(opt.inner_optimizer.learning_rate.numpy())) == 0.5


def _import_error(setup, statement):
  """The ImportError message of `statement`, run in a fresh process."""
  result = fresh_process.run(['-c', '\n'.join(
      ['import json'] + setup +
      ['try:', f'  {statement}', 'except ImportError as error:',
       '  print(json.dumps(str(error)))'])])
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout.strip().splitlines()[-1])


@_KERAS_3
def test_a_keras_3_older_than_the_oldest_supported_is_refused():
  message = _import_error(['import keras', "keras.__version__ = '3.2.1'"],
                          'from tf_loss_scale.keras import LossScaleOptimizer')
  for part in ('Keras 3.2.1 is installed', '3.3.3', '3.15.1',
               "pip install 'keras>=3.3.3'"):
    assert part in message, message


@versions.Condition(not versions.KERAS_3,
                    'needs Keras 2 as `keras` (TensorFlow 2.15 and '
                    'earlier)').mark
def test_the_keras_3_form_on_keras_2_names_the_form_that_works():
  message = _import_error([], 'import tf_loss_scale.keras.keras3')
  assert 'tf_loss_scale.keras.experimental.LossScaleOptimizer' in message
  assert f'Keras {keras.__version__} is installed' in message


@versions.Condition(
    bool(versions.KERAS_3) and versions.KERAS < (3, 5),
    'Keras 3.5 and later sum gradients across replicas, and the Keras 3 '
    f'forms run there (keras {keras.__version__})').mark
def test_several_replicas_are_refused_where_keras_does_not_sum_them(
    mirrored_strategy):
  # Keras 3.3.3's own classes let each replica apply its own gradients: the
  # replicas' copies of a variable come apart.
  from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top
  with mirrored_strategy.scope():
    var = keras.Variable([1.0, 2.0])
    bare = keras.optimizers.SGD(1.0)
    bare.build([var])
  mirrored_strategy.run(lambda: bare.apply(
      [tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
               tf.float32) * tf.ones(2)], [var]))
  copies = [v.numpy().tolist() for v in
            mirrored_strategy.experimental_local_results(var.value)]
  assert copies == [[1.0, 2.0], [0.0, 1.0]], copies

  with mirrored_strategy.scope():
    for make in (
        lambda: tls_keras.LossScaleOptimizer(keras.optimizers.SGD()),
        lambda: tls_keras.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), 'dynamic')):
      with pytest.raises(ValueError, match=(
          r"do not sum gradients across replicas under MirroredStrategy.*"
          r"pip install 'keras>=3.5'")):
        make()


@versions.Condition(
    bool(versions.KERAS_3) and not versions.LEGACY_KERAS_REQUESTED,
    'needs Keras 3, run without TF_USE_LEGACY_KERAS (its child imports '
    'Keras 3 either way: the run without it covers it)').mark
def test_smoke_checks_of_the_installed_keras_release():
  # .ci/run's keras-releases step runs the same script on every Keras 3
  # minor release; here, on the suite's own Keras.
  result = fresh_process.run([os.path.join(os.path.dirname(
      os.path.abspath(__file__)), 'keras_release_smoke.py')])
  summary = f'{result.stdout}\n{result.stderr[-3000:]}'
  assert result.returncode == 0, summary
  checks = len(keras_release_smoke.CHECKS)
  assert f'{checks} passed, 0 failed' in result.stdout, summary
