"""A Keras 2 program's `import keras` under `python -m tf_loss_scale run`.

The program is run as its users wrote it for TensorFlow 2.4-2.15: `import
keras` and `from keras import layers` name Keras 2, the one `tf.keras` is.
Only the command and the program's output are looked at, not how the
command sets the program up.
"""

import json
import textwrap
from importlib import metadata

import fresh_process
import versions

_PROGRAM = textwrap.dedent('''\
    import json

    import keras
    from keras import layers
    import numpy as np
    import tensorflow as tf

    model = keras.Sequential([layers.Dense(1, input_shape=(2,),
                                           kernel_initializer='ones')])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss='mse')
    model.fit(np.ones((1, 2)), np.zeros((1, 1)), verbose=0)
    print(json.dumps({
        'keras': [keras.__name__, keras.__version__],
        'layers': layers.__name__,
        'tf_keras_layers': layers.Dense is tf.keras.layers.Dense,
        'model_is_tf_keras': isinstance(model, tf.keras.Model),
        'kernel': model.get_weights()[0].ravel().tolist(),
    }))
    ''')


def test_a_program_importing_keras_gets_keras_2(tmp_path):
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()
  program = tmp_path / 'keras2_program.py'
  program.write_text(_PROGRAM)
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', str(program)],
                           cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  # tf_keras where `keras` is Keras 3; TensorFlow's own keras 2.x before.
  package = 'tf_keras' if versions.KERAS_3 else 'keras'
  assert report['keras'] == [package, metadata.version(package)]
  assert report['keras'][1].startswith('2.'), report
  assert report['layers'] in (f'{package}.layers', f'{package}.api._v2.'
                              'keras.layers'), report
  assert report['tf_keras_layers'] and report['model_is_tf_keras'], report
  # One SGD step on mse from weights of ones: 1 - 0.5 * 2 * 2 = -1.
  assert report['kernel'] == [-1.0, -1.0]
