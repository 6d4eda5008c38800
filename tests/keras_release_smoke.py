"""Smoke checks of the Keras 3 forms on whichever Keras 3 is installed.

`python tests/keras_release_smoke.py` runs, in this one process (TensorFlow
imports slowly), the checks below on the installed Keras; .ci/run's
`keras-releases` step runs it once per Keras 3 minor release over the
README's TensorFlow (.ci/keras_releases.py), and tests/
test_keras_releases.py runs it on the suite's own Keras. Each check
restores what it changes (install(), the dtype policy). It prints one line
per check, `PASSED name` or `FAILED name: what differed`, then
`N passed, N failed`, and exits 1 if any failed, or if
TF_LOSS_SCALE_EXPECTED_KERAS names another version than the Keras it
imported (.ci/keras_releases.py sets it to the release asked for). A
Keras that cannot import, or fit a model, on the installed TensorFlow
without this library (a Keras too old or too new for it) is no platform:
the script prints `SKIPPED: why` and exits 2 (which .ci/keras_releases.py
accepts only where docs/testing.md lists that platform limit).

  fit            compile/fit under mixed_float16 with install() (which makes
                 its TF 2.4-2.15 class) against the same program without it
                 (Keras's class): loss, weights, scale and counts per step,
                 through a step that overflows.
  keras3_loop    a Keras 3 custom loop (`scale_loss`, a tape,
                 `apply_gradients` and `apply`) under
                 `keras.mixed_precision.LossScaleOptimizer` after install(),
                 against Keras's class without it, step by step; then both
                 classes' variables, config and aggregations.
  tf2_loop       a TF 2.4-2.15 loop (`get_scaled_loss`,
                 `get_unscaled_gradients`, `apply_gradients`) under
                 install()'s class, against values worked out by hand.
  checkpoint     a checkpoint written by Keras's class read by install()'s
                 and one written by install()'s read by Keras's; a `.keras`
                 file of a model fitted under mixed_float16 alike.
  drop_in        `tf_loss_scale.keras.LossScaleOptimizer` against Keras's
                 class in the Keras 3 loop and in compile/fit.
  inner_features the Keras 3 loop with an inner `loss_scale_factor` and
                 gradient accumulation, both classes against Keras's.
  replicas       two replicas under MirroredStrategy, both classes against
                 Keras's (before Keras 3.5, both refuse them).
"""

import contextlib
import os
import re
import sys
import tempfile
import traceback
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

import tf_loss_scale.compat

keras = None  # Imported by `main`, which reports a Keras that cannot load.

INF = float('inf')


def _value(x: Any) -> Any:
  return np.asarray(tf.convert_to_tensor(x)).tolist()


@contextlib.contextmanager
def _installed():
  tf_loss_scale.compat.install()
  try:
    yield
  finally:
    tf_loss_scale.compat.uninstall()


@contextlib.contextmanager
def _policy(name: str):
  previous = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(name)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy(previous)


def _state(opt: Any) -> Dict[str, Any]:
  """What a Keras 3 program reads of a loss scale optimizer after a step."""
  return {'scale': _value(opt.dynamic_scale),
          'iterations': _value(opt.iterations),
          'inner iterations': _value(opt.inner_optimizer.iterations)}


def _first_difference(label: str, expected: List[Any],
                      got: List[Any]) -> None:
  """Raises AssertionError naming the first step whose values differ."""
  for step, (want, have) in enumerate(zip(expected, got)):
    if want != have:
      raise AssertionError(f'{label}, step {step}: expected {want}, got {have}')
  if len(expected) != len(got):
    raise AssertionError(f'{label}: {len(expected)} steps expected, '
                         f'{len(got)} recorded')


# Per-sample inputs of the fit: the first overflows in float16 at the
# initial scale (its gradient, 2 * 300 * 1.5 * 2**15, is past float16's
# 65504), the rest do not at half of it.
_X = np.array([[300.0], [0.5], [1.0], [0.25], [0.5]], np.float32)
_Y = np.array([[0.0], [1.0], [0.5], [1.0], [0.0]], np.float32)


