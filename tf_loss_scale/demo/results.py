"""What one training run of the demo records, and `results.json`."""

import dataclasses
import json
import os
import platform
import sys
from typing import Any, Dict, List, Optional

import numpy as np

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import onednn

RUN_NAMES = ('float32', 'mixed_float16, no loss scaling',
             'mixed_float16, dynamic loss scale')
# The keys of results.json, in the order of RUN_NAMES.
RESULT_KEYS = ('float32', 'float16_unscaled', 'float16_scaled')
LOSS_WINDOW = 50


@dataclasses.dataclass
class RunResult:
  """The measurements of one run.

  Attributes:
    name: One of `RUN_NAMES`.
    losses: Unweighted training loss at each step.
    scales: Loss scale after each step, or None without loss scaling.
    skipped: Whether each step was skipped (all False without scaling).
    flushed_fraction: Over the probes taken during training, the share of
      gradient values that are non-zero in float32 but exactly zero after
      passing through float16; None for the float32 run itself.
    gradient_histogram: Over the same probes, counts of the float32 copy's
      gradient values per bin of `measure.LOG2_EDGES`; None for float32.
    test_accuracy: Accuracy on the test set after training.
    wall_time: Seconds spent training, probes included.
    checkpoint: The checkpoint the run saved its model and optimizer to
      (what `tf-loss-scale inspect` reads), or None.
    skip_report: Why the run's last skipped step was skipped (a
      `tf_loss_scale.monitoring.SkipReport`), or None.
  """
  name: str
  losses: List[float]
  scales: Optional[List[float]]
  skipped: List[bool]
  flushed_fraction: Optional[float]
  gradient_histogram: Optional[np.ndarray]
  test_accuracy: float
  wall_time: float
  checkpoint: Optional[str] = None
  skip_report: Optional[Any] = None

  @property
  def skipped_steps(self) -> int:
    """How many steps were skipped."""
    return int(sum(self.skipped))

  @property
  def final_scale(self) -> Optional[float]:
    """The loss scale after the last step, or None without scaling."""
    return self.scales[-1] if self.scales else None

  def final_loss(self, window: int = LOSS_WINDOW) -> float:
    """Mean training loss over the last `window` steps."""
    return float(np.mean(self.losses[-window:]))

  def summary(self) -> Dict[str, Any]:
    """The run's entry in results.json."""
    return {
        'test_accuracy': self.test_accuracy,
        'final_loss': self.final_loss(),
        'flushed_fraction': self.flushed_fraction,
        'skipped_steps': self.skipped_steps,
        'final_scale': self.final_scale,
        'seconds': self.wall_time,
        'checkpoint': self.checkpoint,
        'skip_report': (dataclasses.asdict(self.skip_report)
                        if self.skip_report else None),
    }


def settings(config: config_lib.DemoConfig) -> Dict[str, Any]:
  """The settings that shape the runs' numbers (not where files go)."""
  return {field.name: getattr(config, field.name)
          for field in dataclasses.fields(config)
          if field.name not in ('out', 'verbose')}


def environment() -> Dict[str, Any]:
  """The versions and switches a run's numbers and speed depend on.

  Call it once TensorFlow is imported.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {
      'python': platform.python_version(),
      'tensorflow': tf.__version__,
      'keras': _version_of('keras'),
      'tf_keras': _version_of('tf_keras'),
      'TF_USE_LEGACY_KERAS': os.environ.get('TF_USE_LEGACY_KERAS'),
      onednn.ENV: os.environ.get(onednn.ENV),
      'accelerator_visible': onednn.accelerator_visible(),
      'platform': platform.platform(),
  }


def write_json(runs: List[RunResult], path: str,
               run_settings: Dict[str, Any],
               run_environment: Dict[str, Any]) -> None:
  """Writes results.json.

  Args:
    runs: The runs, in the order of `RUN_NAMES`.
    path: The file to write.
    run_settings: What `settings` returned, with the API that ran.
    run_environment: What `environment` returned.

  The file holds `settings`, `environment` and `runs`: one
  `RunResult.summary` per key of `RESULT_KEYS`.
  """
  with open(path, 'w') as f:
    json.dump({'settings': run_settings, 'environment': run_environment,
               'runs': {key: run.summary()
                        for key, run in zip(RESULT_KEYS, runs)}},
              f, indent=2)
    f.write('\n')


def _version_of(module: str) -> Optional[str]:
  """The version of an imported module, or of its installed distribution."""
  if module in sys.modules:
    return getattr(sys.modules[module], '__version__', None)
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version(module)
  except metadata.PackageNotFoundError:
    return None
