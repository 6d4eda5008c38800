"""Tests of `python -m tf_loss_scale demo`, on tiny configurations."""

import glob
import io
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_loss_scale import __main__ as cli
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import keras_run
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import results as results_lib
from tf_loss_scale.demo import runner

STEPS = 40
GROWTH_STEPS = 5
INITIAL_SCALE = 2.0**15
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TensorFlow's C++ logging prints: "I0000 00:00:17... file.cc:31] ...",
# absl's notice before its initialisation, and the CPU-feature advice.
_TF_LOG_LINE = re.compile(
    r'^[IWEF]\d{4} |absl::InitializeLog|cpu_feature_guard|oneDNN|'
    r'To enable the following instructions')


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


def _check_results_json(out_dir, steps):
  """results.json: the three keys, each with every field in its range."""
  with open(os.path.join(out_dir, runner.RESULTS_FILE)) as f:
    results = json.load(f)
  assert list(results) == ['float32', 'float16_unscaled', 'float16_scaled']
  for key, entry in results.items():
    assert set(entry) == {'test_accuracy', 'final_loss', 'flushed_fraction',
                          'skipped_steps', 'final_scale', 'seconds'}, key
    assert 0.0 <= entry['test_accuracy'] <= 1.0, (key, entry)
    assert math.isfinite(entry['final_loss']) and entry['final_loss'] > 0, (
        key, entry)
    assert isinstance(entry['skipped_steps'], int), (key, entry)
    assert 0 <= entry['skipped_steps'] <= steps, (key, entry)
    assert entry['seconds'] > 0, (key, entry)
  assert results['float32']['flushed_fraction'] is None
  for key in ('float32', 'float16_unscaled'):
    assert results[key]['final_scale'] is None, key
    assert results[key]['skipped_steps'] == 0, key
  scaled = results['float16_scaled']
  assert scaled['final_scale'] >= 1.0, scaled
  # The default loss weight puts nearly every gradient below float16's
  # smallest subnormal: unscaled float16 loses them, the loss scale keeps them.
  assert results['float16_unscaled']['flushed_fraction'] > 0.9, results
  assert scaled['flushed_fraction'] < 0.1, results
  assert results['float16_unscaled']['test_accuracy'] < 0.3, results
  assert results['float32']['test_accuracy'] > 0.6, results
  assert scaled['test_accuracy'] == pytest.approx(
      results['float32']['test_accuracy'], abs=0.05), results
  return results


def _check_png(out_dir):
  with open(os.path.join(out_dir, runner.PLOT_FILE), 'rb') as png:
    assert png.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('api', config_lib.APIS)
def test_mirrored_runs_record_consistent_results(tmp_path, monkeypatch,
                                                 mirrored_strategy, api):
  # The process's one eager MirroredStrategy is the tests' shared one.
  monkeypatch.setattr(keras_run, 'mirrored_strategy', lambda: mirrored_strategy)
  config = config_lib.DemoConfig(
      api=api, strategy='mirrored', steps=STEPS, growth_steps=GROWTH_STEPS,
      initial_scale=INITIAL_SCALE, probe_every=10, out=str(tmp_path))
  stream = io.StringIO()
  runs = runner.run_demo(config, stream)

  assert [run.name for run in runs] == list(results_lib.RUN_NAMES)
  float32, unscaled, scaled = runs
  for run in runs:
    assert len(run.losses) == STEPS and len(run.skipped) == STEPS, run.name
    assert all(math.isfinite(loss) for loss in run.losses), run.name
  for run in (float32, scaled):
    assert run.losses[-1] < run.losses[0] / 2, f'{run.name} did not learn'
  # Every gradient flushed: the unscaled run's weights never move.
  assert unscaled.losses[-1] > 2.0, unscaled.losses
  assert float32.scales is None and unscaled.scales is None
  assert len(scaled.scales) == STEPS
  _check_scale_follows_the_rule(scaled)
  for run in (unscaled, scaled):
    assert run.gradient_histogram.sum() > 0, run.name
  text = stream.getvalue()
  for run in runs:
    assert f'{run.name:<34} [{"#" * 30}] {STEPS}/{STEPS}' in text, text

  _check_png(str(tmp_path))
  _check_results_json(str(tmp_path), STEPS)
  for kind, run in zip(config_lib.KINDS, runs):
    log_dir = os.path.join(str(tmp_path), runner.TENSORBOARD_DIR, kind)
    losses = _scalars(log_dir, 'loss')
    assert sorted(losses) == list(range(STEPS)), kind
    assert [losses[step] for step in range(STEPS)] == pytest.approx(
        run.losses, rel=1e-6), kind
  scales = _scalars(os.path.join(str(tmp_path), runner.TENSORBOARD_DIR,
                                 'scaled'), 'loss_scale/scale')
  assert [scales[step] for step in range(STEPS)] == scaled.scales


