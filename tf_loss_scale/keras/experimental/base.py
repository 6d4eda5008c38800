"""`LossScaleOptimizer(optimizer, loss_scale)`: the TF 2.0-2.3 Keras form.

Constructed, it is of its inner optimizer's family's class (picked by the
package), a subclass of this one and of that Keras's optimizer bases, so
its `compile` keeps it. This module imports no Keras and no family's
module. What every family shares is here, with the forwarding rule: the
wrapper's state is the inner optimizer and the loss scale; the names in
`forwarded_names(inner)` are read and written on the inner optimizer (one
held in a variable without a setter is assigned); any other name the
wrapper lacks is an `AttributeError`, as in TF 2.3.
"""

import copy
from typing import (Any, Callable, Dict, FrozenSet, Iterable, List, Optional,
                    Sequence, Tuple, Union)

import tensorflow as tf

from tf_loss_scale import distribute
from tf_loss_scale import execution
from tf_loss_scale import gradients
from tf_loss_scale import guards
from tf_loss_scale import loss_scale as loss_scale_lib
from tf_loss_scale import precision
from tf_loss_scale import private_api
from tf_loss_scale import step
from tf_loss_scale import step_record
from tf_loss_scale.keras.shared import families
from tf_loss_scale.keras.shared import protocols
from tf_loss_scale.keras.shared import tf2_members

LossScaleArgument = Union[str, float, int, loss_scale_lib.LossScale,
                          Dict[str, Any]]

# TF 2.3's names for settings of the inner optimizer.
_TF23_FORWARDED = frozenset({'learning_rate', 'lr', 'clipnorm', 'clipvalue',
                             'global_clipnorm', 'iterations'})
_ALIASES = {'lr': 'learning_rate'}
# The config entry that says which family the inner optimizer is of.
FAMILY_KEY = 'optimizer_family'
_NAME = 'LossScaleOptimizer'


def loss_scale_from(loss_scale: Any) -> loss_scale_lib.LossScale:
  """Turns the constructor's `loss_scale` argument into a `LossScale`.

  Raises:
    ValueError: If `loss_scale` is None or not a loss scale identifier.
  """
  if loss_scale is None:
    raise ValueError(
        "loss_scale cannot be None: pass 'dynamic', a number, a LossScale or "
        'a serialized LossScale dict.')
  if isinstance(loss_scale, dict):
    return loss_scale_lib.deserialize(loss_scale)
  return loss_scale_lib.get(loss_scale)


def forwarded_names(inner_optimizer: Any,
                    inner_methods: Iterable[str] = ()) -> FrozenSet[str]:
  """The names a wrapper reads and writes on `inner_optimizer`.

  Args:
    inner_optimizer: Any Keras optimizer.
    inner_methods: Names of the wrapper's Keras bases that are the inner's.

  Returns:
    Its settings, TF 2.3's forwarded names and `inner_methods`.
  """
  settings, _ = tf2_members.settings_of(inner_optimizer)
  return settings | _TF23_FORWARDED | frozenset(inner_methods)


