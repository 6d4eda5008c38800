"""What `tf-loss-scale run` reads from a program's code, without running it.

`read()`: the names the syntax trees of the program and of its folder's
modules it imports use, resolved through every import (guarded, in a
function, under any alias); `generation()`: what they were written for;
`report()`: what `run` gives them (`--check`) and what it cannot serve.
"""

import ast
import os
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

from tf_loss_scale import run_setup


class Name(NamedTuple):
  full: str  # 'tensorflow.placeholder'; for a string, the string
  written: str  # 'tf.placeholder'
  where: str  # 'line 19', or 'line 3 of helper.py'


class Generation(NamedTuple):
  tf: Optional[str] = None  # '1', '1.15', '2.3'
  keras: Optional[str] = None  # '3'
  reason: Optional[str] = None  # 'tf.placeholder on line 19'


_MARKER = re.compile(r'^# tf-loss-scale: --tf (\S+)', re.MULTILINE)
# What tells each generation, in this order (searched in resolved names).
_RULES = (
    (Generation('1'), r'^tensorflow\.(Session|InteractiveSession|placeholder|'
     r'get_variable|global_variables_initializer|ConfigProto|contrib|'
     r'train\.\w*Optimizer|keras\.backend\.get_session)\b'),
    (Generation('1.15'), r'^tensorflow\.compat\.v2\.enable_v2_behavior$'),
    (Generation('2.3'), r'^tensorflow\.(compat\.v2\.)?train\.experimental'
     r'\.enable_mixed_precision_graph_rewrite$|mixed_precision\.experimental'),
    (Generation(keras='3'), r'^(tensorflow\.)?keras\.(optimizers\.'
     r'LossScaleOptimizer|ops)\b|(^|\.)scale_loss$|\.weights\.h5$'),
)
# A loss scaling name old code used, and what `run` gives under it.
_SERVED = (
    (r'\bMixedPrecisionLossScaleOptimizer$',
     'tf_loss_scale.MixedPrecisionLossScaleOptimizer'),
    (r'\benable_mixed_precision_graph_rewrite$',
     "tf_loss_scale's graph rewrite, wrapping with the library's classes"),
    (r'\b(Dynamic|Fixed)LossScale$', 'tf_loss_scale.{}'),
    (r'\bmixed_precision\.experimental\b', 'tf_loss_scale.keras.experimental '
     '(LossScaleOptimizer, Policy, set_policy)'),
)
# TF 2.4-2.15's class, where the program does not name TF 2.3's.
_TF24 = r'\bmixed_precision\.LossScaleOptimizer$'


def read(program: str) -> Tuple[List[Name], Optional[Generation]]:
  """The names `program` and its folder's modules it imports use.

  Returns:
    The names, in the program's order, its modules' after; and the
    generation a `# tf-loss-scale: --tf VERSION` line says, if any.
  """
  queue, names = [os.path.realpath(program)], []  # Python's sys.path[0]
  folder = os.path.dirname(queue[0])
  for path in queue:  # longer as modules are found
    with open(path, encoding='utf-8', errors='replace') as f:
      source = f.read()
    if path == queue[0]:
      of, marker = '', _MARKER.search(source)
    else:
      of = f' of {os.path.relpath(path, folder)}'
    try:
      found, imported = _names(ast.parse(source), of)
    except (SyntaxError, ValueError):
      continue  # Python says what is wrong when it runs.
    names += found
    queue += [p for p in (_local(folder, m) for m in imported)
              if p and p not in queue]
  return names, marker and Generation(
      marker.group(1), reason=f'its "{marker.group(0)}" line')


def generation(names: List[Name]) -> Generation:
  """The generation the first telling name says, by `_RULES`' order."""
  for told, rule in _RULES:
    for name in names:
      if re.search(rule, name.full):
        return told._replace(reason=f'{name.written} on {name.where}')
  return Generation()


