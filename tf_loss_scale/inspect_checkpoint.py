"""Finds the loss scale state held in a checkpoint, whoever wrote it.

Reads `tf.compat.v1.train.Saver` checkpoints, `tf.train.Checkpoint`
checkpoints and `.keras` files (Keras 3, and Keras 2.12 to 2.15), and reports
every pair of the `LAYOUTS` found, with this library's option counters.
"""

import dataclasses
import importlib
import io
import json
import os
import re
import zipfile
from typing import Any, Dict, List, Tuple

import tensorflow as tf

# (scale variable, good-steps variable) -> the classes that use those names.
LAYOUTS = {
    ('current_loss_scale', 'good_steps'):
        'current_loss_scale + good_steps (tf_loss_scale / TensorFlow '
        'LossScale, Keras 2 LossScaleOptimizer)',
    ('dynamic_scale', 'step_counter'):
        'dynamic_scale + step_counter (Keras 3 LossScaleOptimizer)',
}

# Counters that this library's DynamicLossScale saves when an option is on.
OPTION_COUNTERS = ('non_finite_streak', 'skips_at_floor')

_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
_VALUE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


class CheckpointError(Exception):
  """A checkpoint is missing, unreadable or corrupt."""


@dataclasses.dataclass(frozen=True)
class LossScaleState:
  """One loss scale's state as found in a checkpoint.

  Attributes:
    owner: Where the state sits in the checkpoint (a name scope, an object
      path, or a Keras optimizer's name); '' for the top level.
    scale, good_steps: The current loss scale and good-step count.
    layout: Which variable names held them (a value of `LAYOUTS`).
    variables: The checkpoint keys of the scale, the good-step count and
      any option counters.
    counters: `(name, value)` of each of `OPTION_COUNTERS` found.
  """
  owner: str
  scale: float
  good_steps: int
  layout: str
  variables: Tuple[str, ...] = ()
  counters: Tuple[Tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Inspection:
  """What `inspect` found: the file read (`path`), the kind of checkpoint
  (`kind`) and every loss scale state found (`states`, possibly none)."""
  path: str
  kind: str
  states: List[LossScaleState]


def inspect(path: str) -> Inspection:
  """Reads the loss scale state out of a checkpoint into an `Inspection`.

  Args:
    path: A `.keras` file, a checkpoint prefix (such as `ckpt-1`), or a
      directory holding a `checkpoint` file that names the latest one.

  Raises:
    CheckpointError: If nothing readable is at `path`.
  """
  if zipfile.is_zipfile(path) or path.endswith('.keras'):
    return _inspect_keras_file(path)
  prefix = path
  if os.path.isdir(path):
    prefix = tf.train.latest_checkpoint(path)
    if prefix is None:
      raise CheckpointError(f'no checkpoint found in directory {path}')
  try:
    reader = tf.train.load_checkpoint(prefix)
    values = {key: reader.get_tensor(key)
              for key in reader.get_variable_to_shape_map()}
  except (tf.errors.OpError, ValueError, OSError) as error:
    raise _error(f'cannot read checkpoint {path}', error) from error
  if _OBJECT_GRAPH_KEY in values:
    kind = 'object-based checkpoint (tf.train.Checkpoint)'
    names = {key[:-len(_VALUE_SUFFIX)]: value for key, value in values.items()
             if key.endswith(_VALUE_SUFFIX)}
  else:
    kind = 'name-based checkpoint (tf.compat.v1.train.Saver)'
    names = values
  return Inspection(prefix, kind, _states_by_name(names))


def format_inspection(inspection: Inspection) -> str:
  """Describes an `Inspection` in a few lines of text (no final newline)."""
  lines = [f'{inspection.path}: {inspection.kind}']
  if not inspection.states:
    lines.append('  no loss scale state found (a fixed loss scale, no loss '
                 'scaling, and Keras 2\'s LossScaleOptimizer in a .keras '
                 'file save none)')
  for state in inspection.states:
    lines.append(f'  {state.owner or "(top level)"}:')
    for label, value in [
        ('current loss scale', f'{state.scale:g}'),
        ('good steps', state.good_steps), ('layout', state.layout),
        ('variables', ', '.join(state.variables)), *state.counters]:
      lines.append(f'    {label.replace("_", " ") + ":":<20}{value}')
  return '\n'.join(lines)


def _states_by_name(values: Dict[str, object]) -> List[LossScaleState]:
  """Pairs scale and good-steps values that share a parent path and suffix
  (`good_steps_1`: a TF1 graph's second loss scale). Option counters sit
  under the scale's key (Saver) or next to it (object based)."""
  states = []
  for key in sorted(values):
    parent, _, leaf = key.rpartition('/')
    for (scale_name, steps_name), layout in LAYOUTS.items():
      match = re.fullmatch(re.escape(scale_name) + r'(_\d+)?', leaf)
      if not match:
        continue
      steps_key = _join(parent, steps_name + (match.group(1) or ''))
      if steps_key not in values:
        continue
      names = [key, steps_key]
      counters = []
      for counter in OPTION_COUNTERS:
        candidates = [f'{key}/{counter}']
        if parent and not match.group(1):
          candidates.append(_join(parent, counter))
        found = [c for c in candidates if c in values]
        if found:
          names.append(found[0])
          counters.append((counter, int(values[found[0]])))
      states.append(LossScaleState(parent, float(values[key]),
                                   int(values[steps_key]), layout,
                                   tuple(names), tuple(counters)))
  return states


def _join(parent: str, name: str) -> str:
  return f'{parent}/{name}' if parent else name


def _inspect_keras_file(path: str) -> Inspection:
  try:
    with zipfile.ZipFile(path) as archive:
      config = json.loads(archive.read('config.json'))
      weights = archive.read('model.weights.h5')
      metadata = json.loads(archive.read('metadata.json'))
  except (OSError, zipfile.BadZipFile, KeyError, ValueError) as error:
    raise _error(f'cannot read Keras file {path}', error) from error
  # The Keras family that wrote it, from the version it recorded.
  family = str(metadata.get('keras_version', '3')).split('.')[0]
  kind = f'Keras {family} .keras file'
  optimizer_config = (config.get('compile_config') or {}).get('optimizer')
  if not optimizer_config:
    return Inspection(path, kind, [])
  stored = _read_optimizer_values(path, weights)
  if not stored:  # Saved before the optimizer was built.
    return Inspection(path, kind, [])
  names = _optimizer_variable_names(path, optimizer_config, family)
  if len(stored) < len(names):
    raise CheckpointError(
        f'cannot read Keras file {path}: its optimizer stores {len(stored)} '
        f'variables but its config builds at least {len(names)}')
  owner = optimizer_config.get('config', {}).get('name', '')
  return Inspection(path, kind, _states_by_name(
      {f'{owner}/{name}': value for name, value in zip(names, stored)}))


def _optimizer_variable_names(path: str, optimizer_config: dict,
                              family: str) -> List[str]:
  """Names of an optimizer's own variables, in the order Keras saves them
  (by position only): built with no model variables, it names the leading
  ones, a wrapper's own first."""
  keras_module = _keras_of_family(path, family)
  try:
    optimizer = keras_module.optimizers.deserialize(optimizer_config)
    optimizer.build([])
    variables = optimizer.variables
  except (AttributeError, TypeError, ValueError) as error:
    raise _error(f'cannot rebuild the optimizer of Keras file {path}',
                 error) from error
  return [_leaf_name(variable) for variable in variables]


def _keras_of_family(path: str, family: str) -> Any:
  """The installed Keras of a family ('2' or '3'), its file classes known."""
  # Importing the library's Keras modules registers their file classes.
  for module in ('keras3', 'experimental'):
    try:
      importlib.import_module(f'tf_loss_scale.keras.{module}')
    except (AttributeError, ImportError):
      pass  # Not a Keras this form runs on: its classes cannot be in use.
  from tf_loss_scale.keras.shared import families  # pylint: disable=g-import-not-at-top
  try:
    return families.namespace_for(
        families.KERAS2 if family == '2' else families.KERAS3)
  except ImportError as error:
    raise _error(f'cannot rebuild the optimizer of Keras {family} file {path}',
                 error) from error


def _read_optimizer_values(path: str, weights: bytes) -> List[object]:
  import h5py  # pylint: disable=g-import-not-at-top
  try:
    with h5py.File(io.BytesIO(weights), 'r') as store:
      group = store.get('optimizer/vars')
      if group is None:
        return []
      return [group[str(i)][()] for i in range(len(group))]
  except (OSError, KeyError, ValueError) as error:
    raise _error(f'cannot read Keras file {path}', error) from error


def _leaf_name(variable: object) -> str:
  name = getattr(variable, 'path', None) or variable.name
  return name.split(':')[0].rpartition('/')[2]


def _error(what: str, error: BaseException) -> CheckpointError:
  """`what` failed, with the first line of `error`."""
  text = str(error).strip() or type(error).__name__
  return CheckpointError(f'{what}: {text.splitlines()[0]}')