def _fit_trajectory(make_optimizer: Optional[Callable[[], Any]] = None,
                    **compile_arguments: Any) -> Dict[str, Any]:
  """Fits a one-weight model under mixed_float16, one sample a step.

  `compile` is Keras's default but for `compile_arguments` (its default
  `jit_compile` is XLA's on TensorFlow).

  Returns the optimizer's class and the steps: the scale before the first,
  then what each step left.
  """
  with _policy('mixed_float16'):
    model = keras.Sequential([
        keras.Input((1,)),
        keras.layers.Dense(1, use_bias=False,
                           kernel_initializer=keras.initializers.Constant(1.5))])
    optimizer = (keras.optimizers.SGD(0.125) if make_optimizer is None
                 else make_optimizer())
    model.compile(optimizer=optimizer, loss='mse', **compile_arguments)
    steps = []

    class Record(keras.callbacks.Callback):

      def on_train_begin(self, logs=None):
        del logs  # Unused.
        # Built in the first step: its argument, then.
        steps.append({'scale': float(self.model.optimizer.initial_scale)})

      def on_train_batch_end(self, batch, logs=None):
        del batch  # Unused.
        steps.append(dict(_state(self.model.optimizer),
                          loss=float(logs['loss']),
                          kernel=_value(self.model.layers[0].kernel)))

    model.fit(_X, _Y, batch_size=1, epochs=1, shuffle=False, verbose=0,
              callbacks=[Record()])
  return {'class': type(model.optimizer), 'steps': steps}


def _check_scale_moved(steps: List[Dict[str, Any]]) -> None:
  scales = [step['scale'] for step in steps]
  if len(set(scales)) < 2:
    raise AssertionError(f'the scale never moved: {scales} (the overflow '
                         'step did not overflow)')


def check_fit() -> None:
  theirs = _fit_trajectory()
  _check_scale_moved(theirs['steps'])
  with _installed():
    from tf_loss_scale.keras.mixed_precision import shared_name  # pylint: disable=g-import-not-at-top
    ours = _fit_trajectory()
  if ours['class'] is not shared_name.LossScaleOptimizer:
    raise AssertionError(f'compile made {ours["class"]} under install(), not '
                         'tf_loss_scale.keras.mixed_precision.shared_name.'
                         'LossScaleOptimizer')
  _first_difference('fit (Keras\'s class, install()\'s)', theirs['steps'],
                    ours['steps'])
  # The class passed to compile by its mixed_precision name: compile must
  # keep it (not wrap it once more).
  def given():
    return keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.125))
  theirs = _fit_trajectory(given, jit_compile=False)
  with _installed():
    ours = _fit_trajectory(given, jit_compile=False)
  if ours['class'] is not shared_name.LossScaleOptimizer:
    raise AssertionError(f'compile given install()\'s class has {ours["class"]}')
  _first_difference('fit given keras.mixed_precision.LossScaleOptimizer '
                    '(Keras\'s class, install()\'s)', theirs['steps'],
                    ours['steps'])


def _keras3_loop(opt: Any) -> Dict[str, Any]:
  """A Keras 3 loop: scale_loss, a tape, then apply_gradients or apply."""
  var = keras.Variable([2.0, -1.0], name='w')
  steps = []
  # Step 1's loss overflows in float16 once scaled; at growth steps of 2
  # the scale doubles after two finite steps in a row.
  for step, factor in enumerate([1.0, 1.0, 4000.0, 1.0, 1.0, 1.0]):
    with tf.GradientTape() as tape:
      half = tf.cast(var.value, tf.float16) * tf.constant(factor, tf.float16)
      loss = tf.reduce_sum(tf.cast(half * half, tf.float32))
      scaled = opt.scale_loss(loss)
      # The gradient flows through float16: inf when it overflows there.
    grads = tape.gradient(scaled, [var.value])
    if step % 2:
      opt.apply(grads, [var])
    else:
      opt.apply_gradients(zip(grads, [var]))
    steps.append(dict(_state(opt), w=_value(var)))
  return {'steps': steps, 'variables': [
      (v.name, tuple(v.shape),
       str(v.dtype), str(getattr(v, 'aggregation', None)),
       # TensorFlow's variable's, which follows Keras's from Keras 3.7.
       str(getattr(getattr(v, 'value', None), 'aggregation', None)),
       _value(v))
      for v in opt.variables],
          'config': _without_name(opt.get_config())}


def _without_name(config: Any) -> Any:
  """A config without its names, which count the instances made."""
  if not isinstance(config, dict):
    return config
  return {k: _without_name(v) for k, v in config.items() if k != 'name'}


def _keras3_arguments() -> Dict[str, Any]:
  return dict(initial_scale=1024.0, dynamic_growth_steps=2)


def _compare_keras3(theirs: Dict[str, Any], ours: Dict[str, Any],
                    label: str) -> None:
  _check_scale_moved(theirs['steps'])
  _first_difference(label, theirs['steps'], ours['steps'])
  if theirs['variables'] != ours['variables']:
    raise AssertionError(f'{label}: variables (name, shape, dtype, '
                         f'aggregations, value) {theirs["variables"]} != '
                         f'{ours["variables"]}')
  if theirs['config'] != ours['config']:
    raise AssertionError(f'{label}: config {theirs["config"]} != '
                         f'{ours["config"]}')