class LossScaleOptimizer(protocols.TwoProtocols,
                         tf2_members.InnerWeights,
                         private_api.DelegatesCheckpointToInner):
  """Loss scaling with TF 2.3's API, around any Keras optimizer.

  Custom loop (as in TF 2.3):

  ```python
  opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.1), 'dynamic')
  with tf.GradientTape() as tape:
    scaled_loss = opt.get_scaled_loss(loss_fn())
  grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
  opt.apply_gradients(zip(grads, variables))
  ```

  A step whose gradients (summed across replicas) are not all finite is
  skipped; `iterations` counts every call (TF 2.2-2.3), or the applied steps
  only where `counts_skipped_steps` is False (TF 1.15's Keras; `tf-loss-scale
  run` sets it so for a TF 1.x program). The checkpoint is the inner
  optimizer's plus a `loss_scale` dependency (TF 2.3's layout). Which
  gradients each apply takes: `shared/protocols.py`. See
  docs/migrating_tf23.md.
  """

  # The class for an inner optimizer's family: set by the package, which
  # imports each family's module on first use.
  _class_for: Callable[[families.Family], type]
  # Each family's class sets these.
  _keras = None  # The family's Keras API namespace.
  _kind = None  # One of families.KINDS.
  _INNER_METHODS: FrozenSet[str] = frozenset()
  # Whether a skipped step counts in `iterations`: one setting per program.
  counts_skipped_steps = True

  def __new__(cls, optimizer: Any = None, *args: Any, **kwargs: Any) -> Any:
    del args, kwargs  # For __init__.
    if cls is LossScaleOptimizer:
      guards.check_family(optimizer, guards.EXPERIMENTAL_FORM)
      cls = cls._class_for(families.family_of(optimizer))
    elif cls._kind is None:
      raise TypeError(
          f'{cls.__name__} subclasses LossScaleOptimizer, whose class is '
          "picked by the inner optimizer's family: subclass the family's "
          "class instead (type(LossScaleOptimizer(optimizer, 'dynamic'))).")
    return super(LossScaleOptimizer, cls).__new__(cls)

  def __init__(self, optimizer: Any, loss_scale: LossScaleArgument):
    """Wraps `optimizer`.

    Args:
      optimizer: A Keras optimizer: Keras 3, or Keras 2 new or legacy.
      loss_scale: `'dynamic'` (a default `DynamicLossScale`), a number (a
        fixed scale), a `LossScale`, or `tf_loss_scale.serialize`'s output.

    Raises:
      TypeError: If `optimizer` is not a Keras optimizer.
      ValueError: If `optimizer` is already wrapped, `loss_scale` is none of
        the above, or under an unsupported strategy.
    """
    guards.check_new_wrapper(optimizer, guards.EXPERIMENTAL_FORM, self)
    self._check_inner_optimizer(optimizer)
    scale = loss_scale_from(loss_scale)
    # The wrapper's only state; set past Keras's attribute tracking, which
    # is for state Keras saves (the checkpoint is the inner optimizer's).
    object.__setattr__(self, '_inner_optimizer', optimizer)
    object.__setattr__(self, '_loss_scale', scale)
    object.__setattr__(self, '_forwarded_names',
                       forwarded_names(optimizer, self._INNER_METHODS))
    precision.warn_if_scaling_is_not_needed(
        self._keras.mixed_precision.global_policy().compute_dtype, _NAME)

  @classmethod
  def _check_inner_optimizer(cls, optimizer: Any) -> None:
    """Refuses what this family cannot wrap, beyond `guards`' policy."""
    del optimizer  # Every optimizer `guards` accepts.

  def _check_family_runs_here(self, where: str) -> None:
    """Refuses a step this family cannot take here, beyond `guards`'."""
    del where  # Every family takes the steps `guards` lets through.

  # ---- the forwarding rule (module docstring) ------------------------------

  def __getattribute__(self, name: str) -> Any:
    own = object.__getattribute__(self, '__dict__')
    if name in own.get('_forwarded_names', ()):
      return getattr(own['_inner_optimizer'], _ALIASES.get(name, name))
    return object.__getattribute__(self, name)

  def __setattr__(self, name: str, value: Any) -> None:
    if name not in self.__dict__.get('_forwarded_names', ()):
      object.__setattr__(self, name, value)
      return
    inner, name = self.inner_optimizer, _ALIASES.get(name, name)
    try:
      setattr(inner, name, value)
    except AttributeError:
      current = getattr(inner, name, None)
      if not hasattr(current, 'assign'):
        raise
      current.assign(value)

  def __getattr__(self, name: str) -> Any:
    # Reached only when normal lookup fails: TF 2.3's message.
    raise AttributeError(f'{_NAME!r} object has no attribute {name!r}')

  # ---- what the wrapper is ------------------------------------------------

  @property
  def inner_optimizer(self) -> Any:
    """The optimizer that applies the gradients."""
    return self._inner_optimizer

  @property
  def loss_scale(self) -> loss_scale_lib.LossScale:
    """The `LossScale` this optimizer drives (call it for the value)."""
    return self._loss_scale

  @property
  def name(self) -> str:
    """The wrapper's name, as TF 2.3's was."""
    return _NAME

  # ---- scaling (the two protocols: `protocols`) ----------------------------

  def _current_scale(self) -> tf.Tensor:
    return self._loss_scale()

  def _keras_scale_loss(self, loss: gradients.Loss) -> gradients.Loss:
    # In the loss's dtype, as `get_scaled_loss`: no Keras class of TF 2.3's
    # API had `scale_loss`.
    return gradients.scale_loss(loss, self._current_scale())

  def _follows_tensorflow(self) -> bool:
    return True  # TF 2.3's constructor: `apply_gradients` takes unscaled.

  def _unscaled_gradients_of(self, loss: Any, var_list: Any,
                             tape: Optional[tf.GradientTape],
                             grad_loss: Optional[tf.Tensor] = None
                            ) -> Tuple[List[Any], List[Any]]:
    """Scales `loss`, differentiates it and unscales the gradients.

    Raises:
      ValueError: If `loss` is a tensor and no `tape` is given.
    """
    if not callable(loss) and tape is None:
      raise ValueError(
          'minimize() needs tape= when loss is a tensor; or pass the loss as '
          'a zero-argument callable.')
    tape = tape if tape is not None else tf.GradientTape()
    with tape:
      if callable(loss):
        if not callable(var_list):
          # Keras 3 variables cannot be watched, and need not be: reads of a
          # trainable variable are recorded anyway.
          tape.watch([v for v in tf.nest.flatten(var_list)
                      if isinstance(v, tf.Variable)])
        loss = loss()
      scaled_loss = self.get_scaled_loss(loss)
    if callable(var_list):
      var_list = var_list()
    var_list = tf.nest.flatten(var_list)
    grads = tape.gradient(scaled_loss, var_list, grad_loss)
    return self.get_unscaled_gradients(grads), var_list

  def minimize(self, loss: gradients.Loss, var_list: Any,
               grad_loss: Optional[tf.Tensor] = None,
               name: Optional[str] = None,
               tape: Optional[tf.GradientTape] = None) -> Any:
    """Scales `loss`, differentiates, unscales and applies, in one call.

    Args:
      loss: A zero-argument callable returning the loss, or a loss tensor
        recorded by `tape` (then required).
      var_list: The variables to train, or a callable returning them.
      grad_loss: Optional gradient of the loss.
      name: Passed to `apply_gradients`.
      tape: The tape that recorded `loss`.

    Returns:
      What `apply_gradients` returns.

    Raises:
      ValueError: If `loss` is a tensor and no `tape` is given.
    """
    grads, var_list = self._unscaled_gradients_of(loss, var_list, tape,
                                                  grad_loss)
    return self.apply_gradients(zip(grads, var_list), name=name)

  # ---- the step -----------------------------------------------------------

  def _apply_step(self, grads: Sequence[Any],
                  apply_inner: Callable[[List[Any]], Any],
                  inner_sums: bool = False, summed: bool = False,
                  variables: Optional[Sequence[Any]] = None,
                  method: Optional[str] = None) -> Optional[tf.Operation]:
    """Runs the step on the gradients, in a replica context.

    `apply_inner` applies a list like `grads` with the inner optimizer; if
    `inner_sums`, it sums across replicas itself, else the step sums once
    and hands it the sums; `summed`: `grads` are sums already. `variables`
    name the gradients in a skip report; `method` is as
    `protocols.TwoProtocols._scaled_flags` takes it. Returns, in a TF1
    graph, one op that runs the step (None otherwise); raises ValueError in
    a cross-replica context or under an unsupported strategy.
    """
    where = f'{_NAME}.apply_gradients()'
    guards.check_step(where, [self.inner_optimizer])
    self._check_family_runs_here(where)
    distribute.require_replica_context(where)
    outcome = step.apply_step(
        grads, step.LossScaleState(self._loss_scale), apply_inner,
        scaled=self._scaled_flags(grads, variables, method),
        reduces=inner_sums,
        summed=summed, on_skip=(lambda _: self._on_skipped_step()) if (
            self.counts_skipped_steps) else None,
        names=(None if variables is None else
               step_record.gradient_names(variables)),
        held_as=None if variables is None else [v.dtype for v in variables])
    # Eagerly the step has run; in a tf.function its ops run in program
    # order. In a TF1 graph, the one op every replica returns, which a
    # Session can run (TF 2.3's one-op contract).
    return outcome.op if execution.in_tf1_graph() else None

  def _on_skipped_step(self) -> Any:
    """Runs once, in the cross-replica context, when a step is skipped."""
    # TF 2.3: `iterations` counts every step, applied or skipped.
    return self.inner_optimizer.iterations.assign_add(1)

  # ---- config -------------------------------------------------------------

  def get_config(self) -> Dict[str, Any]:
    """TF 2.3's `{'optimizer': ..., 'loss_scale': ...}`, and the family."""
    return {
        'optimizer': self._keras.optimizers.serialize(self.inner_optimizer),
        'loss_scale': loss_scale_lib.serialize(self._loss_scale),
        FAMILY_KEY: self._kind,
    }

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    """Recreates the optimizer (without its state) from `get_config()`.

    Args:
      config: `get_config()`, or TF 2.3's (no family: `tf.keras`'s).
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new wrapper, not yet built.

    Raises:
      ImportError: If the family's Keras is not installed.
      ValueError: If the config names an unknown family.
    """
    kind = config.get(FAMILY_KEY) or families.default_kind()
    if cls._kind is not None and families.is_keras3(cls._keras) == (
        kind == families.KERAS3):
      keras = cls._keras
    else:
      keras = families.namespace_for(kind)
    options = {}
    if kind == families.KERAS2_LEGACY:
      options['use_legacy_optimizer'] = True
    # Deserializing edits the dict it is given; the caller's must stay as
    # it was.
    inner = keras.optimizers.deserialize(copy.deepcopy(config['optimizer']),
                                         custom_objects=custom_objects,
                                         **options)
    return LossScaleOptimizer(inner, config['loss_scale'])
