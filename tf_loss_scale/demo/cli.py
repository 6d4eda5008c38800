"""The `demo` command's arguments, and the command (`tf_loss_scale.__main__`).

Nothing here imports TensorFlow before the demo runs (see `onednn`).
"""

import argparse
import sys
from typing import Any

from tf_loss_scale.demo import config as config_lib
from tf_loss_scale.demo import onednn

_USAGE_ERROR = 2


def add_parser(commands: Any) -> None:
  """Adds the `demo` command to `commands`, the tool's `add_subparsers()`."""
  defaults = config_lib.DemoConfig()
  demo = commands.add_parser(
      'demo', help='train float32, mixed_float16 and mixed_float16 with a '
      'dynamic loss scale on the 8x8 digits, and compare them',
      description='Trains float32, mixed_float16 without loss scaling and '
      'mixed_float16 with a dynamic loss scale on the 8x8 digits, with the '
      'cross-entropy weighted as small as a loss averaged over 2**18 outputs '
      '(--loss-weight 1: the plain classifier). Prints a table; writes a '
      'plot, results.json, the scaled run\'s checkpoint and TensorBoard logs '
      'to --out. Numbers may be written as powers of two: 2**-18 or 2^-18.',
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  demo.add_argument('--api', choices=(config_lib.AUTO,) + config_lib.APIS,
                    default=defaults.api,
                    help='Keras 3 model.fit, the TF 2.0-2.3 experimental '
                    'wrapper in a custom loop, or a TF1 session loop; auto: '
                    'keras where Keras 3 is installed, else v1')
  demo.add_argument('--onednn', choices=onednn.SETTINGS,
                    default=defaults.onednn,
                    help='TensorFlow\'s oneDNN kernels; auto turns them off '
                    'on a machine without GPU or TPU, where their float16 '
                    'path can make mixed_float16 many times slower')
  demo.add_argument('--strategy', choices=config_lib.STRATEGIES,
                    default=defaults.strategy,
                    help='mirrored runs two replicas on two logical CPUs')
  demo.add_argument('--out', default=defaults.out,
                    help='directory for the PNG, results.json, TensorBoard '
                    'event files and TensorFlow\'s log')
  demo.add_argument('--verbose', action='store_true',
                    help='show TensorFlow\'s log lines instead of writing '
                    'them to tensorflow.log in --out')
  for name, help_text in (
      ('steps', 'training steps per run'),
      ('batch_size', 'examples per step'),
      ('hidden_units', 'width of the two hidden layers'),
      ('growth_steps', 'finite steps after which the dynamic scale doubles'),
      ('probe_every', 'steps between measurements of flushed gradients'),
      ('seed', 'seed of the data order and initial weights')):
    demo.add_argument('--' + name.replace('_', '-'), type=int,
                      default=getattr(defaults, name), help=help_text)
  for name, help_text in (
      ('learning_rate', 'SGD-with-momentum learning rate for the unweighted '
       'loss (the optimizer gets it divided by the loss weight)'),
      ('loss_weight', 'factor on the cross-entropy; 1 trains the plain '
       'classifier'),
      ('initial_scale', 'first value of the dynamic loss scale')):
    # A string default goes through `type` too, and shows in --help as is.
    demo.add_argument('--' + name.replace('_', '-'), type=_number,
                      default=config_lib.format_number(getattr(defaults, name)),
                      help=help_text)


def run(args: argparse.Namespace) -> int:
  """Runs the demo with the parsed arguments; returns the exit code."""
  from tf_loss_scale.demo import apis  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.demo import runner  # pylint: disable=g-import-not-at-top
  settings = {key: value for key, value in vars(args).items()
              if key != 'command'}
  try:
    config = config_lib.DemoConfig(**settings)
  except ValueError as error:
    print(f'tf-loss-scale demo: error: {error}', file=sys.stderr)
    return _USAGE_ERROR
  try:
    runner.run_demo(config)
  except apis.UnavailableError as error:
    print(f'tf-loss-scale demo: error: {error}', file=sys.stderr)
    return _USAGE_ERROR
  return 0


def _number(text: str) -> float:
  try:
    return config_lib.parse_number(text)
  except ValueError as error:
    raise argparse.ArgumentTypeError(str(error)) from error