def check_keras3_loop() -> None:
  theirs = _keras3_loop(keras.mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.125, momentum=0.5), **_keras3_arguments()))
  with _installed():
    ours = _keras3_loop(keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.125, momentum=0.5), **_keras3_arguments()))
  _compare_keras3(theirs, ours, 'Keras 3 loop (Keras\'s class, install()\'s)')


def check_tf2_loop() -> None:
  # SGD at 0.5 on 0.5 * w**2 (gradient w) from w = 2, the scale 8 and
  # doubling after 2 finite steps; step 1's loss is multiplied by inf.
  # By hand: w 2 -> 1 (scale 8, 1 good step), skipped (scale 4, 0),
  # 1 -> 0.5 (4, 1), 0.5 -> 0.25 (doubles to 8, 0), 0.25 -> 0.125 (8, 1).
  # As TF 2.4-2.15's class, `iterations` counts the skipped step too.
  expected = [
      {'w': 1.0, 'loss_scale': 8.0, 'counter': 1, 'iterations': 1},
      {'w': 1.0, 'loss_scale': 4.0, 'counter': 0, 'iterations': 2},
      {'w': 0.5, 'loss_scale': 4.0, 'counter': 1, 'iterations': 3},
      {'w': 0.25, 'loss_scale': 8.0, 'counter': 0, 'iterations': 4},
      {'w': 0.125, 'loss_scale': 8.0, 'counter': 1, 'iterations': 5},
  ]
  with _installed():
    opt = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), dynamic=True, initial_scale=8.0,
        dynamic_growth_steps=2)
    var = tf.Variable(2.0)
    got = []
    for factor in (1.0, INF, 1.0, 1.0, 1.0):
      with tf.GradientTape() as tape:
        loss = 0.5 * var * var * factor
        scaled = opt.get_scaled_loss(loss)
      grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
      opt.apply_gradients(zip(grads, [var]))
      got.append({'w': _value(var), 'loss_scale': _value(opt.loss_scale),
                  'counter': _value(opt.dynamic_counter),
                  'iterations': _value(opt.iterations)})
  _first_difference('TF 2.4-2.15 loop (by hand, install()\'s class)',
                    expected, got)


def _train(opt: Any, var: Any, grads: List[float]) -> None:
  for grad in grads:
    opt.apply([tf.constant([grad, grad], tf.float32)], [var])


def _saved_state(opt: Any, var: Any) -> Dict[str, Any]:
  inner = opt.inner_optimizer
  slots = [_value(v) for v in inner.variables
           if v is not inner.iterations and 'learning_rate' not in v.name]
  return {'scale': _value(opt.dynamic_scale),
          'counter': _value(opt.step_counter),
          'inner iterations': _value(inner.iterations),
          'slots': slots, 'weights': _value(var)}


def _new_keras3(initial_scale: float) -> Any:
  return keras.mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.25, momentum=0.5), initial_scale=initial_scale,
      dynamic_growth_steps=3)


def _written_and_read(write_class_installed: bool, directory: str) -> None:
  """Trains, writes, reads into a fresh optimizer of the other class."""
  grads = [1.0, INF, 2.0, 0.5]  # A skip, then a counter of 2.
  label = ('install()\'s class to Keras\'s' if write_class_installed
           else 'Keras\'s class to install()\'s')
  writing = _installed() if write_class_installed else contextlib.nullcontext()
  with writing:
    opt = _new_keras3(16.0)
    var = keras.Variable([1.0, -1.0])
    opt.build([var])
    _train(opt, var, grads)
    written = _saved_state(opt, var)
    path = tf.train.Checkpoint(optimizer=opt, var=var).write(
        os.path.join(directory, label.replace(' ', '_').replace("'", '')))
  reading = contextlib.nullcontext() if write_class_installed else _installed()
  with reading:
    opt = _new_keras3(1.0)  # Read values must replace these.
    var = keras.Variable([0.0, 0.0])
    opt.build([var])
    tf.train.Checkpoint(optimizer=opt, var=var).read(
        path).assert_existing_objects_matched()
    read = _saved_state(opt, var)
  if written != read:
    raise AssertionError(f'checkpoint from {label}: wrote {written}, read '
                         f'{read}')
  if (written['scale'], written['counter']) != (8.0, 2):
    raise AssertionError(f'checkpoint from {label}: training before it left '
                         f'{written}, not the scale 8 and counter 2 expected')


