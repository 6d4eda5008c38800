"""Keras's own tests of its LossScaleOptimizer, run against ours.

The Keras wheel installs the test files of its optimizers. This module loads
them from the installed Keras (never copied here) and runs, on the
TensorFlow backend, every test in them that exercises
`keras.optimizers.LossScaleOptimizer`, with `tf_loss_scale.keras.
LossScaleOptimizer` bound in its place for the duration of each test.

Two kinds of change to Keras's tests, both listed in the README's drop-in
section:
- Keras skips its `stateless` cases on the TensorFlow backend (its class
  cannot run statelessly there); ours can, so they run here.
- Tests whose expectation is a deliberate difference are listed in
  `_DIFFERENT_BY_DESIGN` with the reason (none of the installed tests need
  it in Keras 3.15; the list is where one would go).
"""

import importlib

import keras
import pytest

from tf_loss_scale import keras as tls_keras

_OURS = tls_keras.LossScaleOptimizer
# Test name -> why ours is expected to differ from Keras's there.
_DIFFERENT_BY_DESIGN = {}


def _load(module_name):
  return importlib.import_module(module_name)


def _with_ours_bound(test_class, module, attribute, keep=None):
  """A subclass of `test_class` that binds ours as `module.attribute`.

  Args:
    test_class: One of Keras's TestCase classes.
    module: The module whose name binding Keras's tests look the class up in.
    attribute: The name of that binding.
    keep: If given, a predicate on test names: only those run.

  Returns:
    The subclass, for pytest to collect.
  """

  class WithOurs(test_class):

    def setUp(self):
      self._keras_class = getattr(module, attribute)
      setattr(module, attribute, _OURS)
      self.addCleanup(setattr, module, attribute, self._keras_class)
      super().setUp()

  for name in dir(test_class):
    if not name.startswith('test'):
      continue
    if (keep is not None and not keep(name)) or name in _DIFFERENT_BY_DESIGN:
      setattr(WithOurs, name, None)
  WithOurs.__name__ = WithOurs.__qualname__ = f'{test_class.__name__}WithOurs'
  return WithOurs


_lso_tests = _load('keras.src.optimizers.loss_scale_optimizer_test')


class _RunsStatelessOnTensorFlow(_lso_tests.LossScaleOptimizerTest):

  def _skip_test_for_stateless(self, stateless):
    # Keras skips its stateless cases on TensorFlow because its class raises
    # there; ours runs them. The stateful cases always run on TensorFlow.
    del stateless


LossScaleOptimizerTestWithOurs = _with_ours_bound(
    _RunsStatelessOnTensorFlow, _lso_tests, 'LossScaleOptimizer')

OptimizerSparseTestWithOurs = _with_ours_bound(
    _load('keras.src.optimizers.optimizer_sparse_test').OptimizerSparseTest,
    keras.src.optimizers, 'LossScaleOptimizer',
    keep=lambda name: 'loss_scale' in name)

MultiOptimizerTestWithOurs = _with_ours_bound(
    _load('keras.src.optimizers.multi_optimizer_test').MultiOptimizerTest,
    keras.src.optimizers, 'LossScaleOptimizer',
    keep=lambda name: 'loss_scale' in name or 'nested' in name)

SwapEMAWeightsTestWithOurs = _with_ours_bound(
    _load('keras.src.callbacks.swap_ema_weights_test').SwapEMAWeightsTest,
    keras.src.optimizers, 'LossScaleOptimizer',
    keep=lambda name: 'loss_scale' in name)


def test_the_peer_tests_really_run_ours():
  # Guards against binding ours where Keras's tests do not look.
  for module, attribute in ((_lso_tests, 'LossScaleOptimizer'),
                            (keras.src.optimizers, 'LossScaleOptimizer')):
    assert getattr(module, attribute) is not _OURS
  case = LossScaleOptimizerTestWithOurs('test_finite_step_stateful')
  case.setUp()
  try:
    assert _lso_tests.LossScaleOptimizer is _OURS
    assert keras.src.optimizers.LossScaleOptimizer is not _OURS
  finally:
    case.doCleanups()
  assert _lso_tests.LossScaleOptimizer is not _OURS


# Collected through its subclass only.
del _RunsStatelessOnTensorFlow
