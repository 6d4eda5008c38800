"""Runs tests/keras_release_smoke.py on every Keras 3 minor release.

`python keras_releases.py LOGS_DIR [VERSION...]` (the Python of a
TensorFlow environment: in CI, the tf221 virtualenv of .ci/run) asks the
package index for Keras's releases (`pip index versions keras`) and takes
the newest patch of each minor release from the oldest this library
supports (keras3_support.OLDEST) on, or the versions named. Each is
installed over this environment's TensorFlow: `pip install --no-deps
--target DIR keras==X.Y.Z` (a Keras wheel is pure Python; a second or so
each), then any requirement of that Keras this environment does not meet
into DIR too; the smoke script then runs with DIR first on PYTHONPATH, in
one process. The Keras this environment has runs as it is.

A release whose wheel ships Keras's own test files also runs the
`keras-class` group of .ci/keras_tests_with_install.py (Keras's tests of
its LossScaleOptimizer against the class install() names).

A release fails if the smoke script imported another Keras than the one
asked for, or if it skipped without naming one of the platform limits
docs/testing.md lists (its "Platform limits" list: a skip is a Keras that
cannot run on this TensorFlow at all, and must be one a reader can look up).
The releases listed by the index must hold every minor release from the
oldest supported to the newest listed or tested (keras3_support's
NEWEST_TESTED): one that is missing fails the run rather than going unrun.

A release named by TF_LOSS_SCALE_CI_KERAS_RUN_ELSEWHERE (in CI, the Keras of
the README's .venv, over the same TensorFlow: the README's suite runs the
smoke script on it, and the with-install step Keras's class tests) is
listed as run there, not run again.

Prints a line per release (passed, failed or skipped with the script's
reason, and seconds) and each failing check's output; the scripts' output
goes to LOGS_DIR/keras-release-X.Y.Z.log. Exits 1 if a release failed, the
releases could not be listed or installed, a minor release is missing, or
none ran.
"""

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from packaging.requirements import Requirement

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SMOKE = os.path.join(_CHECKOUT, 'tests', 'keras_release_smoke.py')
_SUPPORT = os.path.join(_CHECKOUT, 'tf_loss_scale', 'keras', 'shared',
                        'keras3_support.py')
_SKIPPED = 2  # The smoke script's exit status for a Keras that cannot run.
_TESTING_DOC = os.path.join(_CHECKOUT, 'docs', 'testing.md')
# The smoke script's environment variable naming the Keras it must import.
_EXPECTED = 'TF_LOSS_SCALE_EXPECTED_KERAS'
_WITH_INSTALL = os.path.join(_CHECKOUT, '.ci', 'keras_tests_with_install.py')
# Shipped by some Keras wheels (3.12.4, 3.15.1), not all.
_TESTS = os.path.join('src', 'optimizers', 'loss_scale_optimizer_test.py')

Release = Tuple[int, int, int]


def _supported(name: str) -> Release:
  """keras3_support's OLDEST or NEWEST_TESTED."""
  # Read from the source: importing it would import Keras and TensorFlow.
  with open(_SUPPORT) as f:
    found = re.search(rf'^{name} = \((\d+), (\d+), (\d+)\)', f.read(), re.M)
  if found is None:
    raise SystemExit(f'no {name} = (...) in {_SUPPORT}')
  return tuple(int(part) for part in found.groups())


def newest_patches(listed: List[str], oldest: Release) -> List[str]:
  """The newest patch of each Keras 3 minor release from `oldest` on.

  Args:
    listed: versions as the package index lists them ('3.12.0', '3.13.0rc1').
    oldest: the oldest release supported.

  Returns:
    'X.Y.Z' per minor release, oldest first; pre-releases are left out.
  """
  newest: Dict[Tuple[int, int], Release] = {}
  for version in listed:
    if not re.fullmatch(r'\d+\.\d+\.\d+', version):
      continue
    release = tuple(int(part) for part in version.split('.'))
    if release[0] == 3 and release[:2] >= oldest[:2]:
      minor = release[:2]
      newest[minor] = max(newest.get(minor, release), release)
  return ['.'.join(map(str, newest[minor])) for minor in sorted(newest)]


