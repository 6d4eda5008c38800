"""benchmarks/earlier.py imports the library of a commit beside today's, and
`run.py --against` times it as a variant of its own."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import earlier
from benchmarks import variants
from benchmarks import workloads

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKLOAD = workloads.Workload(
    'tiny', lambda: [np.linspace(-1, 1, 5, dtype=np.float32) * (i + 1)
                     for i in range(3)],
    lambda vs: tf.add_n([tf.reduce_sum(tf.square(v)) for v in vs]))


def _head():
  if shutil.which('git') is None:
    pytest.skip('git is not installed')
  found = subprocess.run(['git', '-C', _ROOT, 'rev-parse', '--short', 'HEAD'],
                         capture_output=True, text=True)
  if found.returncode:
    pytest.skip(f'{_ROOT} is not a git work tree: {found.stderr.strip()}')
  return found.stdout.strip()


def test_the_package_of_a_commit_imports_under_a_name_of_its_own():
  head = _head()
  package = earlier.load('HEAD', os.path.join(_ROOT, 'benchmarks'))
  assert package.__name__ == f'tf_loss_scale_at_{head}'
  optimizer = package.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
  assert type(optimizer).__module__.startswith(package.__name__)
  # Its modules import each other, none of today's.
  home = os.path.dirname(package.__file__)
  assert not home.startswith(_ROOT)
  loaded = [m for n, m in sys.modules.items() if n.startswith(package.__name__)]
  assert len(loaded) > 5
  for module in loaded:
    assert module.__file__.startswith(home), module


def test_the_earlier_variant_steps_as_tensorflows_wrapper_does():
  _head()
  variants.add_earlier(earlier.load('HEAD', _ROOT))
  try:
    results = {}
    for name in ('earlier', 'tf_v1', 'bare'):
      session, train_op, variables = variants.graph_step(
          _WORKLOAD, variants.variants_of('v1')[name])
      with session:
        for _ in range(3):
          session.run(train_op)
        results[name] = session.run(variables)
  finally:
    variants.EARLIER.clear()
  for got, want, bare in zip(results['earlier'], results['tf_v1'],
                             results['bare']):
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, bare, rtol=1e-6)
  assert not np.array_equal(results['earlier'][0],
                            _WORKLOAD.initial_values()[0])


def test_a_commit_git_does_not_know_is_refused():
  _head()
  with pytest.raises(subprocess.CalledProcessError):
    earlier.load('no-such-revision', _ROOT)
