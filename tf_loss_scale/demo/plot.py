"""The demo's figure: loss per step, the loss scale, and gradient magnitudes."""

import math
from typing import Any, List

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import results as results_lib

_FLOAT16_LINES = (
    (measure.SMALLEST_SUBNORMAL_LOG2, 'smallest subnormal 2$^{-24}$'),
    (measure.SMALLEST_NORMAL_LOG2, 'smallest normal 2$^{-14}$'),
    (measure.LARGEST_LOG2, 'largest 65504'),
)


def save_plot(runs: List[results_lib.RunResult], path: str,
              config: config_lib.DemoConfig) -> None:
  """Writes a PNG: loss and loss scale per step, and a gradient histogram.

  Args:
    runs: The runs, in the order of `results.RUN_NAMES`; every run's loss is
      drawn, the loss scale of each run that had one with its skipped steps
      marked, and the histogram of the gradients of a float32 copy of the
      scaled run, as computed and times its final loss scale.
    path: The PNG file to write.
    config: The settings the runs were made with (the API resolved).
  """
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure = make_figure(runs, config)
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def make_figure(runs: List[results_lib.RunResult],
                config: config_lib.DemoConfig) -> Any:
  """The figure `save_plot` writes, drawn and laid out, not yet closed.

  Args:
    runs: As for `save_plot`.
    config: As for `save_plot`.

  Returns:
    A `matplotlib.figure.Figure` (close it with `pyplot.close`).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  figure = pyplot.figure(figsize=(14, 7))
  grid = figure.add_gridspec(2, 2, height_ratios=(3, 2), width_ratios=(1, 1))
  loss_axes = figure.add_subplot(grid[0, 0])
  scale_axes = figure.add_subplot(grid[1, 0], sharex=loss_axes)
  histogram_axes = figure.add_subplot(grid[:, 1])
  _draw_losses(loss_axes, runs)
  _draw_scales(scale_axes, runs)
  _draw_histogram(histogram_axes, runs[-1], config.probe_every)
  figure.suptitle(_title(config), fontsize=10)
  figure.tight_layout()
  return figure


def _draw_losses(axes, runs):
  for index, run in enumerate(runs):
    # float32 is drawn wide so that a scaled run on top of it stays visible.
    axes.plot(run.losses, label=run.name, linewidth=2.5 if index == 0 else 0.9,
              alpha=0.5 if index == 0 else 0.9)
  axes.set_yscale('log')
  axes.set_ylabel('training loss (cross-entropy)')
  axes.legend()


def _draw_scales(axes, runs):
  for run in runs:
    if run.scales is None:
      continue
    axes.plot(run.scales, label=f'loss scale ({run.name})', color='C2')
    skipped = [step for step, was_skipped in enumerate(run.skipped)
               if was_skipped]
    axes.scatter(skipped, [run.scales[step] for step in skipped], marker='x',
                 color='C3', zorder=3, label=f'skipped steps ({len(skipped)})')
    report = run.skip_report
    if report is not None and 0 <= report.step < len(run.scales):
      # Above the axes, where no legend or curve can cover it.
      axes.annotate(
          f'last skip report: step {report.step}, {report.cause} '
          f'({len(report.inf)} inf, {len(report.nan)} NaN gradients)',
          (report.step, run.scales[report.step]), xytext=(0.99, 1.02),
          textcoords='axes fraction', ha='right', va='bottom', fontsize=8,
          color='C3', arrowprops={'arrowstyle': '->', 'color': 'C3'})
  axes.set_yscale('log', base=2)
  axes.set_xlabel('step')
  axes.set_ylabel('loss scale')
  axes.legend()


def _title(config: config_lib.DemoConfig) -> str:
  return (f'8x8 digits MLP, {config.api} API, strategy {config.strategy}, '
          f'batch {config.batch_size}, loss weight '
          f'{_math_number(config.loss_weight)}; dynamic scale from '
          f'{_math_number(config.initial_scale)}, $\\times$2 after '
          f'{config.growth_steps} good steps')


def _math_number(value: float) -> str:
  """A power of two as 2 with a superscript, as the axes write them."""
  text = config_lib.format_number(value)
  if text.startswith('2**'):
    return f'2$^{{{text[3:]}}}$'
  return text


def _draw_histogram(axes, run, probe_every):
  """log2 |g| of a float32 copy's gradients, as is and times the loss scale."""
  counts = run.gradient_histogram
  edges = measure.LOG2_EDGES
  shift = math.log2(run.final_scale) if run.final_scale else 0.0
  total = max(int(counts.sum()), 1)
  for offset, color, label in (
      (0.0, 'C1', 'float32 copy, no loss scale'),
      (shift, 'C2', 'float32 copy times the final loss scale '
       f'{_math_number(2.0**shift)}')):
    flushed = measure.share_below(counts, measure.SMALLEST_SUBNORMAL_LOG2,
                                  offset)
    axes.stairs(100 * counts / total, edges + offset, fill=True, alpha=0.45,
                color=color,
                label=f'{label}: {100 * flushed:.1f}% below 2$^{{-24}}$')
  filled = edges[:-1][counts > 0]
  low = filled.min() - 2 if filled.size else measure.SMALLEST_SUBNORMAL_LOG2
  high = max(measure.LARGEST_LOG2, (filled.max() if filled.size else 0) +
             shift) + 4
  axes.set_xlim(low, high)
  axes.axvspan(low, measure.SMALLEST_SUBNORMAL_LOG2, color='0.85', zorder=0,
               label='flushes to zero in float16')
  for exponent, label in _FLOAT16_LINES:
    axes.axvline(exponent, color='0.3', linestyle='--', linewidth=0.8)
    axes.annotate(label, (exponent, 1.0), xycoords=('data', 'axes fraction'),
                  xytext=(3, -4), textcoords='offset points', rotation=90,
                  va='top', fontsize=8)
  axes.set_xlabel('log$_2$ |gradient value|')
  axes.set_ylabel('% of non-zero gradient values')
  axes.set_title(
      'gradients of a float32 copy of the scaled run (same weights),\non a '
      f'fixed batch of {config_lib.PROBE_EXAMPLES} images every '
      f'{probe_every} steps', fontsize=9)
  # Below the axes, clear of the threshold labels at the top.
  axes.legend(loc='upper center', bbox_to_anchor=(0.5, -0.1), fontsize=8)
