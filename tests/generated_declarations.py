"""What generated programs may observe differently from their peers, as data.

`DOCUMENTED` holds the deliberate differences, each with the section of
docs/differences.md that states it and the sentence there, quoted
(`test_generated_programs.py` checks that the sentence is in that section).
Nothing else is excused: any other difference fails, and a defect found
this way is fixed, its shrunk program kept in
`test_generated_regressions.py`.

Each entry's `applies(program, peer_trace)` returns the index of the first
observation it excuses, or None where it does not apply; from that index on,
the fields it names (`'*'`: all) are not compared.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from generated_programs import Program

Trace = List[Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Excuse:
  """A difference the comparison does not count, and why.

  Attributes:
    name: A short name, reported with the programs it excused.
    applies: `(program, peer_trace) -> first excused observation or None`.
    fields: The observations excused (`'*'` for all of them).
    anchor: The section of docs/differences.md that states it (its
      heading's anchor).
    sentence: The sentence of that section that states it, quoted.
  """
  name: str
  applies: Callable[[Program, Trace], Optional[int]]
  fields: Tuple[str, ...]
  anchor: str
  sentence: str


def observation_of_step(program: Program, step: int) -> int:
  """The index of the observation after `step`, counting the restore's."""
  restored = program.restore_after is not None and step >= program.restore_after
  return step + (1 if restored else 0)


def _first_step(program: Program, kinds: Tuple[str, ...]) -> Optional[int]:
  for step, (kind, _) in enumerate(program.gradients):
    if kind in kinds:
      return observation_of_step(program, step)
  return None


def _keras(program: Program) -> bool:
  return program.family in ('keras3', 'tf24')


def _tf_keras_peer(program: Program) -> bool:
  return program.family in ('tf24', 'tf23')


def _first_replica_only(program: Program, _: Trace) -> Optional[int]:
  if (program.family != 'keras3' or program.replicas != 2 or
      program.replica != 1):
    return None
  return _first_step(program, ('overflow', 'inf', 'nan'))


def _peer_scale_below_one(program: Program, peer: Trace) -> Optional[int]:
  if program.family != 'keras3' or program.ours != 'form':
    return None
  for i, observation in enumerate(peer):
    if observation.get('scale', 1.0) < 1.0:
      return i
  return None


def _grappler_reassociates(program: Program, _: Trace) -> Optional[int]:
  # A finite float16 gradient of 2 overflows too, once scaled by 2**15.
  if (not _tf_keras_peer(program) or program.shape == 'eager' or
      program.dtype != 'float16'):
    return None
  return 0


def _grappler_folds_a_fixed_scale(program: Program, _: Trace
                                  ) -> Optional[int]:
  # A fixed scale and its reciprocal are constants of tf_keras's graph.
  if (not _tf_keras_peer(program) or program.dynamic or
      program.shape in ('eager', 'jit')):
    return None
  return _first_step(program, ('overflow',))


def _keras_builds_in_a_replica_function(program: Program, _: Trace
                                        ) -> Optional[int]:
  if program.family != 'keras3' or program.shape not in (
      'mirrored', 'mirrored_two_runs'):
    return None
  if not program.built_before:
    return 0
  if program.restore_after is not None and not program.restore_built:
    return program.restore_after
  return None


def _keras_traced_its_initial_scale(program: Program, peer: Trace
                                    ) -> Optional[int]:
  # Keras's unbuilt class multiplies by `initial_scale` in the trace of the
  # gradients, which outlives the build: wrong once the scale has moved.
  if (program.family != 'keras3' or program.shape != 'split_traced_gradients'
      or program.built_before):
    return None
  for i, observation in enumerate(peer):
    # (The last observation is an error's, with no scale, if a step raised.)
    if observation.get('scale', program.scale0) != program.scale0:
      return i + 1
  return None


def _keras_restored_unbuilt(program: Program, _: Trace) -> Optional[int]:
  # The restored scale reaches Keras's variable only when it is built.
  if (program.family != 'keras3' or program.restore_after is None or
      program.restore_built):
    return None
  return program.restore_after


def _restore_observation(program: Program) -> int:
  """The index of the restore's observation (`fit` observes once a call)."""
  return -(-program.restore_after // program.steps_per_execution)


def _fit_uncounted_skip(program: Program, _: Trace) -> Optional[int]:
  # Keras 3's `fit` counts only applied steps, of this class too; tf_keras's
  # counts skipped ones (Adam's bias correction and a schedule read it).
  if program.family != 'tf24' or program.shape not in ('fit', 'fit_mirrored'):
    return None
  if program.dtype != 'float32':
    return 0  # A finite float16 gradient may overflow too, once scaled.
  for step, (kind, _) in enumerate(program.gradients):
    if kind != 'finite':  # The first step that may be skipped (`fit`
      # observes once a call, restored or not).
      calls = step // program.steps_per_execution
      restored = (program.restore_after is not None and
                  step >= program.restore_after)
      return calls + (1 if restored else 0)
  return None


def _tf_keras_file_drops_the_scale(program: Program, _: Trace
                                   ) -> Optional[int]:
  # tf_keras's class keeps no loss scale in a `.keras` file; ours on Keras 3
  # (TF 2.4-2.15's form, TF 2.3's that `compile` wrapped) keeps it.
  on_keras3 = program.family == 'tf24' or program.policy_loss_scale
  if (not on_keras3 or program.file_kind != 'keras' or
      program.restore_after is None):
    return None
  return _restore_observation(program)


def _keras2_model_file(program: Program, _: Trace) -> Optional[int]:
  # tf_keras's class around a non-legacy optimizer loads no state of `.h5`.
  if (program.family != 'tf23' or program.file_kind != 'h5' or
      program.keras2_legacy or program.restore_after is None):
    return None
  return _restore_observation(program)


def _keras_loads_the_installed_fixed_scale(program: Program, _: Trace
                                           ) -> Optional[int]:
  # The file names Keras's class, which refuses a fixed scale.
  if (program.family != 'tf24' or program.ours != 'installed' or
      program.install or program.dynamic or program.file_kind != 'keras' or
      program.restore_after is None):
    return None
  return _restore_observation(program)


DOCUMENTED = (
    Excuse(
        name='keras_checks_the_first_replica',
        applies=_first_replica_only, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="Keras 3's own `LossScaleOptimizer` trusts the first "
                 "replica's check on its own gradients, so both are applied "
                 "(the weights become inf)."),
    Excuse(
        name='scale_floor_of_one',
        applies=_peer_scale_below_one, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="The Keras 3 form keeps TensorFlow's rule: the scale never "
                 "falls below 1 and never grows to inf (Keras 3's may do "
                 "both)."),
    Excuse(
        name='tf_keras_reassociates_float16_in_a_function',
        applies=_grappler_reassociates, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="In a `tf.function` with float16 gradients, tf_keras's class "
                 "may apply a step it skips eagerly"),
    Excuse(
        name='tf_keras_folds_a_fixed_scale_in_a_function',
        applies=_grappler_folds_a_fixed_scale, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence='With a fixed scale the same folding happens in float32: a '
                 "gradient that overflows once scaled comes out of tf_keras's "
                 'class finite in a `tf.function`, and inf eagerly and under '
                 "XLA; this class's is inf in all three."),
    Excuse(
        name='keras_class_first_applied_in_a_replica_function',
        applies=_keras_builds_in_a_replica_function, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence='Under `MirroredStrategy`, variables made inside a running '
                 'function are never initialised ("You must feed a value for '
                 "placeholder tensor ...\"), which is what Keras 3's own "
                 'class (or a momentum SGD) meets when first applied there.'),
    Excuse(
        name='keras_traces_its_initial_scale_unbuilt',
        applies=_keras_traced_its_initial_scale, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="Keras's class, unbuilt, scales a loss traced in a "
                 '`tf.function` by its initial scale for as long as the trace '
                 'lives (its scale variable does not exist yet), so the steps '
                 'after the first overflow go wrong.'),
    Excuse(
        name='keras_restored_unbuilt_scales_by_its_initial_scale',
        applies=_keras_restored_unbuilt, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence='Restored into while unbuilt, it scales the losses before '
                 'its build by its initial scale too (the restored scale '
                 'reaches its variable at the build) and unscales them by '
                 'the restored one.'),
    Excuse(
        name='keras3_fit_counts_applied_steps',
        applies=_fit_uncounted_skip, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="So `fit`, which follows Keras 3's protocol, counts only "
                 'applied steps: TF 2.4-2.15 code that fits with this class '
                 'counted its skipped steps on TF 2.15 and does not on Keras '
                 '3,'),
    Excuse(
        name='tf_keras_keeps_no_scale_in_a_keras_file',
        applies=_tf_keras_file_drops_the_scale, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence='`.keras` files hold its scale and counter, where '
                 "tf_keras's class keeps neither in its own: loaded, it "
                 'starts again from its initial scale.'),
    Excuse(
        name='keras2_model_files_keep_the_inner_optimizer',
        applies=_keras2_model_file, fields=('*',),
        anchor='tf-20-23-keras',
        sentence="Around tf_keras's optimizers, a model's `.h5` and `.keras` "
                 "files keep what tf_keras keeps of the bare inner "
                 'optimizer, so the loss scale loads afresh, as from TF '
                 "2.3's `.h5` files; tf_keras's own class around its "
                 'non-legacy optimizers loads none of its state from an '
                 '`.h5` file (it warns and starts afresh).'),
    Excuse(
        name='keras_refuses_a_fixed_scale_file_without_install',
        applies=_keras_loads_the_installed_fixed_scale, fields=('*',),
        anchor='where-this-library-deliberately-differs',
        sentence="with a fixed scale, only under `install()`: Keras's class "
                 'refuses its `dynamic: False` with a ValueError.'),
)
