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

Some Keras wheels ship no test files (3.3.3 among them: the module skips,
saying so), and older ones lack some of the files (each absent file is a
skipped test naming it).
"""

import importlib
import importlib.util

import keras
import pytest

import versions

versions.KERAS_TEST_FILES.require()

from tf_loss_scale import keras as tls_keras  # pylint: disable=g-import-not-at-top,g-bad-import-order

_OURS = tls_keras.LossScaleOptimizer
# Test name -> why ours is expected to differ from Keras's there.
_DIFFERENT_BY_DESIGN = {}


def _load(module_name):
  return importlib.import_module(module_name)


def _absent_file_skips(module_name):
  """A test that skips, saying this Keras ships no such test file."""

  def test_file_absent():
    pytest.skip(f'Keras {keras.__version__} ships no {module_name} test '
                'file')

  return test_file_absent


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

# Keras's other test files with loss scale cases: (module, TestCase, which
# of its tests to keep), all looking the class up in keras.src.optimizers.
_OTHER_FILES = {
    'OptimizerSparseTest': (
        'keras.src.optimizers.optimizer_sparse_test',
        lambda name: 'loss_scale' in name),
    'MultiOptimizerTest': (
        'keras.src.optimizers.multi_optimizer_test',
        lambda name: 'loss_scale' in name or 'nested' in name),
    'SwapEMAWeightsTest': (
        'keras.src.callbacks.swap_ema_weights_test',
        lambda name: 'loss_scale' in name),
}

for _class_name, (_module_name, _keep) in _OTHER_FILES.items():
  if importlib.util.find_spec(_module_name) is None:
    globals()[f'test_{_class_name}_file'] = _absent_file_skips(_module_name)
  else:
    globals()[f'{_class_name}WithOurs'] = _with_ours_bound(
        getattr(_load(_module_name), _class_name), keras.src.optimizers,
        'LossScaleOptimizer', keep=_keep)


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
