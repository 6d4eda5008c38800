"""Test setup shared by every test module.

Splits the one physical CPU into two logical devices before TensorFlow
initialises, so that MirroredStrategy runs two real replicas, and gives the
tests one MirroredStrategy over them, made anew after a test whose
collectives aborted (which would fail every later collective).
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
# The only way back from aborted collectives: a new eager context.
from tensorflow.python.eager import context as eager_context  # pylint: disable=g-import-not-at-top


def _two_logical_cpus():
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices('CPU')[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)


_two_logical_cpus()
_strategy = []  # The MirroredStrategy of the tests, once made.
# What a collective op raises, in this and every later collective of the
# process, once one collective failed (a shape mismatch, a replica's error).
_ABORTED = 'Collective ops is aborted'


@pytest.fixture
def mirrored_strategy():
  """The MirroredStrategy over the two logical CPUs that the tests share.

  A second MirroredStrategy in the same process breaks its collectives
  ("Shape mismatch in the collective instance"), so the tests share one,
  until a test's collectives abort: then the eager context is made anew
  and so is the strategy (see `pytest_runtest_makereport`).
  """
  if not _strategy:
    _strategy.append(tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1']))
  return _strategy[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """After a test whose collectives aborted, resets them for the next."""
  del item, call  # Unused.
  outcome = yield
  report = outcome.get_result()
  if report.failed and _ABORTED in str(report.longrepr):
    # Every variable and tensor made so far goes with the old context: the
    # failing test's report stands, the later tests start afresh.
    eager_context._reset_context()  # pylint: disable=protected-access
    _two_logical_cpus()
    _strategy.clear()


# Tests of the full tier only, by id (a prefix: every parametrization),
# beside the files and parametrizations marked slow where they are defined.
# Each is covered in the fast tier by a cheaper test (docs/testing.md).
_FULL_TIER_ONLY = (
    # The originals' records are there only after `.ci/run originals`,
    # whose run of this file passes --full.
    'tests/test_traces.py::',
    'tests/test_compat_keras.py::test_fit_without_legacy_names_is_bit_'
    'identical_with_install[tf_keras]',
    'tests/test_run_command.py::test_each_generation_imports_keras_in_a_'
    'child_set_up_alike[keras3]',
    'tests/test_run_command.py::test_each_generation_imports_keras_in_a_'
    'child_set_up_alike[tf1]',
    'tests/test_compat.py::test_tf23_compile_fit_script_runs_unmodified_'
    'under_keras_3',
    'tests/test_compat.py::test_importing_changes_nothing[legacy_keras]',
    'tests/test_refusals.py::test_tf23_program_with_a_loss_scale_outside_'
    'the_scope_runs_as_tf23',
    'tests/test_package_imports.py::test_each_public_module_resolves_on_'
    'first_access[legacy_keras]',
    'tests/test_experimental_namespace.py::test_compile_wraps_with_the_'
    'policy_loss_scale[legacy_keras]',
    'tests/test_experimental_namespace.py::test_fit_trains_like_keras_and_'
    'skips_an_inf_batch[legacy_keras]',
    'tests/test_package_imports.py::test_unknown_names_raise_attribute_error_'
    'naming_them[legacy_keras]',
    'tests/test_compat_keras.py::test_keras_file_saved_with_install_holds_'
    'what_it_holds_without[default]',
    'tests/test_refusals.py::test_tf23_policy_set_before_the_strategy_trains_'
    'after_install',
    'tests/test_conftest.py::test_tests_after_an_aborted_collective_run_on_a_'
    'new_strategy',
    'tests/test_optimizer_v1.py::test_mirrored_matches_tensorflow_step_by_'
    'step[function]',
    'tests/test_run_command.py::test_keras_3_and_the_programs_traceback',
    'tests/test_compat.py::test_tf23_mixed_precision_guide_runs_unmodified_'
    'after_install[legacy_keras]',
    'tests/test_compat_keras.py::test_keras_file_saved_with_or_without_'
    'install_loads_with_or_without_it',
    'tests/test_compat_keras.py::test_install_patches_compile_on_the_class_'
    'defining_it_and_uninstall_restores[tf_keras]',
    'tests/test_demo.py::test_mirrored_runs_record_consistent_results',
    'tests/test_demo.py::test_cli_prints_the_table_and_writes_results[keras]',
    'tests/test_demo.py::test_cli_prints_the_table_and_writes_results'
    '[experimental]',
    'tests/test_demo.py::test_cli_keeps_onednn_on_when_asked',
    'tests/test_demo.py::test_cli_output_is_quiet_and_every_printed_command_'
    'works',
    'tests/test_experimental_namespace.py::test_policy_loss_scale_as_tf23_'
    'defined_it[legacy_keras]',
    'tests/test_inspect.py::test_command_line_errors_are_one_line_without_'
    'tensorflow_log',
    'tests/test_keras_experimental_tf_keras.py::test_hdf5_model_loads_in_a_'
    'fresh_process_that_imports_the_form[legacy]',
    'tests/test_keras_experimental_tf_keras.py::test_wrapping_under_mixed_'
    'bfloat16_warns_once[keras2-',
    'tests/test_keras_mixed_precision.py::test_tf_keras_checkpoints_restore_'
    'whole_into_this_class',
    'tests/test_keras_releases.py::test_smoke_checks_of_the_installed_keras_'
    'release',
    'tests/test_optimizer_v1.py::test_training_inside_a_while_loop_matches_'
    'tensorflow[v1]',
    'tests/test_run_command.py::test_children_are_set_up_as_the_program[2-1]',
    'tests/test_run_command.py::test_children_are_set_up_as_the_program[3-',
    'tests/test_xla_passes.py::test_an_exact_check_under_xla_is_one_pass_'
    'with_the_skip_report_in_it',
    'tests/test_compat.py::test_tf23_mixed_precision_guide_runs_unmodified_'
    'after_install[default]',
    'tests/test_compat_keras.py::test_isinstance_train_step_trains_after_'
    'install_as_tf_keras_class_does',
    'tests/test_compat_keras.py::test_tf_keras_loss_scale_optimizer_config_'
    'deserializes_while_installed',
    'tests/test_compat_keras.py::test_compile_made_keras_wrapper_is_replaced_'
    'only_while_installed',
    'tests/test_run_command.py::test_without_tf_keras_says_how_to_get_it',
    'tests/test_experimental_namespace.py::test_policy_loss_scale_as_tf23_'
    'defined_it[default]',
    'tests/test_keras_experimental_tf_keras.py::test_hdf5_model_loads_in_a_'
    'fresh_process_that_imports_the_form[new]',
    'tests/test_keras_experimental_tf_keras.py::test_wrapping_under_mixed_'
    'bfloat16_warns_once[keras3-',
    'tests/test_keras_releases.py::test_a_keras_3_older_than_the_oldest_'
    'supported_is_refused',
    'tests/test_package_imports.py::test_import_loads_no_keras_module_beyond_'
    'tensorflows[legacy_keras]',
    'tests/test_multi_worker.py::test_parameter_server_strategy_is_refused_'
    'at_construction_and_apply',
    'tests/test_keras_mixed_precision_checkpoints.py::test_tf_keras_'
    'checkpoint_restores_whole_under_a_mirrored_strategy[adam-built]',
    'tests/test_keras_mixed_precision_checkpoints.py::test_tf_keras_'
    'checkpoint_restores_whole_under_a_mirrored_strategy[sgd_momentum-',
    'tests/test_compat.py::test_tf23_compile_fit_script_runs_unmodified_where_'
    'tf_keras_is_keras2',
    'tests/test_compat_keras.py::test_keras_file_saved_with_install_holds_'
    'what_it_holds_without[tf_keras]',
    'tests/test_package_imports.py::test_dir_lists_the_public_modules'
    '[legacy_keras]',
    'tests/test_experimental_namespace.py::test_layers_take_the_policy_and_'
    'get_layer_policy_returns_it[legacy_keras]',
    'tests/test_experimental_namespace.py::test_graph_rewrite_switches_'
    'tensorflow_rewrite_and_wraps_with_ours[legacy_keras]',
    # The originals' step runs this file with --full.
    'tests/test_tf1_control_flow.py::',
    'tests/test_inspect.py::test_keras_file_of_the_keras_3_form_from_a_fresh_'
    'command_line',
    'tests/test_loss_scale_options.py::test_warn_in_a_graph_and_a_function_'
    'logs_once_per_collapse',
    'tests/test_run_command.py::test_tf_2_3_gets_tf_2_10s_optimizers',
    'tests/test_run_command.py::test_what_the_program_sets_before_importing_'
    'tensorflow_counts',
    'tests/test_compat_keras.py::test_fit_without_legacy_names_is_bit_'
    'identical_with_install[default]',
    'tests/test_compat_keras.py::test_install_patches_compile_on_the_class_'
    'defining_it_and_uninstall_restores[default]',
    'tests/test_experimental_namespace.py::test_graph_rewrite_session_trains_'
    'and_skips_as_tensorflow[legacy_keras]',
    'tests/test_experimental_namespace.py::test_uninstall_restores_compile_'
    'and_the_rewrite_names[legacy_keras]',
    # Two replicas: one trajectory of each kind keeps them in the fast tier.
    *(f'tests/test_loss_scale_spec.py::test_dynamic_trajectory[mirrored-{name}-'
      for name in ('grows', 'shrinks', 'nan-clears-the-good-steps',
                   'period-one', 'alternating-period', 'multiplier-three')),
    *(f'tests/test_loss_scale_options.py::test_pinned_trajectory[mirrored-'
      f'{name}-' for name in ('floor-below-one', 'hysteresis-two', 'cap')),
    'tests/test_skip_report.py::test_report_is_the_union_over_replicas'
    '[keras_mixed_precision]',
    'tests/test_skip_report.py::test_report_is_the_union_over_replicas'
    '[experimental_',
    'tests/test_keras_mixed_precision_checkpoints.py::test_tf_keras_'
    'checkpoint_restores_whole_into_ours[tf24_class-sgd_momentum-',
    'tests/test_keras_mixed_precision_checkpoints.py::test_tf_keras_'
    'checkpoint_restores_whole_into_ours[under_keras_name-sgd_momentum-',
    'tests/test_keras_mixed_precision_checkpoints.py::test_a_bare_optimizers_'
    'checkpoint_restores_into_the_wrapper[tf_keras-sgd_momentum-',
    'tests/test_keras_mixed_precision_checkpoints.py::test_a_bare_optimizers_'
    'checkpoint_restores_into_the_wrapper[ours-sgd_momentum-',
    'tests/test_keras_experimental_tf_keras.py::test_matches_keras2_loss_'
    'scale_optimizer_on_two_replicas[sgd_momentum]',
    'tests/test_keras_experimental_tf_keras.py::test_matches_keras2_loss_'
    'scale_optimizer_on_two_replicas[legacy_sgd_momentum]',
)


def pytest_configure(config):
  """Under pytest-xdist, sends each file's tests to one worker.

  Several files run their programs in batches, once per process, from a
  module or session fixture (the legacy programs, the README's blocks, the
  file matrix, ...): spread over two workers, each worker would run the
  whole batch. `-n 2` distributes test by test (`--dist load`, its
  default); here that becomes `--dist loadfile`. Another `--dist` is kept.
  The files go out in the order collection leaves them (below), not by
  their number of tests: the long ones first, so that neither worker is
  left with one at the end.
  """
  if getattr(config.option, 'dist', 'no') == 'load':
    config.option.dist = 'loadfile'
    config.option.loadscopereorder = False


def pytest_addoption(parser):
  parser.addoption(
      '--full', action='store_true',
      help='also run the tests marked slow (the full tier; docs/testing.md)')


def _starts_processes(item) -> bool:
  module = getattr(item, 'module', None)
  return module is not None and ('fresh_process' in vars(module) or
                                 'subprocess' in vars(module))


def pytest_collection_modifyitems(config, items):
  """Leaves the tests marked slow out unless --full is given.

  First come the files whose tests start processes (each test a TensorFlow
  start-up or more), then the rest, each part in its order.
  """
  items.sort(key=lambda item: not _starts_processes(item))
  for item in items:
    if item.nodeid.startswith(_FULL_TIER_ONLY):
      item.add_marker(pytest.mark.slow)
  if config.getoption('--full'):
    return
  slow = [item for item in items if item.get_closest_marker('slow')]
  config.stash[_SLOW_LEFT_OUT] = len(slow)
  # Under pytest-xdist (`-n 2`) the workers collect; the controller, which
  # writes the summary, learns the count from them.
  if hasattr(config, 'workeroutput'):
    config.workeroutput['slow_left_out'] = len(slow)
  if slow:
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if not item.get_closest_marker('slow')]


_SLOW_LEFT_OUT = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  """Under pytest-xdist, takes the full tier's count from a worker."""
  del error  # Unused.
  count = getattr(node, 'workeroutput', {}).get('slow_left_out')
  if count is not None:
    node.config.stash[_SLOW_LEFT_OUT] = count


