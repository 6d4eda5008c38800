"""Runs the demo: three trainings, then the table, plot, results and event files."""

import contextlib
import math
import os
import sys
from typing import List, Optional, TextIO

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import quiet
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib

PLOT_FILE = 'loss_scale_demo.png'
RESULTS_FILE = 'results.json'
TENSORBOARD_DIR = 'tensorboard'
TENSORFLOW_LOG = 'tensorflow.log'


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

  Unless `config.verbose`, TensorFlow's log goes to `tensorflow.log` in
  `config.out` (TensorFlow is imported in here, after the switch).

  Args:
    config: The demo's settings.
    stream: Where progress and the table are printed; `sys.stdout` by default.

  Returns:
    The three `results.RunResult`s, in the order of `results.RUN_NAMES`.
  """
  stream = stream or sys.stdout
  os.makedirs(config.out, exist_ok=True)
  log_path = os.path.join(config.out, TENSORFLOW_LOG)
  with (contextlib.nullcontext() if config.verbose
        else quiet.tensorflow_output_to(log_path)):
    runs = _train_and_report(config, stream)
  if not config.verbose:
    stream.write(f'TensorFlow log: {log_path}\n')
  return runs


def _train_and_report(config: config_lib.DemoConfig,
                      stream: TextIO) -> List[results_lib.RunResult]:
  # The modules that import TensorFlow come in here, after the log switch.
  from tf_loss_scale.demo import plot  # pylint: disable=g-import-not-at-top
  configure_devices(config)
  api_run = _api_module(config.api)
  digits = data_lib.load_digits(seed=config.seed)
  batches = data_lib.batch_indices(len(digits.x_train), config.batch_size,
                                   config.steps, config.seed)
  stream.write(
      f'Digits: {len(digits.x_train)} training and {len(digits.x_test)} test '
      f'images. API {config.api}, strategy {config.strategy}, '
      f'{config.steps} steps of {config.batch_size}, loss weight '
      f'{_power_of_two(config.loss_weight)}.\n')
  runs = []
  for kind, name in zip(config_lib.KINDS, results_lib.RUN_NAMES):
    log_dir = os.path.join(config.out, TENSORBOARD_DIR, kind)
    runs.append(api_run.train(kind, name, config, digits, batches, log_dir,
                              stream))
  stream.write('\n' + report.format_table(runs, results_lib.LOSS_WINDOW) +
               '\n')
  plot_path = os.path.join(config.out, PLOT_FILE)
  plot.save_plot(runs, plot_path, _title(config))
  results_path = os.path.join(config.out, RESULTS_FILE)
  results_lib.write_json(runs, results_path)
  stream.write(f'\nPlot: {plot_path}\nResults: {results_path}\n'
               'TensorBoard: tensorboard --logdir '
               f'{os.path.join(config.out, TENSORBOARD_DIR)}\n')
  return runs


def _api_module(api: str):
  # pylint: disable=g-import-not-at-top
  if api == 'keras':
    from tf_loss_scale.demo import keras_run
    return keras_run
  if api == 'experimental':
    from tf_loss_scale.demo import experimental_run
    return experimental_run
  from tf_loss_scale.demo import v1_run
  return v1_run


def _power_of_two(value: float) -> str:
  log2 = math.log2(value)
  return f'2**{log2:g}' if log2.is_integer() else f'{value:g}'


def _title(config: config_lib.DemoConfig) -> str:
  return (f'8x8 digits MLP, {config.api} API, strategy {config.strategy}, '
          f'batch {config.batch_size}, loss weight '
          f'{_power_of_two(config.loss_weight)}; dynamic scale from '
          f'{config.initial_scale:g}, x2 after {config.growth_steps} good steps')
