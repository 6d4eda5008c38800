"""Training traces of ours against the originals', through inf and NaN steps.

tests/originals/traces.py runs the same scenarios (a custom loop eagerly
and in `tf.function`, and `fit`; a dynamic loss scale starting at 2**15
that doubles after 2 good steps; gradients finite, then inf, then NaN;
and TF 2.3's mixed_float16 `Policy` with that loss scale, through `fit`,
where a float16 gradient overflows by itself) on
TensorFlow 1.15, 2.3 and 2.15 themselves (`.ci/run originals` records them
in .ci/logs/originals/) and here on ours, with Keras 3 and with tf_keras
(TF_USE_LEGACY_KERAS=1). After every step the loss scale and the iteration
count must be equal and the weights equal within a relative and absolute
tolerance of 1e-6 (float32 rounding: TF 1.15's graph and TF 2's kernels
round the momentum update differently in the last bits), but for one
difference by design (COUNTS_APPLIED_STEPS). The optimizers' and loss
scales' `get_config()` must hold the original's entries (the inner
optimizer by class name). What TF 2.x's optimizer members
(`get_weights`, `weights`, `get_slot`, `set_weights`, `minimize` with
`grad_loss`, `add_slot`, `lr`, `decay`, `variables()`) return after a step
must be the original's, entry by entry (floats within the same tolerance;
an error as its class name), but where listed by design (AS_AROUND_LEGACY,
MEMBERS_DIFFER): on Keras 3 for both Keras forms, under tf_keras for the
experimental one. The slots of each TF 2.x optimizer that keeps them, read
by TF 2.x's names after one step, must be the original's. The TF1 programs
of tests/legacy/ compared with TensorFlow's wrapper print on TF 1.15 what
they print with ours on TF 2.21, but the skip record only ours keeps
(`record`, None there). Without the
originals' JSON these tests skip, saying so, unless
TF_LOSS_SCALE_REQUIRE_ORIGINALS=1 (as in CI), where they fail.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fresh_process
import versions

_TRACES = os.path.join(os.path.dirname(__file__), 'originals', 'traces.py')
_ORIGINALS = {'1.15': 'traces-tf1.15.json', '2.3': 'traces-tf2.3.json',
              '2.15': 'traces-tf2.15.json'}
TOLERANCE = 1e-6

# Ours -> the originals' scenarios it must trace alike.
_MODES = ('eager', 'tf.function', 'fit')
PAIRS = (
    [(f'experimental {mode}', f'experimental {mode}')
     for mode in _MODES + ('policy fit',)] +
    [(f'mixed_precision {mode}', f'mixed_precision {inner} {mode}')
     for mode in _MODES for inner in ('legacy', 'new')] +
    [(f'v1 {mode}', 'v1 session') for mode in ('eager', 'tf.function')])

# Where ours traces otherwise by design (docs/differences.md): in `fit`,
# which follows Keras 3's protocol, the TF 2.4-2.15 form counts only applied
# steps in `iterations`, as Keras 3's class does, where TF 2.15's counted
# skipped steps too. Everything else must still be the original's.
COUNTS_APPLIED_STEPS = {('Keras 3', 'mixed_precision fit')}


def _directory():
  return os.environ.get('TF_LOSS_SCALE_ORIGINALS', os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.ci',
      'logs', 'originals'))


@pytest.fixture(scope='module')
def originals():
  absent = [name for name in _ORIGINALS.values()
            if not os.path.exists(os.path.join(_directory(), name))]
  if absent:
    message = (f'no {", ".join(absent)} in {_directory()}: `bash .ci/run '
               "originals` records the originals' traces")
    if os.environ.get('TF_LOSS_SCALE_REQUIRE_ORIGINALS') == '1':
      pytest.fail(message)
    pytest.skip(message)
  traces = {}  # The scenarios' traces, and `configs tfX.Y`: get_config()s.
  for name in _ORIGINALS.values():
    with open(os.path.join(_directory(), name)) as f:
      traces.update(json.load(f)['traces'])
  return traces


def _ours(tmp_path_factory, legacy_keras):
  out = tmp_path_factory.mktemp('traces') / 'ours.json'
  result = fresh_process.run([_TRACES, '--ours', str(out)],
                             legacy_keras=legacy_keras, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  with open(out) as f:
    return json.load(f)['traces']


@pytest.fixture(scope='module')
def ours_keras_3(tmp_path_factory, originals):
  del originals  # Only to skip first when they are absent.
  return _ours(tmp_path_factory, legacy_keras=False)


@pytest.fixture(scope='module')
def ours_tf_keras(tmp_path_factory, originals):
  del originals
  return _ours(tmp_path_factory, legacy_keras=True)


def _compare(ours, original):
  """The first step where the traces differ, described, or None."""
  if len(ours) != len(original):
    return f'{len(ours)} steps here, {len(original)} there'
  for step, (mine, theirs) in enumerate(zip(ours, original), 1):
    if (mine['scale'] != theirs['scale'] or
        mine['iterations'] != theirs['iterations'] or
        not np.allclose(mine['weights'], theirs['weights'], rtol=TOLERANCE,
                        atol=TOLERANCE)):
      return f'step {step}: ours {mine}, the original {theirs}'
  return None


def _applied_steps(trace):
  """`trace` with `iterations` counting only the steps that moved weights."""
  applied, previous, counted = 0, None, []
  for step in trace:
    applied += step['weights'] != previous
    previous = step['weights']
    counted.append(dict(step, iterations=applied))
  return counted


def _check(keras_name, traces, originals, ours_name, original_name):
  original = originals[original_name]
  if (keras_name, ours_name) in COUNTS_APPLIED_STEPS:
    assert _compare(traces[ours_name], original) is not None
    original = _applied_steps(original)
  assert _compare(traces[ours_name], original) is None


@versions.KERAS_3.mark
@pytest.mark.parametrize('ours_name, original_name', PAIRS)
def test_keras_3_traces_as_the_original(ours_keras_3, originals, ours_name,
                                        original_name):
  _check('Keras 3', ours_keras_3, originals, ours_name,
         original_name)


@(versions.KERAS_3 & versions.TF_KERAS_INSTALLED).mark
@pytest.mark.parametrize('ours_name, original_name', [
    (ours_name, original_name) for ours_name, original_name in PAIRS
    # Under tf_keras the TF 2.4-2.15 form is tf_keras's own class.
    if not ours_name.startswith('mixed_precision')])
def test_tf_keras_traces_as_the_original(ours_tf_keras, originals, ours_name,
                                         original_name):
  _check('tf_keras', ours_tf_keras, originals, ours_name,
         original_name)


# Ours -> the originals' config it must hold, entry for entry.
CONFIG_PAIRS = [
    ('experimental', 'configs tf2.3', 'experimental'),
    ('mixed_precision', 'configs tf2.15', 'mixed_precision legacy'),
    ('mixed_precision', 'configs tf2.15', 'mixed_precision new'),
    ('FixedLossScale', 'configs tf2.3', 'FixedLossScale'),
    ('DynamicLossScale', 'configs tf2.3', 'DynamicLossScale'),
    ('FixedLossScale', 'configs tf1.15', 'FixedLossScale'),
    ('DynamicLossScale', 'configs tf1.15', 'DynamicLossScale'),
]
# Entries ours adds to a config: the experimental form records which Keras
# family its inner optimizer is of, so that `from_config` rebuilds that one;
# TF 2.4-2.15's form writes Keras's config, which has the optimizer's name.
EXTRA_CONFIG_KEYS = {'experimental': {'optimizer_family'},
                     'mixed_precision': {'name'}}
# Entries of the original's that ours leaves out: TF 2.4-2.15's form writes
# Keras's config, where a dynamic scale is the default (a fixed one adds
# `dynamic: False`), so that Keras's class loads it.
MISSING_CONFIG_KEYS = {'mixed_precision': {'dynamic'}}


@versions.KERAS_3.mark
@pytest.mark.parametrize('ours_name, configs, original_name', CONFIG_PAIRS)
def test_get_config_as_the_original(ours_keras_3, originals, ours_name,
                                    configs, original_name):
  mine, theirs = ours_keras_3['configs'][ours_name], originals[configs][
      original_name]
  missing = MISSING_CONFIG_KEYS.get(ours_name, set())
  assert {key: mine[key] for key in theirs if key in mine} == {
      key: value for key, value in theirs.items() if key not in missing}
  assert set(theirs) - set(mine) == missing
  assert set(mine) - set(theirs) == EXTRA_CONFIG_KEYS.get(ours_name, set())


# Ours -> the originals' `members` records it must match, entry by entry.
MEMBER_PAIRS = (
    ('members experimental', 'members experimental'),
    ('members mixed_precision', 'members mixed_precision legacy'),
    ('members mixed_precision', 'members mixed_precision new'))
# TF 2.15's class around a new (Keras 2.11+) optimizer had none of the
# members of its class around a legacy one that these entries use (an
# AttributeError, and a TypeError for `minimize`'s `grad_loss`); ours adds
# them (docs/differences.md: "TF 2.4-2.15's members that Keras 3's class
# lacks are added"), and forwards `momentum` as TF 2.4-2.10's class did, so
# there it must record what the legacy one did. The second step follows the
# momentum that `set_weights` wrote.
AS_AROUND_LEGACY = {
    ('members mixed_precision new', entry): 'members mixed_precision legacy'
    for entry in ('get_weights', 'get_slot momentum', 'get_slot_names',
                  'set_weights then get_slot momentum', 'second step',
                  'minimize with grad_loss', 'add_slot', 'decay',
                  'momentum', 'momentum = 0.5, then the momentum')}
# Entries where ours differs by design, and why.
_KERAS_NAMES = ("ours' variables are the inner optimizer's own, named as "
                'its Keras names them: `iteration`, and a slot after its '
                'variable (`v_momentum` in Keras 3)')
MEMBERS_DIFFER = {
    **{(original_name, entry): _KERAS_NAMES
       for _, original_name in MEMBER_PAIRS
       for entry in ('weights names', 'variables() names')},
    **{('members experimental', entry): (
        "ours reads and writes the inner optimizer's hyperparameters, where "
        "TF 2.3's forwarded the learning rate only (docs/migrating_tf23.md)")
       for entry in ('momentum', 'momentum = 0.5, then the momentum')}}


def _same(mine, theirs):
  """Whether two recorded values are equal, floats within TOLERANCE."""
  if isinstance(mine, dict) and isinstance(theirs, dict):
    return set(mine) == set(theirs) and all(
        _same(mine[key], theirs[key]) for key in theirs)
  if isinstance(mine, list) and isinstance(theirs, list):
    return len(mine) == len(theirs) and all(
        _same(a, b) for a, b in zip(mine, theirs))
  numbers = (int, float)
  if (isinstance(mine, numbers) and isinstance(theirs, numbers) and
      float in (type(mine), type(theirs))):
    return bool(np.isclose(mine, theirs, rtol=TOLERANCE, atol=TOLERANCE))
  return type(mine) is type(theirs) and mine == theirs


def _member_mismatches(ours_name, mine, original_name, originals):
  """Each entry of `mine` that differs from the original's, described."""
  theirs = originals[original_name]
  if set(mine) != set(theirs):
    return [f'{ours_name}: entries {sorted(mine)}, {original_name}: '
            f'{sorted(theirs)}']
  mismatches = []
  for entry in sorted(theirs):
    expected_in = AS_AROUND_LEGACY.get((original_name, entry), original_name)
    expected = originals[expected_in][entry]
    same = _same(mine[entry], expected)
    if (original_name, entry) in MEMBERS_DIFFER:
      if same:  # A listed difference that is gone must leave the list.
        mismatches.append(f'{ours_name} vs {original_name}, {entry}: listed '
                          f'as differing, but both {expected!r}')
    elif not same:
      mismatches.append(f'{ours_name} vs {original_name}, {entry}: ours '
                        f'{mine[entry]!r}, {expected_in} {expected!r}')
  return mismatches


