"""Shrunk generated programs that diverged from their peers, one test each.

Each is a program Hypothesis drew and shrank (`test_generated_programs.py`),
or one written on its axes, that exposed a defect of this library, since
fixed; each test runs it with only the documented differences excused.
The last three pin behaviours of the peers' that declarations excuse, and
check that each excuse starts where the peer goes another way, not before.
"""

import dataclasses

import pytest

import versions

# The declarations are those of Keras 3.12 and later, where they were
# checked; Keras 3.3's class differs more (docs/differences.md).
versions.keras_at_least(3, 12).require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import generated_declarations as declarations
import generated_programs as generated
from generated_programs import Program
import test_generated_programs
# pylint: enable=g-import-not-at-top,wrong-import-order

_FINITE = (('finite', 1.0),)
INF = float('inf')


@pytest.mark.parametrize('program', [
    # The trace keeps 2**15 after the scale doubled: the loss is scaled by
    # half the scale the apply unscales by (with an overflow, every step is
    # skipped while the reported scale halves).
    pytest.param(Program(family='tf24', ours='installed',
                         shape='split_traced_gradients', built_before=False,
                         growth_steps=1, gradients=_FINITE * 2),
                 id='split_step_unbuilt'),
    pytest.param(Program(family='keras3', dtype='mixed_float16',
                         loss_float32=False, gradients=_FINITE),
                 id='float16_loss_to_scale_loss'),
    pytest.param(Program(family='tf1', shape='session', inner='adam',
                         control_flow_v2=False, gradients=_FINITE),
                 id='v1_control_flow_adam_names'),
    # The scale halved by the inf step comes back as 2**15.
    pytest.param(Program(family='tf24', ours='installed', restore_after=1,
                         restore_built=False, gradients=(('inf', 1.0),)),
                 id='restore_into_unbuilt'),
    # TF 2.3's policy loss scale, made before the strategy's scope: refused.
    pytest.param(Program(family='tf23', ours='installed', install=True,
                         keras2_legacy=False, dtype='mixed_float16',
                         shape='fit_mirrored', policy_before_scope=True,
                         policy_loss_scale=True, built_before=False,
                         gradients=(('finite', 0.5),), restore_built=False),
                 id='policy_set_before_the_scope'),
    # With v2 behaviour off too: Adam's variables named as TensorFlow's.
    pytest.param(Program(family='tf1', shape='session', inner='adam',
                         control_flow_v2=False, v2_behaviour=False,
                         gradients=(('finite', 0.5),)),
                 id='v2_behaviour_off_adam_names'),
])
def test_a_shrunk_program_trains_as_its_peer(program, mirrored_strategy):
  test_generated_programs.check(program, mirrored_strategy,
                                declarations.DOCUMENTED)


def test_keras_unbuilt_traced_scaling_is_excused_where_it_goes_wrong():
  """Pins a bug of Keras 3's class, excused by a declaration.

  Keras's unbuilt class scales the loss traced in the gradients' function by
  its initial scale, and keeps that trace after the first overflow halved
  its scale: its second step is scaled by 2**15 and unscaled by 2**14.
  """
  program = Program(family='keras3', shape='split_traced_gradients',
                    built_before=False,
                    gradients=(('overflow', 0.5), ('finite', 0.5)))
  ours = generated.run(program, 'ours', None)
  peer = generated.run(program, 'peer', None)
  assert [o['scaled_loss'] for o in ours[1:]] == [[2.0 ** 14 * 1.5]]
  assert [o['scaled_loss'] for o in peer[1:]] == [[2.0 ** 15 * 1.5]]
  assert ours[1]['weights'][0] == pytest.approx([1.0 - 0.05, -2.0 + 0.05])
  assert generated.divergences(program, ours, peer, ()) == [
      'observation 1, scaled_loss: ours [24576.0], peer [49152.0]',
      'observation 1, weights: ours [[0.949999988079071, '
      '-1.9500000476837158]], peer [[0.8999999761581421, '
      '-1.899999976158142]]']
  assert not generated.divergences(program, ours, peer,
                                   declarations.DOCUMENTED)


