"""Tests of `python -m tf_loss_scale demo`, on tiny configurations."""

import glob
import io
import math
import os

import pytest
import tensorflow as tf

from tf_loss_scale import __main__ as cli
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import keras_run
from tf_loss_scale.demo import results as results_lib
from tf_loss_scale.demo import runner

STEPS = 40
GROWTH_STEPS = 5
INITIAL_SCALE = 2.0**15


def _scalars(log_dir, tag):
  found = {}
  for path in glob.glob(os.path.join(log_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          found[event.step] = (float(tf.make_ndarray(value.tensor))
                               if value.HasField('tensor') else value.simple_value)
  return found


def _check_scale_follows_the_rule(run):
  """Replays the dynamic rule on the recorded skips; the scales must match."""
  scale, good = INITIAL_SCALE, 0
  for step, (skipped, recorded) in enumerate(zip(run.skipped, run.scales)):
    if skipped:
      scale, good = max(scale / 2, 1.0), 0
    elif good + 1 >= GROWTH_STEPS:
      scale, good = scale * 2, 0
    else:
      good += 1
    assert recorded == scale, (
        f'{run.name}: step {step}: recorded loss scale {recorded}, the rule '
        f'gives {scale} (skipped={skipped})')


def _check_outputs(runs, out_dir, steps):
  assert [run.name for run in runs] == list(results_lib.RUN_NAMES)
  for run in runs:
    assert len(run.losses) == steps and len(run.skipped) == steps, run.name
    assert all(math.isfinite(loss) for loss in run.losses), run.name
    assert run.losses[-1] < run.losses[0], f'{run.name} did not learn'
    assert 0.5 < run.test_accuracy <= 1.0, f'{run.name}: {run.test_accuracy}'
    assert run.wall_time > 0
  float32, mixed, scaled = runs
  assert float32.flushed_fraction is None and float32.scales is None
  assert mixed.scales is None and mixed.skipped_steps == 0
  for run in (mixed, scaled):
    assert 0.0 <= run.flushed_fraction < 1.0, run.name
  assert len(scaled.scales) == steps
  _check_scale_follows_the_rule(scaled)

  with open(os.path.join(out_dir, runner.PLOT_FILE), 'rb') as png:
    assert png.read(8) == b'\x89PNG\r\n\x1a\n'
  for kind, run in zip(config_lib.KINDS, runs):
    log_dir = os.path.join(out_dir, runner.TENSORBOARD_DIR, kind)
    losses = _scalars(log_dir, 'loss')
    assert sorted(losses) == list(range(steps)), kind
    assert [losses[step] for step in range(steps)] == pytest.approx(
        run.losses, rel=1e-6), kind
  scales = _scalars(os.path.join(out_dir, runner.TENSORBOARD_DIR, 'scaled'),
                    'loss_scale/scale')
  assert [scales[step] for step in range(steps)] == scaled.scales


@pytest.mark.parametrize('api, strategy', [
    ('v1', 'none'), ('v1', 'mirrored'), ('keras', 'none'),
    ('keras', 'mirrored')])
def test_demo_runs_record_consistent_results(tmp_path, monkeypatch,
                                             mirrored_strategy, api, strategy):
  # The process's one eager MirroredStrategy is the tests' shared one.
  monkeypatch.setattr(keras_run, 'mirrored_strategy', lambda: mirrored_strategy)
  config = config_lib.DemoConfig(
      api=api, strategy=strategy, steps=STEPS, growth_steps=GROWTH_STEPS,
      initial_scale=INITIAL_SCALE, probe_every=10, out=str(tmp_path))
  stream = io.StringIO()
  runs = runner.run_demo(config, stream)
  _check_outputs(runs, str(tmp_path), STEPS)
  text = stream.getvalue()
  for run in runs:
    assert f'{run.name:<34} [{"#" * 30}] {STEPS}/{STEPS}' in text, text


def test_cli_prints_the_table(capsys, tmp_path):
  code = cli.main(['demo', '--api', 'v1', '--steps', '20', '--growth-steps',
                   '5', '--probe-every', '5', '--out', str(tmp_path)])
  out = capsys.readouterr().out
  assert code == 0
  lines = out.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith('run '))
  assert lines[header].split() == ['run', 'test', 'acc', 'final', 'loss', 'fp16',
                                   'grads', 'flushed', 'skipped', 'final',
                                   'scale', 'time']
  rows = lines[header + 2:header + 5]
  assert rows[0].startswith('float32 ') and '(reference)' in rows[0]
  assert rows[1].startswith('mixed_float16, no loss scaling ')
  assert rows[2].startswith('mixed_float16, dynamic loss scale ')
  for row in rows:
    accuracy = float(row.split('%')[0].split()[-1])
    assert 50.0 < accuracy <= 100.0, row
  assert os.path.exists(os.path.join(tmp_path, runner.PLOT_FILE))


def test_cli_rejects_bad_settings(capsys):
  assert cli.main(['demo', '--steps', '0']) == 2
  assert 'steps must be a positive int' in capsys.readouterr().err
  assert cli.main(['demo', '--strategy', 'mirrored', '--batch-size', '7']) == 2
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['demo', '--api', 'v2'])
  assert exit_info.value.code == 2
