"""Tests of `python -m tf_loss_scale demo`, on tiny configurations."""

import glob
import importlib.util
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_loss_scale import __main__ as cli
from tf_loss_scale.demo import apis
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import measure
from tf_loss_scale.demo import onednn
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib
from tf_loss_scale.demo import runner

import versions

STEPS = 40
GROWTH_STEPS = 5
# The demo's default: high enough that the first step overflows float16.
INITIAL_SCALE = 2.0**40
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TensorFlow's C++ logging prints: "I0000 00:00:17... file.cc:31] ...",
# absl's notice before its initialisation, and the CPU-feature advice.
_TF_LOG_LINE = re.compile(
    r'^[IWEF]\d{4} |absl::InitializeLog|cpu_feature_guard|oneDNN custom|'
    r'To enable the following instructions')
# TensorFlow's notice, at import, that its oneDNN kernels are in use.
_ONEDNN_ON_NOTICE = 'oneDNN custom operations are on'


def _installed_keras_version():
  import keras  # pylint: disable=g-import-not-at-top
  return keras.__version__


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
  """Replays the dynamic rule on the recorded skips; the scales must match.

  Returns:
    The final `(scale, good_steps)` of the replay.
  """
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
  return scale, good


def _check_results_json(out_dir, steps, api, strategy='none'):
  """results.json: settings, versions, and the three runs in their ranges."""
  with open(os.path.join(out_dir, runner.RESULTS_FILE)) as f:
    results = json.load(f)
  assert list(results) == ['settings', 'environment', 'runs']
  settings = results['settings']
  assert (settings['api'], settings['strategy'], settings['steps'],
          settings['seed'], settings['loss_weight'],
          settings['initial_scale']) == (api, strategy, steps, 0, 2.0**-18,
                                         INITIAL_SCALE), settings
  environment = results['environment']
  assert environment['tensorflow'] == tf.__version__, environment
  assert environment['keras'] == _installed_keras_version(), environment
  assert environment[onednn.ENV] == os.environ.get(onednn.ENV), environment
  runs = results['runs']
  assert list(runs) == ['float32', 'float16_unscaled', 'float16_scaled']
  for key, entry in runs.items():
    assert set(entry) == {'test_accuracy', 'final_loss', 'flushed_fraction',
                          'skipped_steps', 'final_scale', 'seconds',
                          'checkpoint', 'skip_report'}, key
    assert 0.0 <= entry['test_accuracy'] <= 1.0, (key, entry)
    assert math.isfinite(entry['final_loss']) and entry['final_loss'] > 0, (
        key, entry)
    assert isinstance(entry['skipped_steps'], int), (key, entry)
    assert 0 <= entry['skipped_steps'] <= steps, (key, entry)
    assert entry['seconds'] > 0, (key, entry)
  assert runs['float32']['flushed_fraction'] is None
  for key in ('float32', 'float16_unscaled'):
    assert runs[key]['final_scale'] is None, key
    assert runs[key]['skipped_steps'] == 0, key
    assert runs[key]['checkpoint'] is None, key
    assert runs[key]['skip_report'] is None, key
  scaled = runs['float16_scaled']
  # The first step overflows at 2**40; the report is the last skip's.
  assert scaled['skipped_steps'] >= 1, scaled
  report = scaled['skip_report']
  assert set(report) == {'step', 'loss_scale', 'nan', 'inf', 'cause'}, report
  assert report['cause'] == 'overflow' and report['nan'] == [], report
  assert 0 <= report['step'] < steps, report
  assert report['inf'] and all(isinstance(name, str) and name
                               for name in report['inf']), report
  assert 1.0 <= report['loss_scale'] <= INITIAL_SCALE, report
  assert scaled['final_scale'] >= 1.0, scaled
  assert os.path.dirname(scaled['checkpoint']) == os.path.join(
      out_dir, runner.CHECKPOINT_DIR), scaled
  # The default loss weight puts nearly every gradient below float16's
  # smallest subnormal: unscaled float16 loses them, the loss scale keeps them.
  assert runs['float16_unscaled']['flushed_fraction'] > 0.9, runs
  assert scaled['flushed_fraction'] < 0.1, runs
  assert runs['float16_unscaled']['test_accuracy'] < 0.3, runs
  assert runs['float32']['test_accuracy'] > 0.6, runs
  assert scaled['test_accuracy'] == pytest.approx(
      runs['float32']['test_accuracy'], abs=0.05), runs
  return runs


def _check_png(out_dir):
  with open(os.path.join(out_dir, runner.PLOT_FILE), 'rb') as png:
    assert png.read(8) == b'\x89PNG\r\n\x1a\n'


