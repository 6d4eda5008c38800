"""What the loss scale optimizers refuse to wrap, and where they refuse to run.

One policy for every front end:
`tf_loss_scale.MixedPrecisionLossScaleOptimizer`,
`tf_loss_scale.keras.LossScaleOptimizer` (and TF 2.4-2.15's form, its
subclass, in tf_keras's words), and
`tf_loss_scale.keras.experimental.LossScaleOptimizer` around Keras 3 and
around tf_keras optimizers. Each calls `check_new_wrapper` in
its constructor and `check_step` when a step starts, before anything of
the step is built, so a refused call changes nothing. Each form wraps its
own family; no loss scale optimizer is wrapped, nor an optimizer a live one
of ours holds (marked by a weak reference); strategies are refused as
docs/distribution.md says.
Messages start with the peer's wording where it has one, then say what to do.
"""

import sys
import weakref
from typing import Any, Callable, List, NamedTuple, Sequence

import tensorflow as tf


class Form(NamedTuple):
  """A front end, as the guards name it and check what it wraps.

  Attributes:
    name: The public class, as users spell it.
    argument: The constructor argument that takes the optimizer.
    accepts: Tells whether an optimizer is of the family the form wraps.
    accepted: What the form wraps, for messages.
    needed: What a message for another object says the argument must be,
      in the words of the form's peer.
  """
  name: str
  argument: str
  accepts: Callable[[Any], bool]
  accepted: str
  needed: str


class WrapsAWrapperError(TypeError, ValueError):
  """A loss scale optimizer given to be wrapped.

  Both peers' types: TensorFlow's v1 and Keras 3's wrappers raise ValueError
  there, tf_keras's TypeError, and code written for either catches it.
  """


def _is_v1_optimizer(optimizer: Any) -> bool:
  return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def _is_keras3_optimizer(optimizer: Any) -> bool:
  return isinstance(optimizer, _keras_optimizer_types(keras3=True))


def _is_keras_optimizer(optimizer: Any) -> bool:
  return isinstance(optimizer, _keras_optimizer_types(keras3=False))


V1_FORM = Form(
    'tf_loss_scale.MixedPrecisionLossScaleOptimizer', 'opt', _is_v1_optimizer,
    'a tf.compat.v1.train.Optimizer', 'an instance of Optimizer')
# Keras 3's class checks nothing: its form's message takes the others' shape.
KERAS_FORM = Form(
    'tf_loss_scale.keras.LossScaleOptimizer', 'inner_optimizer',
    _is_keras3_optimizer, 'a Keras 3 optimizer (keras.optimizers.*)',
    'a Keras 3 optimizer')
MIXED_PRECISION_FORM = KERAS_FORM._replace(
    name='tf_loss_scale.keras.mixed_precision.LossScaleOptimizer',
    needed='an instance of `tf.keras.optimizers.Optimizer` or '
    '`tf.keras.optimizers.experimental.Optimizer`')
EXPERIMENTAL_FORM = Form(
    'tf_loss_scale.keras.experimental.LossScaleOptimizer', 'optimizer',
    _is_keras_optimizer,
    'a Keras 3 optimizer (keras.optimizers.*) or a Keras 2 optimizer '
    '(tf.keras.optimizers.* on TensorFlow 2.12-2.15, tf_keras.optimizers.*, '
    'and their optimizers.legacy.*: the OptimizerV2 that TF 2.3 wrapped)',
    'an instance of OptimizerV2')

# Set by a wrapper on what it wraps: a weak reference, not to keep it alive.
_HOLDER = '_tf_loss_scale_wrapper'

# Where to go with an optimizer of each family, most specific first.
_FORM_FOR_FAMILY = (
    (_is_v1_optimizer, f'For a tf.compat.v1.train.Optimizer use '
                       f'{V1_FORM.name}(opt, loss_scale).'),
    (_is_keras3_optimizer, f'For a Keras 3 optimizer use {KERAS_FORM.name}('
                           'inner_optimizer), or TF 2.3\'s API: '
                           f'{EXPERIMENTAL_FORM.name}(optimizer, '
                           'loss_scale).'),
    (_is_keras_optimizer, f'For a Keras 2 optimizer use '
                          f'{EXPERIMENTAL_FORM.name}(optimizer, loss_scale).'),
)


