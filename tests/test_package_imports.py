"""A plain `import tf_loss_scale` reaches every public module, lazily.

Each case runs in a fresh interpreter: what an import loads is process-wide,
and `TF_USE_LEGACY_KERAS` is read once, when TensorFlow is imported.

`import tensorflow` itself loads the Keras that `tf.keras` is (Keras 3's
`keras`, or `tf_keras` under `TF_USE_LEGACY_KERAS=1`), so "loads no Keras"
means: no Keras module beyond those TensorFlow loaded, and never the other
Keras.
"""

import ast
import functools
import os

import pytest

import fresh_process
import keras_families

_PROBE = '''
import json, sys
import tensorflow

def keras_modules():
  return {m for m in sys.modules if m.split('.')[0] in ('keras', 'tf_keras')}

def library_modules():
  return sorted(m for m in sys.modules if m.startswith('tf_loss_scale.'))

loaded_by_tensorflow = keras_modules()
import tf_loss_scale
import tf_loss_scale.keras
result = {
    'keras_modules_added': sorted(keras_modules() - loaded_by_tensorflow),
    'library_modules': library_modules(),
    'dir': dir(tf_loss_scale),
    'keras_dir': dir(tf_loss_scale.keras),
}
result['resolved'] = {
    'compat.install': tf_loss_scale.compat.install.__qualname__,
    'monitoring.LossScaleCallback':
        tf_loss_scale.monitoring.LossScaleCallback.__qualname__,
    'inspect_checkpoint.CheckpointError':
        tf_loss_scale.inspect_checkpoint.CheckpointError.__qualname__,
    'keras.experimental.LossScaleOptimizer':
        tf_loss_scale.keras.experimental.LossScaleOptimizer.__module__,
}
try:
  result['resolved']['keras.LossScaleOptimizer'] = (
      tf_loss_scale.keras.LossScaleOptimizer.__module__)
except ImportError as e:
  result['resolved']['keras.LossScaleOptimizer'] = 'ImportError: ' + str(e)
try:
  from tf_loss_scale.keras import LossScaleOptimizer
  result['from_import'] = LossScaleOptimizer.__module__
except ImportError as e:
  result['from_import'] = 'ImportError: ' + str(e)
errors = {}
for package, name in ((tf_loss_scale, 'no_such_module'),
                      (tf_loss_scale.keras, 'NoSuchOptimizer')):
  try:
    getattr(package, name)
  except AttributeError as e:
    errors[name] = str(e)
result['errors'] = errors
result['tf_keras_loaded'] = 'tf_keras' in sys.modules
print(json.dumps(result))
'''

_LAZY_LIBRARY_MODULES = ('tf_loss_scale.compat', 'tf_loss_scale.monitoring',
                         'tf_loss_scale.inspect_checkpoint',
                         'tf_loss_scale.keras.experimental',
                         'tf_loss_scale.keras.experimental.keras2',
                         'tf_loss_scale.keras.experimental.keras3',
                         'tf_loss_scale.keras.shared.families',
                         'tf_loss_scale.keras.keras3',
                         'tf_loss_scale.keras.shared.slots')


@functools.lru_cache(maxsize=None)
def _probe(legacy_keras):
  return fresh_process.run_json(['-c', _PROBE], legacy_keras=legacy_keras)


@pytest.fixture(params=[False, True], ids=['default', 'legacy_keras'])
def probe(request):
  if request.param and not keras_families.tf_keras_can_be_keras3():
    # TensorFlow <= 2.15 reads the variable too, and then needs tf_keras.
    pytest.skip('TF_USE_LEGACY_KERAS=1 is for TensorFlow 2.16+ (tf.keras is '
                'Keras 2 already here)')
  return request.param, _probe(request.param)


