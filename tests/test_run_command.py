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

import pytest

import fresh_process
import versions

_PROGRAM = textwrap.dedent('''\
    """Reports the Keras, the classes under the legacy names and its argv."""
    import json
    import os
    import sys

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


def _keras_2_package() -> str:
  # tf_keras where `keras` is Keras 3; the keras 2.x TensorFlow 2.15 and
  # earlier depend on otherwise.
  return 'tf_keras' if versions.KERAS_3 else 'keras'


def test_keras_2_argv_and_exit_status(program, tmp_path):
  if versions.KERAS_3:
    versions.TF_KERAS_INSTALLED.require()
  # The program's arguments, options of the command's own spelling included,
  # are the program's; its `sys.exit` code is the command's.
  done = fresh_process.run(['-m', 'tf_loss_scale', 'run', program,
                            '--exit', '3', '--keras', '3', '-x'],
                           cwd=str(tmp_path))
  assert done.returncode == 3, done.stderr[-3000:]
  report = _report(done)
  assert report['argv'] == [program, '--exit', '3', '--keras', '3', '-x']
  assert report['main'] == '__main__'
  assert report['path0'] == str(tmp_path)
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
  assert report['tf24_class'] == _OURS_TF24
  assert report['v1_class'] == _OURS_V1
  traceback = done.stderr[done.stderr.index('Traceback'):].splitlines()
  # As `python old_program.py` prints it: from the program's module on.
  assert traceback[0] == 'Traceback (most recent call last):'
  assert traceback[1] == f'  File "{program}", line 29, in <module>'
  assert f'  File "{program}", line 13, in fail' in traceback
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
