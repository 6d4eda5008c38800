"""This library's public members against the originals' (docs/surface.md).

The originals' members are read by tests/originals/enumerate_originals.py
run with TensorFlow 1.15, 2.3 and 2.15 themselves (`.ci/run originals`
records them in .ci/logs/originals/); without that JSON these tests skip,
saying so, unless TF_LOSS_SCALE_REQUIRE_ORIGINALS=1 (as in CI), where they
fail. Each original member must be ours with the same kind and parameters,
or have a reason in tests/originals/surface_reasons.txt; docs/surface.md is
the table generated from both and must be current.
"""

import os
import sys

import pytest

import versions

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'originals'))
import surface  # pylint: disable=g-import-not-at-top,wrong-import-position

NEWEST = versions.Condition(
    versions.TF[:2] == (2, 21) and versions.KERAS is not None and
    versions.KERAS[0] == 3,
    'docs/surface.md describes TensorFlow 2.21 with Keras 3; here: '
    f'TensorFlow {".".join(map(str, versions.TF))}, keras '
    f'{".".join(map(str, versions.KERAS or ())) or "absent"}')


@pytest.fixture(scope='module')
def rows():
  absent = surface.missing_originals()
  if absent:
    message = (f'no {", ".join(absent)} in {surface.originals_dir()}: '
               '`bash .ci/run originals` records the originals\' members')
    if os.environ.get('TF_LOSS_SCALE_REQUIRE_ORIGINALS') == '1':
      pytest.fail(message)
    pytest.skip(message)
  return surface.compare(surface.load_originals(), surface.ours())


@NEWEST.mark
def test_every_difference_has_a_reason(rows):
  assert surface.unexplained(rows, surface.load_reasons()) == []


@NEWEST.mark
def test_every_reason_is_for_a_difference(rows):
  assert surface.stale(rows, surface.load_reasons()) == []


@NEWEST.mark
def test_every_original_generation_is_compared(rows):
  subjects = {(row['generation'], row['subject']) for row in rows}
  assert {generation for generation, _ in subjects} == {
      'TF 1.13-1.15 contrib', 'TF 1.14-1.15', 'TF 2.0-2.3', 'TF 2.4-2.15'}
  assert {subject for _, subject in subjects} >= set(surface.OURS)


@NEWEST.mark
def test_docs_surface_md_is_current(rows):
  with open(surface.DOC) as doc:
    written = doc.read()
  expected = surface.render(surface.load_originals(), rows,
                            surface.load_reasons())
  assert written == expected, (
      'docs/surface.md is stale: run python tests/originals/surface.py')


def _params(*specs):
  """[name, kind] pairs from 'name', 'name=', '*args', '**kwargs', '*, k'."""
  described, keyword_only = [], False
  for spec in specs:
    if spec == '*':
      keyword_only = True
    elif spec.startswith('**'):
      described.append([spec[2:], 'VAR_KEYWORD'])
    elif spec.startswith('*'):
      described.append([spec[1:], 'VAR_POSITIONAL'])
      keyword_only = True
    else:
      kind = 'KEYWORD_ONLY' if keyword_only else 'POSITIONAL_OR_KEYWORD'
      described.append([spec.rstrip('='),
                        kind + ('=' if spec.endswith('=') else '')])
  return described


@pytest.mark.parametrize('original, ours, expected', [
    (('loss', 'var_list'), ('loss', 'var_list', 'tape='), None),
    (('loss', 'grad_loss='), ('loss', 'tape='),
     '`grad_loss` not parameter 2'),
    (('grads', 'name='), ('grads',), '`name` not parameter 2'),
    (('grads', 'name='), ('grads', 'name'), '`name` required'),
    (('grads',), ('grads', 'scale'), '`scale` required here'),
    (('a', 'b='), ('*args', '**kwargs'), None),
    (('a', '**kwargs'), ('a',), 'no **kwargs'),
    (('a', '*', 'k='), ('a', '**kwargs'), None),
    (('a', '*', 'k='), ('a',), 'no `k`'),
])
def test_parameter_difference(original, ours, expected):
  assert surface.parameter_difference(_params(*original),
                                      _params(*ours)) == expected


@pytest.mark.parametrize('original, ours, expected', [
    ({'kind': 'method', 'callable': True, 'parameters': []}, None, 'absent'),
    ({'kind': 'attribute', 'callable': False},
     {'kind': 'property', 'callable': False}, None),
    ({'kind': 'method', 'callable': True, 'parameters': []},
     {'kind': 'property', 'callable': True, 'parameters': []},
     'a property here, a method there'),
    ({'kind': 'property', 'callable': True, 'parameters': []},
     {'kind': 'property', 'callable': False}, 'callable there, not here'),
])
def test_difference(original, ours, expected):
  assert surface.difference(original, ours) == expected