@pytest.mark.parametrize('ours_name, original_name', MEMBER_PAIRS)
def test_keras_3_members_as_the_original(ours_keras_3, originals, ours_name,
                                         original_name):
  assert _member_mismatches(ours_name, ours_keras_3[ours_name],
                            original_name, originals) == []


@(versions.KERAS_3 & versions.TF_KERAS_INSTALLED).mark
def test_tf_keras_members_as_the_original(ours_tf_keras, originals):
  # Under tf_keras the experimental form is ours around tf_keras's new
  # optimizers (the TF 2.4-2.15 form is tf_keras's own class).
  assert _member_mismatches('members experimental',
                            ours_tf_keras['members experimental'],
                            'members experimental', originals) == []


# (Keras, ours) -> the original's slots, after one step of each optimizer
# of TF 2.x that keeps slots: the names (TF 2.x's, in the original's order)
# and each slot's value read by that name.
SLOT_PAIRS = (
    pytest.param('Keras 3', 'slots experimental', 'slots experimental',
                 marks=versions.KERAS_3.mark),
    pytest.param('Keras 3', 'slots mixed_precision',
                 'slots mixed_precision legacy', marks=versions.KERAS_3.mark),
    pytest.param('tf_keras', 'slots experimental', 'slots experimental',
                 marks=(versions.KERAS_3 & versions.TF_KERAS_INSTALLED).mark))