def check_new_wrapper(optimizer: Any, form: Form, wrapper: Any,
                      loss_scale: Any = None, exclusive: bool = True) -> None:
  """Refuses what no front end may wrap, and a strategy it cannot run under.

  Call it first in a constructor. If nothing is refused, marks `optimizer`
  as held by `wrapper`.

  Args:
    optimizer: The optimizer about to be wrapped.
    form: The front end being constructed.
    wrapper: The wrapper being constructed.
    loss_scale: The loss scale the wrapper will drive, if it exists already;
      anything else (an identifier, None) is ignored.
    exclusive: Whether to refuse an optimizer that a live wrapper of ours
      holds (Keras 3's class lets two wrappers hold one).

  Raises:
    WrapsAWrapperError: If `optimizer` is a loss scale optimizer (both a
      TypeError and a ValueError).
    TypeError: If a Keras form is given an optimizer of another family.
    ValueError: If the v1 form is given an optimizer of another family; if
      a live optimizer of ours holds `optimizer`;
      under a strategy the library refuses; or for state created outside
      the current strategy's scope.
  """
  if isinstance(optimizer, _loss_scale_optimizer_types()):
    raise WrapsAWrapperError(
        'LossScaleOptimizer cannot wrap another LossScaleOptimizer, but got: '
        f'{optimizer}. It is already a loss scale optimizer: use it as it is, '
        f'or pass {form.name} a new optimizer.')
  check_family(optimizer, form)
  holder = getattr(optimizer, _HOLDER, lambda: None)()
  if exclusive and getattr(holder, 'inner_optimizer', None) is optimizer:
    raise ValueError(
        f'"{form.argument}" is already wrapped by a LossScaleOptimizer. An '
        'optimizer can only be wrapped by a single LossScaleOptimizer: '
        f'a {type(holder).__name__} holds it. Keep using that wrapper, or '
        'create a new optimizer for this one.')
  check_step(f'{form.name}()', [loss_scale, optimizer])
  setattr(optimizer, _HOLDER, weakref.ref(wrapper))


def release(optimizer: Any) -> None:
  """Forgets which wrapper of ours holds `optimizer`, if one does.

  For a wrapper that takes `optimizer` over from one Keras's `compile`
  made: Keras 3 lets every `compile` wrap the optimizer anew, whatever
  wrapped it before.
  """
  vars(optimizer).pop(_HOLDER, None)


def check_family(optimizer: Any, form: Form) -> None:
  """Refuses an optimizer of a family `form` does not wrap.

  Raises:
    TypeError: For a Keras form, naming the form that takes `optimizer`.
    ValueError: For the v1 form (TensorFlow's type), naming the form too.
  """
  if form.accepts(optimizer):
    return
  hint = next((text for is_family, text in _FORM_FOR_FAMILY
               if is_family(optimizer)), '')
  if form is V1_FORM:
    # TensorFlow's v1 wrapper raises ValueError, with these first words.
    raise ValueError(
        f'"{form.argument}" must be {form.needed}, but got: '
        f'{type(optimizer)}. {form.name} wraps {form.accepted}. {hint}'.strip())
  raise TypeError(
      f'"{form.argument}" must be {form.needed}, but got: {optimizer}. '
      f'{form.name} wraps {form.accepted}; got an object of type '
      f'{type(optimizer).__name__}. {hint}'.strip())


def check_step(where: str, state: Sequence[Any]) -> None:
  """Refuses a step under a strategy the library does not support.

  Call it when a step starts, before anything of the step is built.

  Args:
    where: The call being checked, named in the messages.
    state: Loss scales, optimizers and variables the step uses; their
      variables that exist so far are checked. Anything else is ignored.

  Raises:
    ValueError: Under CentralStorageStrategy, ParameterServerStrategy or
      TPUStrategy, or if a variable of `state` was created outside the
      current strategy's scope.
  """
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  name = type(strategy).__name__
  if isinstance(strategy, _strategy_types('TPUStrategy')):
    raise ValueError(
        'Loss scaling is not supported with TPUStrategy. Loss scaling is '
        'unnecessary with TPUs, since they support bfloat16 instead of '
        'float16 and bfloat16 does not require loss scaling. You should '
        'remove the use of the LossScaleOptimizer when TPUs are used. '
        f"({where}: use the 'mixed_bfloat16' policy and the inner optimizer "
        'on its own.)')
  if isinstance(strategy, _strategy_types('CentralStorageStrategy',
                                          'ParameterServerStrategy')):
    raise ValueError(
        'Loss scaling is not supported with the tf.distribute.Strategy: '
        f'{name}. Try using a different Strategy, e.g. a MirroredStrategy '
        f'({where}: under {name} a replica holds no copy of the variables, '
        'so the replicas cannot skip a step together; MirroredStrategy, '
        'MultiWorkerMirroredStrategy, OneDeviceStrategy and no strategy '
        'work).')
  variables = [_tf_variable(v) for owner in state
               for v in _variables_of(owner)]
  outside = [v.name for v in variables
             if not strategy.extended.variable_created_in_scope(v)]
  if outside:
    raise ValueError(
        f'{where}: the variables {outside} were created outside the scope of '
        f'the {name} in use, so the replicas would not share them. Create '
        'the optimizer, its inner optimizer and its loss scale inside '
        '`with strategy.scope():`, and do not use them before that.')