def _skip_unless_available(api):
  reason = apis.unavailable_reason(api)
  if reason is not None:
    pytest.skip(f'--api {api} {reason} (test_cli_refuses_an_unavailable_api '
                'covers the refusal)')


@pytest.mark.parametrize('api', config_lib.APIS)
def test_mirrored_runs_record_consistent_results(tmp_path, monkeypatch,
                                                 mirrored_strategy, api):
  _skip_unless_available(api)
  # The demo's Keras APIs train with the `keras` package.
  if (api != 'v1' and versions.KERAS_3 and
      not versions.KERAS_SUMS_ACROSS_REPLICAS):
    pytest.skip(versions.KERAS_SUMS_ACROSS_REPLICAS.reason)
  from tf_loss_scale.demo import keras_run  # pylint: disable=g-import-not-at-top
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
  final_state = _check_scale_follows_the_rule(scaled)
  skipped = [step for step, was_skipped in enumerate(scaled.skipped)
             if was_skipped]
  assert skipped[0] == 0, skipped
  report = scaled.skip_report
  assert report.step == skipped[-1], (report, skipped)
  assert report.cause == 'overflow' and report.inf and not report.nan, report
  # The scale the skipped step's gradients were computed with: the scale
  # the step before left.
  assert report.loss_scale == (scaled.scales[report.step - 1]
                               if report.step else INITIAL_SCALE), report
  for run in (unscaled, scaled):
    assert run.gradient_histogram.sum() > 0, run.name
  text = stream.getvalue()
  assert (f'mixed_float16, dynamic loss scale: skipped steps '
          f'{", ".join(map(str, skipped[:10]))}') in text, text
  assert ('Why the last was skipped (tf_loss_scale.monitoring.last_skip): '
          f'{report}.') in text, text
  for run in runs:
    assert f'{run.name:<34} [{"#" * 30}] {STEPS}/{STEPS}' in text, text
  # TensorFlow was imported before the demo: it says it cannot switch.
  assert text.splitlines()[0].startswith('oneDNN: as TensorFlow was '
                                         'imported with'), text

  _check_png(str(tmp_path))
  _check_results_json(str(tmp_path), STEPS, api, 'mirrored')
  for kind, run in zip(config_lib.KINDS, runs):
    log_dir = os.path.join(str(tmp_path), runner.TENSORBOARD_DIR, kind)
    losses = _scalars(log_dir, 'loss')
    assert sorted(losses) == list(range(STEPS)), kind
    assert [losses[step] for step in range(STEPS)] == pytest.approx(
        run.losses, rel=1e-6), kind
  scales = _scalars(os.path.join(str(tmp_path), runner.TENSORBOARD_DIR,
                                 'scaled'), 'loss_scale/scale')
  assert [scales[step] for step in range(STEPS)] == scaled.scales
  from tf_loss_scale import inspect_checkpoint  # pylint: disable=g-import-not-at-top
  state, = inspect_checkpoint.inspect(scaled.checkpoint).states
  assert (state.scale, state.good_steps) == final_state, state


@pytest.mark.parametrize('api', config_lib.APIS)
def test_cli_prints_the_table_and_writes_results(capsys, tmp_path, api):
  _skip_unless_available(api)
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
  runs = _check_results_json(str(tmp_path), 30, api)
  report = runs['float16_scaled']['skip_report']
  assert (f'Why the last was skipped (tf_loss_scale.monitoring.last_skip): '
          f'step {report["step"]} skipped at loss scale '
          f'{report["loss_scale"]:g} (overflow): inf in ') in out, out
  for row, key in zip(rows, results_lib.RESULT_KEYS):
    accuracy = float(row.split('%')[0].split()[-1])
    assert accuracy == pytest.approx(100 * runs[key]['test_accuracy'],
                                     abs=0.05), row
  _check_png(str(tmp_path))
  for name in (runner.PLOT_FILE, runner.RESULTS_FILE, runner.TENSORFLOW_LOG):
    assert os.path.join(str(tmp_path), name) in out, (name, out)


@pytest.mark.parametrize('api', config_lib.APIS)
def test_cli_refuses_an_unavailable_api(capsys, tmp_path, api):
  reason = apis.unavailable_reason(api)
  if reason is None:
    pytest.skip(f'--api {api} works with TensorFlow {tf.__version__}; '
                'test_unavailable_api_message covers the message')
  code = cli.main(['demo', '--api', api, '--steps', '5', '--out',
                   str(tmp_path)])
  captured = capsys.readouterr()
  assert code == 2
  assert captured.out == ''
  available = [other for other in config_lib.APIS
               if apis.unavailable_reason(other) is None]
  assert captured.err == (
      f'tf-loss-scale demo: error: --api {api} {reason}; available here: '
      f'{", ".join(available)}.\n')