def test_import_loads_no_keras_module_beyond_tensorflows(probe):
  legacy_keras, result = probe
  assert result['keras_modules_added'] == [], (
      f'TF_USE_LEGACY_KERAS={int(legacy_keras)}: `import tf_loss_scale, '
      f'tf_loss_scale.keras` loaded {result["keras_modules_added"]}')
  loaded = [m for m in _LAZY_LIBRARY_MODULES if m in result['library_modules']]
  assert loaded == [], f'loaded before first use: {loaded}'


def test_dir_lists_the_public_modules(probe):
  _, result = probe
  for name in ('compat', 'inspect_checkpoint', 'keras', 'monitoring',
               'DynamicLossScale', 'MixedPrecisionLossScaleOptimizer'):
    assert name in result['dir'], name
  for name in ('LossScaleOptimizer', 'experimental'):
    assert name in result['keras_dir'], name


def test_each_public_module_resolves_on_first_access(probe):
  _, result = probe
  resolved = dict(result['resolved'])
  keras3_form = resolved.pop('keras.LossScaleOptimizer')
  assert resolved == {
      'compat.install': 'install',
      'monitoring.LossScaleCallback': 'LossScaleCallback',
      'inspect_checkpoint.CheckpointError': 'CheckpointError',
      'keras.experimental.LossScaleOptimizer':
          'tf_loss_scale.keras.experimental.base',
  }
  if keras_families.keras3_or_none() is not None:
    assert keras3_form == 'tf_loss_scale.keras.keras3'
    assert result['from_import'] == keras3_form


def test_the_keras3_form_without_keras3_is_an_import_error_naming_the_other():
  if keras_families.keras3_or_none() is not None:
    pytest.skip('Keras 3 is installed here: the Keras 3 form imports')
  result = _probe(False)
  for resolved in (result['resolved']['keras.LossScaleOptimizer'],
                   result['from_import']):
    assert resolved.startswith('ImportError: '), resolved
    assert 'needs Keras 3 (TensorFlow 2.16 or later)' in resolved, resolved
    assert 'tf_loss_scale.keras.experimental.LossScaleOptimizer(' in (
        resolved), resolved


def test_unknown_names_raise_attribute_error_naming_them(probe):
  _, result = probe
  assert result['errors'] == {
      'no_such_module':
          "module 'tf_loss_scale' has no attribute 'no_such_module'",
      'NoSuchOptimizer':
          "module 'tf_loss_scale.keras' has no attribute 'NoSuchOptimizer'",
  }


def test_keras_front_ends_never_load_tf_keras_under_keras_3():
  # tf_keras is an optional extra: under Keras 3, reaching every module and
  # both Keras front ends must not import it. Read from the Keras 3 probe
  # only: under TF_USE_LEGACY_KERAS=1 TensorFlow itself loads tf_keras.
  assert not _probe(False)['tf_keras_loaded']


def test_import_loads_no_tensorflow_until_a_name_is_used():
  # The command line relies on it: `python -m tf_loss_scale demo` must route
  # TensorFlow's start-up log lines before TensorFlow loads.
  result = fresh_process.run_json(['-c', '''
import json, sys
import tf_loss_scale
before = 'tensorflow' in sys.modules
scale = tf_loss_scale.FixedLossScale(8)
print(json.dumps([before, 'tensorflow' in sys.modules, float(scale())]))
'''])
  assert result == [False, True, 8.0]



def _imports_of_keras_modules(library):
  """Each module of `library`/keras to the library modules it imports.

  Every import statement counts, at module level or in a function. (That
  importing a submodule runs its package's `__init__.py` first is how
  packages work, not an import of the package.)
  """
  graph = {}
  for directory, _, files in os.walk(os.path.join(library, 'keras')):
    for file in files:
      if file.endswith('.py'):
        path = os.path.join(directory, file)
        parts = os.path.relpath(path, os.path.dirname(library))[:-3].split(
            os.sep)
        with open(path) as f:
          graph['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = (
              ast.parse(f.read()))
  edges = {}
  for module, tree in graph.items():
    imported = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        imported.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module:
        for alias in node.names:
          name = f'{node.module}.{alias.name}'
          imported.add(name if name in graph else node.module)
    edges[module] = {m for m in imported if m in graph and m != module}
  return edges


