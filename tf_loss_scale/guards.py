"""What the loss scale optimizers refuse to wrap, and where they refuse to run.

One policy for every front end (`Form`): each calls `check_new_wrapper` in
its constructor and `check_step` when a step starts, before anything of the
step is built, so a refused call changes nothing. Each form wraps its own
family; no loss scale optimizer is wrapped, nor an optimizer a live one of
ours holds (marked by a weak reference); strategies are refused as
docs/distribution.md says. Messages start with the peer's wording where it
has one, then say what to do.
"""

import sys
import weakref
from typing import Any, Callable, List, NamedTuple, Sequence

import tensorflow as tf

# Loads no Keras: it looks at the Keras packages already imported.
from tf_loss_scale.keras.shared import families


class Form(NamedTuple):
  """A front end: its public class `name`, the constructor `argument` that
  takes the optimizer, whether it `accepts` one, what it wraps (`accepted`)
  and what its peer's message says the argument must be (`needed`)."""
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


V1_FORM = Form(
    'tf_loss_scale.MixedPrecisionLossScaleOptimizer', 'opt',
    lambda opt: isinstance(opt, tf.compat.v1.train.Optimizer),
    'a tf.compat.v1.train.Optimizer', 'an instance of Optimizer')
# Keras 3's class checks nothing: its form's message takes the others' shape.
KERAS_FORM = Form(
    'tf_loss_scale.keras.LossScaleOptimizer', 'inner_optimizer',
    lambda opt: isinstance(opt, _keras_optimizer_types(keras3=True)),
    'a Keras 3 optimizer (keras.optimizers.*)', 'a Keras 3 optimizer')
MIXED_PRECISION_FORM = KERAS_FORM._replace(
    name='tf_loss_scale.keras.mixed_precision.LossScaleOptimizer',
    needed='an instance of `tf.keras.optimizers.Optimizer` or '
    '`tf.keras.optimizers.experimental.Optimizer`')
EXPERIMENTAL_FORM = Form(
    'tf_loss_scale.keras.experimental.LossScaleOptimizer', 'optimizer',
    lambda opt: isinstance(opt, _keras_optimizer_types(keras3=False)),
    'a Keras 3 optimizer (keras.optimizers.*) or a Keras 2 optimizer '
    '(tf.keras.optimizers.* on TensorFlow 2.12-2.15, tf_keras.optimizers.*, '
    'and their optimizers.legacy.*: the OptimizerV2 that TF 2.3 wrapped)',
    'an instance of OptimizerV2')

# Set by a wrapper on what it wraps: a weak reference, not to keep it alive.
_HOLDER = '_tf_loss_scale_wrapper'

# Where to go with an optimizer of each family, most specific first.
_FORM_FOR_FAMILY = (
    (V1_FORM.accepts, f'For a tf.compat.v1.train.Optimizer use '
                      f'{V1_FORM.name}(opt, loss_scale).'),
    (KERAS_FORM.accepts, f'For a Keras 3 optimizer use {KERAS_FORM.name}('
                         'inner_optimizer), or TF 2.3\'s API: '
                         f'{EXPERIMENTAL_FORM.name}(optimizer, loss_scale).'),
    (EXPERIMENTAL_FORM.accepts, f'For a Keras 2 optimizer use '
                                f'{EXPERIMENTAL_FORM.name}(optimizer, '
                                'loss_scale).'),
)


def check_new_wrapper(optimizer: Any, form: Form, wrapper: Any,
                      exclusive: bool = True) -> None:
  """Refuses what no front end may wrap, and a strategy it cannot run under.

  Call it first in the constructor of `wrapper`, of front end `form`, about
  to wrap `optimizer`. If nothing is refused, marks `optimizer` as held.

  Args:
    exclusive: Whether to refuse an optimizer that a live wrapper of ours
      holds (Keras 3's class lets two wrappers hold one).

  Raises:
    WrapsAWrapperError: If `optimizer` is a loss scale optimizer.
    TypeError, ValueError: As `check_family` and `check_step`; ValueError
      if a live optimizer of ours holds `optimizer`.
  """
  if is_loss_scale_optimizer(optimizer):
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
  check_step(f'{form.name}()', [optimizer])
  setattr(optimizer, _HOLDER, weakref.ref(wrapper))


