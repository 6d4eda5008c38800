"""Runs the demo: three trainings, then the table, the plot and the event files."""

import os
import sys
from typing import List, Optional, TextIO

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import data as data_lib
from tf_loss_scale.demo import plot
from tf_loss_scale.demo import report
from tf_loss_scale.demo import results as results_lib

PLOT_FILE = 'loss_scale_demo.png'
TENSORBOARD_DIR = 'tensorboard'
_LOSS_WINDOW = 50


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
  """Trains the three runs and writes the table, PNG and event files.

  Args:
    config: The demo's settings.
    stream: Where progress and the table are printed; `sys.stdout` by default.

  Returns:
    The three `RunResult`s, in the order of `results.RUN_NAMES`.
  """
  stream = stream or sys.stdout
  configure_devices(config)
  if config.api == 'keras':
    from tf_loss_scale.demo import keras_run as api_run  # pylint: disable=g-import-not-at-top
  else:
    from tf_loss_scale.demo import v1_run as api_run  # pylint: disable=g-import-not-at-top
  digits = data_lib.load_digits(seed=config.seed)
  batches = data_lib.batch_indices(len(digits.x_train), config.batch_size,
                                   config.steps, config.seed)
  os.makedirs(config.out, exist_ok=True)
  stream.write(
      f'Digits: {len(digits.x_train)} training and {len(digits.x_test)} test '
      f'images. API {config.api}, strategy {config.strategy}, '
      f'{config.steps} steps of {config.batch_size}.\n')
  runs = []
  for kind, name in zip(config_lib.KINDS, results_lib.RUN_NAMES):
    log_dir = os.path.join(config.out, TENSORBOARD_DIR, kind)
    runs.append(api_run.train(kind, name, config, digits, batches, log_dir,
                              stream))
  stream.write('\n' + report.format_table(runs, _LOSS_WINDOW) + '\n')
  plot_path = os.path.join(config.out, PLOT_FILE)
  plot.save_plot(runs, plot_path, _title(config))
  stream.write(f'\nPlot: {plot_path}\nTensorBoard: tensorboard --logdir '
               f'{os.path.join(config.out, TENSORBOARD_DIR)}\n')
  return runs


def _title(config: config_lib.DemoConfig) -> str:
  return (f'8x8 digits MLP, {config.api} API, strategy {config.strategy}, '
          f'batch {config.batch_size}; dynamic scale from '
          f'{config.initial_scale:g}, x2 after {config.growth_steps} good steps')
