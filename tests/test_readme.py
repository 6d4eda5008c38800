"""Every ```python block in README.md and docs/*.md runs, so they cannot drift.

The blocks run in fresh processes, one after another, each as a script of
its own (own namespace, empty working directory, global state such as
policies and `compat.install()` restored after it; tests/run_readme_blocks.py):
- a block that mentions `TF_USE_LEGACY_KERAS` runs with
  `TF_USE_LEGACY_KERAS=1` (`tf.keras` is `tf_keras`), and under Keras 3 too
  unless it sets the variable itself (`os.environ[...]`);
- every other block runs under Keras 3.
Shell blocks and output listings are not run. The README is written for the
newest TensorFlow: where Keras 3 is absent (TensorFlow 2.15 and earlier),
or Keras 2 under `TF_USE_LEGACY_KERAS=1` (no tf_keras on 2.16 and later),
the blocks meant for it skip, saying so.
"""

import collections
import functools
import json
import os
import re

import pytest

import fresh_process
import versions

_TESTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TESTS)
_FENCE = re.compile(r'^```(\S*)\n(.*?)^```', re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r'^#+ (.*)$', re.MULTILINE)
_SETS_LEGACY_KERAS = re.compile(r'environ\b.*TF_USE_LEGACY_KERAS')

Block = collections.namedtuple('Block', 'id heading code')


def _documents():
  """README.md, then every page of docs/, as paths relative to the root."""
  docs = os.path.join(_ROOT, 'docs')
  return ['README.md'] + sorted(
      os.path.join('docs', name) for name in os.listdir(docs)
      if name.endswith('.md'))


def _read(document):
  with open(os.path.join(_ROOT, document)) as f:
    return f.read()


def _python_blocks():
  blocks = []
  for document in _documents():
    text = _read(document)
    for fence in _FENCE.finditer(text):
      if fence.group(1) != 'python':
        continue
      first_line = text.count('\n', 0, fence.start(2)) + 1
      headings = _HEADING.findall(text, 0, fence.start())
      blocks.append(Block(f'{document}:{first_line}',
                          headings[-1] if headings else '', fence.group(2)))
  return blocks


def _environments(block):
  if 'TF_USE_LEGACY_KERAS' not in block.code:
    return ['keras3']
  if _SETS_LEGACY_KERAS.search(block.code):
    return ['tf_keras']
  return ['keras3', 'tf_keras']


_BLOCKS = _python_blocks()
_CASES = [(block, env) for block in _BLOCKS for env in _environments(block)]
# What each environment needs installed.
_NEEDS = {'keras3': versions.KERAS_3,
          'tf_keras': versions.LEGACY_KERAS_IS_KERAS_2}


@functools.lru_cache(maxsize=None)
def _errors(env, tmp_dir):
  """Runs every block meant for `env` in one fresh process; id -> error."""
  blocks = [{'id': block.id, 'code': block.code}
            for block, block_env in _CASES if block_env == env]
  blocks_file = os.path.join(tmp_dir, f'readme_blocks_{env}.json')
  with open(blocks_file, 'w') as f:
    json.dump(blocks, f)
  return fresh_process.run_json(
      [os.path.join(_TESTS, 'run_readme_blocks.py'), blocks_file],
      legacy_keras=env == 'tf_keras', timeout=600)


def test_readme_has_python_blocks_and_no_other_python_fences():
  assert any(b.id.startswith('README.md:') for b in _BLOCKS), (
      'no ```python blocks found in README.md')
  # A block fenced as ```py or ```python3 would silently not be tested.
  other = [f'{document}: ```{lang}' for document in _documents()
           for lang, _ in _FENCE.findall(_read(document))
           if lang.startswith('py') and lang != 'python']
  assert not other, f'fence Python blocks as ```python, not {other}'


def _case_id(block, env):
  heading = re.sub(r'[^a-z0-9]+', '-', block.heading.lower()).strip('-')
  return f'{block.id}-{heading}-{env}'


@pytest.mark.parametrize(
    'block,env',
    [pytest.param(*case, marks=_NEEDS[case[1]].mark) for case in _CASES],
    ids=[_case_id(*case) for case in _CASES])
def test_readme_block_runs(block, env, tmp_path_factory):
  error = _errors(env, str(tmp_path_factory.getbasetemp()))[block.id]
  assert error is None, (
      f'Block at {block.id} (under "{block.heading}") failed '
      f'under {env}:\n{block.code}\n{error}')


def test_readme_is_at_most_400_lines():
  lines = _read('README.md').count('\n')
  assert lines <= 400, (
      f'README.md has {lines} lines: details belong in docs/, the README '
      'keeps what a newcomer needs at a glance')


_SPEED_MODES = {'TF1 graph': 'graph', '`tf.function`': 'function',
                '`jit_compile=True`': 'jit',
                'MirroredStrategy, 2 replicas': 'mirrored'}
_SPEED_SHAPES = {'10 variables of 1M': '10x1M', '200 variables of 1k': '200x1k',
                 'small CNN': 'cnn'}


def test_readme_speed_table_is_the_last_full_benchmark_runs_ratios():
  text = _read('README.md')
  section = text[text.index('## Speed\n'):]
  section = section[:section.index('\n## ', 1)]
  rows = [[cell.strip() for cell in line.strip('|').split('|')]
          for line in section.splitlines() if line.startswith('|')]
  header, rows = rows[0], rows[2:]
  shapes = [_SPEED_SHAPES[name] for name in header[2:]]
  with open(os.path.join(_ROOT, 'benchmarks', 'results.json')) as f:
    results = json.load(f)
  # What benchmarks/run.py wrote without --quick: every mode and shape.
  assert '--quick' not in results['command'], results['command']
  ratios = {(row['mode'], row['shape']): row['ratio']
            for row in results['rows']}
  shown = {(_SPEED_MODES[row[0]], shape): float(cell)
           for row in rows for shape, cell in zip(shapes, row[2:])}
  assert shown == {key: round(ratio, 2) for key, ratio in ratios.items()}
  assert f'TensorFlow {results["tensorflow"]}, Keras {results["keras"]}' in (
      ' '.join(section.split()))
