"""Started by every interpreter under `tf-loss-scale run` (it is on PYTHONPATH).

Applies the launcher's set-up (`tf_loss_scale.run_setup`) where the
environment asks for it, in an interpreter that has this library; then runs
the `sitecustomize` this one hides, if any.
"""

import importlib.machinery
import importlib.util
import os
import sys

try:
  from tf_loss_scale import run_setup
except ImportError:  # another interpreter, without this library
  pass
else:
  run_setup.apply_from_environ()

_HERE = os.path.dirname(os.path.abspath(__file__))
_hidden = importlib.machinery.PathFinder.find_spec(
    'sitecustomize', [p for p in sys.path if os.path.abspath(p) != _HERE])
if _hidden is not None:
  sys.modules['sitecustomize'] = importlib.util.module_from_spec(_hidden)
  _hidden.loader.exec_module(sys.modules['sitecustomize'])