@pytest.mark.parametrize('keras_name, ours_name, original_name', SLOT_PAIRS)
def test_slots_by_tf2_names_as_the_original(request, originals, keras_name,
                                            ours_name, original_name):
  ours = request.getfixturevalue(
      'ours_keras_3' if keras_name == 'Keras 3' else 'ours_tf_keras')
  mine, theirs = ours[ours_name], originals[original_name]
  assert sorted(mine) == sorted(theirs)
  for optimizer in theirs:
    assert mine[optimizer]['names'] == theirs[optimizer]['names'], optimizer
    for slot in theirs[optimizer]['names']:
      assert _same(mine[optimizer][slot], theirs[optimizer][slot]), (
          f'{keras_name} {optimizer} slot {slot}: ours '
          f'{mine[optimizer][slot]}, the original '
          f'{theirs[optimizer][slot]}')


def test_compare_finds_a_difference():
  step = {'scale': 32768.0, 'iterations': 1, 'weights': [0.9, 1.9]}
  assert _compare([step], [dict(step)]) is None
  assert _compare([step], [dict(step, weights=[0.9 + 1e-7, 1.9])]) is None
  assert _compare([step], [dict(step, iterations=2)]).startswith('step 1')
  assert _compare([step], [dict(step, scale=16384.0)]).startswith('step 1')
  assert _compare([step], [dict(step, weights=[0.9001, 1.9])]) is not None
  assert _compare([step], []) == '1 steps here, 0 there'