def _keras_namespaces() -> list:
  """The API namespaces of the Keras packages already imported (none else
  can have made an optimizer); `tf.keras` too, Keras 2's API on TF <= 2.15."""
  namespaces = [sys.modules.get('keras'), sys.modules.get('tf_keras')]
  if any(namespaces):
    namespaces.append(tf.keras)
  return [n for n in namespaces if n is not None]


def _loss_scale_optimizer_types() -> tuple:
  ours = sys.modules.get('tf_loss_scale.optimizer_v1')
  candidates = [
      getattr(tf.compat.v1.mixed_precision,
              'MixedPrecisionLossScaleOptimizer', None),
      getattr(ours, 'MixedPrecisionLossScaleOptimizer', None),
  ] + [getattr(getattr(keras, namespace, None), 'LossScaleOptimizer', None)
       for keras in _keras_namespaces()
       # Keras 3's own class is under `optimizers` too, which install()
       # leaves alone when it maps `mixed_precision`'s name to TF 2.4's.
       for namespace in ('mixed_precision', 'optimizers')]
  return tuple(t for t in candidates if isinstance(t, type))


def _keras_optimizer_types(keras3: bool) -> tuple:
  """Optimizer base classes of the Keras packages already imported.

  Only Keras 3's (told by `stateless_apply`) when `keras3`.
  """
  found = []
  for keras in _keras_namespaces():
    optimizers = getattr(keras, 'optimizers', None)
    base = getattr(optimizers, 'Optimizer', None)
    if not isinstance(base, type):
      continue
    if hasattr(base, 'stateless_apply'):
      found.append(base)
    elif not keras3:
      found.append(base)
      found.append(getattr(getattr(optimizers, 'legacy', None), 'Optimizer',
                           None))
  return tuple(t for t in found if isinstance(t, type))


def _strategy_types(*names: str) -> tuple:
  # Looked up by public name, so a TensorFlow without one of them has
  # nothing to refuse.
  found = []
  for namespace in (tf.distribute, tf.distribute.experimental,
                    tf.compat.v1.distribute.experimental):
    for name in names:
      strategy_type = getattr(namespace, name, None)
      if isinstance(strategy_type, type):
        found.append(strategy_type)
  return tuple(found)


def _variables_of(owner: Any) -> List[Any]:
  """A variable itself, or the variables of a loss scale or an optimizer."""
  if _is_variable(owner):
    return [owner]
  variables = getattr(owner, 'variables', None)
  if variables is None or isinstance(owner, (str, bytes, dict)):
    return []
  # tf.compat.v1 and tf_keras legacy optimizers have a method, the others a
  # property.
  return list(variables() if callable(variables) else variables)


def _is_variable(value: Any) -> bool:
  keras_variable = getattr(sys.modules.get('keras'), 'Variable', None)
  return isinstance(value, tf.Variable) or (
      isinstance(keras_variable, type) and isinstance(value, keras_variable))


def _tf_variable(variable: Any) -> Any:
  # A Keras 3 variable holds its tf.Variable as `value`.
  if isinstance(variable, tf.Variable):
    return variable
  return variable.value


def is_loss_scale_optimizer(optimizer: Any) -> bool:
  """Whether `optimizer` is a loss scale optimizer, ours or a peer's."""
  return isinstance(optimizer, _loss_scale_optimizer_types())
