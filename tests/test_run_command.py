"""Tests of `python -m tf_loss_scale run PROGRAM.py [ARGS...]`.

Each run is a fresh process started without `TF_USE_LEGACY_KERAS`: the
command itself chooses the Keras. The program below reports what it saw;
its own arguments tell it how to end.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
import tf_loss_scale

import fresh_process
import versions

_PROGRAM = textwrap.dedent('''\
    """Reports the Keras, the classes under the legacy names and its argv."""
    import importlib
    import json
    import os
    import sys

    import keras
    import tensorflow as tf


    from class_names import class_name as name


    def fail():
      raise RuntimeError('the program failed on purpose')


    print(json.dumps({
        'argv': sys.argv,
        'legacy_keras': os.environ.get('TF_USE_LEGACY_KERAS'),
        'sgd': name(tf.keras.optimizers.SGD),
        'tf24_class': name(tf.keras.mixed_precision.LossScaleOptimizer),
        # Only install(override=True) replaces the names TensorFlow ships.
        'v1_class': name(
            tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer),
        'main': __name__,
        'path0': sys.path[0],
        'file': __file__,
        'keras': [keras.__name__, keras.__version__],
        'optimizers': [name(tf.keras.optimizers.SGD),
                       name(keras.optimizers.Adam),
                       name(importlib.import_module(
                           'tensorflow.keras.optimizers').RMSprop)],
    }))
    sys.stdout.flush()
    if sys.argv[1:2] == ['--raise']:
      fail()
    if sys.argv[1:2] == ['--exit']:
      sys.exit(int(sys.argv[2]))
    ''')
_OURS_V1 = 'tf_loss_scale.optimizer_v1.MixedPrecisionLossScaleOptimizer'
_OURS_TF24 = 'tf_loss_scale.keras.mixed_precision.LossScaleOptimizer'
# What the command prints where Keras 2 is not installed (here TF 2.N).
_TF_MINOR = '.'.join(map(str, versions.TF[:2]))
_HINT = f"pip install 'tf_loss_scale[tfkeras]' 'tf_keras~={_TF_MINOR}.0'"
# A process in which `tf_keras` cannot be imported nor found, as if it were
# not installed: `sys.modules[name] = None` is Python's own way to say so.
_WITHOUT_TF_KERAS = ('import sys; sys.modules["tf_keras"] = None; '
                     'from tf_loss_scale.__main__ import main; '
                     'sys.exit(main(sys.argv[1:]))')


@pytest.fixture(name='program')
def _program(tmp_path):
  path = tmp_path / 'old_program.py'
  path.write_text(_PROGRAM)
  return str(path)


def _report(done):
  return json.loads(done.stdout.strip().splitlines()[-1])


# Keras 2.12 (TensorFlow 2.12's): `import keras` is its package, whose
# modules are not under `src`.
_KERAS_2_12 = not versions.KERAS_3 and versions.TF[:2] < (2, 13)


def _keras_2_package() -> str:
  # tf_keras where `keras` is Keras 3; the keras 2.x TensorFlow 2.15 and
  # earlier depend on otherwise.
  return 'tf_keras' if versions.KERAS_3 else 'keras'


def _require_keras_2():
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()


def test_keras_2_argv_and_exit_status(program, tmp_path):
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()
  # The program's arguments, options of the command's own spelling included,
  # are the program's; its `sys.exit` code is the command's.
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', program,
                            '--exit', '3', '--', '-5', '--keras', '3', '-x'],
                           cwd=str(tmp_path))
  assert done.returncode == 3, done.stderr[-3000:]
  report = _report(done)
  # Whole, `--` included, as `python old_program.py ...` gives it.
  assert report['argv'] == [program, '--exit', '3', '--', '-5', '--keras',
                            '3', '-x']
  assert report['main'] == '__main__'
  assert report['path0'] == str(tmp_path)
  assert report['file'] == program
  # `import keras` is Keras 2 too: tf_keras where `keras` is Keras 3.
  assert report['keras'] == [_keras_2_package(),
                             metadata.version(_keras_2_package())]
  # TensorFlow 2.11+'s optimizers, for a program that does not say older
  # (Keras 2.12's `import keras` is its package, not its API: there
  # `keras.optimizers.Adam` was the legacy one, as without the launcher).
  by_api = report['optimizers'][::2] if _KERAS_2_12 else report['optimizers']
  assert not [n for n in by_api if '.legacy.' in n], report
  assert report['sgd'].startswith(_keras_2_package() + '.'), report
  assert report['legacy_keras'] == ('1' if versions.KERAS_3 else None)
  # install(override=True) ran: TF1's name is the library's class.
  assert report['v1_class'] == _OURS_V1
  # Keras 2's own TF 2.4-2.15 class stays (install() leaves it).
  assert report['tf24_class'].startswith(_keras_2_package() + '.'), report


@versions.KERAS_3.mark
def test_keras_3_and_the_programs_traceback(program, tmp_path):
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--keras', '3',
                            program, '--raise'], legacy_keras=True,
                           cwd=str(tmp_path))
  assert done.returncode == 1
  report = _report(done)
  assert report['legacy_keras'] is None  # removed, though the caller set it
  assert report['sgd'].startswith('keras.'), report
  assert report['keras'] == ['keras', metadata.version('keras')]
  assert report['tf24_class'] == _OURS_TF24
  assert report['v1_class'] == _OURS_V1
  traceback = done.stderr[done.stderr.index('Traceback'):].splitlines()
  # As `python old_program.py` prints it: from the program's module on.
  assert traceback[0] == 'Traceback (most recent call last):'
  assert traceback[1] == f'  File "{program}", line 37, in <module>'
  assert f'  File "{program}", line 15, in fail' in traceback
  assert traceback[-1] == 'RuntimeError: the program failed on purpose'
  assert not [line for line in traceback
              if 'runpy' in line or 'tf_loss_scale' in line], traceback


@versions.KERAS_3.mark
def test_without_tf_keras_says_how_to_get_it(program, tmp_path):
  done = fresh_process.run(['-c', _WITHOUT_TF_KERAS, 'run', program],
                           cwd=str(tmp_path))
  assert done.returncode == 2
  assert done.stdout == ''
  assert _HINT in done.stderr, done.stderr
  assert '--keras 3' in done.stderr
  # Keras 3, chosen, needs no tf_keras.
  done = fresh_process.run(['-c', _WITHOUT_TF_KERAS, 'run', '--keras', '3',
                            program], cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  assert _report(done)['tf24_class'] == _OURS_TF24


def test_console_script(program, tmp_path):
  script = shutil.which(
      'tf-loss-scale', path=os.path.dirname(sys.executable))
  if not script:
    pytest.skip('no tf-loss-scale console script next to the interpreter')
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()
  done = fresh_process.run([script, 'run', program, '--exit', '5'],
                           cwd=str(tmp_path))
  assert done.returncode == 5, done.stderr[-3000:]
  assert _report(done)['v1_class'] == _OURS_V1


def test_a_missing_program(tmp_path):
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', 'nowhere.py'],
                           cwd=str(tmp_path))
  assert done.returncode == 2
  assert "can't open file 'nowhere.py'" in done.stderr


@pytest.mark.parametrize('keras,tf_version', [('2', None), ('3', None),
                                              ('2', '1')])
def test_children_are_set_up_as_the_program(keras, tf_version, tmp_path,
                                             monkeypatch):
  if keras == '3':
    versions.KERAS_3.require()
  else:
    _require_keras_2()
  path = tmp_path / 'parent.py'
  path.write_text(_CHILDREN)
  # The user's own sitecustomize, on the child's PYTHONPATH, still runs.
  (tmp_path / 'site').mkdir()
  (tmp_path / 'site' / 'sitecustomize.py').write_text('MARK = "theirs"\n')
  monkeypatch.syspath_prepend(str(tmp_path / 'site'))
  done = fresh_process.run(
      ['-m', 'tf_loss_scale', 'run', '--keras', keras] +
      (['--tf', tf_version] if tf_version else []) + [str(path)],
      cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  report = _report(done)
  if keras == '2':
    expected = {'keras': _keras_2_package(),
                'legacy_keras': '1' if versions.KERAS_3 else None,
                'installed': True, 'v1_class': _OURS_V1,
                'sitecustomize': 'theirs', 'tf1': tf_version == '1'}
  else:
    expected = {'keras': 'keras', 'legacy_keras': None, 'installed': True,
                'v1_class': _OURS_V1, 'sitecustomize': 'theirs', 'tf1': False}
  assert report == {'spawn': expected, 'subprocess': expected}


_CHILDREN = textwrap.dedent('''\
    """Reports what a spawned child and a sys.executable subprocess get."""
    import json
    import multiprocessing
    import subprocess
    import sys


    def probe(_=None):
      import os
      import keras
      import tensorflow as tf
      import tf_loss_scale.compat
      from class_names import class_name
      return {'keras': keras.__name__,
              'legacy_keras': os.environ.get('TF_USE_LEGACY_KERAS'),
              'installed': tf_loss_scale.compat.is_installed(),
              'v1_class': class_name(tf.compat.v1.mixed_precision.
                                     MixedPrecisionLossScaleOptimizer),
              'sitecustomize': getattr(sys.modules.get('sitecustomize'),
                                       'MARK', None),
              'tf1': hasattr(tf, 'placeholder')}


    if __name__ == '__main__':
      if sys.argv[1:] == ['child']:
        print(json.dumps(probe()))
        sys.exit()
      with multiprocessing.get_context('spawn').Pool(1) as pool:
        spawned = pool.map(probe, [None])[0]
      done = subprocess.run([sys.executable, __file__, 'child'],
                            stdout=subprocess.PIPE, check=True)
      print(json.dumps({'spawn': spawned, 'subprocess': json.loads(
          done.stdout.decode().splitlines()[-1])}))
    ''')


def test_tf_2_3_gets_tf_2_10s_optimizers(program, tmp_path):
  _require_keras_2()
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--tf', '2.3',
                            program], cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  # Keras 2.13 and later keep their modules under `src`.
  package = _keras_2_package() + ('' if _KERAS_2_12 else '.src')
  # tf.keras's, keras's and tensorflow.keras's names alike.
  assert _report(done)['optimizers'] == [
      f'{package}.optimizers.legacy.gradient_descent.SGD',
      f'{package}.optimizers.legacy.adam.Adam',
      f'{package}.optimizers.legacy.rmsprop.RMSprop']


_TF1 = textwrap.dedent('''\
    """TF1 code: reports what `tensorflow` is, then reaches for tf.contrib."""
    import importlib
    import json
    import sys

    import tensorflow as tf
    import tensorflow.compat.v1 as v1

    from class_names import class_name as name

    print(json.dumps({
        'is_compat_v1': tf.__name__.endswith('compat.v1'),
        'compat_v1_is_it': v1 is tf,
        'eager': tf.executing_eagerly(),
        'v1_class': name(
            tf.train.experimental.MixedPrecisionLossScaleOptimizer),
        'dynamic': name(tf.mixed_precision.DynamicLossScale),
        # Loaded now: the library's modules keep the real module.
        'library_tf': importlib.import_module(
            'tf_loss_scale.inspect_checkpoint').tf.__name__,
    }))
    sys.stdout.flush()
    try:
      served = tf.contrib.mixed_precision.__name__
    except AttributeError as error:
      served = str(error)
    print(json.dumps({'contrib_mixed_precision': served}))
    sys.stdout.flush()
    tf.contrib.layers.fully_connected
    ''')


_CONTRIB_MESSAGE = (
    'tf.contrib was removed in TensorFlow 2: port this use of it '
    '(tf-loss-scale run --tf 1 serves tf.contrib.mixed_precision only)')


def test_tf_1_runs_tf1_code_and_refuses_tf_contrib(tmp_path):
  _require_keras_2()
  path = tmp_path / 'tf1_program.py'
  path.write_text(_TF1)
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--tf', '1',
                            str(path)], cwd=str(tmp_path))
  assert done.returncode == 1, done.stderr[-3000:]
  first, contrib = [json.loads(line) for line in done.stdout.splitlines()[-2:]]
  assert first == {
      'is_compat_v1': True, 'compat_v1_is_it': True,
      'eager': False, 'v1_class': _OURS_V1,
      'dynamic': 'tf_loss_scale.loss_scale.DynamicLossScale',
      'library_tf': 'tensorflow'}
  # TF 1.13-1.15's tf.contrib.mixed_precision is the library's; the rest of
  # tf.contrib is refused, saying what to do.
  assert contrib['contrib_mixed_precision'] == (
      'tf_loss_scale.contrib.mixed_precision')
  assert done.stderr.strip().splitlines()[-1] == (
      f'AttributeError: {_CONTRIB_MESSAGE}')


def test_check_says_what_the_program_gets_without_running_it(tmp_path):
  _require_keras_2()
  path = tmp_path / 'tf1_contrib.py'
  path.write_text(textwrap.dedent('''\
      import tensorflow as tf
      open('ran', 'w').close()
      x = tf.placeholder(tf.float32)
      y = tf.contrib.layers.fully_connected(x, 1)
      opt = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
          tf.train.GradientDescentOptimizer(0.1), 'dynamic')
      '''))
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check',
                            str(path)], cwd=str(tmp_path))
  assert done.returncode == 1, done.stderr
  assert not (tmp_path / 'ran').exists()
  lines = done.stdout.splitlines()
  assert lines[0] == f'tf-loss-scale run {path}:'
  if versions.KERAS_3:
    assert lines[1] == ('Keras 2: tf.keras, tensorflow.keras, keras and '
                        'keras.* are tf_keras (TF_USE_LEGACY_KERAS=1)')
  assert lines[2] == 'TensorFlow 1 (read from tf.placeholder on line 3)'
  assert lines[3].startswith('import tensorflow gives tensorflow.compat.v1')
  names = lines.index('compat.install(override=True) runs; of the loss '
                      'scaling names it serves, the program uses these:')
  assert lines[names + 1] == (
      '  line 5: tf.train.experimental.MixedPrecisionLossScaleOptimizer: '
      'tf_loss_scale.MixedPrecisionLossScaleOptimizer')
  assert lines[-1] == ('warning: line 4: tf.contrib.layers.fully_connected: '
                       f'{_CONTRIB_MESSAGE}'), lines
  # Names in strings and comments tell nothing.
  path.write_text("""'''Once tf.Session code; tf.contrib is gone.'''\n"""
                  'import tensorflow as tf  # not tf.placeholder\n'
                  "print(tf.constant('mixed_precision.experimental'))\n")
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check',
                            str(path)], cwd=str(tmp_path))
  assert done.returncode == 0, done.stdout + done.stderr
  assert not [line for line in done.stdout.splitlines()
              if line.startswith(('TensorFlow', 'warning'))], done.stdout
  # A marker line says the generation; nothing to warn about.
  path.write_text('# tf-loss-scale: --tf 2.3\nimport tensorflow as tf\n')
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check',
                            str(path)], cwd=str(tmp_path))
  assert done.returncode == 0, done.stdout + done.stderr
  assert ('TensorFlow 2.3 (read from its "# tf-loss-scale: --tf 2.3" line)'
          in done.stdout.splitlines())
  assert not (tmp_path / 'ran').exists()


@pytest.mark.parametrize('args,message', [
    (['--tf', '3'], "argument --tf: '3': the program's TensorFlow is a "
     'release: 1, 1.15, 2.3, 2.3.4'),
    (['--tf', '2'], "argument --tf: '2': the program's TensorFlow is a "
     'release'),
    (['--keras', '3', '--tf', '2.3'],
     'a program of TensorFlow 2.3 runs under Keras 2, not --keras 3'),
])
def test_generations_that_cannot_be(args, message, program, tmp_path):
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', *args, program],
                           cwd=str(tmp_path))
  assert done.returncode == 2
  assert message in done.stderr, done.stderr


# The launcher's own variables: the set-up, `run_site` on PYTHONPATH, and
# the Keras 2 switch where `keras` is Keras 3. Nothing else differs.
_SETUP = 'TF_LOSS_SCALE_RUN'
_RUN_SITE = os.path.join(os.path.dirname(os.path.abspath(
    tf_loss_scale.__file__)), 'run_site')

_AS_PYTHON = textwrap.dedent('''\
    """What Python gives a program: reported at exit, after a late thread."""
    import atexit
    import json
    import os
    import pickle
    import sys
    import threading
    import time

    import helper  # beside the file the link resolves to


    class Thing:
      pass


    seen = {}


    def late():
      time.sleep(0.3)
      seen['thread'] = len(pickle.dumps(Thing())) > 0


    def report():
      print(json.dumps(dict(
          seen, file=__file__, path0=sys.path[0], argv=sys.argv,
          helper=helper.NAME, builtins=type(__builtins__).__name__,
          main=sys.modules['__main__'].Thing is Thing,
          atexit=len(pickle.dumps(Thing())) > 0, environ=dict(os.environ))))


    atexit.register(report)
    threading.Thread(target=late).start()
    sys.exit(int(sys.argv[1]))
    ''')


def _through_a_link(tmp_path):
  """`link/program.py` -> `real/program.py`, whose `helper.py` is beside it."""
  (tmp_path / 'real').mkdir()
  (tmp_path / 'link').mkdir()
  (tmp_path / 'real' / 'program.py').write_text(_AS_PYTHON)
  (tmp_path / 'real' / 'helper.py').write_text("NAME = 'real helper'\n")
  os.symlink(tmp_path / 'real' / 'program.py', tmp_path / 'link' / 'program.py')
  return str(tmp_path / 'link')


def _python_and_launcher(args, cwd, flags=()):
  """The program run with `python ARGS`, then with `run FLAGS ARGS`."""
  return (fresh_process.run(args, cwd=cwd),
          fresh_process.run(['-m', 'tf_loss_scale', 'run', *flags, *args],
                            cwd=cwd))


def _launchers_environ(python_environ):
  """What the launcher adds to the environment `python` gives a program."""
  environ = dict(python_environ, PYTHONPATH=os.pathsep.join(
      [_RUN_SITE, python_environ['PYTHONPATH']]))
  if versions.KERAS_3:
    environ['TF_USE_LEGACY_KERAS'] = '1'
  return environ


def test_the_program_runs_as_python_runs_it(tmp_path):
  _require_keras_2()
  folder = _through_a_link(tmp_path)
  python, launched = _python_and_launcher(
      ['program.py', '3', '--', '-x'], folder)
  assert (python.returncode, launched.returncode) == (3, 3), launched.stderr
  native, ours = _report(python), _report(launched)
  assert native['file'] == os.path.join(folder, 'program.py')
  assert native['path0'] == str(tmp_path / 'real')
  assert native['helper'] == 'real helper'
  assert native['builtins'] == 'module'
  assert native['main'] and native['atexit'] and native['thread']
  assert native['environ'].get('TF_CPP_MIN_LOG_LEVEL') == '2'  # the test's
  environ = ours.pop('environ')
  assert _SETUP in environ
  del environ[_SETUP]
  assert environ == _launchers_environ(native.pop('environ'))
  assert ours == native


_INTERRUPTED = textwrap.dedent('''\
    def train():
      raise KeyboardInterrupt


    train()
    ''')


@pytest.mark.parametrize('source', [_INTERRUPTED, 'print(1)\nx = (\n'],
                         ids=['keyboard_interrupt', 'syntax_error'])
def test_tracebacks_and_exit_status_are_pythons(source, tmp_path):
  _require_keras_2()
  (tmp_path / 'program.py').write_text(source)
  python, launched = _python_and_launcher(['program.py'], str(tmp_path))
  assert python.returncode != 0
  assert (launched.returncode, launched.stderr, launched.stdout) == (
      python.returncode, python.stderr, python.stdout)


_STARTS_ANOTHER_PYTHON = textwrap.dedent('''\
    """Runs a probe with the Python given, which prints what it starts with."""
    import subprocess
    import sys

    PROBE = (
        'import json, os, sys; print(json.dumps({"path": sys.path, '
        '"environ": dict(os.environ), "modules": sorted(m for m in '
        'sys.modules if m.startswith(("tf_loss_scale", "sitecustomize")))}))')
    done = subprocess.run([sys.argv[1], '-c', PROBE], stdout=subprocess.PIPE,
                          check=True)
    print(done.stdout.decode().splitlines()[-1])
    ''')


def test_another_python_starts_as_without_the_launcher(tmp_path):
  _require_keras_2()
  # A plain virtualenv of another interpreter: no TensorFlow, no library.
  subprocess.run([getattr(sys, '_base_executable', sys.executable), '-m',
                  'venv', '--without-pip', str(tmp_path / 'venv')],
                 check=True)
  (tmp_path / 'program.py').write_text(_STARTS_ANOTHER_PYTHON)
  other = str(tmp_path / 'venv' / 'bin' / 'python')
  python, launched = _python_and_launcher(['program.py', other],
                                          str(tmp_path))
  assert launched.returncode == 0, launched.stderr[-3000:]
  assert _report(launched) == _report(python)
  assert _report(python)['modules'] == []


# Program -> the line `run --check` prints: what was read, from which name.
_READ = {
    'guarded_tf1.py': (
        'try:\n  import tensorflow as tf\nexcept ImportError:\n  tf = None\n'
        'x = tf.placeholder(tf.float32, [None, 1])\n',
        'TensorFlow 1 (read from tf.placeholder on line 5)'),
    'tf1_in_a_function.py': (
        'def main():\n  import tensorflow as tf1\n'
        '  with tf1.Session() as session:\n    pass\n',
        'TensorFlow 1 (read from tf1.Session on line 3)'),
    'tf1_in_a_module_beside_it.py': (
        'import json\nfrom helper_tf1 import build\n',
        'TensorFlow 1 (read from tf.train.AdamOptimizer on line 3 of '
        'helper_tf1.py)'),
    'graph_rewrite_with_decay.py': (
        'import tensorflow as tf\n'
        'opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(\n'
        '    tf.keras.optimizers.SGD(1e-4, decay=0.5))\n',
        'TensorFlow 2.3 (read from tf.train.experimental.'
        'enable_mixed_precision_graph_rewrite on line 2)'),
    'nvidia_amp_demo.py': (
        'import tensorflow.compat.v2 as tf\ntf.enable_v2_behavior()\n'
        'opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(\n'
        '    tf.keras.optimizers.SGD(0.1))\n',
        'TensorFlow 1.15 (read from tf.enable_v2_behavior on line 2)'),
    'contrib_mixed_precision.py': (
        'import tensorflow as tf\n'
        'manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n',
        'TensorFlow 1 (read from tf.contrib.mixed_precision.'
        'FixedLossScaleManager on line 2)'),
    'keras3_train_step.py': (
        'import keras\n\n\nclass Model(keras.Model):\n\n'
        '  def train_step(self, data):\n'
        '    return self.optimizer.scale_loss(1.0)\n',
        'Keras 3: tf.keras and keras are Keras 3 (read from '
        'self.optimizer.scale_loss on line 7)'),
    'keras3_ops.py': (
        'from keras import ops as K\nprint(K.mean)\n',
        'Keras 3: tf.keras and keras are Keras 3 (read from keras.ops on '
        'line 1)'),
    'keras3_weights_file.py': (
        "import keras\nkeras.Sequential().load_weights('model.weights.h5')\n",
        "Keras 3: tf.keras and keras are Keras 3 (read from "
        "'model.weights.h5' on line 2)"),
    'keras3_loss_scale_optimizer.py': (
        'import tensorflow as tf\n'
        'opt = tf.keras.optimizers.LossScaleOptimizer(None)\n',
        'Keras 3: tf.keras and keras are Keras 3 (read from '
        'tf.keras.optimizers.LossScaleOptimizer on line 2)'),
}


@pytest.mark.parametrize('name', sorted(_READ))
def test_the_generation_is_read_from_the_programs_code(name, tmp_path):
  if 'Keras 3' in _READ[name][1]:
    versions.KERAS_3.require()
  else:
    _require_keras_2()
  source, line = _READ[name]
  (tmp_path / name).write_text(source)
  (tmp_path / 'helper_tf1.py').write_text(
      'import tensorflow as tf\ndef build():\n'
      '  return tf.train.AdamOptimizer(0.1)\n')
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check', name],
                           cwd=str(tmp_path))
  assert line in done.stdout.splitlines(), done.stdout + done.stderr


@pytest.mark.parametrize('release,tf1', [('1.15', True), ('2.3.4', False)])
def test_tf_takes_a_release_as_users_write_it(release, tf1, program,
                                               tmp_path):
  _require_keras_2()
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check', '--tf',
                            release, program], cwd=str(tmp_path))
  assert done.returncode == 0, done.stdout + done.stderr
  lines = done.stdout.splitlines()
  assert lines[2] == f'TensorFlow {release}'
  assert lines[3].startswith('import tensorflow gives tensorflow.compat.v1'
                             ) == tf1, lines
  assert "tf_keras's legacy optimizers" in done.stdout


_ESTIMATOR_MESSAGE = ('tf.estimator was removed in TensorFlow 2.16: run on '
                      '2.15 or earlier, where this library runs too')


def test_check_names_each_name_that_cannot_be_served(tmp_path):
  _require_keras_2()
  (tmp_path / 'model_garden.py').write_text(textwrap.dedent('''\
      import tensorflow as tf
      from tensorflow.contrib import layers


      def model_fn(features, labels, mode):
        return tf.estimator.EstimatorSpec(mode)


      classifier = tf.estimator.Estimator(model_fn)
      '''))
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--check',
                            'model_garden.py'], cwd=str(tmp_path))
  warnings = [line for line in done.stdout.splitlines()
              if line.startswith('warning:')]
  estimator = [
      f'warning: line 6: tf.estimator.EstimatorSpec: {_ESTIMATOR_MESSAGE}',
      f'warning: line 9: tf.estimator.Estimator: {_ESTIMATOR_MESSAGE}',
  ] if versions.TF >= (2, 16) else []
  assert warnings == [
      'warning: line 2: tensorflow.contrib.layers: ' + _CONTRIB_MESSAGE,
  ] + estimator, done.stdout
  assert done.returncode == 1


_SETS_LEGACY_KERAS = textwrap.dedent('''\
    """A TF 2.16 program that asks for tf_keras itself, then meets Estimator."""
    import json
    import os
    import sys

    os.environ['TF_USE_LEGACY_KERAS'] = '1'
    import tensorflow as tf

    print(json.dumps({'keras': tf.keras.optimizers.SGD.__module__.split('.')[0],
                      'environ': os.environ['TF_USE_LEGACY_KERAS']}))
    sys.stdout.flush()
    tf.estimator.Estimator
    ''')


@versions.KERAS_3.mark
def test_what_the_program_sets_before_importing_tensorflow_counts(tmp_path):
  versions.TF_KERAS_INSTALLED.require()
  (tmp_path / 'program.py').write_text(_SETS_LEGACY_KERAS)
  python, launched = _python_and_launcher(['program.py'], str(tmp_path),
                                          ['--keras', '3'])
  assert _report(python) == {'keras': 'tf_keras', 'environ': '1'}
  assert _report(launched) == _report(python)
  # Where Python says no attribute 'estimator', the launcher says what to do.
  assert launched.returncode == python.returncode == 1
  assert launched.stderr.strip().splitlines()[-1] == (
      f'AttributeError: {_ESTIMATOR_MESSAGE}')


_A_GENERATIONS_CHILD = textwrap.dedent('''\
    """Probes what it gets, in itself and in a child of the same Python."""
    import json
    import subprocess
    import sys

    import keras
    import tensorflow as tf
    import tf_loss_scale.keras.experimental as tf23


    def probe():
      return {'keras': keras.__name__,
              'tf1': hasattr(tf, 'placeholder'),
              'legacy_sgd': '.legacy.' in tf.keras.optimizers.SGD.__module__,
              'counts_skipped_steps':
                  tf23.LossScaleOptimizer.counts_skipped_steps}


    if sys.argv[1:] == ['child']:
      print(json.dumps(probe()))
    else:
      done = subprocess.run([sys.executable, __file__, 'child'],
                            stdout=subprocess.PIPE, check=True)
      print(json.dumps({'parent': probe(), 'child': json.loads(
          done.stdout.decode().splitlines()[-1])}))
    ''')


@pytest.mark.parametrize('flags,expected', [
    (['--tf', '1'], (True, True, False)),
    (['--tf', '2.3'], (False, True, True)),
    # TF 2.4-2.15's in the fast tier: test_children_are_set_up_as_the_program.
    pytest.param([], (False, False, True), marks=pytest.mark.slow),
    (['--keras', '3'], (False, False, True)),
], ids=['tf1', 'tf23', 'tf24', 'keras3'])
def test_each_generation_imports_keras_in_a_child_set_up_alike(
    flags, expected, tmp_path):
  keras_3 = flags == ['--keras', '3']
  if keras_3:
    versions.KERAS_3.require()
  else:
    _require_keras_2()
  (tmp_path / 'program.py').write_text(_A_GENERATIONS_CHILD)
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', *flags,
                            'program.py'], cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  tf1, legacy_sgd, counts = expected
  probe = {'keras': 'keras' if keras_3 else _keras_2_package(), 'tf1': tf1,
           'legacy_sgd': legacy_sgd, 'counts_skipped_steps': counts}
  assert _report(done) == {'parent': probe, 'child': probe}


_KERAS_3_TRAIN_STEP = textwrap.dedent('''\
    """Keras 3 code: a custom `train_step` that scales its loss itself."""
    import json

    import keras
    import numpy as np
    import tensorflow as tf

    keras.mixed_precision.set_global_policy('mixed_float16')


    class Linear(keras.Model):

      def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, use_bias=False,
                                        kernel_initializer='zeros')

      def call(self, x):
        return tf.cast(self.dense(x), 'float32')

      def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
          loss = keras.ops.mean(keras.ops.square(self(x) - y))
          scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {'loss': loss}


    model = Linear()
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.05), initial_scale=2 ** 15,
        dynamic_growth_steps=2), jit_compile=True)
    x = np.ones((4, 1), np.float32)
    model.fit(x, x * 1.5, batch_size=4, epochs=5, verbose=0)
    print(json.dumps({'kernel': float(model.dense.kernel.numpy()[0, 0]),
                      'loss_scale': float(model.optimizer.scale_loss(1.0)),
                      'iterations': int(model.optimizer.iterations.numpy())}))
    ''')


@pytest.mark.slow
@versions.KERAS_3.mark
def test_a_keras_3_program_is_read_as_keras_3_and_runs_as_under_python(
    tmp_path):
  (tmp_path / 'program.py').write_text(_KERAS_3_TRAIN_STEP)
  python, launched = _python_and_launcher(['program.py'], str(tmp_path))
  assert launched.returncode == 0, launched.stderr[-3000:]
  assert _report(launched) == _report(python)
  assert ('program.py reads as Keras 3 code (keras.ops.mean on line 24); '
          'pass --keras to say otherwise') in launched.stderr