def test_unavailable_api_message(monkeypatch):
  # As on TensorFlow 2.15 and older, where `keras` is Keras 2.
  monkeypatch.setattr(apis, '_keras_version', lambda: '2.15.0')
  assert apis.unavailable_reason('keras') == (
      'needs Keras 3 (TensorFlow 2.16 or later); keras 2.15.0 is installed')
  with pytest.raises(apis.UnavailableError) as raised:
    apis.resolve('keras')
  message = str(raised.value)
  assert message.startswith('--api keras needs Keras 3 (TensorFlow 2.16 or '
                            'later); keras 2.15.0 is installed; available '
                            'here: '), message
  assert '\n' not in message
  assert apis.resolve('auto') == ('v1', '(the default here)')


def test_auto_runs_keras_where_it_works_else_v1():
  keras_3 = int(_installed_keras_version().split('.')[0]) >= 3
  if not keras_3:
    assert apis.unavailable_reason('keras').startswith('needs Keras 3')
  expected = 'keras' if apis.unavailable_reason('keras') is None else 'v1'
  assert apis.resolve('auto') == (expected, '(the default here)')


def _run_cli(args):
  # TensorFlow logs everything, to show that none of it reaches the terminal
  # and that its notice about oneDNN tells whether oneDNN is on.
  environment = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='0')
  environment.pop(onednn.ENV, None)
  return subprocess.run([sys.executable, '-m', 'tf_loss_scale', *args],
                        capture_output=True, text=True, timeout=300,
                        env=environment, check=False)


def _printed_commands(stdout):
  """The inspect command and the TensorBoard line the demo printed."""
  inspect_line, = [line for line in stdout.splitlines()
                   if line.startswith("Loss scale in the scaled run's "
                                      'checkpoint: ')]
  tensorboard_line, = [line for line in stdout.splitlines()
                       if line.startswith('TensorBoard')]
  return inspect_line.split(': ', 1)[1], tensorboard_line


@pytest.mark.skipif(onednn.accelerator_visible(),
                    reason='with a GPU or TPU visible, auto keeps oneDNN on')