def test_applied_steps_counts_steps_that_moved_the_weights():
  trace = [{'scale': 2.0, 'iterations': n, 'weights': w}
           for n, w in ((1, [0.9]), (2, [0.9]), (3, [0.8]))]
  assert [s['iterations'] for s in _applied_steps(trace)] == [1, 1, 2]


def test_member_mismatches_name_the_entry_and_both_values():
  originals = {'members mixed_precision legacy': {'lr': 0.1, 'decay': 0.0},
               'members mixed_precision new': {
                   'lr': 0.1, 'decay': {'error': 'AttributeError'}}}
  assert _member_mismatches('ours', {'lr': 0.1 + 1e-8, 'decay': 0.0},
                            'members mixed_precision legacy', originals) == []
  assert _member_mismatches('ours', {'lr': 0.1, 'decay': 0.0},
                            'members mixed_precision new', originals) == []
  assert _member_mismatches(
      'ours', {'lr': 0.2, 'decay': {'error': 'AttributeError'}},
      'members mixed_precision new', originals) == [
          'ours vs members mixed_precision new, decay: ours '
          "{'error': 'AttributeError'}, members mixed_precision legacy 0.0",
          'ours vs members mixed_precision new, lr: ours 0.2, members '
          'mixed_precision new 0.1']
  assert _member_mismatches('ours', {'lr': 0.1},
                            'members mixed_precision legacy', originals) == [
                                "ours: entries ['lr'], members "
                                "mixed_precision legacy: ['decay', 'lr']"]