def report(names: List[Name], settings: Dict[str, object],
           reason: Optional[str],
           tf_installed: Tuple[int, ...]) -> Tuple[List[str], List[str]]:
  """What the program gets under `settings`, and what `run` cannot serve.

  Args:
    names: As `read()` gives them.
    settings: As for `run_setup.apply`.
    reason: What told the program's generation, when it was read.
    tf_installed: The installed TensorFlow, `(2, N)`.

  Returns:
    `(lines, warnings)`, lists of sentences.
  """
  version = run_setup.generation(settings['tf'])
  told = f' (read from {reason})' if reason else ''
  lines = [('Keras 3: tf.keras and keras are Keras 3' if settings['keras'] ==
            '3' else 'Keras 2: tf.keras, tensorflow.keras, keras and keras.* '
            'are tf_keras (TF_USE_LEGACY_KERAS=1)' if settings['alias'] else
            'Keras 2: tf.keras and keras are the Keras 2 TensorFlow ships') +
           ('' if settings['tf'] else told)]
  lines += [f'TensorFlow {settings["tf"]}{told}'] * bool(settings['tf'])
  tf1 = version is not None and version[0] == 1
  if tf1:
    lines.append('import tensorflow gives tensorflow.compat.v1, v2 behaviour '
                 "disabled; tf.keras is Keras 2's v1 API; the experimental "
                 "form's iterations count applied steps (as TF 1.15's)")
  if version and version <= run_setup.LAST_LEGACY_OPTIMIZERS:
    lines.append("tf.keras.optimizers.SGD, Adam, ... are tf_keras's legacy "
                 'optimizers (OptimizerV2), as TensorFlow 2.10 and before had')
  tf24 = ('tf_loss_scale.keras.mixed_precision.LossScaleOptimizer' if
          settings['keras'] == '3' else
          "Keras 2's own class (compat.install() leaves it)")
  served = _SERVED + ((_TF24, tf24),) * (
      not any(re.search(_SERVED[3][0], n.full) for n in names))
  refused = (
      (r'^tensorflow\.contrib\b', run_setup.CONTRIB_MESSAGE, True),
      (r'^tensorflow\.(compat\.v1\.)?estimator\b', run_setup.ESTIMATOR_MESSAGE,
       tf_installed >= (2, 16)),
      (_RULES[0][1], "a name of TensorFlow 1's: pass --tf 1", not tf1))
  used, warnings, seen = [], [], set()
  for name in [n for n in names if not (n.full in seen or seen.add(n.full))]:
    given = [given.format(name.full.split('.')[-1]) for pattern, given
             in served if re.search(pattern, name.full)]
    contrib = re.match(r'tensorflow\.contrib\.?(\w*)', name.full)
    if contrib:
      module = run_setup.CONTRIB_SERVED.get(contrib.group(1))
      given = [module] if tf1 and run_setup.served(module) else []
    at = f'{name.where}: {name.written}: '
    used += [f'  {at}{g}' for g in given[:1]]
    warnings += [at + message for pattern, message, applies in refused
                 if applies and not given and re.search(pattern, name.full)]
  lines.append('compat.install(override=True) runs; of the loss scaling '
               'names it serves, the program uses ' +
               ('these:' if used else 'none'))
  lines += used
  lines.append('child processes of this Python (multiprocessing, '
               'sys.executable) are set up the same way; other Pythons not')
  return lines, warnings


def _names(tree: ast.AST, of: str) -> Tuple[List[Name], List[str]]:
  """The names a module uses (see `read`), and the modules it imports."""
  bound, names, imported = {}, [], []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        bound[alias.asname or alias.name.split('.')[0]] = (
            alias.name if alias.asname else alias.name.split('.')[0])
        names.append(Name(alias.name, alias.name, f'line {node.lineno}{of}'))
        imported.append(alias.name)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        bound[alias.asname or alias.name] = full
        names.append(Name(full, full, f'line {node.lineno}{of}'))
        imported += [node.module, full]
  inner = {id(node.value) for node in ast.walk(tree)
           if isinstance(node, ast.Attribute)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and str(node.value).endswith(
        '.weights.h5'):
      names.append(Name(node.value, repr(node.value),
                        f'line {node.lineno}{of}'))
    elif isinstance(node, (ast.Attribute, ast.Name)) and id(node) not in inner:
      written = _dotted(node)
      if written:
        root, _, rest = written.partition('.')
        full = '.'.join(filter(None, (bound.get(root, root), rest)))
        if root in bound or full.endswith('.scale_loss'):
          names.append(Name(full, written, f'line {node.lineno}{of}'))
  return sorted(names, key=lambda n: int(n.where.split()[1])), imported


def _dotted(node: ast.AST) -> Optional[str]:
  """`a.b.c` for the expression `a.b.c`; None if it is not rooted at a name."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return '.'.join([node.id] + parts[::-1]) if isinstance(
      node, ast.Name) else None


def _local(folder: str, module: str) -> Optional[str]:
  """The file of `module` in the program's folder, if it is one there."""
  base = os.path.join(folder, *module.split('.'))
  for path in (base + '.py', os.path.join(base, '__init__.py')):
    if os.path.isfile(path):
      return path
  return None
