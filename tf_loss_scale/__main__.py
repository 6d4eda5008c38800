"""The `tf-loss-scale` command line (also `python -m tf_loss_scale`).

  tf-loss-scale demo [--api auto|keras|experimental|v1]
                     [--strategy none|mirrored] [--onednn auto|on|off]
                     [--loss-weight W] [--out DIR] [--verbose]
  tf-loss-scale inspect CHECKPOINT
  tf-loss-scale run [--keras 2|3] [--tf RELEASE] [--check] PROGRAM.py [ARGS...]

Nothing here imports TensorFlow before a command runs, so that the demo can
set TensorFlow's oneDNN switch, `run` can choose the Keras TensorFlow loads,
and the commands can keep TensorFlow's start-up log off the terminal.
"""

import argparse
import os
import sys
from typing import List, Optional

_USAGE_ERROR = 2
_RUN_OPTIONS_WITH_VALUE = ('--keras', '--tf')


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the command line with `argv` (by default `sys.argv[1:]`).

  Returns:
    The exit code: 0 on success, 1 when a checkpoint holds no loss scale
    state, 2 for a usage error (a `--api` that does not work with the
    installed packages included) or a missing or unreadable checkpoint;
    `run` becomes the program (see `tf_loss_scale.run_command.run`).
  """
  parser = _parser()
  argv = sys.argv[1:] if argv is None else argv
  # After `run`'s program, every argument is the program's, `--` included.
  program_args = []
  if argv[:1] == ['run']:
    end = _program_index(argv)
    argv, program_args = argv[:end + 1], argv[end + 1:]
  args = parser.parse_args(argv)
  if args.command == 'run':  # Its program gets the environment as it is.
    from tf_loss_scale import run_command  # pylint: disable=g-import-not-at-top
    return run_command.run(args.program, program_args, args.keras, args.tf,
                           args.check)
  # TensorFlow's start-up chatter would bury the output; users may opt in.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if args.command == 'demo':
    from tf_loss_scale.demo import cli as demo_cli  # pylint: disable=g-import-not-at-top
    return demo_cli.run(args)
  return _inspect(args.checkpoint)


def _program_index(argv: List[str]) -> int:
  """The index of `run`'s PROGRAM in `['run', ...]`, or the last one."""
  i = 1
  while i < len(argv):
    if argv[i] in _RUN_OPTIONS_WITH_VALUE:
      i += 2
    elif argv[i] == '--':
      return i + 1
    elif argv[i].startswith('-'):
      i += 1
    else:
      return i
  return len(argv) - 1


def _parser() -> argparse.ArgumentParser:
  # The parser itself needs no TensorFlow.
  from tf_loss_scale.demo import cli as demo_cli  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog='tf-loss-scale',
      description='Loss scaling for mixed precision training: demo and tools.')
  commands = parser.add_subparsers(dest='command', required=True)
  demo_cli.add_parser(commands)
  inspect = commands.add_parser(
      'inspect', help='print the loss scale state saved in a checkpoint')
  inspect.add_argument(
      'checkpoint', help='a .keras file, a checkpoint prefix, or a directory '
      'with a "checkpoint" file')
  run = commands.add_parser(
      'run', help='run a program written for an older TensorFlow, '
      'unmodified, set up as its TensorFlow set it up',
      description='Becomes python PROGRAM.py ARGS (all of them, -- '
      'included), set up before its first line: install(override=True), '
      'the Keras and names of its TensorFlow; in its children of this '
      'Python too.')
  run.add_argument('--keras', choices=('2', '3'), default=None,
                   help='the Keras the program was written for (default: '
                   'read from it; 3 for TensorFlow 2.16 and later, else 2)')
  run.add_argument('--tf', metavar='RELEASE', default=None, type=_tf_version,
                   help='the TensorFlow the program was written for (1, '
                   '1.15, 2.3, 2.3.4; default: read from it, or from a '
                   '"# tf-loss-scale: --tf 2.3" line)')
  run.add_argument('--check', action='store_true',
                   help='say which Keras and names the program gets, and '
                   'what cannot be served, without running it')
  run.add_argument('program', help='the Python file to run')
  run.add_argument('args', nargs=argparse.REMAINDER,
                   help='the program\'s arguments')
  return parser


def _tf_version(text: str) -> str:
  from tf_loss_scale import run_command  # pylint: disable=g-import-not-at-top
  if not run_command.TF_VERSION.fullmatch(text):
    raise argparse.ArgumentTypeError(
        f"{text!r}: the program's TensorFlow is a release: 1, 1.15, 2.3, "
        '2.3.4')
  return text


def _inspect(path: str) -> int:
  from tf_loss_scale.demo import quiet  # pylint: disable=g-import-not-at-top
  # TensorFlow logs its start-up and the reader's failures to descriptor 2;
  # the command's own output is one report or one line of error.
  with quiet.tensorflow_output_to(os.devnull):
    from tf_loss_scale import inspect_checkpoint  # pylint: disable=g-import-not-at-top
    try:
      inspection = inspect_checkpoint.inspect(path)
    except inspect_checkpoint.CheckpointError as error:
      failure = f'tf-loss-scale inspect: error: {error}'
    else:
      failure = None
  if failure:
    print(failure, file=sys.stderr)
    return _USAGE_ERROR
  print(inspect_checkpoint.format_inspection(inspection))
  return 0 if inspection.states else 1


if __name__ == '__main__':
  sys.exit(main())
