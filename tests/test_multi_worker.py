"""Loss scaling across processes on 127.0.0.1: MultiWorkerMirroredStrategy
with two worker processes, and the refusal of ParameterServerStrategy."""

import json
import os
import socket
import subprocess
import sys

_WORKER = os.path.join(os.path.dirname(__file__), 'workers',
                       'multi_worker_training.py')
_PARAMETER_SERVER = os.path.join(os.path.dirname(__file__), 'workers',
                                 'parameter_server_refusal.py')

# Per step: which worker sees inf (-1: none), then the expected state after it.
# SGD(0.5) on sum(v * x) with x = 1 on both workers: an applied step moves
# each element by 0.5 * 2 (gradients are summed over the two workers).
_EXPECTED = [
    # inf on, variable,       scale, good_steps
    (-1, [0.0, 1.0], 8.0, 1),
    (1, [0.0, 1.0], 4.0, 0),    # worker 1 overflows: both skip, scale halves
    (-1, [-1.0, 0.0], 4.0, 1),
    (-1, [-2.0, -1.0], 8.0, 0),  # second finite step in a row: scale doubles
    (0, [-2.0, -1.0], 4.0, 0),   # worker 0 overflows: both skip
    (-1, [-3.0, -2.0], 4.0, 1),
]


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def test_one_workers_overflow_makes_every_worker_skip_and_agree():
  ports = _free_ports(2)
  env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
  workers = [
      subprocess.Popen(
          [sys.executable, _WORKER, str(ports[0]), str(ports[1]), str(index)],
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
      for index in range(2)
  ]
  try:
    results = [worker.communicate(timeout=240) for worker in workers]
  finally:
    for worker in workers:
      if worker.poll() is None:
        worker.kill()
  outputs = []
  for index, (worker, (stdout, stderr)) in enumerate(zip(workers, results)):
    assert worker.returncode == 0, f'worker {index} failed:\n{stderr[-3000:]}'
    outputs.append([json.loads(line) for line in stdout.splitlines()
                    if line.startswith('{')])

  for index, records in enumerate(outputs):
    assert len(records) == len(_EXPECTED), f'worker {index}: {records}'
    for record, (inf_on, variable, scale, good_steps) in zip(records, _EXPECTED):
      where = f"worker {index}, step {record['step']} (inf on worker {inf_on})"
      assert record['variable'] == variable, where
      assert record['scale'] == scale, where
      assert record['good_steps'] == good_steps, where


def test_parameter_server_strategy_is_refused_at_construction_and_apply():
  result = subprocess.run([sys.executable, _PARAMETER_SERVER],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=''))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if ': ' in l]
  attempts = [l.split(': ')[0] for l in lines]
  assert attempts == ['keras construction', 'keras apply',
                      'experimental construction', 'experimental apply']
  for line in lines:
    assert 'ValueError: ' in line, line
    assert 'not supported under ParameterServerStrategy' in line, line