def test_same_compares_floats_within_the_tolerance_and_the_rest_exactly():
  assert _same([1, [0.5, {'a': 2.0}]], [1, [0.5 + 1e-8, {'a': 2.0}]])
  assert not _same([1, [0.5]], [1, [0.5001]])
  assert not _same(['iter'], ['iteration'])
  assert not _same({'a': 1}, {'a': 1, 'b': 2})
  assert not _same(2, 3)
  assert not _same({'error': 'KeyError'}, [0.5])


_TF1_PROGRAMS = sorted(
    name for name in os.listdir(os.path.join(os.path.dirname(__file__),
                                             'legacy'))
    if name.startswith('tf1_') and "# Compared: TensorFlow's wrapper" in open(
        os.path.join(os.path.dirname(__file__), 'legacy', name),
        encoding='utf-8').read().splitlines())


@pytest.mark.parametrize('name', _TF1_PROGRAMS)
def test_tf1_program_prints_what_it_printed_on_tensorflow_1_15(
    ours_keras_3, originals, name):
  key = f'tf1 program {name}'
  if key not in ours_keras_3:
    pytest.skip(f'{name} needs tf.estimator, gone from TensorFlow 2.16 on')
  ours, original = ours_keras_3[key], originals[key]
  assert set(ours) == set(original), (sorted(ours), sorted(original))
  if 'record' in original:
    assert original['record'] is None and ours['record'] is not None, (
        ours['record'], original['record'])
  for entry in sorted(set(original) - {'record'}):
    assert ours[entry] == original[entry], (
        f'{name}: {entry} is {ours[entry]!r} with ours, {original[entry]!r} '
        'on TensorFlow 1.15')


# TF 1.13-1.15's tf.contrib.mixed_precision (tests/originals/contrib_traces.py):
# ours runs the same graphs here, in this process, and every recorded value
# (each global variable by name after every step, the loss scale, the
# variable collections) must be TF 1.15.0's bit for bit, NaN for NaN, but
# one: Adam's update of `emb`, whose 8 elements TF 1.15's CPU kernel
# updates in vector packets with a square root that is not correctly
# rounded (its `w`, 2 elements, is updated one element at a time and
# matches bit for bit, as do both with Momentum). Those values must be
# within TOLERANCE.
_CONTRIB_INEXACT = ('emb',)


def _contrib_traces():
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'originals'))
  import contrib_traces  # pylint: disable=g-import-not-at-top
  return contrib_traces


def _contrib_same(mine, theirs, inexact):
  if isinstance(theirs, dict):
    return (isinstance(mine, dict) and mine.keys() == theirs.keys() and
            all(_contrib_same(mine[k], theirs[k], inexact and k in
                              _CONTRIB_INEXACT) for k in theirs))
  if isinstance(theirs, list):
    return (isinstance(mine, list) and len(mine) == len(theirs) and
            all(_contrib_same(a, b, inexact) for a, b in zip(mine, theirs)))
  if isinstance(theirs, float) and np.isnan(theirs):
    return isinstance(mine, float) and np.isnan(mine)
  if inexact is True and isinstance(theirs, float):
    return mine == pytest.approx(theirs, rel=TOLERANCE, abs=TOLERANCE)
  return type(mine) is type(theirs) and mine == theirs


def _contrib_mismatch(name, mine, theirs):
  """The first entry where ours differs from TF 1.15's, described, or None."""
  exact = 'adam' not in name.split() and 'saver' not in name.split()
  for key in sorted(set(mine) | set(theirs)):
    if key != 'trace':
      if not _contrib_same(mine.get(key), theirs.get(key), not exact):
        return f'{key}: ours {mine.get(key)}, TF 1.15 {theirs.get(key)}'
  if len(mine['trace']) != len(theirs['trace']):
    return f'{len(mine["trace"])} steps here, {len(theirs["trace"])} there'
  for number, (a, b) in enumerate(zip(mine['trace'], theirs['trace']), 1):
    if not _contrib_same(a, b, not exact):
      return f'step {number}: ours {a}, TF 1.15 {b}'
  return None


