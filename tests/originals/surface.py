"""Compares this library's public members with the originals' recorded ones.

The originals' members come from `enumerate_originals.py` (JSON written by
each original TensorFlow, `.ci/logs/originals/` by default, or the directory
in TF_LOSS_SCALE_ORIGINALS); ours are read here, the same way
(`members.public_members`), from instances after one step. Each original
member is `same` when ours has it with the same kind and accepts the same
parameters; otherwise it needs a reason in `surface_reasons.txt`.

    python tests/originals/surface.py         # writes docs/surface.md
    python tests/originals/surface.py --check  # exits 1 if it is stale

Run from the checkout's root with TensorFlow 2.21 and Keras 3.
"""

import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import members  # pylint: disable=g-import-not-at-top,wrong-import-position

ORIGINALS = ('1.15', '2.3', '2.15')
REASONS = os.path.join(HERE, 'surface_reasons.txt')
DOC = os.path.join(ROOT, 'docs', 'surface.md')

# Which of ours each original subject is compared with.
OURS = {
    'experimental.LossScaleOptimizer':
        'tf_loss_scale.keras.experimental.LossScaleOptimizer',
    'mixed_precision.LossScaleOptimizer(legacy optimizer)':
        'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer',
    'mixed_precision.LossScaleOptimizer(TF 2.11+ optimizer)':
        'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer',
    'MixedPrecisionLossScaleOptimizer':
        'tf_loss_scale.MixedPrecisionLossScaleOptimizer',
    'LossScale': 'tf_loss_scale.LossScale',
    'FixedLossScale': 'tf_loss_scale.FixedLossScale',
    'DynamicLossScale': 'tf_loss_scale.DynamicLossScale',
    'contrib.LossScaleManager':
        'tf_loss_scale.contrib.mixed_precision.LossScaleManager',
    'contrib.FixedLossScaleManager':
        'tf_loss_scale.contrib.mixed_precision.FixedLossScaleManager',
    'contrib.ExponentialUpdateLossScaleManager':
        'tf_loss_scale.contrib.mixed_precision.'
        'ExponentialUpdateLossScaleManager',
    'contrib.LossScaleOptimizer':
        'tf_loss_scale.contrib.mixed_precision.LossScaleOptimizer',
}
# Every graph rewrite function's path maps to ours of the same name (the one
# `compat.install()` puts at those paths).
REWRITE_MODULE = 'tf_loss_scale.graph_rewrite'

Key = Tuple[str, str, str]  # generation, subject, member


def originals_dir() -> str:
  return os.environ.get('TF_LOSS_SCALE_ORIGINALS',
                        os.path.join(ROOT, '.ci', 'logs', 'originals'))


def missing_originals(directory: Optional[str] = None) -> List[str]:
  """The originals' JSON files absent from `directory`."""
  directory = directory or originals_dir()
  return [f'members-tf{version}.json' for version in ORIGINALS
          if not os.path.exists(os.path.join(directory,
                                             f'members-tf{version}.json'))]


def load_originals(directory: Optional[str] = None) -> List[Dict[str, Any]]:
  directory = directory or originals_dir()
  return [json.load(open(os.path.join(directory, f'members-tf{version}.json')))
          for version in ORIGINALS]


def _step(opt, var) -> None:
  """One scaled step (loss var * var), as the originals were given."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.GradientTape() as tape:
    loss = opt.get_scaled_loss(var * var)
  grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
  opt.apply_gradients(zip(grads, [var]))


def ours() -> Dict[str, Any]:
  """{our class or function path: it}, each object after one step."""
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf
  import tf_loss_scale
  from tf_loss_scale import graph_rewrite
  from tf_loss_scale.keras import experimental, mixed_precision
  # pylint: enable=g-import-not-at-top
  made = {}
  opt = experimental.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9), 'dynamic')
  _step(opt, keras.Variable(1.0))
  made[OURS['experimental.LossScaleOptimizer']] = opt
  opt = mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.1, momentum=0.9))
  _step(opt, keras.Variable(1.0))
  made['tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'] = opt
  var = tf.Variable(1.0)
  opt = tf_loss_scale.MixedPrecisionLossScaleOptimizer(
      tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), 'dynamic')
  opt.minimize(lambda: var * var, var_list=[var])
  made['tf_loss_scale.MixedPrecisionLossScaleOptimizer'] = opt
  fixed = tf_loss_scale.FixedLossScale(128.0)
  dynamic = tf_loss_scale.DynamicLossScale()
  for loss_scale in (fixed, dynamic):
    loss_scale.update([tf.constant(1.0)])
  made['tf_loss_scale.LossScale'] = tf_loss_scale.LossScale
  made['tf_loss_scale.FixedLossScale'] = fixed
  made['tf_loss_scale.DynamicLossScale'] = dynamic
  for name in ('enable_mixed_precision_graph_rewrite',
               'disable_mixed_precision_graph_rewrite'):
    made[f'{REWRITE_MODULE}.{name}'] = getattr(graph_rewrite, name)
  made.update(_contrib())
  return made


def _contrib() -> Dict[str, Any]:
  """Ours of `tf.contrib.mixed_precision`, after one step in a TF1 graph."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.contrib import mixed_precision  # pylint: disable=g-import-not-at-top
  v1 = tf.compat.v1
  with tf.Graph().as_default():
    var = v1.Variable(1.0)
    managers = (mixed_precision.FixedLossScaleManager(128.0),
                mixed_precision.ExponentialUpdateLossScaleManager(2.0**15, 2))
    opts = [mixed_precision.LossScaleOptimizer(
        v1.train.MomentumOptimizer(0.1, 0.9), manager) for manager in managers]
    steps = [opt.minimize(var * var) for opt in opts]
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      session.run(steps)
  path = 'tf_loss_scale.contrib.mixed_precision.'
  return {path + 'LossScaleManager': mixed_precision.LossScaleManager,
          path + 'FixedLossScaleManager': managers[0],
          path + 'ExponentialUpdateLossScaleManager': managers[1],
          path + 'LossScaleOptimizer': opts[1]}


