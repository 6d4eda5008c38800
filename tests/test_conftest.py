"""What tests/conftest.py gives every run.

One test whose collectives abort does not fail the tests after it. A failed collective op (here, two strategies' all-reduces of different
shapes under the same keys) aborts every later collective of the process.
tests/conftest.py makes the eager context and its `mirrored_strategy` anew
after such a test; a pytest run of made-up tests, in a fresh process with
that conftest, shows the next test's all-reduce sums again. Under
pytest-xdist each file's tests go to one worker, so a file's batch of
programs (a module fixture) runs once. And the run's closing summary says
what it could not check here, under xdist too.
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

import conftest

_TESTS = os.path.dirname(os.path.abspath(__file__))

_MADE_UP_TESTS = """
import tensorflow as tf


def _sum(strategy, n):
  def step():
    context = tf.distribute.get_replica_context()
    one = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
    return context.all_reduce('sum', tf.ones(n) * one)
  return [v.numpy().tolist() for v in
          strategy.experimental_local_results(strategy.run(step))]


def test_1_sums(mirrored_strategy):
  assert _sum(mirrored_strategy, 2) == [[3.0, 3.0], [3.0, 3.0]]


def test_2_aborts_the_collectives(mirrored_strategy):
  other = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
  _sum(other, 3)  # Raises: the keys of test_1's all-reduce, another shape.


def test_3_sums_again(mirrored_strategy):
  assert _sum(mirrored_strategy, 2) == [[3.0, 3.0], [3.0, 3.0]]


def test_4_a_variable_on_both_replicas(mirrored_strategy):
  with mirrored_strategy.scope():
    var = tf.Variable(1.0)
  assert [v.numpy() for v in
          mirrored_strategy.experimental_local_results(var)] == [1.0, 1.0]
"""


def test_tests_after_an_aborted_collective_run_on_a_new_strategy(tmp_path):
  (tmp_path / 'test_made_up.py').write_text(_MADE_UP_TESTS)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=os.pathsep.join([_TESTS] + sys.path))
  done = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
       '-p', 'conftest', '-c', os.devnull, '--rootdir', str(tmp_path),
       '-rA', str(tmp_path / 'test_made_up.py')],
      cwd=str(tmp_path), env=env, capture_output=True, text=True,
      timeout=600, check=False)
  lines = [line for line in done.stdout.splitlines()
           if line.startswith(('PASSED ', 'FAILED '))]
  if 'PASSED test_made_up.py::test_2_aborts_the_collectives' in lines:
    pytest.skip(f'TensorFlow {tf.__version__} runs all-reduces of two shapes '
                'under one key without aborting: no aborted collective to '
                'recover from')
  assert [line.split(' ')[0] + ' ' + line.split('::')[1].split(' ')[0]
          for line in lines] == [
              'PASSED test_1_sums', 'PASSED test_3_sums_again',
              'PASSED test_4_a_variable_on_both_replicas',
              'FAILED test_2_aborts_the_collectives'], done.stdout[-3000:]
  assert 'Collective ops is aborted' in done.stdout


def test_the_summary_names_what_this_run_cannot_check():
  skips = [('tests/b.py::test_x', 'needs Keras 3.9 or later (keras 3.15.1)'),
           ('tests/a.py::test_y', 'needs Keras 3.9 or later (keras 3.15.1)'),
           ('tests/a.py::test_z', 'needs tf_keras')]
  assert conftest.not_run_here(skips, 394) == [
      '394 tests of the full tier not run: `pytest -q tests --full` runs '
      'them (CI does).',
      '3 checks this environment cannot run (CI runs them where they apply: '
      'docs/testing.md):',
      '  needs Keras 3.9 or later (keras 3.15.1)',
      '    tests/a.py::test_y',
      '    tests/b.py::test_x',
      '  needs tf_keras',
      '    tests/a.py::test_z']
  assert conftest.not_run_here([], 0) == []


_BATCHED_TESTS = """
import os

import pytest


@pytest.fixture(scope='module')
def batch():
  with open(os.environ['MADE_UP_BATCHES'], 'a') as f:
    f.write(__name__ + '\\n')


@pytest.mark.parametrize('n', range(4))
def test_in_a_batch(batch, n):
  del batch, n


@pytest.mark.slow
def test_of_the_full_tier():
  pass
"""


@pytest.mark.slow
def test_on_two_workers_a_files_batch_runs_once_and_the_summary_counts(
    tmp_path):
  for name in ('test_one.py', 'test_two.py'):
    (tmp_path / name).write_text(_BATCHED_TESTS)
  batches = tmp_path / 'batches.txt'
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             MADE_UP_BATCHES=str(batches),
             PYTHONPATH=os.pathsep.join([_TESTS] + sys.path))
  done = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
       '-p', 'conftest', '-c', os.devnull, '--rootdir', str(tmp_path),
       '-n', '2', 'test_one.py', 'test_two.py'],
      cwd=str(tmp_path), env=env, capture_output=True, text=True,
      timeout=600, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert '8 passed' in done.stdout, done.stdout[-3000:]
  # Each module's fixture once, though its tests were four.
  assert sorted(batches.read_text().splitlines()) == ['test_one', 'test_two']
  assert ('2 tests of the full tier not run: `pytest -q tests --full` runs '
          'them (CI does).') in done.stdout, done.stdout[-3000:]
