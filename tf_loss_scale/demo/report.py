"""Text output of the demo: progress bars, the results table and the commands to look further."""

import importlib.util
import os
import shlex
import shutil
import sys
import time
from typing import List, Optional, TextIO

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import results as results_lib

_BAR_WIDTH = 30


class ProgressBar:
  """A one-line progress bar, redrawn in place.

  Args:
    label: What is being run.
    total: The number of steps.
    stream: Where to draw; by default `sys.stdout`.
  """

  def __init__(self, label: str, total: int, stream: Optional[TextIO] = None):
    self._label = label
    self._total = total
    self._stream = stream or sys.stdout
    self._start = time.perf_counter()
    self._drawn = -1
    self._interactive = getattr(self._stream, 'isatty', lambda: False)()

  def update(self, done: int) -> None:
    """Redraws the bar after `done` steps, when it visibly moves.

    On a stream that is not a terminal only the finished bar is drawn, so
    logs get one line per run.
    """
    filled = _BAR_WIDTH * done // self._total
    finished = done >= self._total
    if not finished and (filled == self._drawn or not self._interactive):
      return
    self._drawn = filled
    bar = '#' * filled + '.' * (_BAR_WIDTH - filled)
    elapsed = time.perf_counter() - self._start
    self._stream.write(f'\r{self._label:<34} [{bar}] {done}/{self._total} '
                       f'{elapsed:5.1f}s')
    self._stream.flush()

  def close(self) -> None:
    """Ends the bar's line."""
    self._stream.write('\n')
    self._stream.flush()


def format_table(runs: List[results_lib.RunResult], loss_window: int,
                 probe_every: int) -> str:
  """Lays out the results of the runs as a text table.

  Args:
    runs: The runs, in order.
    loss_window: How many final steps the reported loss is averaged over.
    probe_every: Steps between two measurements of flushed gradients.

  Returns:
    The table, with a header line and a short legend, without a final newline.
  """
  headers = ('run', 'test acc', 'final loss', 'fp16 grads flushed',
             'skipped', 'final scale', 'time')
  rows = []
  for run in runs:
    rows.append((
        run.name,
        f'{100 * run.test_accuracy:.1f}%',
        f'{run.final_loss(loss_window):.4f}',
        ('(reference)' if run.flushed_fraction is None else
         f'{100 * run.flushed_fraction:.2f}%'),
        str(run.skipped_steps),
        # As the plot's axis writes it: 2**41, not 2199023255552.
        ('-' if run.final_scale is None else
         config_lib.format_number(run.final_scale)),
        f'{run.wall_time:.1f}s',
    ))
  widths = [max(len(row[i]) for row in rows + [headers])
            for i in range(len(headers))]

  def line(cells):
    first = cells[0].ljust(widths[0])
    rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
    return '  '.join([first] + rest)

  legend = (
      f'final loss: mean training cross-entropy (unweighted) over the last '
      f'{loss_window} steps. '
      'fp16 grads flushed: share of gradient values that are non-zero in a '
      'float32 copy of the model but exactly zero in float16, measured on the '
      f'same weights and a fixed batch of {config_lib.PROBE_EXAMPLES} '
      f'training images every {probe_every} steps.')
  return '\n'.join([line(headers), line(['-' * w for w in widths])] +
                   [line(row) for row in rows] + ['', legend])


def format_skips(run: results_lib.RunResult, shown: int = 10) -> str:
  """Which steps of a scaled run were skipped, and the last one's report.

  Args:
    run: A run with a loss scale.
    shown: How many skipped steps to list at most.

  Returns:
    One or two lines, without a final newline.
  """
  steps = [step for step, skipped in enumerate(run.skipped) if skipped]
  if not steps:
    return f'{run.name}: no step was skipped.'
  listed = ', '.join(map(str, steps[:shown])) + (
      ', ...' if len(steps) > shown else '')
  text = f'{run.name}: skipped steps {listed}.'
  if run.skip_report is not None:
    text += (f'\nWhy the last was skipped (tf_loss_scale.monitoring.'
             f'last_skip): {run.skip_report}.')
  return text


def commands(checkpoint: Optional[str], tensorboard_dir: str) -> str:
  """The commands that look further into the demo's output, one per line.

  Each runs with this interpreter's environment as it is: a command of a
  package that is not installed is preceded by the command that installs it.

  Args:
    checkpoint: The scaled run's checkpoint, or None if none was saved.
    tensorboard_dir: The directory of the TensorBoard event files.

  Returns:
    The lines, each ending with a newline.
  """
  lines = []
  if checkpoint:
    lines.append("Loss scale in the scaled run's checkpoint: " +
                 command('tf-loss-scale', 'tf_loss_scale', 'inspect',
                         checkpoint))
  view = command('tensorboard', 'tensorboard.main', '--logdir',
                 tensorboard_dir)
  if importlib.util.find_spec('tensorboard') is None:
    install = shlex.join([sys.executable, '-m', 'pip', 'install',
                          'tensorboard'])
    lines.append(f'TensorBoard event files: {tensorboard_dir} (TensorBoard '
                 f'is not installed: {install}, then {view})')
  else:
    lines.append(f'TensorBoard: {view}')
  return ''.join(line + '\n' for line in lines)


def command(script: str, module: str, *args: str) -> str:
  """A shell command that runs `module` in this interpreter's environment.

  Args:
    script: The module's console script, used when it is installed next to
      this interpreter and found first on the PATH.
    module: The module to run with `python -m` otherwise.
    *args: The command's arguments.

  Returns:
    The command line, quoted for a POSIX shell.
  """
  found = shutil.which(script)
  here = os.path.abspath(os.path.dirname(sys.executable))
  if found and os.path.abspath(os.path.dirname(found)) == here:
    return shlex.join([script, *args])
  return shlex.join([sys.executable, '-m', module, *args])
