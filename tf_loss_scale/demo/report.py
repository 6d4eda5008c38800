"""Text output of the demo: a progress bar per run and the results table."""

import sys
import time
from typing import List, Optional, TextIO

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


def format_table(runs: List[results_lib.RunResult], loss_window: int) -> str:
  """Lays out the results of the runs as a text table.

  Args:
    runs: The runs, in order.
    loss_window: How many final steps the reported loss is averaged over.

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
        '-' if run.final_scale is None else f'{run.final_scale:.0f}',
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
      'fp16 grads flushed: share of gradient values that are non-zero in '
      'float32 but exactly zero after float16, averaged over probes of the '
      'same weights during training.')
  return '\n'.join([line(headers), line(['-' * w for w in widths])] +
                   [line(row) for row in rows] + ['', legend])