def _model_state(model: Any) -> Dict[str, Any]:
  # Slots are named after their variable's path, which holds the layer's
  # name: a numbered one (`sequential_1_dense_1_kernel_momentum`) in the
  # model saved, another in the model loaded.
  return {'optimizer': [(re.sub(r'^.*_kernel_', 'kernel_', v.name), _value(v))
                        for v in model.optimizer.variables],
          'weights': [_value(w) for w in model.weights]}


def _keras_files_both_ways(directory: str) -> None:
  """A `.keras` file of Keras's class read under install() and back."""
  from tf_loss_scale.keras.mixed_precision import shared_name  # pylint: disable=g-import-not-at-top
  keras_class = keras.optimizers.LossScaleOptimizer
  with _policy('mixed_float16'):
    model = keras.Sequential([
        keras.Input((1,)),
        keras.layers.Dense(1, use_bias=False,
                           kernel_initializer=keras.initializers.Constant(1.5))])
    model.compile(optimizer=keras.optimizers.SGD(0.125, momentum=0.5),
                  loss='mse')
    model.fit(_X, _Y, batch_size=1, shuffle=False, verbose=0)
    first, second = (os.path.join(directory, name)
                     for name in ('keras.keras', 'installed.keras'))
    written = _model_state(model)
    model.save(first)
    with _installed():
      loaded = keras.models.load_model(first)
      read = _model_state(loaded)
      read_class = type(loaded.optimizer)
      loaded.fit(_X[1:3], _Y[1:3], batch_size=1, shuffle=False, verbose=0)
      written_back = _model_state(loaded)
      loaded.save(second)
    back = keras.models.load_model(second)
  for label, cls, want, wrote, got in (
      ('Keras\'s class to install()\'s', shared_name.LossScaleOptimizer,
       read_class, written, read),
      ('install()\'s class to Keras\'s', keras_class, type(back.optimizer),
       written_back, _model_state(back))):
    if want is not cls:
      raise AssertionError(f'.keras file from {label}: loaded as {want}')
    if wrote != got:
      raise AssertionError(f'.keras file from {label}: wrote {wrote}, read '
                           f'{got}')


def check_checkpoint() -> None:
  with tempfile.TemporaryDirectory() as directory:
    _written_and_read(False, directory)
    _written_and_read(True, directory)
    _keras_files_both_ways(directory)


def check_drop_in() -> None:
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  def make(cls):
    return cls(keras.optimizers.SGD(0.125, momentum=0.5),
               **_keras3_arguments())
  theirs = _keras3_loop(make(keras.optimizers.LossScaleOptimizer))
  ours = _keras3_loop(make(LossScaleOptimizer))
  # Its config and variables may differ by design (registered name);
  # the steps must not.
  _check_scale_moved(theirs['steps'])
  _first_difference('Keras 3 loop (Keras\'s class, the drop-in)',
                    theirs['steps'], ours['steps'])
  theirs = _fit_trajectory(lambda: make(keras.optimizers.LossScaleOptimizer))
  ours = _fit_trajectory(lambda: make(LossScaleOptimizer))
  _check_scale_moved(theirs['steps'])
  _first_difference('fit (Keras\'s class, the drop-in)', theirs['steps'],
                    ours['steps'])


def _release() -> tuple:
  return tuple(int(part) for part in re.findall(r'\d+', keras.__version__)[:2])


def check_inner_features() -> None:
  # Keras 3.10 began to clear an inner `loss_scale_factor` (before, its
  # class divided the gradients by it a second time); ours clears it on
  # every release, so before 3.10 it steps as Keras's does without one.
  # Gradient accumulation derives its steps from the inner `iterations`,
  # which Keras's class began to report at 3.9.
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  features = {
      'loss_scale_factor': (
          lambda: keras.optimizers.SGD(0.125, loss_scale_factor=16.0),
          None if _release() >= (3, 10) else keras.optimizers.SGD(0.125)),
      'gradient_accumulation_steps': (
          lambda: keras.optimizers.SGD(0.125, momentum=0.5,
                                       gradient_accumulation_steps=2), None),
  }
  for feature, (inner, keras_inner) in features.items():
    theirs = _keras3_loop(keras.optimizers.LossScaleOptimizer(
        keras_inner or inner(), **_keras3_arguments()))
    _check_scale_moved(theirs['steps'])
    with _installed():
      installed = _keras3_loop(keras.mixed_precision.LossScaleOptimizer(
          inner(), **_keras3_arguments()))
    drop_in = _keras3_loop(LossScaleOptimizer(inner(), **_keras3_arguments()))
    for label, ours in (('install()\'s class', installed),
                        ('the drop-in', drop_in)):
      _first_difference(f'inner {feature} (Keras\'s class, {label})',
                        theirs['steps'], ours['steps'])