_POSITIONAL = ('POSITIONAL_ONLY', 'POSITIONAL_OR_KEYWORD')


def _kind(param: List[str]) -> str:
  return param[1].rstrip('=')


def parameter_difference(original: Optional[List[List[str]]],
                         mine: Optional[List[List[str]]]) -> Optional[str]:
  """Why a call the original accepts could fail on ours, or None."""
  if original is None or mine is None:
    return None  # No signature to read (a builtin): nothing to compare.
  kinds = {_kind(p) for p in mine}
  forwards = {'VAR_POSITIONAL', 'VAR_KEYWORD'} <= kinds
  names = {p[0]: p for p in mine}
  mine_positional = [p[0] for p in mine if _kind(p) in _POSITIONAL]
  problems = []
  position = 0
  for name, kind in original:
    kind, has_default = kind.rstrip('='), kind.endswith('=')
    if kind in ('VAR_POSITIONAL', 'VAR_KEYWORD'):
      if kind not in kinds:
        star = '*args' if kind == 'VAR_POSITIONAL' else '**kwargs'
        problems.append(f'no {star}')
      continue
    if kind in _POSITIONAL:
      if (position >= len(mine_positional) or
          mine_positional[position] != name) and not forwards:
        problems.append(f'`{name}` not parameter {position + 1}')
      position += 1
    elif name not in names and 'VAR_KEYWORD' not in kinds:
      problems.append(f'no `{name}`')
    if (has_default and name in names and not names[name][1].endswith('=')
        and _kind(names[name]) != 'VAR_POSITIONAL'):
      problems.append(f'`{name}` required')
  original_names = {p[0] for p in original}
  for name, kind in mine:
    if (name not in original_names and not kind.endswith('=') and
        kind not in ('VAR_POSITIONAL', 'VAR_KEYWORD')):
      problems.append(f'`{name}` required here')
  return '; '.join(problems) or None


_VALUE_KINDS = {'property', 'attribute'}


def difference(original: Dict[str, Any],
               mine: Optional[Dict[str, Any]]) -> Optional[str]:
  """How our member differs from the original's, or None if the same.

  Property and attribute count as one kind (a program reads and assigns
  both alike); a method and a value do not, nor a value that can be called
  and one that cannot.
  """
  if mine is None:
    return 'absent'
  kinds = {original['kind'], mine['kind']}
  if original['kind'] != mine['kind'] and not kinds <= _VALUE_KINDS:
    return f'a {mine["kind"]} here, a {original["kind"]} there'
  if original['callable'] != mine['callable']:
    return ('callable here, not there' if mine['callable'] else
            'callable there, not here')
  if original['callable']:
    return parameter_difference(original.get('parameters'),
                                mine.get('parameters'))
  return None


def compare(originals: List[Dict[str, Any]],
            mine: Dict[str, Any]) -> List[Dict[str, Any]]:
  """One row per original member: where it is ours, and how it differs."""
  rows = []
  for record in originals:
    for subject, described in sorted(record['subjects'].items()):
      ours_path = OURS[subject]
      for member, original in sorted(described['members'].items()):
        rows.append({
            'generation': described['generation'], 'subject': subject,
            'original': described['public'], 'ours': ours_path,
            'member': member,
            'difference': difference(original,
                                     members.member(mine[ours_path], member))})
    for path, described in sorted(record['functions'].items()):
      name = path.rsplit('.', 1)[1]
      rows.append({
          'generation': described['generation'],
          'subject': path.rsplit('.', 1)[0], 'original': path,
          'ours': f'{REWRITE_MODULE}.{name}', 'member': name,
          'difference': difference(described['function'],
                                   members.function(
                                       mine[f'{REWRITE_MODULE}.{name}']))})
  return rows


