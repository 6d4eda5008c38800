"""Records one run step by step: loss, loss scale, skipped steps, gradient probes."""

from typing import Callable, Optional, TextIO, Tuple

import numpy as np
import tensorflow as tf

from tf_loss_scale import monitoring
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib

# A probe measures the current weights on a fixed batch: flushed and non-zero
# gradient counts, and the float32 copy's gradient values.
Probe = Callable[[], Tuple[int, int, np.ndarray]]


class Recorder:
  """Collects what each API's training loop reports after every step.

  Args:
    name: The run's display name.
    config: The demo's settings.
    log_dir: Where the run's TensorBoard event files go.
    stream: Where the progress bar is drawn.
    probe: Measures flushed gradients, or None for the float32 run.
  """

  def __init__(self, name: str, config: config_lib.DemoConfig, log_dir: str,
               stream: TextIO, probe: Optional[Probe]):
    self._name = name
    self._config = config
    self._probe = probe
    self._losses, self._scales, self._skipped = [], [], []
    self._flushed = self._nonzero = 0
    self._histogram = np.zeros(len(measure.LOG2_EDGES) - 1, np.int64)
    self._log_dir = log_dir
    self._bar = report.ProgressBar(name, config.steps, stream)

  def step(self, step: int, loss: float, scale: Optional[float] = None,
           skipped_total: Optional[int] = None) -> None:
    """Records a finished step.

    Args:
      step: The step's index, from 0.
      loss: The step's unweighted training loss.
      scale: The loss scale after the step; None without loss scaling.
      skipped_total: Steps skipped so far, with `scale`.
    """
    self._losses.append(float(loss))
    if scale is None:
      self._skipped.append(False)
    else:
      self._scales.append(float(scale))
      self._skipped.append(int(skipped_total) > sum(self._skipped))
    if self._probe and (step % self._config.probe_every == 0 or
                        step == self._config.steps - 1):
      flushed, nonzero, values = self._probe()
      self._flushed += int(flushed)
      self._nonzero += int(nonzero)
      self._histogram += measure.log2_histogram(values)
    self._bar.update(step + 1)

  def finish(self, test_accuracy: float, wall_time: float,
             checkpoint: Optional[str] = None,
             skip_report: Optional[monitoring.SkipReport] = None
            ) -> results_lib.RunResult:
    """Ends the progress bar, writes the losses and returns the results.

    Call it eagerly (outside a TF1 graph): the TensorBoard writer is
    TensorFlow 2's.

    Args:
      test_accuracy: The trained model's accuracy on the test set.
      wall_time: Seconds spent training.
      checkpoint: Where the run saved its model and optimizer, if it did.
      skip_report: What `monitoring.last_skip` said after training.

    Returns:
      The run's `RunResult`.
    """
    self._bar.close()
    writer = tf.summary.create_file_writer(self._log_dir)
    with writer.as_default():
      for step, loss in enumerate(self._losses):
        monitoring.write_scalar('loss', loss, step)
    writer.close()
    probed = self._probe is not None
    return results_lib.RunResult(
        name=self._name, losses=self._losses,
        scales=self._scales or None, skipped=self._skipped,
        flushed_fraction=(self._flushed / max(self._nonzero, 1)
                          if probed else None),
        gradient_histogram=self._histogram if probed else None,
        test_accuracy=test_accuracy, wall_time=wall_time,
        checkpoint=checkpoint, skip_report=skip_report)