def check_replicas() -> None:
  # Keras's optimizers sum the replicas' gradients from 3.5; before, each
  # replica applied its own, and the Keras 3 forms refuse several replicas.
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])

  def trajectory(make):
    with strategy.scope():
      var = keras.Variable([1.0, 2.0])
      opt = make(keras.optimizers.SGD(0.25), **_keras3_arguments())
      opt.build([var])
    steps = []
    for factor in (1.0, INF, 1.0, 2.0):
      def step(factor=factor):
        replica = tf.cast(tf.distribute.get_replica_context()
                          .replica_id_in_sync_group, tf.float32)
        opt.apply([tf.ones(2) * (replica + 1.0) * factor], [var])
      strategy.run(step)
      steps.append({'w': [_value(v) for v in
                          strategy.experimental_local_results(var.value)],
                    'scale': _value(opt.dynamic_scale),
                    'inner iterations': _value(
                        opt.inner_optimizer.iterations)})
    return steps

  def refused(make, label):
    try:
      trajectory(make)
    except ValueError as error:
      if "pip install 'keras>=3.5'" not in str(error):
        raise AssertionError(f'{label} refused several replicas with: '
                             f'{error}') from error
    else:
      raise AssertionError(f'{label} trained two replicas on Keras '
                           f'{keras.__version__}, whose optimizers do not '
                           'sum their gradients')

  def under_install_name(inner, **kwargs):
    return keras.mixed_precision.LossScaleOptimizer(inner, **kwargs)

  if _release() < (3, 5):
    # Keras's own class trains the replicas apart there (README).
    refused(LossScaleOptimizer, 'the drop-in')
    with _installed():
      refused(under_install_name, 'install()\'s class')
    return
  theirs = trajectory(keras.optimizers.LossScaleOptimizer)
  _check_scale_moved([{'scale': 1024.0}] + theirs)
  if any(step['w'][0] != step['w'][1] for step in theirs):
    raise AssertionError(f'Keras\'s class: replicas apart: {theirs}')
  _first_difference('two replicas (Keras\'s class, the drop-in)', theirs,
                    trajectory(LossScaleOptimizer))
  with _installed():
    installed = trajectory(under_install_name)
  _first_difference('two replicas (Keras\'s class, install()\'s)', theirs,
                    installed)


CHECKS = {'fit': check_fit, 'keras3_loop': check_keras3_loop,
          'tf2_loop': check_tf2_loop, 'checkpoint': check_checkpoint,
          'drop_in': check_drop_in, 'inner_features': check_inner_features,
          'replicas': check_replicas}


def _keras_runs_here() -> None:
  """Imports Keras and fits a model with it, without this library."""
  global keras
  import keras  # pylint: disable=g-import-not-at-top,redefined-outer-name
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile(optimizer='sgd', loss='mse')
  model.fit(_X, _Y, verbose=0)


def main(names: List[str]) -> int:
  # Two replicas for `replicas`, set before TensorFlow initialises.
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  try:
    _keras_runs_here()
  except Exception as error:  # pylint: disable=broad-except
    print(f'SKIPPED: Keras ({os.environ.get("PYTHONPATH", "")}) does not '
          f'run on TensorFlow {tf.__version__} without this library: '
          f'{type(error).__name__}: {error}')
    return 2
  print(f'Keras {keras.__version__} ({os.path.dirname(keras.__file__)}), '
        f'TensorFlow {tf.__version__}', flush=True)
  expected = os.environ.get('TF_LOSS_SCALE_EXPECTED_KERAS')
  if expected and keras.__version__ != expected:
    # Another Keras earlier on the path: its results would stand for this.
    print(f'FAILED version: imported Keras {keras.__version__}, not '
          f'{expected} (TF_LOSS_SCALE_EXPECTED_KERAS)')
    return 1
  failed = []
  for name in names or CHECKS:
    try:
      CHECKS[name]()
    except Exception as error:  # pylint: disable=broad-except
      failed.append(name)
      print(f'FAILED {name}: {type(error).__name__}: {error}')
      traceback.print_exc(file=sys.stdout)
    else:
      print(f'PASSED {name}')
    sys.stdout.flush()
    if tf_loss_scale.compat.is_installed():
      print(f'FAILED {name}: left install() in effect')
      return 1
  print(f'{len(names or CHECKS) - len(failed)} passed, {len(failed)} failed')
  return int(bool(failed))


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
