"""Generated programs train as their peers, observation by observation.

Hypothesis draws programs (`generated_programs.programs()`), each a point in
the product of the axes users combine; each runs under this library and under
its peer, and every observation after every step must be the same, but for
the differences declared in `generated_declarations.py`. A divergence fails
with the program as a script, shrunk by Hypothesis to the smallest program
that still diverges.

The fast tier draws `TF_LOSS_SCALE_GENERATED_PROGRAMS` programs (20) from the
fixed seed below; CI draws a few hundred from the tested commit's seed
(`TF_LOSS_SCALE_GENERATED_SEED`, which it prints). Hypothesis's database of
failing examples is not kept (`database=None`): a run is reproduced from its
seed. With `TF_LOSS_SCALE_GENERATED_REPORT` set to a path, each program whose
traces differed only where a declaration excuses them is appended to that
file, one JSON line naming the declarations.
"""

import json
import os
import re

import hypothesis
import pytest

import versions

# The declarations are those of Keras 3.12 and later, where they were
# checked; Keras 3.3's class differs more (docs/differences.md).
versions.keras_at_least(3, 12).require()
versions.TF_KERAS_INSTALLED.require()

# pylint: disable=g-import-not-at-top,wrong-import-order
import generated_declarations as declarations
import generated_programs as generated
# pylint: enable=g-import-not-at-top,wrong-import-order

SEED = int(os.environ.get('TF_LOSS_SCALE_GENERATED_SEED', '20261201'))
PROGRAMS = int(os.environ.get('TF_LOSS_SCALE_GENERATED_PROGRAMS', '20'))
_REPORT = os.environ.get('TF_LOSS_SCALE_GENERATED_REPORT')
_DIFFERENCES = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'docs', 'differences.md')


def check(program, strategy, excuses=declarations.DOCUMENTED):
  """Runs `program` on both sides; fails with its script if they diverge."""
  ours = generated.run(program, 'ours', strategy)
  peer = generated.run(program, 'peer', strategy)
  left = generated.divergences(program, ours, peer, excuses)
  assert not left, (
      f'ours and the peer diverge (TF_LOSS_SCALE_GENERATED_SEED={SEED}):\n  '
      + '\n  '.join(left) +
      '\nThe program, as a script:\n' + generated.script(program))
  if _REPORT and generated.divergences(program, ours, peer):
    with open(_REPORT, 'a') as report:
      report.write(json.dumps({
          'seed': SEED, 'program': repr(program),
          'excused_by': [e.name for e in excuses
                         if e.applies(program, peer) is not None]}) + '\n')


@hypothesis.seed(SEED)
@hypothesis.settings(max_examples=PROGRAMS, database=None, deadline=None,
                     print_blob=False,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(program=generated.programs())
def test_a_generated_program_trains_as_its_peer(program, mirrored_strategy):
  check(program, mirrored_strategy)


def _sections():
  """docs/differences.md's sections by anchor, whitespace made single."""
  sections, anchor = {}, ''
  with open(_DIFFERENCES) as f:
    for line in f:
      heading = re.match(r'#+ (.*)', line)
      if heading:
        anchor = re.sub(r'[^a-z0-9 -]', '', heading.group(1).lower())
        anchor = anchor.replace(' ', '-')
        sections[anchor] = ''
      else:
        sections[anchor] = sections.get(anchor, '') + line
  return {a: ' '.join(text.split()) for a, text in sections.items()}


@pytest.mark.parametrize('excuse', declarations.DOCUMENTED,
                         ids=lambda e: e.name)
def test_each_documented_difference_quotes_its_sentence(excuse):
  sections = _sections()
  assert excuse.anchor in sections, (
      f'{excuse.name}: no section #{excuse.anchor} in docs/differences.md')
  assert excuse.sentence in sections[excuse.anchor], (
      f'{excuse.name}: docs/differences.md#{excuse.anchor} does not say '
      f'{excuse.sentence!r}')