def test_the_keras_modules_import_each_other_without_a_cycle():
  library = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'tf_loss_scale')
  graph = _imports_of_keras_modules(library)
  assert 'tf_loss_scale.keras.experimental.base' in graph, sorted(graph)
  done, path = set(), []

  def visit(module):
    if module in path:
      cycle = path[path.index(module):] + [module]
      raise AssertionError('import cycle: ' + ' -> '.join(cycle))
    if module not in done:
      path.append(module)
      for imported in sorted(graph[module]):
        visit(imported)
      path.pop()
      done.add(module)

  for module in sorted(graph):
    visit(module)


# The modules `.keras` files of the library's Keras 3 classes named before
# the Keras folder was laid out by generation: new -> earlier.
_EARLIER_MODULES = {
    'tf_loss_scale.keras.keras3': 'tf_loss_scale.keras.loss_scale_optimizer',
    'tf_loss_scale.keras.experimental.keras3':
        'tf_loss_scale.keras.experimental_keras3',
}

_LOAD_WITHOUT_THE_LIBRARY = '''
import json, sys
import keras
results = {}
for path in sys.argv[1:]:
  try:
    model = keras.models.load_model(path)
  except TypeError as e:
    results[path] = 'TypeError: ' + str(e)[:200]
  else:
    opt = model.optimizer
    # Keras 3 before 3.5 counts the wrapper's own steps apart: the inner
    # optimizer's count is the one every Keras 3 restores.
    results[path] = [type(opt).__module__,
                     int(opt.inner_optimizer.iterations.numpy())]
results['library_imported'] = 'tf_loss_scale' in sys.modules
print(json.dumps(results))
'''


@pytest.mark.parametrize('modules', ['current', 'earlier'])
def test_keras_files_load_by_the_module_they_name(tmp_path, modules):
  import zipfile  # pylint: disable=g-import-not-at-top
  keras = keras_families.keras3_or_none()
  if keras is None:
    pytest.skip('the `.keras` files of Keras 3 classes need Keras 3')
  if tuple(int(p) for p in keras.__version__.split('.')[:2]) >= (3, 9):
    pytest.skip(f'Keras {keras.__version__} imports no module a file names '
                'outside its own packages (from Keras 3.9): the class must '
                'be registered, whatever its module')
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras import LossScaleOptimizer  # pylint: disable=g-import-not-at-top
  from tf_loss_scale.keras import experimental  # pylint: disable=g-import-not-at-top
  paths = []
  for name, opt in (
      ('keras3', LossScaleOptimizer(keras.optimizers.SGD(0.1))),
      ('experimental', experimental.LossScaleOptimizer(
          keras.optimizers.SGD(0.1), 'dynamic'))):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss='mse')
    model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=3, verbose=0)
    saved = str(tmp_path / f'{name}.keras')
    model.save(saved)
    path = str(tmp_path / f'{name}-{modules}.keras')
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(path, 'w') as out:
      for item in source.infolist():
        data = source.read(item)
        if modules == 'earlier' and item.filename == 'config.json':
          text = data.decode()
          named = [m for m in _EARLIER_MODULES if f'"{m}"' in text]
          assert len(named) == 1, (name, named)
          data = text.replace(f'"{named[0]}"',
                              f'"{_EARLIER_MODULES[named[0]]}"').encode()
        out.writestr(item, data)
    paths.append(path)
  result = fresh_process.run_json(['-c', _LOAD_WITHOUT_THE_LIBRARY] + paths)
  assert result == {
      paths[0]: ['tf_loss_scale.keras.keras3', 3],
      paths[1]: ['tf_loss_scale.keras.experimental.keras3', 3],
      'library_imported': True,
  }