def not_run_here(skips, slow_left_out):
  """The closing summary's lines: what this run could not check.

  Args:
    skips: (test id, reason) of each test that skipped.
    slow_left_out: how many tests of the full tier were left out.

  Returns:
    Lines: the full tier's count and how to run it, then each reason a
    test skipped for (what this environment lacks), with its tests.
  """
  lines = []
  if slow_left_out:
    lines.append(f'{slow_left_out} test{"s" * (slow_left_out != 1)} of the '
                 'full tier not run: `pytest -q tests --full` runs them (CI '
                 'does).')
  by_reason = {}
  for test, reason in skips:
    by_reason.setdefault(reason, []).append(test)
  if by_reason:
    lines.append(f'{len(skips)} check{"s" * (len(skips) != 1)} this '
                 'environment cannot run (CI runs them where they apply: '
                 'docs/testing.md):')
  for reason, tests in sorted(by_reason.items()):
    lines.append(f'  {reason}')
    lines += [f'    {test}' for test in sorted(tests)]
  return lines


def _skip_reason(report):
  if isinstance(report.longrepr, tuple):
    reason = report.longrepr[2]
  else:
    reason = str(report.longrepr)
  return reason[len('Skipped: '):] if reason.startswith('Skipped: ') else reason


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  """Says what the run did not check: the full tier, and each skip's why."""
  del exitstatus  # Unused.
  skips = [(report.nodeid, _skip_reason(report))
           for report in terminalreporter.stats.get('skipped', ())]
  lines = not_run_here(skips, config.stash.get(_SLOW_LEFT_OUT, 0))
  if lines:
    terminalreporter.write_sep('=', 'not run here')
    for line in lines:
      terminalreporter.write_line(line)
