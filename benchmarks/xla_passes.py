"""How often an XLA-compiled step reads each variable, from XLA's own plan.

Usage (from the repository root):

  .venv/bin/python benchmarks/xla_passes.py              # 10x1M, ~1 min
  .venv/bin/python benchmarks/xla_passes.py --shape cnn

Builds the Keras 3 training step of each variant (bare SGD, ours, Keras's
`LossScaleOptimizer`) with `jit_compile=True` in a child process of its own
that has XLA dump the step's optimized HLO, then reads the entry computation
of that module: for every variable, the instructions (fusions, in practice)
that take its value as an operand. On XLA:CPU each such fusion is one loop
over the variable's memory, so their count is the passes a step makes over
it; in these workloads each gradient is computed from its variable inside
the fusions that use it, so a pass over the variable is a pass over the
gradient. Prints, per variant, the passes per variable and the kinds of
fusion that make them.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_VARIANTS = ('bare', 'ours', 'keras3')
# `%arg3.1 = f32[1000000]{0} parameter(3)` in an HLO dump (older XLA
# writes names without the `%`).
_PARAMETER = re.compile(r'^\s*%?([\w.-]+) = (\w+\[[\d,]*\])\S* parameter\(')
# `%name = type opcode(%a, %b), attributes`: name, opcode and operands.
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.-]+) = .*? ([\w-]+)\((.*?)\)')
_OPERAND = re.compile(r'%?([A-Za-z_][\w.-]*)')


def _dump_step(variant: str, shape: str, directory: str) -> None:
  """Compiles and runs one step of `variant`, XLA dumping into `directory`."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             XLA_FLAGS=f'--xla_dump_to={directory} --xla_dump_hlo_as_text')
  done = subprocess.run(
      [sys.executable, os.path.abspath(__file__), '--child', variant,
       '--shape', shape], env=env, capture_output=True, text=True,
      check=False)
  if done.returncode != 0:
    raise RuntimeError(f'{variant}: {done.stderr[-2000:]}')


def _run_child(variant: str, shape: str) -> None:
  from benchmarks import variants  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  variants.build('jit', 'keras', variant, workloads.WORKLOADS[shape]).step()


def _entry_lines(directory: str) -> List[str]:
  """The entry computation of the training step's optimized module."""
  paths = glob.glob(os.path.join(
      directory, '*replica_step*after_optimizations.txt'))
  if len(paths) != 1:
    raise RuntimeError(f'expected one optimized step module, found {paths}')
  with open(paths[0]) as module:
    lines = module.read().splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith('ENTRY'))
  end = next(i for i in range(start, len(lines)) if lines[i].startswith('}'))
  return lines[start + 1:end]


def passes_per_variable(lines: List[str], size: int) -> Dict[str, List[str]]:
  """For each parameter of `size` float32 values, the ops that read it.

  Args:
    lines: The entry computation's instructions, one per line.
    size: The number of values of a variable.

  Returns:
    Parameter name (without `%`) -> the opcodes (a fusion's name without
    its number) of the instructions that take it as an operand.
  """
  variables = [m.group(1) for m in map(_PARAMETER.match, lines)
               if m and m.group(2) == f'f32[{size}]']
  readers = {v: [] for v in variables}
  for line in lines:
    match = _INSTRUCTION.match(line)
    if not match or match.group(2) == 'parameter':
      continue
    name, opcode, operands = match.groups()
    kind = re.sub(r'\.\d+$', '', name) if opcode == 'fusion' else opcode
    for operand in _OPERAND.findall(operands):
      if operand in readers:
        readers[operand].append(kind)
  return readers


def compiled_step_readers(variant: str, shape: str) -> Dict[str, List[str]]:
  """`passes_per_variable` of one variant's XLA-compiled step.

  Args:
    variant: 'bare', 'ours' or 'keras3'.
    shape: A workload name (`benchmarks.workloads.WORKLOADS`) whose
      variables all have the size of its first.

  Returns:
    Variable parameter -> the instructions of the step that read it.
  """
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  size = workloads.WORKLOADS[shape].initial_values()[0].size
  with tempfile.TemporaryDirectory() as directory:
    _dump_step(variant, shape, directory)
    return passes_per_variable(_entry_lines(directory), size)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--shape', default='10x1M')
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if args.child:
    _run_child(args.child, args.shape)
    return 0
  print(f'{"variant":8} {"passes per variable":>20}  fusions reading it')
  for variant in _VARIANTS:
    readers = compiled_step_readers(variant, args.shape)
    counts = sorted({len(r) for r in readers.values()})
    kinds = {k for r in readers.values() for k in r}
    print(f'{variant:8} {"/".join(map(str, counts)):>20}  '
          + ', '.join(sorted(kinds)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
