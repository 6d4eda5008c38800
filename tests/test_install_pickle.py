"""`pickle` of the class `compat.install()` puts under Keras's name.

Keras pickles an optimizer as its `.keras` file and its class's loader. The
install class pickles the same way and names Keras's class, as its files
do: the pickle loads into it under `install()`, and into Keras's class once
the library is uninstalled; a pickle of Keras's own class loads into
Keras's class either way.
"""

import pytest

import fresh_process
import versions

pytestmark = versions.KERAS_3.mark

_CHILD = '''
import json, pickle
import keras
import tf_loss_scale.compat
from tf_loss_scale import keras as tls_keras

def described(opt):
  return [type(opt).__module__, type(opt).__qualname__,
          float(opt.initial_scale), opt.dynamic_growth_steps,
          float(keras.ops.convert_to_numpy(opt.inner_optimizer.learning_rate))]

def new(cls):
  return cls(keras.optimizers.SGD(0.25), initial_scale=8.0,
             dynamic_growth_steps=3)

tf_loss_scale.compat.install()
install_class = keras.mixed_precision.LossScaleOptimizer
pickles = {'install': pickle.dumps(new(install_class)),
           'keras': pickle.dumps(new(keras.optimizers.LossScaleOptimizer))}
out = {
    'install_is_ours': install_class is not keras.optimizers.LossScaleOptimizer,
    'names_library': {k: b'tf_loss_scale' in v for k, v in pickles.items()},
    'installed': {k: described(pickle.loads(v)) for k, v in pickles.items()},
    'by_name': [described(pickle.loads(pickle.dumps(new(cls))))
                for cls in (tls_keras.LossScaleOptimizer,
                            tls_keras.mixed_precision.LossScaleOptimizer)],
}
tf_loss_scale.compat.uninstall()
out['uninstalled'] = {k: described(pickle.loads(v)) for k, v in pickles.items()}
print(json.dumps(out))
'''

_KERAS = ['keras.src.optimizers.loss_scale_optimizer', 'LossScaleOptimizer',
          8.0, 3, 0.25]


def test_install_class_pickles_as_keras_class_and_loads_without_the_library():
  out = fresh_process.run_json(['-c', _CHILD])
  assert out['install_is_ours']
  assert out['names_library'] == {'install': False, 'keras': False}
  # Under install(), each loads into its own class.
  assert out['installed'] == {
      'install': ['keras.optimizers', 'LossScaleOptimizer', 8.0, 3, 0.25],
      'keras': _KERAS}
  assert out['uninstalled'] == {'install': _KERAS, 'keras': _KERAS}
  assert out['by_name'] == [
      ['tf_loss_scale.keras.keras3', 'LossScaleOptimizer', 8.0, 3, 0.25],
      ['tf_loss_scale.keras.mixed_precision', 'LossScaleOptimizer', 8.0, 3,
       0.25]]
