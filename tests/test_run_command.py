"""Tests of `python -m tf_loss_scale run PROGRAM.py [ARGS...]`.

Each run is a fresh process started without `TF_USE_LEGACY_KERAS`: the
command itself chooses the Keras. The program below reports what it saw;
its own arguments tell it how to end.
"""

import json
import os
import shutil
import sys
import textwrap
from importlib import metadata

import pytest

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


def test_after_tensorflow_was_imported_a_fresh_interpreter_runs_it(
    program, tmp_path):
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()
  code = ('import sys; import tensorflow; '
          'from tf_loss_scale.__main__ import main; '
          'sys.exit(main(["run", sys.argv[1], "--exit", "4"]))')
  done = fresh_process.run(['-c', code, program], cwd=str(tmp_path))
  assert done.returncode == 4, done.stderr[-3000:]
  report = _report(done)
  assert report['argv'] == [program, '--exit', '4']
  assert report['sgd'].startswith(_keras_2_package() + '.'), report
  assert report['v1_class'] == _OURS_V1


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
    tf.contrib.layers.fully_connected
    ''')


def test_tf_1_runs_tf1_code_and_refuses_tf_contrib(tmp_path):
  _require_keras_2()
  path = tmp_path / 'tf1_program.py'
  path.write_text(_TF1)
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', '--tf', '1',
                            str(path)], cwd=str(tmp_path))
  assert done.returncode == 1, done.stderr[-3000:]
  assert _report(done) == {
      'is_compat_v1': True, 'compat_v1_is_it': True,
      'eager': False, 'v1_class': _OURS_V1,
      'dynamic': 'tf_loss_scale.loss_scale.DynamicLossScale',
      'library_tf': 'tensorflow'}
  assert done.stderr.strip().splitlines()[-1] == (
      'AttributeError: tf.contrib was removed in TensorFlow 2 and '
      'tf-loss-scale run --tf 1 cannot serve it: port this use of tf.contrib '
      '(tf.contrib.mixed_precision is tf.train.experimental.'
      'MixedPrecisionLossScaleOptimizer, which the launcher serves)')


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
  assert lines[names + 1] == ('  line 5: MixedPrecisionLossScaleOptimizer: '
                              'tf_loss_scale.MixedPrecisionLossScaleOptimizer')
  assert lines[-1].startswith('warning: line 4: tf.contrib: tf.contrib was '
                              'removed in TensorFlow 2'), lines
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
    (['--tf', '3'], "argument --tf: '3': the program's TensorFlow is 1 or 2.N"),
    (['--keras', '3', '--tf', '2.3'],
     'a program of TensorFlow 2.3 runs under Keras 2, not --keras 3'),
])
def test_generations_that_cannot_be(args, message, program, tmp_path):
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', *args, program],
                           cwd=str(tmp_path))
  assert done.returncode == 2
  assert message in done.stderr, done.stderr