@pytest.fixture(scope='module')
def contrib_ours(tmp_path_factory, originals):
  del originals  # Only to skip first when they are absent.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.contrib import mixed_precision  # pylint: disable=g-import-not-at-top
  return _contrib_traces().scenarios(
      tf.compat.v1, mixed_precision, str(tmp_path_factory.mktemp('contrib')))


_CONTRIB_NAMES = [f'contrib {name}' for name in (
    'exponential momentum minimize', 'exponential adam compute_apply',
    'exponential ratios momentum compute_apply',
    'exponential float32 max adam minimize',
    'exponential floor momentum minimize',
    'exponential below one momentum minimize', 'fixed momentum compute_apply',
    'fixed adam minimize', 'own momentum minimize', 'own adam compute_apply',
    'saver resume', 'monitored session')]


def test_contrib_scenarios_are_listed():
  assert sorted(_CONTRIB_NAMES) == sorted(
      ['contrib ' + name for name in _contrib_traces().SCENARIOS] +
      ['contrib saver resume', 'contrib monitored session'])


@pytest.mark.parametrize('name', _CONTRIB_NAMES)
def test_contrib_traces_as_tf_1_15(contrib_ours, originals, name):
  assert _contrib_mismatch(name, contrib_ours[name], originals[name]) is None


def test_contrib_resumes_a_tf_1_15_checkpoint(originals):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.contrib import mixed_precision  # pylint: disable=g-import-not-at-top
  contrib_traces = _contrib_traces()
  resumed = contrib_traces.run(
      tf.compat.v1, mixed_precision, contrib_traces.SAVER,
      restore_from=os.path.join(_directory(), 'contrib-tf1.15', 'saver'))
  assert _contrib_mismatch('saver', resumed,
                           originals['contrib saver resume']) is None


def _tf_1_15_python():
  """TF 1.15's interpreter, where `.ci/run originals` makes it."""
  venvs = os.environ.get('TF_LOSS_SCALE_CI_VENVS', os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.ci',
      'venvs'))
  return os.path.join(venvs, 'original-tf115', 'bin', 'python')


def test_tf_1_15_resumes_a_contrib_checkpoint_of_ours(tmp_path, originals):
  python = _tf_1_15_python()
  if not os.path.exists(python):
    message = f'no {python}: `bash .ci/run originals` makes it'
    if os.environ.get('TF_LOSS_SCALE_REQUIRE_ORIGINALS') == '1':
      pytest.fail(message)
    pytest.skip(message)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.contrib import mixed_precision  # pylint: disable=g-import-not-at-top
  contrib_traces = _contrib_traces()
  checkpoint = str(tmp_path / 'saver')
  contrib_traces.run(tf.compat.v1, mixed_precision, contrib_traces.SAVER,
                     save_to=checkpoint)
  out = tmp_path / 'resumed.json'
  # TensorFlow 2 sets TF2_BEHAVIOR=1 in this process's environment, which
  # would turn TF 1.15's v2 behaviour on in the child.
  env = {k: v for k, v in os.environ.items() if k != 'TF2_BEHAVIOR'}
  done = subprocess.run(
      [python, os.path.join(os.path.dirname(_TRACES), 'contrib_traces.py'),
       '--resume', checkpoint, str(out)], capture_output=True, text=True,
      timeout=300, check=False, env=env)
  assert done.returncode == 0, done.stderr[-4000:]
  with open(out) as f:
    resumed = json.load(f)
  assert _contrib_mismatch('saver', resumed,
                           originals['contrib saver resume']) is None


def test_contrib_same_tells_bits_apart_but_for_adams_emb():
  assert _contrib_same({'w': [0.1, float('nan')]}, {'w': [0.1, float('nan')]},
                       False)
  assert not _contrib_same({'w': [0.1000000000000001]}, {'w': [0.1]}, False)
  assert not _contrib_same({'w': [0.30000001]}, {'w': [0.3]}, True)
  assert _contrib_same({'emb': [0.30000001]}, {'emb': [0.3]}, True)
  assert not _contrib_same({'emb': [0.30000001]}, {'emb': [0.3]}, False)
  assert not _contrib_same({'good_steps': 1.0}, {'good_steps': 1}, False)
