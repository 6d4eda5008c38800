"""This library as it was at an earlier commit, importable beside today's.

Whether a change made a step slower is told by timing both steps in one
process: between runs of the benchmark this machine's speed drifts by more
than most of the differences it measures (docs/benchmarks.md). The package
of the commit is read from git and written to a temporary directory under a
name of its own, with every mention of its name changed to that one, so
that its modules import each other and not today's.
"""

import importlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import types

PACKAGE = 'tf_loss_scale'


def load(commit: str, repository: str) -> types.ModuleType:
  """Imports the package as it was at `commit`.

  Args:
    commit: A git revision of `repository`.
    repository: A directory of the git work tree the package is in.

  Returns:
    The package, imported as `tf_loss_scale_at_<short hash>`.

  Raises:
    subprocess.CalledProcessError: If git cannot resolve `commit` or the
      package does not exist at it.
  """
  repository = _git(repository, 'rev-parse', '--show-toplevel').decode().strip()
  short = _git(repository, 'rev-parse', '--short', f'{commit}^{{commit}}')
  name = f'{PACKAGE}_at_{short.decode().strip()}'
  if name not in sys.modules:
    root = tempfile.mkdtemp(prefix='tf_loss_scale_earlier_')
    _extract(_git(repository, 'archive', '--format=tar', f'{commit}:{PACKAGE}'),
             root, name)
    sys.path.insert(0, root)
  return importlib.import_module(name)


def _git(repository: str, *args: str) -> bytes:
  return subprocess.run(['git', '-C', repository, *args], check=True,
                        capture_output=True).stdout


def _extract(archive: bytes, root: str, name: str) -> None:
  # Writes the package's files under root/name, renamed in its sources.
  mention = re.compile(rf'\b{PACKAGE}\b'.encode())
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    for member in tar.getmembers():
      if not member.isfile():
        continue
      path = os.path.join(root, name, member.name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      content = tar.extractfile(member).read()
      if path.endswith('.py'):
        content = mention.sub(name.encode(), content)
      with open(path, 'wb') as f:
        f.write(content)
