"""Runs the demo: three trainings, then the table, plot, results and event files."""

import contextlib
import dataclasses
import os
import sys
from typing import List, Optional, TextIO

from tf_loss_scale.demo import apis
from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import onednn
from tf_loss_scale.demo import quiet
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib

PLOT_FILE = 'loss_scale_demo.png'
RESULTS_FILE = 'results.json'
TENSORBOARD_DIR = 'tensorboard'
TENSORFLOW_LOG = 'tensorflow.log'
CHECKPOINT_DIR = 'checkpoint'


def configure_devices(config: config_lib.DemoConfig) -> None:
  """Splits the CPU into two logical devices when the strategy is mirrored.

  Must run before TensorFlow initialises its devices.

  Args:
    config: The demo's settings.

  Raises:
    RuntimeError: If TensorFlow has already initialised with one CPU device.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if config.strategy != 'mirrored':
    return
  cpu = tf.config.list_physical_devices('CPU')[0]
  if len(tf.config.get_logical_device_configuration(cpu) or []) >= 2:
    return
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


def run_demo(config: config_lib.DemoConfig,
             stream: Optional[TextIO] = None) -> List[results_lib.RunResult]:
  """Trains the three runs and writes the table, PNG, JSON and event files.

  First sets TensorFlow's oneDNN switch as `config.onednn` says (which works
  only if TensorFlow is not imported yet) and says so in one line. Unless
  `config.verbose`, TensorFlow's log goes to `tensorflow.log` in
  `config.out` (TensorFlow is imported in here, after the switch).

  Args:
    config: The demo's settings.
    stream: Where progress and the table are printed; `sys.stdout` by default.

  Returns:
    The three `results.RunResult`s, in the order of `results.RUN_NAMES`.

  Raises:
    apis.UnavailableError: If `config.api` cannot run with the installed
      TensorFlow and Keras (before anything is printed or trained).
  """
  stream = stream or sys.stdout
  onednn_line = onednn.configure_for_this_process(config.onednn)
  os.makedirs(config.out, exist_ok=True)
  log_path = os.path.join(config.out, TENSORFLOW_LOG)
  with (contextlib.nullcontext() if config.verbose
        else quiet.tensorflow_output_to(log_path)):
    # Before anything runs on TensorFlow's devices, the API check included.
    configure_devices(config)
    api, api_note = apis.resolve(config.api)
    stream.write(onednn_line + '\n')
    runs = _train_and_report(dataclasses.replace(config, api=api), api_note,
                             stream)
  if not config.verbose:
    stream.write(f'TensorFlow log: {log_path}\n')
  return runs


def _train_and_report(config: config_lib.DemoConfig, api_note: str,
                      stream: TextIO) -> List[results_lib.RunResult]:
  # The modules that import TensorFlow come in here, after the log switch.
  from tf_loss_scale.demo import plot  # pylint: disable=g-import-not-at-top
  api_run = apis.run_module(config.api)
  digits = data_lib.load_digits(seed=config.seed)
  batches = data_lib.batch_indices(len(digits.x_train), config.batch_size,
                                   config.steps, config.seed)
  stream.write(
      f'Digits: {len(digits.x_train)} training and {len(digits.x_test)} test '
      f'images. API {config.api}{" " + api_note if api_note else ""}, '
      f'strategy {config.strategy}, {config.steps} steps of '
      f'{config.batch_size}, loss weight '
      f'{config_lib.format_number(config.loss_weight)}.\n')
  runs = []
  for kind, name in zip(config_lib.KINDS, results_lib.RUN_NAMES):
    log_dir = os.path.join(config.out, TENSORBOARD_DIR, kind)
    checkpoint_dir = (os.path.join(config.out, CHECKPOINT_DIR)
                      if kind == config_lib.SCALED else None)
    runs.append(api_run.train(kind, name, config, digits, batches, log_dir,
                              checkpoint_dir, stream))
  stream.write('\n' + report.format_table(runs, results_lib.LOSS_WINDOW,
                                          config.probe_every) +
               '\n\n' + report.format_skips(runs[-1]) + '\n')
  plot_path = os.path.join(config.out, PLOT_FILE)
  plot.save_plot(runs, plot_path, config)
  results_path = os.path.join(config.out, RESULTS_FILE)
  results_lib.write_json(runs, results_path, results_lib.settings(config),
                         results_lib.environment())
  stream.write(f'\nPlot: {plot_path}\nResults: {results_path}\n')
  stream.write(report.commands(runs[-1].checkpoint,
                               os.path.join(config.out, TENSORBOARD_DIR)))
  return runs
