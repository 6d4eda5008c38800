"""The demo's settings and the runs it makes."""

import dataclasses

APIS = ('keras', 'experimental', 'v1')
STRATEGIES = ('none', 'mirrored')
# The three runs: (name in results.RUN_NAMES order, float16?, loss scaled?).
FLOAT32, MIXED, SCALED = 'float32', 'mixed', 'scaled'
KINDS = (FLOAT32, MIXED, SCALED)


@dataclasses.dataclass(frozen=True)
class DemoConfig:
  """Settings of a demo invocation.

  Attributes:
    api: `'keras'` (Keras 3 `model.fit`), `'experimental'` (the TF 2.0-2.3
      wrapper in a custom loop) or `'v1'` (a TF1 session loop).
    strategy: `'none'` or `'mirrored'` (two logical CPU devices).
    steps: Training steps per run.
    batch_size: Examples per step (split between replicas when mirrored).
    hidden_units: Width of the two hidden layers.
    learning_rate: SGD-with-momentum learning rate for the unweighted loss;
      the optimizer gets `learning_rate / loss_weight`, so that float32
      takes the same steps whatever the weight.
    loss_weight: Factor on the cross-entropy, a positive number. The default
      makes the gradients as small as those of a loss averaged over 2**18
      outputs, which float16 flushes to zero unless the loss is scaled; 1
      trains the plain classifier, where the three runs agree.
    initial_scale: The dynamic loss scale's first value.
    growth_steps: Finite steps after which the dynamic scale doubles. The
      demo uses a short period so the scale's ups and downs show in a short
      run (libraries default to 2000).
    probe_every: Steps between two measurements of flushed gradients.
    seed: Seed of the data order and of the initial weights.
    out: Directory for the PNG, `results.json`, TensorBoard event files
      and, unless verbose, TensorFlow's log.
    verbose: Whether TensorFlow's own log lines reach the terminal.
  """
  api: str = 'keras'
  strategy: str = 'none'
  steps: int = 1000
  batch_size: int = 128
  hidden_units: int = 128
  learning_rate: float = 0.1
  loss_weight: float = 2.0**-18
  initial_scale: float = 2.0**15
  growth_steps: int = 100
  probe_every: int = 50
  seed: int = 0
  out: str = './tf_loss_scale_demo'
  verbose: bool = False

  def __post_init__(self):
    if self.api not in APIS:
      raise ValueError(f'api must be one of {APIS}, but got {self.api!r}.')
    if self.strategy not in STRATEGIES:
      raise ValueError(
          f'strategy must be one of {STRATEGIES}, but got {self.strategy!r}.')
    for name in ('steps', 'batch_size', 'hidden_units', 'growth_steps',
                 'probe_every'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int, but got {value!r}.')
    for name in ('learning_rate', 'loss_weight', 'initial_scale'):
      value = getattr(self, name)
      if not 0 < value < float('inf'):
        raise ValueError(
            f'{name} must be a finite positive number, but got {value!r}.')
    if self.strategy == 'mirrored' and self.batch_size % 2:
      raise ValueError(
          'batch_size must be even with strategy mirrored (two replicas), but '
          f'got {self.batch_size}.')
