"""Runs TF 2.3-era scripts unmodified after `tf_loss_scale.compat.install()`.

`python run_after_install.py SCRIPT...` runs each script in turn as
`__main__`, each in its own working directory after its own `install()`,
restoring global state after it. Its last output line is a JSON object
mapping each script's file name to what the run left behind (the
optimizer's state, the policy and layer dtypes, the losses) or to the
traceback of its failure. Used by tests/test_compat.py in fresh processes,
with and without `TF_USE_LEGACY_KERAS=1` (tests/ must be on the path).
"""

import functools
import json
import os
import runpy
import sys
from typing import Any, Callable, Dict, List, Tuple

import tensorflow as tf

from class_names import class_name as _name
import isolation
import tf_loss_scale


def _guide_loop(script_globals: Dict[str, Any]) -> Tuple[List[float], float]:
  return (script_globals['epoch_losses'],
          float(script_globals['test_accuracy'].result()))


def _fit(script_globals: Dict[str, Any]) -> Tuple[List[float], float]:
  return (script_globals['history'].history['loss'],
          float(script_globals['test_accuracy']))


# Where each script leaves the per-epoch training losses and test accuracy of
# its run with `optimizer`.
_RESULTS: Dict[str, Callable[[Dict[str, Any]], Tuple[List[float], float]]] = {
    'tf23_custom_training_loop.py': _guide_loop,
    'tf23_compile_fit.py': _fit,
}


def _summary(script: str, script_globals: Dict[str, Any]) -> Dict[str, Any]:
  optimizer = script_globals['optimizer']
  loss_scale = optimizer.loss_scale
  model = script_globals['model']
  policy = tf.keras.mixed_precision.global_policy()
  losses, test_accuracy = _RESULTS[os.path.basename(script)](script_globals)
  return {
      'optimizer': _name(type(optimizer)),
      'loss_scale_class': _name(type(loss_scale)),
      'loss_scale': float(loss_scale()),
      'good_steps': int(loss_scale.good_steps.numpy()),
      'skipped_steps': int(loss_scale.skipped_steps.numpy()),
      'iterations': int(optimizer.iterations.numpy()),
      'losses': [float(loss) for loss in losses],
      'test_accuracy': test_accuracy,
      # What `compile` made of the optimizer it was given, and what `fit`
      # did with it.
      'compiled_optimizer': _name(type(model.optimizer)),
      'compiled_optimizer_is_optimizer': model.optimizer is optimizer,
      'fit_losses': script_globals['history'].history['loss'],
      'global_policy': policy.name,
      # The Keras whose policy it is (TF 2.3's Policy subclasses it).
      'policy_package': next(
          c for c in type(policy).__mro__
          if not c.__module__.startswith('tf_loss_scale')
      ).__module__.split('.')[0],
      'compiled_with_policy_loss_scale': (
          getattr(model.optimizer, 'loss_scale', None) is
          getattr(policy, 'loss_scale', False)),
      'layer_policies': [layer.dtype_policy.name for layer in model.layers
                         if layer.weights],
      'output_dtype': tf.as_dtype(model.outputs[0].dtype).name,
  }


def _install_and_run(script: str) -> Dict[str, Any]:
  tf_loss_scale.compat.install()
  return _summary(script, runpy.run_path(script, run_name='__main__'))


def main(scripts: List[str]) -> None:
  results = {}
  for script in scripts:
    summary, error = isolation.run_isolated(
        functools.partial(_install_and_run, script))
    results[os.path.basename(script)] = summary or {'error': error}
  print(json.dumps(results))


if __name__ == '__main__':
  main(sys.argv[1:])
