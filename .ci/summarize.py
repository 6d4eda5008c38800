"""Prints what CI ran per TensorFlow version: versions, results, skips.

`python3 summarize.py LOGS_DIR`: reads the pytest logs (`suite-NAME.log`,
run with `-rs`) and pip freezes (`freeze-NAME-after.txt`) that .ci/run wrote,
the install checks' logs, the comparison of test files with and without
`compat.install()` (`with-install.log`) and the Keras 3 releases' smoke
checks (`keras-releases.log`), and prints one line per run, the
skip reasons per run, that comparison, and a closing total. Exits 1 if a suite log has no pytest result.
"""

import collections
import glob
import os
import re
import sys

_RUNS = {
    'readme': ('readme', 'the README\'s test command (the fast tier)'),
    'readme-slow': ('readme', 'the rest of the README\'s full suite (-m slow)'),
    'tf212': ('tf212', 'the fast tier\'s in-process files'),
    'tf215': ('tf215', 'the fast tier\'s files of fresh processes'),
    'tf216': ('tf216', 'the fast tier; tf_keras children left to readme'),
    'tf221-legacy': ('readme', 'the README\'s .venv, TF_USE_LEGACY_KERAS=1; '
                     'the fast tier of the files that reach tf.keras in '
                     'the test process, 50 generated programs'),
    'generated-programs': ('readme', "programs drawn from the commit's seed "
                           '(printed above), against their peers'),
    'originals': ('readme', "the originals' files (test_surface, "
                  "test_traces, test_launcher_programs, test_tf1_control_flow) "
                  "against the originals' records"),
}
_RESULT = re.compile(r'^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s')
_SKIPPED = re.compile(r'^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$')
# The versions the reasons repeat, left out of the grouped listing.
_VERSIONS_SUFFIX = re.compile(r' \(TensorFlow [^)]*\)$')


def _freeze(logs, name):
  path = os.path.join(logs, f'freeze-{name}-after.txt')
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return dict(line.strip().lower().replace('_', '-').split('==', 1)
                for line in f if '==' in line)


def _suite(path):
  result, skips = None, collections.Counter()
  with open(path, errors='replace') as f:
    for line in f:
      line = line.rstrip('\n')
      skipped = _SKIPPED.match(line)
      if skipped:
        skips[_VERSIONS_SUFFIX.sub('', skipped.group(2))] += int(
            skipped.group(1))
      found = _RESULT.match(line)
      if found:
        result = found.group(1)
  return result, skips


def _counts(result):
  counts = collections.Counter()
  for number, word in re.findall(r'(\d+) (\w+)', result or ''):
    counts[word.rstrip('s') if word != 'passed' else word] += int(number)
  return counts


def main(logs):
  print('\n=== Summary: the suite per TensorFlow version')
  print(f'{"run":<20}{"tensorflow":<12}{"keras":<9}{"tf_keras":<10}result')
  totals, missing, skip_lines = collections.Counter(), [], []
  for run, (venv, note) in _RUNS.items():
    path = os.path.join(logs, f'suite-{run}.log')
    if not os.path.exists(path):
      continue
    versions = _freeze(logs, venv)
    result, skips = _suite(path)
    if result is None:
      missing.append(run)
    totals.update(_counts(result))
    print(f'{run:<20}{versions.get("tensorflow", "?"):<12}'
          f'{versions.get("keras", "-"):<9}{versions.get("tf-keras", "-"):<10}'
          f'{result or "NO PYTEST RESULT"} ({note})')
    for reason, count in skips.most_common():
      skip_lines.append(f'  {run:<20}{count:>4}  {reason}')
  if skip_lines:
    print('Skipped, by reason:')
    print('\n'.join(skip_lines))
  checks = []
  for path in sorted(glob.glob(os.path.join(logs, 'install-*.status'))):
    name = os.path.basename(path)[len('install-'):-len('.status')]
    with open(path) as f:
      checks.append(f'{name} {"ok" if f.read().strip() == "0" else "FAILED"}')
  if checks:
    print('Installing the checkout left every installed package as it was: '
          + ', '.join(checks))
  comparison = os.path.join(logs, 'with-install.log')
  if os.path.exists(comparison):
    print('Test files with compat.install(), then plainly what did not pass '
          '(.ci/keras_tests_with_install.py):')
    with open(comparison, errors='replace') as f:
      print(''.join('  ' + line for line in f))
  releases = os.path.join(logs, 'keras-releases.log')
  if os.path.exists(releases):
    print('Keras 3 releases over TensorFlow 2.21 (.ci/keras_releases.py):')
    with open(releases, errors='replace') as f:
      print(''.join('  ' + line for line in f if line.startswith('keras ')))
  for run in missing:
    print(f'{run}: pytest printed no result line (it did not finish)')
  # Errors (a test's setup failed) count as failures.
  print(f'total: {totals["passed"]} passed, '
        f'{totals["failed"] + totals["error"]} failed, '
        f'{totals["skipped"]} skipped')
  return 1 if missing else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