def release(optimizer: Any) -> None:
  """Forgets which wrapper of ours holds `optimizer`, if one does: Keras 3
  lets every `compile` wrap the optimizer anew, whatever wrapped it before."""
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

  A loss scale's variables may live outside the strategy's scope, as
  TensorFlow's did wherever the program made them: the step reads and
  assigns them in the cross-replica context only, so every replica sees one
  value. An inner optimizer's may not (Keras 3's optimizers refuse them
  too, when they first make a slot).

  Args:
    where: The call being checked, named in the messages.
    state: Optimizers and variables that every replica updates (anything
      else is ignored); their variables that exist so far are checked.

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
  outside = [v.name for owner in state for v in _tf_variables_of(owner)
             if not strategy.extended.variable_created_in_scope(v)]
  if outside:
    raise ValueError(
        f'{where}: the variables {outside} were created outside the scope of '
        f'the {name} in use, so the replicas would not share them. Create '
        'the inner optimizer inside `with strategy.scope():`, and do not use '
        'it before that.')


def _loss_scale_optimizer_types() -> tuple:
  ours = sys.modules.get('tf_loss_scale.optimizer_v1')
  candidates = [
      getattr(tf.compat.v1.mixed_precision,
              'MixedPrecisionLossScaleOptimizer', None),
      getattr(ours, 'MixedPrecisionLossScaleOptimizer', None),
  ] + [getattr(getattr(keras, namespace, None), 'LossScaleOptimizer', None)
       for keras in families.loaded_namespaces()
       # Keras 3's own class is under `optimizers` too, which install()
       # leaves alone when it maps `mixed_precision`'s name to TF 2.4's.
       for namespace in ('mixed_precision', 'optimizers')]
  return tuple(t for t in candidates if isinstance(t, type))


def _keras_optimizer_types(keras3: bool) -> tuple:
  """Optimizer base classes of the Keras packages already imported (none
  else can have made an optimizer); only Keras 3's when `keras3`."""
  found = []
  for keras in families.loaded_namespaces():
    if families.is_keras3(keras):
      found.append(keras.optimizers.Optimizer)
    elif not keras3:
      found += [keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer]
  return tuple(found)


def _strategy_types(*names: str) -> tuple:
  # Looked up by public name, so a TensorFlow without one of them has
  # nothing to refuse.
  found = [getattr(namespace, name, None) for name in names
           for namespace in (tf.distribute, tf.distribute.experimental,
                             tf.compat.v1.distribute.experimental)]
  return tuple(t for t in found if isinstance(t, type))


def _tf_variables_of(owner: Any) -> List[tf.Variable]:
  """A variable itself, or the variables of a loss scale or an optimizer."""
  keras_variable = getattr(sys.modules.get('keras'), 'Variable', None)
  if isinstance(owner, tf.Variable) or (
      isinstance(keras_variable, type) and isinstance(owner, keras_variable)):
    variables = [owner]
  elif getattr(owner, 'variables', None) is None or isinstance(
      owner, (str, bytes, dict)):
    return []
  else:
    # tf.compat.v1 and tf_keras legacy optimizers have a method, the others
    # a property.
    variables = owner.variables
    variables = variables() if callable(variables) else variables
  # A Keras 3 variable holds its tf.Variable as `value`.
  return [v if isinstance(v, tf.Variable) else v.value for v in variables]


def is_loss_scale_optimizer(optimizer: Any) -> bool:
  """Whether `optimizer` is a loss scale optimizer, ours or a peer's."""
  return isinstance(optimizer, _loss_scale_optimizer_types())