def missing_minors(versions: List[str], oldest: Release,
                   newest_tested: Release) -> List[str]:
  """Keras 3 minor releases absent from `versions`, as 'X.Y'.

  Every minor release from `oldest`'s to the newest of `versions` and
  `newest_tested` must be there: the index may lack one (yanked, or a
  mirror behind), and a release not listed is a release not run.
  """
  have = {tuple(int(part) for part in v.split('.')[:2]) for v in versions}
  last = max(have | {newest_tested[:2]})[1]
  return [f'3.{minor}' for minor in range(oldest[1], last + 1)
          if (3, minor) not in have]


def _listed() -> List[str]:
  """Every version of Keras the package index lists."""
  listed = subprocess.run(
      [sys.executable, '-m', 'pip', 'index', 'versions', 'keras'],
      capture_output=True, text=True, check=False)
  found = re.search(r'^Available versions: (.*)$', listed.stdout, re.M)
  if listed.returncode or found is None:
    raise SystemExit('pip index versions keras listed no releases:\n'
                     f'{listed.stdout}{listed.stderr}')
  return found.group(1).split(', ')


def platform_limits(text: str) -> Dict[str, List[str]]:
  """The skips docs/testing.md allows: 'X.Y' -> words the reason must hold.

  Read from its "Platform limits" list, one item a limit:
  `` - Keras 3.4: `words of the skip's reason` (why) ``.
  """
  section = re.search(r'^Platform limits[^\n]*\n((?:\n|- .*\n|  .*\n)*)',
                      text, re.M)
  limits: Dict[str, List[str]] = {}
  for minor, words in re.findall(r'^- Keras (3\.\d+): `([^`]+)`',
                                 section.group(1) if section else '', re.M):
    limits.setdefault(minor, []).append(words)
  return limits


def judge(version: str, returncode: int, output: str,
          limits: Dict[str, List[str]]) -> Tuple[str, str]:
  """The outcome of one release's smoke run, and the line that shows it.

  Args:
    version: the Keras release asked for.
    returncode: the smoke script's exit status.
    output: what it printed.
    limits: the skips allowed, from `platform_limits`.

  Returns:
    ('passed' | 'failed' | 'skipped', what to print after the outcome).
  """
  summary = re.findall(r'^(\d+ passed, \d+ failed|SKIPPED: .*)$', output,
                       re.M)
  shown = summary[-1] if summary else f'exit {returncode}'
  if returncode == _SKIPPED:
    reason = shown[len('SKIPPED: '):] if shown.startswith('SKIPPED: ') else ''
    minor = '.'.join(version.split('.')[:2])
    if reason and any(words in reason for words in limits.get(minor, ())):
      return 'skipped', shown
    return 'failed', (f'{shown} (no platform limit of docs/testing.md for '
                      f'Keras {minor} names this skip)')
  imported = re.search(r'^Keras (\S+) \(', output, re.M)
  if imported is None or imported.group(1) != version:
    return 'failed', (f'{shown}; imported Keras '
                      f'{imported.group(1) if imported else "(none said)"}, '
                      f'not {version}')
  if returncode != 0 or not summary or summary[-1].startswith('SKIPPED'):
    return 'failed', shown  # Exit 0 without the summary: not the script's.
  return 'passed', shown


def _unmet(target: str, version: str) -> List[str]:
  """Requirements of the Keras in `target` this environment does not meet."""
  metadata = importlib.metadata.PathDistribution.at(
      os.path.join(target, f'keras-{version}.dist-info')).metadata
  unmet = []
  for line in metadata.get_all('Requires-Dist') or ():
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate({'extra': ''}):
      continue
    try:
      have = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
      unmet.append(line)
      continue
    if not requirement.specifier.contains(have, prereleases=True):
      unmet.append(line)
  return unmet


def _install(version: str, target: str) -> str:
  """Installs Keras `version` into `target`; returns what went wrong, or ''."""
  pip = [sys.executable, '-m', 'pip', 'install', '-q', '--target', target]
  done = subprocess.run([*pip, '--no-deps', f'keras=={version}'],
                        capture_output=True, text=True, check=False)
  if done.returncode:
    return done.stdout + done.stderr
  unmet = _unmet(target, version)
  if unmet:
    print(f'  keras {version} needs {unmet}, which this environment lacks: '
          'installing them beside it')
    done = subprocess.run([*pip, *unmet], capture_output=True, text=True,
                          check=False)
    if done.returncode:
      return done.stdout + done.stderr
  return ''