def test_cli_output_is_quiet_and_every_printed_command_works(tmp_path):
  done = _run_cli(['demo', '--steps', '5', '--probe-every', '5', '--out',
                   str(tmp_path)])
  assert done.returncode == 0, done.stderr
  noisy = [line for line in done.stdout.splitlines()
           if _TF_LOG_LINE.search(line)]
  assert not noisy, done.stdout
  # Nothing at all on stderr: `import tf_loss_scale` loads no TensorFlow, so
  # the demo routes even TensorFlow's import notices to its log file.
  assert not done.stderr.strip(), done.stderr
  with open(os.path.join(str(tmp_path), runner.TENSORFLOW_LOG)) as log:
    tensorflow_log = log.read()
  assert tensorflow_log, 'TensorFlow said nothing: was the log captured?'
  # On a CPU-only machine oneDNN is off, said in one line, and TensorFlow
  # took it: its notice that oneDNN is on is missing from its log.
  onednn_lines = [line for line in done.stdout.splitlines()
                  if 'oneDNN' in line]
  assert onednn_lines == [
      'oneDNN: off on this CPU-only machine (its float16 kernels can slow '
      'mixed_float16 many times over); --onednn on keeps it.'], done.stdout
  assert _ONEDNN_ON_NOTICE not in tensorflow_log
  with open(os.path.join(str(tmp_path), runner.RESULTS_FILE)) as f:
    results = json.load(f)
  assert results['environment'][onednn.ENV] == '0'
  assert results['settings']['onednn'] == 'auto'

  inspect_command, tensorboard_line = _printed_commands(done.stdout)
  inspected = subprocess.run(shlex.split(inspect_command), capture_output=True,
                             text=True, timeout=300, check=False,
                             env=dict(os.environ, PYTHONPATH=ROOT))
  assert (inspected.returncode, inspected.stderr) == (0, ''), inspected.stderr
  final_scale = results['runs']['float16_scaled']['final_scale']
  assert f'    current loss scale: {final_scale:g}' in (
      inspected.stdout.splitlines()), inspected.stdout
  log_dir = os.path.join(str(tmp_path), runner.TENSORBOARD_DIR)
  if importlib.util.find_spec('tensorboard') is None:
    assert tensorboard_line == (
        f'TensorBoard event files: {log_dir} (TensorBoard is not installed: '
        f'{shlex.join([sys.executable, "-m", "pip", "install", "tensorboard"])}'
        f', then {report.command("tensorboard", "tensorboard.main", "--logdir", log_dir)})')
    return
  tensorboard_command = tensorboard_line.split(': ', 1)[1]
  assert shlex.split(tensorboard_command)[-2:] == ['--logdir', log_dir]
  # --inspect makes TensorBoard summarise the event files instead of serving.
  viewed = subprocess.run(shlex.split(tensorboard_command) + ['--inspect'],
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert viewed.returncode == 0, viewed.stderr
  for kind in config_lib.KINDS:
    assert os.path.join(log_dir, kind) in viewed.stdout, viewed.stdout


@pytest.mark.skipif(onednn.accelerator_visible(),
                    reason='the notice is about the CPU kernels')
def test_cli_keeps_onednn_on_when_asked(tmp_path):
  # Mirrored too: the two logical CPUs are made before the API check runs.
  done = _run_cli(['demo', '--api', 'v1', '--strategy', 'mirrored',
                   '--onednn', 'on', '--steps', '2', '--probe-every', '2',
                   '--out', str(tmp_path)])
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[0] == (
      f'oneDNN: on (--onednn on, {onednn.ENV}=1).')
  with open(os.path.join(str(tmp_path), runner.TENSORFLOW_LOG)) as log:
    assert _ONEDNN_ON_NOTICE in log.read()


def test_onednn_choice_for_each_setting_and_machine():
  def configure(setting, environ=None, **kwargs):
    environ = {} if environ is None else environ
    line = onednn.configure(setting, environ, **kwargs)
    return environ.get(onednn.ENV), line

  value, line = configure('auto')
  assert value == '0' and line.startswith('oneDNN: off on this CPU-only')
  value, line = configure('auto', accelerator=True)
  assert value is None and line.startswith("oneDNN: TensorFlow's default")
  # The user's own setting stands under auto, and the flag overrides it.
  value, line = configure('auto', {onednn.ENV: '1'})
  assert value == '1' and line == (
      f'oneDNN: {onednn.ENV}=1 from the environment (--onednn on|off '
      'overrides it).')
  assert configure('off', {onednn.ENV: '1'})[0] == '0'
  assert configure('on', accelerator=False)[0] == '1'
  # Once TensorFlow is loaded nothing changes, and the line says so.
  value, line = configure('off', tensorflow_loaded=True)
  assert value is None and 'can no longer change it' in line
  with pytest.raises(ValueError, match=r"onednn must be one of .*'maybe'"):
    onednn.configure('maybe', {})


@pytest.mark.parametrize('files, environ, visible', [
    ((), {}, False),
    (('dev/nvidia0',), {}, True),
    (('proc/driver/nvidia/gpus/0000:00:04.0/information',), {}, True),
    (('dev/nvidia0',), {'CUDA_VISIBLE_DEVICES': ''}, False),
    (('dev/nvidia0',), {'CUDA_VISIBLE_DEVICES': '-1'}, False),
    (('dev/nvidiactl',), {}, False),  # the driver's control file, no GPU
    (('dev/kfd',), {}, True),
    (('dev/kfd',), {'HIP_VISIBLE_DEVICES': '-1'}, False),
    (('dev/accel0',), {}, True),
])
def test_accelerator_seen_from_device_files(tmp_path, files, environ,
                                            visible):
  for name in files:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('')
  assert onednn.accelerator_visible(environ, str(tmp_path)) == visible


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


@pytest.mark.parametrize('text, value', [
    ('2**-18', 2.0**-18), ('2^-18', 2.0**-18), (' 2 ** 15 ', 2.0**15),
    ('2^+3', 8.0), ('0.1', 0.1), ('1e-3', 1e-3), ('1', 1.0),
])
def test_cli_takes_numbers_and_powers_of_two(monkeypatch, text, value):
  taken = []
  monkeypatch.setattr(runner, 'run_demo', taken.append)
  for flag, field in (('--loss-weight', 'loss_weight'),
                      ('--initial-scale', 'initial_scale'),
                      ('--learning-rate', 'learning_rate')):
    assert cli.main(['demo', flag, text]) == 0
    assert getattr(taken.pop(), field) == value, (flag, text)


@pytest.mark.parametrize('text', ['2**x', '3**2', '2**-1.5', '2**', 'big'])
def test_cli_rejects_other_numbers_naming_them(capsys, text):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(['demo', '--loss-weight', text])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.splitlines()[-1] == (
      'tf-loss-scale demo: error: argument --loss-weight: expected a number '
      f'or a power of two such as 2**-18 or 2^-18, but got {text!r}'), err


def test_help_shows_powers_of_two(capsys):
  with pytest.raises(SystemExit):
    cli.main(['demo', '--help'])
  help_text = ' '.join(capsys.readouterr().out.split())
  assert 'classifier (default: 2**-18)' in help_text, help_text
  assert 'dynamic loss scale (default: 2**40)' in help_text, help_text
  assert '(default: 0.1)' in help_text, help_text
  assert '3.814697265625e-06' not in help_text


def test_numbers_are_written_as_they_are_read():
  for value, text in ((2.0**-18, '2**-18'), (2.0**15, '2**15'), (1.0, '1'),
                      (8.0, '8'), (0.1, '0.1'), (3.0, '3')):
    assert config_lib.format_number(value) == text
    assert config_lib.parse_number(text) == value


def test_commands_use_a_console_script_only_from_this_environment(
    monkeypatch):
  here = os.path.dirname(sys.executable)
  monkeypatch.setattr(report.shutil, 'which',
                      lambda name: os.path.join(here, name))
  assert report.command('tf-loss-scale', 'tf_loss_scale', 'inspect',
                        'a b/ckpt') == "tf-loss-scale inspect 'a b/ckpt'"
  # Another environment's script on the PATH would run other packages.
  monkeypatch.setattr(report.shutil, 'which',
                      lambda name: os.path.join('/elsewhere/bin', name))
  assert report.command('tf-loss-scale', 'tf_loss_scale', 'inspect',
                        'ckpt') == shlex.join(
                            [sys.executable, '-m', 'tf_loss_scale', 'inspect',
                             'ckpt'])


def _demo_like_runs(steps=1000, growth_steps=100,
                    skips=(0, 1, 3, 22, 598, 807, 987)):
  """Runs shaped as the demo's: its skipped steps, its dynamic rule."""
  from tf_loss_scale import step_record  # pylint: disable=g-import-not-at-top
  scales, skipped, scale, good = [], [], 2.0**40, 0
  for step in range(steps):
    skip = step in skips
    if skip:
      scale, good = scale / 2, 0
    elif good + 1 >= growth_steps:
      scale, good = scale * 2, 0
    else:
      good += 1
    scales.append(scale)
    skipped.append(skip)
  losses = list(np.linspace(2.3, 0.05, steps))
  histogram = np.zeros(len(measure.LOG2_EDGES) - 1)
  histogram[40:90] = np.arange(50)
  report_ = step_record.SkipReport(
      step=skips[-1], loss_scale=scales[skips[-1] - 1], nan=(),
      inf=('dense/kernel',), cause='overflow')
  return [
      results_lib.RunResult('float32', losses, None, [False] * steps, None,
                            None, 0.9, 1.0),
      results_lib.RunResult(results_lib.RUN_NAMES[1], [2.3] * steps, None,
                            [False] * steps, 0.5, histogram, 0.1, 1.0),
      results_lib.RunResult(results_lib.RUN_NAMES[2], losses, scales, skipped,
                            0.001, histogram, 0.9, 1.0,
                            skip_report=report_)]


def test_plot_notes_are_clear_of_every_legend():
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  from matplotlib import text as text_lib  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.demo import plot  # pylint: disable=g-import-not-at-top
  figure = plot.make_figure(_demo_like_runs(), config_lib.DemoConfig())
  try:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    # The notes' text, not their arrows (which may cross a legend).
    notes = {note.get_text(): text_lib.Text.get_window_extent(note, renderer)
             for axes in figure.axes for note in axes.texts}
    legends = [axes.get_legend().get_window_extent(renderer)
               for axes in figure.axes if axes.get_legend() is not None]
    assert ('last skip report: step 987, overflow (1 inf, 0 NaN gradients)'
            in notes), sorted(notes)
    assert len(legends) == 3
    for label, box in notes.items():
      assert figure.bbox.contains(box.x0, box.y0) and figure.bbox.contains(
          box.x1, box.y1), f'{label!r} is outside the figure'
      for legend in legends:
        assert not box.overlaps(legend), f'{label!r} is under a legend'
  finally:
    pyplot.close(figure)


def test_table_writes_scales_as_powers_of_two():
  runs = _demo_like_runs()
  table = report.format_table(runs, loss_window=10, probe_every=50)
  scaled = table.splitlines()[4]
  assert scaled.startswith(results_lib.RUN_NAMES[2]), table
  # 2**40 halved 7 times, doubled 8 times (after 100 finite steps each).
  assert runs[2].final_scale == 2.0**41
  assert scaled.split()[-2] == '2**41', table
