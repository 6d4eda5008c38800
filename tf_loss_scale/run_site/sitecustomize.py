"""Started by every interpreter under `tf-loss-scale run` (it is on PYTHONPATH).

In an interpreter of the launcher's Python (its prefix and version, written
in `TF_LOSS_SCALE_RUN`), applies the launcher's set-up
(`tf_loss_scale.run_setup`). Any other Python (another virtualenv or
version) starts as without the launcher: the environment, `sys.path` and
`sys.modules` it would have had. Then the `sitecustomize` this one hides
runs, if any.
"""

import importlib.machinery
import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENVIRON = 'TF_LOSS_SCALE_RUN'  # run_setup.ENVIRON, read before importing it


def _start():
  """Sets this interpreter up, or restores another Python's start; True if
  set up."""
  where = [i for i, p in enumerate(sys.path) if os.path.abspath(p) == _HERE]
  for i in reversed(where):
    del sys.path[i]
  settings = json.loads(os.environ.get(_ENVIRON) or 'null')
  if settings is None:
    return False
  if settings['python'] != [sys.prefix, sys.version]:
    for name, value in settings['environ'].items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
    del os.environ[_ENVIRON]
    return False
  if settings['path'] and settings['path'] not in sys.path:
    sys.path.insert(where[0] if where else 0, settings['path'])
  from tf_loss_scale import run_setup  # pylint: disable=g-import-not-at-top
  run_setup.apply(settings)
  return True


_set_up = _start()
_hidden = importlib.machinery.PathFinder.find_spec('sitecustomize', sys.path)
if _hidden is not None:
  sys.modules['sitecustomize'] = importlib.util.module_from_spec(_hidden)
  _hidden.loader.exec_module(sys.modules['sitecustomize'])
elif not _set_up:
  # As Python starts without one: `site` passes over this error silently.
  raise ImportError('no sitecustomize', name='sitecustomize')
