"""The demo's figure: loss per step, and the loss scale with skipped steps."""

from typing import List

from tf_loss_scale.demo import results as results_lib


def save_plot(runs: List[results_lib.RunResult], path: str, title: str) -> None:
  """Writes a PNG with two panels sharing the step axis.

  Args:
    runs: The runs; every run's loss is drawn, and the loss scale of each run
      that had one, with its skipped steps marked.
    path: The PNG file to write.
    title: The figure's title.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  figure, (loss_axes, scale_axes) = pyplot.subplots(
      2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
  for run in runs:
    loss_axes.plot(run.losses, label=run.name, linewidth=0.8, alpha=0.85)
  loss_axes.set_yscale('log')
  loss_axes.set_ylabel('training loss')
  loss_axes.legend()
  loss_axes.set_title(title, fontsize=10)

  for run in runs:
    if run.scales is None:
      continue
    scale_axes.plot(run.scales, label=f'loss scale ({run.name})', color='C2')
    skipped = [step for step, was_skipped in enumerate(run.skipped)
               if was_skipped]
    scale_axes.scatter(skipped, [run.scales[step] for step in skipped],
                       marker='x', color='C3', zorder=3,
                       label=f'skipped steps ({len(skipped)})')
  scale_axes.set_yscale('log', base=2)
  scale_axes.set_xlabel('step')
  scale_axes.set_ylabel('loss scale')
  scale_axes.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  pyplot.close(figure)