def load_reasons(path: str = REASONS) -> Dict[Key, str]:
  """{(generation, subject, member): reason} from the hand-kept file."""
  reasons = {}
  with open(path) as lines:
    for number, line in enumerate(lines, 1):
      line = line.strip()
      if not line or line.startswith('#'):
        continue
      parts = [part.strip() for part in line.split('|')]
      if len(parts) != 4 or not all(parts):
        raise ValueError(f'{path}:{number}: expected "generation | subject | '
                         f'member | reason", got {line!r}')
      reasons[tuple(parts[:3])] = parts[3]
  return reasons


def unexplained(rows, reasons) -> List[str]:
  """Differences without a reason."""
  return [f'{r["generation"]} | {r["subject"]} | {r["member"]} | '
          f'({r["difference"]})'
          for r in rows if r['difference'] and
          (r['generation'], r['subject'], r['member']) not in reasons]


def stale(rows, reasons) -> List[str]:
  """Reasons for members that are the same (or no longer recorded)."""
  different = {(r['generation'], r['subject'], r['member'])
               for r in rows if r['difference']}
  return [' | '.join(key) for key in reasons if key not in different]


def _major_minor(version: str) -> str:
  return '.'.join(version.split('.')[:2])


def render(originals, rows, reasons) -> str:
  """docs/surface.md's text."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  lines = [
      '# Public members against the originals',
      '',
      '<!-- Generated by tests/originals/surface.py from the members the',
      'original TensorFlows list (tests/originals/enumerate_originals.py) and',
      'the reasons in tests/originals/surface_reasons.txt. Do not edit. -->',
      '',
      'Every public member of an instance of each original class after one',
      'training step (and each graph rewrite function), as the original',
      'TensorFlow lists it (' + ', '.join(
          f'TensorFlow {r["tensorflow"]}' for r in originals) + '), looked',
      f'up on this library (TensorFlow {_major_minor(tf.__version__)}, '
      f'Keras {keras.__version__.split(".")[0]}). **same**:',
      'ours has it with the same kind (method, or a value: property or',
      'attribute; callable or not) and accepts every call the original',
      'accepts (its parameters by name and position). Otherwise the row says',
      'how ours differs and why.',
  ]
  current = None
  for row in rows:
    if row['subject'] in OURS:
      title = f'`{row["original"]}`'
      if '(' in row['subject']:  # which inner optimizer it wrapped
        title += ' around a ' + row['subject'].split('(')[1].rstrip(')')
      heading = (row['generation'], title, row['ours'])
    else:  # the graph rewrite functions, one section per module
      heading = (row['generation'], f'`{row["subject"]}`', REWRITE_MODULE)
    if heading != current:
      current = heading
      lines += ['', f'## {heading[0]}: {heading[1]}', '',
                f'Ours: `{heading[2]}`.', '',
                '| member | generation | same / why not |',
                '| --- | --- | --- |']
    key = (row['generation'], row['subject'], row['member'])
    verdict = ('same' if not row['difference'] else
               f'{row["difference"]}; why: '
               f'{reasons.get(key, "(no reason given)")}')
    lines.append(f'| `{row["member"]}` | {row["generation"]} | {verdict} |')
  return '\n'.join(lines) + '\n'


def main(argv: List[str]) -> int:
  absent = missing_originals()
  if absent:
    print(f'no {", ".join(absent)} in {originals_dir()}: run '
          'tests/originals/enumerate_originals.py with each original',
          file=sys.stderr)
    return 2
  originals = load_originals()
  rows = compare(originals, ours())
  reasons = load_reasons()
  problems = ([f'no reason for: {line}' for line in unexplained(rows, reasons)]
              + [f'reason for a member that is the same: {line}'
                 for line in stale(rows, reasons)])
  for problem in problems:
    print(problem, file=sys.stderr)
  text = render(originals, rows, reasons)
  if argv[1:] == ['--check']:
    with open(DOC) as doc:
      if doc.read() != text:
        print(f'{DOC} is stale: run python tests/originals/surface.py',
              file=sys.stderr)
        return 1
    return 1 if problems else 0
  with open(DOC, 'w') as doc:
    doc.write(text)
  print(f'wrote {DOC}')
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
