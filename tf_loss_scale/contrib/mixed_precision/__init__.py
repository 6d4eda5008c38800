"""TF 1.13-1.15's `tf.contrib.mixed_precision`, on TensorFlow 2.

```python
from tf_loss_scale.contrib import mixed_precision

manager = mixed_precision.ExponentialUpdateLossScaleManager(
    init_loss_scale=2**32, incr_every_n_steps=1000, decr_ratio=0.5)
opt = mixed_precision.LossScaleOptimizer(
    tf.compat.v1.train.AdamOptimizer(1e-4), manager)
train_op = opt.minimize(loss, global_step=global_step)
```

The managers keep TF 1.15's variables (names, dtypes, collections), so
`tf.compat.v1.train.Saver` checkpoints interchange with TF 1.15's; their
rules are options of this library's one update rule
(`tf_loss_scale.loss_scale.advance_dynamic_state`), and the optimizer's step
is this library's (`tf_loss_scale.step`). docs/differences.md says where
they differ from TF 1.15's.
"""

from tf_loss_scale.contrib.mixed_precision.loss_scale_manager import (
    ExponentialUpdateLossScaleManager, FixedLossScaleManager,
    LossScaleManager)
from tf_loss_scale.contrib.mixed_precision.loss_scale_optimizer import (
    LossScaleOptimizer)

__all__ = ['LossScaleManager', 'FixedLossScaleManager',
           'ExponentialUpdateLossScaleManager', 'LossScaleOptimizer']
