"""Old programs run unmodified through `tf-loss-scale run`, with their numbers.

tests/legacy/launcher/ holds programs written for one TensorFlow each (the
prefix says which: tf1_ TF 1.15, tf23_ TF 2.3, tf24_ TF 2.4-2.15), none of
which runs on today's TensorFlow with `python PROGRAM.py`: TF 1.x's own
namespace (imported inside `try:` too); a TF 1.15 job resuming its own
Saver file; TF 2's API on TF 1.15 (`tensorflow.compat.v2`) with the graph
rewrite; TF 2.3's graph rewrite around an SGD with `decay`; TF 1.15's Keras
`decay`, by the applied steps; one Keras optimizer for two models (TF
1.15's in graph mode; TF 2.3's in a loop and `fit`, with `decay`); TF 2.3's
Adam with a schedule that has no `get_config`; `import keras` for Keras 2;
TF 1.15's `tf.contrib.mixed_precision`; training in child processes.
Each runs here as users run it, `tf-loss-scale run PROGRAM.py ARGS` with
nothing else said, and prints its loss scales, iterations (or global
steps) and weights: they must be those its own TensorFlow gives, running
the program with `python`.

`_RECORDED` holds the originals' output, from runs of these programs on
TensorFlow 1.15.0, 2.3.4 and 2.15.1 (the CPU packages). `.ci/run
originals` runs them again there and writes `launcher-NAME.json` into
.ci/logs/originals/; when that file is present, the run is checked against it
as well.
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

import pytest

import fresh_process
import versions

# The full tier only (docs/testing.md).
pytestmark = pytest.mark.slow

_PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'legacy',
                         'launcher')
_ORIGINALS = os.environ.get('TF_LOSS_SCALE_ORIGINALS', os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.ci',
    'logs', 'originals'))
_TIMEOUT = 300

_SCALES = [16384.0, 16384.0, 32768.0, 16384.0, 16384.0, 32768.0, 32768.0,
           65536.0]
_KERNELS = [0.0, 0.15000000596046448, 0.41996094584465027,
            0.41996094584465027, 0.7709336280822754, 1.1597094535827637,
            1.5435919761657715, 1.8846917152404785]
_CHILD = {'loss_scale': _SCALES[:5], 'iterations': [1, 2, 3, 4, 5],
          'kernel': _KERNELS[:5]}
# Every program's arguments (.ci/run gives the originals the same).
_ARGS = ['--', '-5', '--flag']
# Program -> what its TensorFlow printed.
_RECORDED = {
    # TensorFlow 1.15.0. The global step stays on the skipped steps (the
    # first, at 2**15, and the fourth, after the scale doubled back).
    'tf1_namespace_session.py': {
        'loss_scale': _SCALES, 'global_step': [0, 1, 2, 2, 3, 4, 5, 6],
        'skipped': 2, 'w': _KERNELS, 'argv': _ARGS},
    # TensorFlow 1.15.0: Adam's beta powers are made inside the wrapper's
    # `cond`, and the resumed job's steps go on from the file's state.
    'tf1_saver_resume.py': {
        'loss_scale': [16384.0, 16384.0, 32768.0, 16384.0, 16384.0, 32768.0],
        'global_step': [0, 1, 2, 2, 3, 4],
        'w': [0.0, 0.09999999403953552, 0.1997617930173874,
              0.1997617930173874, 0.29909971356391907, 0.39780521392822266],
        'checkpoint': ['cond_1/beta1_power', 'cond_1/beta2_power',
                       'current_loss_scale', 'global_step', 'good_steps', 'w',
                       'w/Adam', 'w/Adam_1']},
    # TensorFlow 1.15.0: 5 steps of `fit` per model. Its `iterations`
    # counted the applied steps only: 2 skipped for the first model, 1 for
    # the second.
    'tf1_keras_optimizer_two_models.py': {
        'loss_scale': [16384.0, 32768.0], 'iterations': [3, 7],
        'kernel': [0.7709336280822754, 1.1597094535827637]},
    # TensorFlow 1.15.0: 2 of 6 steps skipped; the rate decays by the 4
    # applied ones (counting all 6, the kernel ends elsewhere).
    'tf1_keras_sgd_decay.py': {
        'loss_scale': 131072.0, 'iterations': 4, 'kernel': 0.6388800144195557},
    # TensorFlow 1.15.0: the first step skipped at 2**15.
    'tf1_guarded_import.py': {
        'loss_scale': [16384.0, 16384.0, 32768.0, 16384.0, 16384.0],
        'w': [0.0, 0.15000000596046448, 0.28496092557907104,
              0.28496092557907104, 0.40644529461860657]},
    # TensorFlow 1.15.0: one step of each `fit` skipped, not counted.
    'tf1_compat_v2_graph_rewrite.py': {
        'loss_scale': [16384.0, 8192.0], 'iterations': [4, 8],
        'kernel': [1.1598000526428223, 1.1598000526428223]},
    # TensorFlow 2.3.4: 2 of 6 steps skipped, counted in `iterations`.
    'tf23_graph_rewrite_decay.py': {
        'loss_scale': 131072.0, 'iterations': 6, 'kernel': 0.5978742837905884},
    # TensorFlow 1.15.0: tf.contrib.mixed_precision's manager from 2**32
    # halves every 2 skipped steps; the loop's own global step moves on the
    # 10 finite steps, from 2**12 on.
    'tf1_contrib_bert_loop.py': {
        'loss_scale': [2.0 ** (32 - (step + 1) // 2) for step in range(40)] +
                      [4096.0] * 10,
        'global_step': [0] * 40 + list(range(1, 11)),
        'weights': [0.5533382296562195, 0.40935155749320984,
                    0.5272089838981628], 'argv': _ARGS},
    # TensorFlow 2.3.4: `iterations` counts the skipped steps too; `fit`
    # runs 6 steps on the second model with the same optimizer.
    'tf23_one_optimizer_two_models.py': {
        'loss_scale': [16384.0, 16384.0, 32768.0, 16384.0, 16384.0, 65536.0],
        'iterations': [1, 2, 3, 4, 5, 11],
        'first_kernel': 0.758560061454773,
        'second_kernel': 1.4683257341384888},
    # TensorFlow 2.3.4: Adam's steps follow the schedule, 0.1 / (1 + step).
    'tf23_adam_schedule.py': {
        'loss_scale': [16384.0, 16384.0, 32768.0, 16384.0, 16384.0, 32768.0],
        'iterations': [1, 2, 3, 4, 5, 6],
        'kernel': [0.0, 0.03720667585730553, 0.0658012256026268,
                   0.0658012256026268, 0.08285011351108551,
                   0.09778402745723724]},
    # TensorFlow 2.3.4, the same bits every run: OpenNMT-tf's trainer, its
    # loss scale made outside `strategy.scope()`, two replicas; the first
    # two steps overflow at 2**15 and 2**14, the fourth on one replica.
    'tf23_mirrored_outside_scope.py': {
        'loss_scale': [16384.0, 8192.0, 8192.0, 4096.0, 4096.0, 4096.0],
        'iterations': [1, 2, 3, 4, 5, 6],
        'kernel': [[1.0, 1.0], [1.0, 1.0]] + [[k, k] for k in (
            0.936118483543396, 0.936118483543396, 0.8630035519599915,
            0.7819222211837769)]},
    # TensorFlow 2.3.4: the policy's loss scale, made before the strategy,
    # wrapped by `compile` in its scope; one step of `fit` per epoch.
    'tf23_set_policy_then_mirrored_compile.py': {
        'loss_scale': [16384.0] + [8192.0] * 5,
        'iterations': [1, 2, 3, 4, 5, 6],
        'kernel': [[1.0, 1.0], [1.0, 1.0]] + [[k, k] for k in (
            0.8500000238418579, 0.72398442029953, 0.6181250810623169,
            0.529218852519989)]},
    # TensorFlow 2.15.1 (Keras 2.15).
    'tf24_import_keras.py': {
        'loss_scale': _SCALES, 'iterations': list(range(1, 9)),
        'kernel': _KERNELS},
    'tf24_child_processes.py': {'spawn': _CHILD, 'subprocess': _CHILD},
}


def _condition() -> versions.Condition:
  if versions.LEGACY_KERAS_REQUESTED:
    return versions.Condition(False, (
        '`run` chooses the Keras itself: the run without TF_USE_LEGACY_KERAS '
        'runs these'))
  return versions.TF_KERAS_INSTALLED if versions.KERAS_3 else versions.KERAS_2


def _command():
  """The console script users run, or `python -m tf_loss_scale`."""
  script = shutil.which('tf-loss-scale', path=os.path.dirname(sys.executable))
  return [script] if script else ['-m', 'tf_loss_scale']


def _run(name, workdir):
  try:
    return fresh_process.run(
        _command() + ['run', os.path.join(_PROGRAMS, name)] + _ARGS,
        timeout=_TIMEOUT, cwd=workdir)
  except subprocess.TimeoutExpired:
    return None


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  if not _condition():
    pytest.skip(_condition().reason)
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    futures = {name: pool.submit(_run, name,
                                 str(tmp_path_factory.mktemp(name[:-3])))
               for name in _RECORDED}
    return {name: future.result() for name, future in futures.items()}


def test_every_program_has_recorded_numbers():
  assert sorted(_RECORDED) == sorted(
      n for n in os.listdir(_PROGRAMS) if n.endswith('.py'))


@pytest.mark.parametrize('name', sorted(_RECORDED))
def test_program_prints_what_its_tensorflow_printed(name, runs):
  done = runs[name]
  assert done is not None, f'{name}: killed after {_TIMEOUT} s'
  assert done.returncode == 0, (
      f'tf-loss-scale run {name} exited with {done.returncode}:\n'
      f'{done.stderr[-4000:]}')
  printed = json.loads(done.stdout.strip().splitlines()[-1])
  expected = _RECORDED[name]
  for key in expected:
    assert _close(printed[key], expected[key]), (
        f'{name}: {key} is {printed[key]}, its TensorFlow printed '
        f'{expected[key]}')
  original = os.path.join(_ORIGINALS, f'launcher-{name[:-3]}.json')
  if os.path.exists(original):
    with open(original, encoding='utf-8') as f:
      recorded = json.load(f)
    assert _close(printed, recorded), (
        f'{name}: printed {printed}, the original in CI {recorded}')
  else:
    assert os.environ.get('TF_LOSS_SCALE_REQUIRE_ORIGINALS') != '1', (
        f'no {original}: `bash .ci/run originals` records it')


def _close(mine, theirs) -> bool:
  """Equal, floats within 1e-6 relative, through dicts and lists."""
  if isinstance(theirs, dict):
    return isinstance(mine, dict) and mine.keys() == theirs.keys() and all(
        _close(mine[key], theirs[key]) for key in theirs)
  if isinstance(theirs, list):
    return isinstance(mine, list) and len(mine) == len(theirs) and all(
        _close(a, b) for a, b in zip(mine, theirs))
  if isinstance(theirs, float):
    return mine == pytest.approx(theirs, rel=1e-6)
  return mine == theirs


def test_close_finds_a_difference_deep_down():
  trace = {'spawn': {'kernel': [0.0, 0.15], 'iterations': [1, 2]}}
  assert _close(json.loads(json.dumps(trace)), trace)
  assert not _close({'spawn': {'kernel': [0.0, 0.1501], 'iterations': [1, 2]}},
                    trace)
  assert not _close({'spawn': {'kernel': [0.0, 0.15], 'iterations': [1, 3]}},
                    trace)
  assert not _close({'spawn': {'kernel': [0.0], 'iterations': [1, 2]}}, trace)


def test_tf1_program_is_read_as_tensorflow_1(runs):
  assert ('tf1_namespace_session.py reads as TensorFlow 1 code '
          '(tf.placeholder on line 19)') in runs['tf1_namespace_session.py'
                                                ].stderr