def _run(version: str, scratch: str, logs: str,
         limits: Dict[str, List[str]]) -> str:
  """Installs and smoke-tests one release; returns its outcome's word."""
  start = time.monotonic()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  env.pop('TF_USE_LEGACY_KERAS', None)
  path = [_CHECKOUT] + [p for p in env.get('PYTHONPATH', '').split(
      os.pathsep) if p]
  target = ''
  if version != importlib.metadata.version('keras'):
    target = os.path.join(scratch, version)
    problem = _install(version, target)
    if problem:
      print(f'keras {version:<8} FAILED to install:\n{problem}')
      return 'failed'
    path.insert(0, target)
  env['PYTHONPATH'] = os.pathsep.join(path)
  env[_EXPECTED] = version
  log = os.path.join(logs, f'keras-release-{version}.log')
  with open(log, 'w') as f:
    done = subprocess.run([sys.executable, _SMOKE], env=env, stdout=f,
                          stderr=subprocess.STDOUT, check=False)
  with open(log) as f:
    output = f.read()
  outcome, shown = judge(version, done.returncode, output, limits)
  details = [f'  {line}' for line in output.splitlines()
             if line.startswith('FAILED ')]
  if outcome == 'failed' and not details:
    details = [output[-3000:]]
  keras_dir = os.path.join(target, 'keras') if target else os.path.dirname(
      importlib.util.find_spec('keras').origin)
  if outcome != 'skipped' and os.path.exists(os.path.join(keras_dir, _TESTS)):
    passed, counts, failures = _keras_class_tests(version, env, logs)
    shown += f"; Keras's own tests of its class: {counts}"
    details += failures
    if not passed:
      outcome = 'failed'
  print(f'keras {version:<8} {outcome.upper():<8} {shown} '
        f'({time.monotonic() - start:.0f} s)', flush=True)
  if details:
    print('\n'.join(details))
  return outcome


def _keras_class_tests(version: str, env: Dict[str, str],
                       logs: str) -> Tuple[bool, str, List[str]]:
  """Keras's tests of its class against install()'s, where it ships them.

  Returns whether they passed, each run's counts, and the failures.
  """
  done = subprocess.run(
      [sys.executable, _WITH_INSTALL,
       os.path.join(logs, f'keras-class-{version}'), 'keras-class'],
      env=env, capture_output=True, text=True, check=False)
  lines = done.stdout.splitlines()
  runs = {'keras-class-plain': 'plainly',
          'keras-class-install': 'with install()'}
  counts = '; '.join(
      f'{line.split(maxsplit=1)[1].split(" (pytest")[0]} '
      f'{runs[line.split()[0]]}' for line in lines
      if line.split()[:1] and line.split()[0] in runs and
      'pytest exit' in line) or 'no result'
  failures = [f'  {line}' for line in lines if line.startswith('FAILED ')]
  if done.returncode and not failures:
    failures = [done.stdout[-2000:] + done.stderr[-2000:]]
  return done.returncode == 0, counts, failures


def main(logs: str, *versions: str) -> int:
  os.makedirs(logs, exist_ok=True)
  missing = []
  if not versions:
    versions = tuple(newest_patches(_listed(), _supported('OLDEST')))
    missing = missing_minors(list(versions), _supported('OLDEST'),
                             _supported('NEWEST_TESTED'))
  with open(_TESTING_DOC) as f:
    limits = platform_limits(f.read())
  print(f'Keras 3 releases over TensorFlow in {sys.prefix}: '
        f'{", ".join(versions)}', flush=True)
  if missing:
    print(f'keras {", ".join(missing)}: FAILED: the package index lists no '
          'such minor release, which therefore cannot run', flush=True)
  elsewhere = os.environ.get('TF_LOSS_SCALE_CI_KERAS_RUN_ELSEWHERE')
  start = time.monotonic()
  with tempfile.TemporaryDirectory() as scratch:
    outcomes = {}
    for version in versions:
      if version == elsewhere:
        print(f'keras {version:<8} run by the README\'s suite, on its .venv',
              flush=True)
      else:
        outcomes[version] = _run(version, scratch, logs, limits)
  counts = {o: sum(1 for v in outcomes.values() if v == o)
            for o in ('passed', 'failed', 'skipped')}
  print(f'keras releases: {counts["passed"]} passed, {counts["failed"]} '
        f'failed, {counts["skipped"]} skipped'
        f'{", 1 run by the README" if elsewhere in versions else ""}'
        f'{f", {len(missing)} missing" if missing else ""} '
        f'({time.monotonic() - start:.0f} s)')
  return int(bool(counts['failed']) or bool(missing) or not counts['passed'])


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:]))