@pytest.mark.parametrize('api', config_lib.APIS)
def test_cli_prints_the_table_and_writes_results(capsys, tmp_path, api):
  code = cli.main(['demo', '--api', api, '--steps', '30', '--growth-steps',
                   '5', '--probe-every', '10', '--out', str(tmp_path)])
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
  results = _check_results_json(str(tmp_path), 30)
  for row, key in zip(rows, results_lib.RESULT_KEYS):
    accuracy = float(row.split('%')[0].split()[-1])
    assert accuracy == pytest.approx(100 * results[key]['test_accuracy'],
                                     abs=0.05), row
  _check_png(str(tmp_path))
  for name in (runner.PLOT_FILE, runner.RESULTS_FILE, runner.TENSORFLOW_LOG):
    assert os.path.join(str(tmp_path), name) in out, (name, out)


def test_cli_output_is_quiet(tmp_path):
  command = [sys.executable, '-m', 'tf_loss_scale', 'demo', '--api', 'v1',
             '--steps', '5', '--probe-every', '5', '--out', str(tmp_path)]
  environment = dict(os.environ, PYTHONPATH=ROOT)
  environment.pop('TF_CPP_MIN_LOG_LEVEL', None)
  done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                        env=environment, check=False)
  assert done.returncode == 0, done.stderr
  noisy = [line for line in done.stdout.splitlines()
           if _TF_LOG_LINE.search(line)]
  assert not noisy, done.stdout
  # Nothing at all on stderr: `import tf_loss_scale` loads no TensorFlow, so
  # the demo routes even TensorFlow's import notices to its log file.
  assert not done.stderr.strip(), done.stderr
  with open(os.path.join(str(tmp_path), runner.TENSORFLOW_LOG)) as log:
    assert log.read(), 'TensorFlow said nothing: was the log captured?'


def test_histogram_counts_magnitudes_and_the_share_below_a_threshold():
  counts = measure.log2_histogram(
      np.array([2.0**-30, -2.0**-30, 2.0**-10, 0.0, 2.0**-24]))
  assert counts.sum() == 4  # The zero is not counted.
  assert counts[np.searchsorted(measure.LOG2_EDGES, -30.0)] == 2
  # 2**-30 twice is below 2**-24; 2**-24 itself and 2**-10 are not.
  assert measure.share_below(counts, -24.0) == 0.5
  # Times a loss scale of 2**10, nothing is below 2**-24 any more.
  assert measure.share_below(counts, -24.0, shift=10.0) == 0.0
  assert measure.share_below(np.zeros_like(counts), -24.0) == 0.0


def test_cli_rejects_bad_settings(capsys):
  assert cli.main(['demo', '--steps', '0']) == 2
  assert 'steps must be a positive int' in capsys.readouterr().err
  assert cli.main(['demo', '--loss-weight', '0']) == 2
  assert 'loss_weight must be a finite positive number, but got 0.0' in (
      capsys.readouterr().err)
  assert cli.main(['demo', '--strategy', 'mirrored', '--batch-size', '7']) == 2
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['demo', '--api', 'v2'])
  assert exit_info.value.code == 2