def test_tf_keras_fixed_scale_folded_in_a_function_is_excused_there_only():
  """Pins what Grappler makes of tf_keras's class, excused by a declaration.

  With a fixed scale, a gradient that overflows once scaled is inf eagerly
  and under XLA on both sides; in a `tf.function` tf_keras's class applies
  it finite (the scale and its reciprocal folded), ours still inf.
  """
  steps = {}
  for shape in ('eager', 'jit', 'function'):
    program = Program(family='tf24', inner='momentum', shape=shape,
                      built_before=False, dynamic=False,
                      gradients=(('overflow', 0.5),))
    ours = generated.run(program, 'ours', None)
    peer = generated.run(program, 'peer', None)
    steps[shape] = (ours[0]['weights'][0][0], peer[0]['weights'][0][0],
                    bool(generated.divergences(program, ours, peer, ())),
                    generated.divergences(program, ours, peer,
                                          declarations.DOCUMENTED))
  assert steps['eager'] == steps['jit'] == (-INF, -INF, False, [])
  ours, peer, diverged, left = steps['function']
  assert (ours, diverged, left) == (-INF, True, [])
  assert -INF < peer < -1e30


def test_keras_restored_unbuilt_scaling_is_excused_after_the_restore():
  """Pins a bug of Keras 3's class, excused by a declaration.

  Restored into while unbuilt, Keras's class scales the next loss by its
  initial scale (2**15), and unscales by the restored one (2**14).
  """
  program = Program(family='keras3', built_before=False, restore_after=1,
                    restore_built=False,
                    gradients=(('overflow', 0.5), ('finite', 0.5)))
  ours = generated.run(program, 'ours', None)
  peer = generated.run(program, 'peer', None)
  assert [o['scaled_loss'] for o in ours] == [[INF], [], [2.0 ** 14 * 1.5]]
  assert [o['scaled_loss'] for o in peer] == [[INF], [], [2.0 ** 15 * 1.5]]
  assert [d.split(':')[0] for d in generated.divergences(
      program, ours, peer, ())] == ['observation 2, scaled_loss',
                                    'observation 2, weights']
  assert not generated.divergences(program, ours, peer,
                                   declarations.DOCUMENTED)


def test_tf_keras_keras_file_scale_is_excused_after_the_load():
  """Pins what tf_keras's class keeps in a `.keras` file: no loss scale.

  After an overflow halved the scale to 2**14, the model's `.keras` file
  loads our TF 2.4-2.15 form at 2**14 and tf_keras's class at 2**15.
  """
  program = Program(family='tf24', inner='adam', shape='train_step',
                    file_kind='keras', restore_after=1,
                    gradients=(('overflow', 1.0), ('finite', 1.0)))
  ours = generated.run(program, 'ours', None)
  peer = generated.run(program, 'peer', None)
  assert [o['scale'] for o in ours] == [2.0 ** 14] * 2 + [2.0 ** 14]
  assert [o['scale'] for o in peer] == [2.0 ** 14, 2.0 ** 15, 2.0 ** 15]
  assert generated.divergences(program, ours, peer, ())[0].startswith(
      'observation 1, scale: ours 16384.0, peer 32768.0')
  assert not generated.divergences(program, ours, peer,
                                   declarations.DOCUMENTED)


@pytest.mark.parametrize('v2_behaviour', [True, False])
def test_a_tf1_program_restores_its_saver_file_and_trains_on(v2_behaviour):
  """The TF1 programs' restore runs: each side restores and steps again."""
  program = Program(family='tf1', shape='session', inner='adam',
                    v2_behaviour=v2_behaviour,
                    control_flow_v2=v2_behaviour, restore_after=1,
                    gradients=(('overflow', 1.0), ('finite', 1.0)))
  for side in ('ours', 'peer'):
    trace = generated.run(program, side, None)
    assert [sorted(o) for o in trace] == [
        ['variables'], ['restored', 'variables'], ['variables']], (side, trace)
    scales = [o['variables']['current_loss_scale'] for o in trace]
    steps = [o['variables']['global_step'] for o in trace]
    assert (scales, steps) == ([2.0 ** 14] * 3, [0, 0, 1]), side


def test_keras_file_of_the_installed_fixed_scale_loads_under_install_only():
  """Keras's class refuses the file without `install()`, loudly; with it, not.

  The class `install()` names writes Keras's name in a `.keras` file, and a
  fixed scale's `dynamic: False`, which Keras's class refuses.
  """
  program = Program(family='tf24', ours='installed', shape='fit',
                    built_before=False, dynamic=False, file_kind='keras',
                    restore_after=1, restore_built=False,
                    gradients=(('finite', 0.5), ('finite', 0.5)))
  without = generated.run(program, 'ours', None)
  assert without[1] == {'error': ('ValueError', ('dynamic',
                                                  'inner_optimizer'))}
  assert not generated.divergences(program, without,
                                   generated.run(program, 'peer', None),
                                   declarations.DOCUMENTED)
  program = dataclasses.replace(program, install=True)
  test_generated_programs.check(program, None, ())
