"""What `tf-loss-scale run` reads from a program's source, without running it.

`tensorflow()` tells a program's TensorFlow generation where its names give
it away; `report()` says what `run` with given settings gives the program
(`tf-loss-scale run --check`), and what it cannot serve.
"""

import io
import re
import tokenize
from typing import Dict, List, Optional, Tuple

from tf_loss_scale import run_setup

# Names only TF 1.x's own namespace has, after `import tensorflow as ALIAS`.
_TF1_NAMES = (r'Session|InteractiveSession|placeholder|get_variable|'
              r'global_variables_initializer|ConfigProto|contrib|'
              r'train\.\w*Optimizer|keras\.backend\.get_session')
_EXPERIMENTAL = (r'mixed_precision\.experimental\b|'
                 r'mixed_precision import experimental\b')
# A loss scaling name old code used, and what `run` gives under it.
_NAMES = (
    (r'\bMixedPrecisionLossScaleOptimizer\b',
     'tf_loss_scale.MixedPrecisionLossScaleOptimizer'),
    (r'\benable_mixed_precision_graph_rewrite\b',
     'tf_loss_scale\'s graph rewrite, wrapping with the library\'s classes'),
    (r'\b(?:Dynamic|Fixed)LossScale\b', 'tf_loss_scale.{}'),
    (_EXPERIMENTAL, 'tf_loss_scale.keras.experimental (LossScaleOptimizer, '
     'Policy, set_policy)'),
)
# TF 2.4-2.15's class, where the program does not name TF 2.3's.
_TF24 = (r'mixed_precision\.LossScaleOptimizer\b|'
         r'mixed_precision import [^\n]*\bLossScaleOptimizer\b')
_TF24_KERAS2 = "Keras 2's own class (compat.install() leaves it)"
_TF24_KERAS3 = 'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'
_MARKER = re.compile(r'^# tf-loss-scale: --tf (\S+)', re.MULTILINE)


def tensorflow(source: str) -> Tuple[Optional[str], Optional[str]]:
  """The program's TensorFlow, `'1'` or `'2.N'`, and what tells it; or None.

  A `# tf-loss-scale: --tf VERSION` line says it; else a TF1-only name of
  `import tensorflow as tf` (`tf.Session`, `tf.placeholder`,
  `tf.train.MomentumOptimizer`...) tells `'1'`, and TF 2.1-2.3's
  `mixed_precision.experimental` tells `'2.3'`.

  Returns:
    `(version, reason)` for the program's text `source`, or `(None, None)`
    when nothing tells.
  """
  marker = _MARKER.search(source)
  if marker:
    return marker.group(1), f'its "{marker.group(0)}" line'
  source = _code(source)
  for version, found in (('1', _tf1_name(source)),
                         ('2.3', re.search(_EXPERIMENTAL, source))):
    if found:
      return version, f'{found.group(0)} on line {_line(source, found.start())}'
  return None, None


def report(source: str, settings: Dict[str, str],
           guessed: Optional[str]) -> Tuple[List[str], List[str]]:
  """What the program gets under `settings`, and what `run` cannot serve.

  Args:
    source: The program's text.
    settings: As for `run_setup.apply`.
    guessed: What told the program's TensorFlow, when `tensorflow()` did.

  Returns:
    `(lines, warnings)`, lists of sentences.
  """
  tf_version = settings.get('tf')
  version = run_setup.generation(tf_version)
  if settings['keras'] == '3':
    keras = 'Keras 3: tf.keras and keras are Keras 3'
  elif settings['alias'] == '1':
    keras = ('Keras 2: tf.keras, tensorflow.keras, keras and keras.* are '
             'tf_keras (TF_USE_LEGACY_KERAS=1)')
  else:
    keras = 'Keras 2: tf.keras and keras are the Keras 2 TensorFlow ships'
  lines = [keras]
  if tf_version:
    told = f' (read from {guessed})' if guessed else ''
    lines.append(f'TensorFlow {tf_version}{told}')
  if version == (1,):
    lines.append('import tensorflow gives tensorflow.compat.v1, v2 behaviour '
                 'disabled; tf.keras is Keras 2\'s v1 API')
  if version and version <= run_setup.LAST_LEGACY_OPTIMIZERS:
    lines.append('tf.keras.optimizers.SGD, Adam, ... are tf_keras\'s legacy '
                 'optimizers (OptimizerV2), as TensorFlow 2.10 and before had')
  source = _code(source)
  tf24 = _TF24_KERAS3 if settings['keras'] == '3' else _TF24_KERAS2
  names = sorted(
      (_line(source, found.start()), found.group(0), given)
      for pattern, given in _NAMES + ((_TF24, tf24),) * (
          not re.search(_EXPERIMENTAL, source))
      for found in [re.search(pattern, source)] if found)
  lines.append('compat.install(override=True) runs; of the loss scaling '
               'names it serves, the program uses ' +
               ('these:' if names else 'none'))
  lines += [f'  line {line}: {name}: {given.format(name)}'
            for line, name, given in names]
  lines.append('child processes (multiprocessing, sys.executable) are set up '
               'the same way')
  warnings = [f'line {_line(source, found.start())}: {found.group(0)}: '
              f'{run_setup.CONTRIB_MESSAGE}' for found in re.finditer(
                  r'\b\w+\.contrib\b|tensorflow\.contrib', source)]
  found = _tf1_name(source) if version != (1,) else None
  if found:
    warnings.append(f'line {_line(source, found.start())}: {found.group(0)} '
                    'is TensorFlow 1\'s: pass --tf 1')
  return lines, warnings


def _tf1_name(source: str) -> Optional[re.Match]:
  """The first TF1-only name after `import tensorflow as ALIAS`, if any."""
  for imported in re.finditer(r'^import tensorflow as (\w+)', source,
                              re.MULTILINE):
    found = re.compile(rf'\b{imported.group(1)}\.({_TF1_NAMES})\b').search(
        source, imported.end())
    if found:
      return found
  return None


def _code(source: str) -> str:
  """The source with its strings and comments blanked, lines kept."""
  lines = source.splitlines(keepends=True)
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (tokenize.TokenError, SyntaxError):
    return source  # Python will say what is wrong when it runs.
  for token in tokens:
    if token.type in (tokenize.STRING, tokenize.COMMENT):
      (first, start), (last, end) = token.start, token.end
      for row in range(first - 1, last):
        line = lines[row]
        begin = start if row == first - 1 else 0
        stop = end if row == last - 1 else len(line.rstrip('\r\n'))
        lines[row] = line[:begin] + ' ' * (stop - begin) + line[stop:]
  return ''.join(lines)


def _line(source: str, offset: int) -> int:
  return source.count('\n', 0, offset) + 1
