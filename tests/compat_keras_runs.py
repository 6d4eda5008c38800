"""Programs that use no legacy name, run with and without `compat.install()`.

`python compat_keras_runs.py PROGRAM INSTALL [PATH]` runs one of them in
this fresh process, after `tf_loss_scale.compat.install()` if INSTALL is 1,
and prints what it left behind as a JSON line:

  fit PATH   compiles a float16 model under `mixed_float16` (Keras adds its
             loss scaling), fits it through steps that overflow, saves it to
             the `.keras` file PATH;
  load PATH  loads that file, reports the state it restored, and fits one
             more epoch.

Used by tests/test_compat_keras.py (tests/ and the checkout on the path),
which compares the runs.
"""

import json
import sys
import warnings
from typing import Any, Dict

import numpy as np
import tensorflow as tf

import class_names
import tf_loss_scale.compat

# Inputs up to 6 against a sum: the first float16 gradients, scaled by
# 2**15, overflow, and a few steps are skipped before the scale settles.
_RNG = np.random.RandomState(0)
_X = _RNG.uniform(0, 6, (64, 4)).astype('float32')
_Y = _X.sum(axis=1, keepdims=True)


def _fit(model: Any, epochs: int) -> list:
  history = model.fit(_X, _Y, batch_size=8, epochs=epochs, shuffle=False,
                      verbose=0)
  return history.history['loss']


def _name(obj: Any) -> str:
  return class_names.class_name(type(obj))


def _state(model: Any) -> Dict[str, Any]:
  """The weights and the optimizer's state, as exact floats."""
  opt = model.optimizer
  # The list Keras reads (tf_keras's and the library's can also be called,
  # returning TF 2.x's narrower list); a method on Keras 2's legacy
  # optimizers.
  variables = opt.variables
  variables = variables if isinstance(variables, list) else variables()
  scale = getattr(opt, 'dynamic_scale', None)
  if scale is None:
    scale = opt.loss_scale  # tf_keras's class.
  return {
      'optimizer': _name(opt),
      'inner_optimizer': _name(opt.inner_optimizer),
      # The inner optimizer's: Keras's class counts in one of its own, which
      # never moves, before Keras 3.9.
      'iterations': int(np.asarray(opt.inner_optimizer.iterations)),
      'loss_scale': float(np.asarray(scale)),
      'weights': [w.ravel().tolist() for w in model.get_weights()],
      'optimizer_variables': [np.asarray(v).ravel().tolist()
                              for v in variables],
  }


def fit_and_save(path: str) -> Dict[str, Any]:
  tf.keras.mixed_precision.set_global_policy('mixed_float16')
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(4,)),
      tf.keras.layers.Dense(8, activation='relu'),
      tf.keras.layers.Dense(1),
  ])
  model.set_weights([_RNG.uniform(-0.5, 0.5, w.shape).astype('float32')
                     for w in model.get_weights()])
  model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss='mse')
  losses = _fit(model, epochs=2)
  model.save(path)
  return dict(_state(model), losses=losses)


def load_and_fit(path: str) -> Dict[str, Any]:
  tf.keras.mixed_precision.set_global_policy('mixed_float16')
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    model = tf.keras.models.load_model(path)
  loaded = _state(model)
  losses = _fit(model, epochs=1)
  return {'loaded': loaded, 'continued': dict(_state(model), losses=losses),
          'warnings': [str(w.message) for w in caught
                       if 'compile' in str(w.message)]}


def main(argv: list) -> None:
  program, install, *args = argv
  if install == '1':
    tf_loss_scale.compat.install()
  result = {'fit': fit_and_save, 'load': load_and_fit}[program](*args)
  print(json.dumps(result))


if __name__ == '__main__':
  main(sys.argv[1:])
