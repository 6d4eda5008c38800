"""What the TF 2.0-2.3 `LossScaleOptimizer` offers whatever it wraps.

`tf_loss_scale.keras.experimental.LossScaleOptimizer` takes its path from
the inner optimizer's type (Keras 3, tf_keras legacy, tf_keras). Every path
mixes in `TF23Surface`: the loss scale argument, scaling the loss and
unscaling gradients, `minimize` (TF 2.3's signature), TF 2.3's config
format, and one rule for hyperparameters, stated here once:

  The inner optimizer's hyperparameters are the arguments its `get_config()`
  reports (except `name`). The wrapper reads and writes exactly those on the
  inner optimizer; any other attribute the wrapper does not have itself is an
  `AttributeError`, as in TF 2.3.

Nothing here imports Keras or tf_keras.
"""

import copy
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

import tensorflow as tf

from tf_loss_scale import gradients
from tf_loss_scale import loss_scale as loss_scale_lib

LossScaleArgument = Union[str, float, int, loss_scale_lib.LossScale,
                          Dict[str, Any]]

# Config entries that describe the object rather than tune the optimizer.
_NOT_HYPERPARAMETERS = frozenset({'name', 'is_legacy_optimizer'})


def loss_scale_from(loss_scale: Any) -> loss_scale_lib.LossScale:
  """Turns the constructor's `loss_scale` argument into a `LossScale`.

  Args:
    loss_scale: `'dynamic'`, a positive number, a `LossScale`, or the output
      of `tf_loss_scale.serialize`.

  Returns:
    The `LossScale` (the one given, if it is one).

  Raises:
    ValueError: If `loss_scale` is None or none of the above.
  """
  if loss_scale is None:
    raise ValueError(
        "loss_scale cannot be None: pass 'dynamic', a number, a LossScale or "
        'a serialized LossScale dict.')
  if isinstance(loss_scale, dict):
    return loss_scale_lib.deserialize(loss_scale)
  return loss_scale_lib.get(loss_scale)


def hyperparameter_names(inner_optimizer: Any) -> FrozenSet[str]:
  """The names the wrapper forwards: the inner optimizer's config keys.

  Read once, when the wrapper is made, from the public `get_config()`.

  Args:
    inner_optimizer: Any Keras or tf_keras optimizer.

  Returns:
    The hyperparameter names.
  """
  return frozenset(inner_optimizer.get_config()) - _NOT_HYPERPARAMETERS


class InnerAttribute:
  """A wrapper attribute that is the inner optimizer's, read and written there.

  For the attributes TF 2.3's wrapper forwarded by name (`learning_rate`,
  `lr`, clipping, `iterations`), which the wrapper's base class would
  otherwise answer itself.
  """

  def __init__(self, doc: str, name: Optional[str] = None):
    """Forwards to the inner optimizer's attribute `name` (default: own)."""
    self.__doc__ = doc
    self._name = name

  def __set_name__(self, owner: type, name: str) -> None:
    self._name = self._name or name

  def __get__(self, wrapper: Any, owner: Optional[type] = None) -> Any:
    if wrapper is None:
      return self
    return getattr(wrapper.inner_optimizer, self._name)

  def __set__(self, wrapper: Any, value: Any) -> None:
    # Keras's base __init__ sets some of these on the wrapper before the
    # inner optimizer is there; the wrapper keeps no copy of its own.
    inner = getattr(wrapper, 'inner_optimizer', None)
    if inner is not None:
      setattr(inner, self._name, value)


class TF23Surface:
  """The part of TF 2.3's API that is the same on every path.

  A subclass sets `inner_optimizer` (the wrapped optimizer), `_loss_scale`
  (a `LossScale`) and, last, `_hyperparameter_names`; and has the
  `_serialize_inner`/`_deserialize_inner` functions of its Keras.
  """

  # What the optimizer base classes of both Keras families would otherwise
  # answer themselves; other hyperparameters go through __getattr__ below.
  learning_rate = InnerAttribute(
      "The inner optimizer's learning rate (settable, schedules too).")
  lr = InnerAttribute('Alias of `learning_rate`.', name='learning_rate')
  clipnorm = InnerAttribute(
      "The inner optimizer's per-gradient norm clip (of unscaled gradients).")
  clipvalue = InnerAttribute(
      "The inner optimizer's value clip (of unscaled gradients).")
  global_clipnorm = InnerAttribute(
      "The inner optimizer's global norm clip (of unscaled gradients).")

  @property
  def loss_scale(self) -> loss_scale_lib.LossScale:
    """The `LossScale` this optimizer drives (call it for the value)."""
    return self._loss_scale

  def get_scaled_loss(self, loss: gradients.Loss) -> gradients.Loss:
    """Multiplies a loss by the current loss scale.

    Call it inside the `tf.GradientTape`, then differentiate the result and
    pass the gradients through `get_unscaled_gradients`.

    Args:
      loss: A loss tensor (any float dtype: the scale is cast to it), or a
        zero-argument callable returning one.

    Returns:
      The scaled loss, or for a callable a callable returning it.
    """
    return gradients.scale_loss(loss, self._loss_scale())

  def get_unscaled_gradients(self, grads: Iterable[Any]) -> List[Any]:
    """Divides gradients of a scaled loss by the current loss scale.

    Args:
      grads: A list of gradients; `None` entries and `tf.IndexedSlices`
        are kept as they are (slices rescaled, still sparse).

    Returns:
      A new list of the same length, each gradient in its own dtype.
    """
    return list(gradients.unscale(list(grads), self._loss_scale()))

  def gradients_of_scaled_loss(self, loss: Any, var_list: Any,
                        tape: Optional[tf.GradientTape],
                        grad_loss: Optional[tf.Tensor] = None
                       ) -> Tuple[List[Any], List[Any]]:
    """Scales `loss`, differentiates it and unscales the gradients.

    What `minimize` does before it applies.

    Args:
      loss: A zero-argument callable returning the loss, or a loss tensor
        recorded by `tape`.
      var_list: The variables, or a callable returning them.
      tape: The tape that recorded `loss` (required for a tensor loss).
      grad_loss: Optional gradient of the loss.

    Returns:
      `(unscaled gradients, variables)`, two lists of the same length.

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

    TF 2.3's signature; `apply_gradients` takes it from there.

    Args:
      loss: A zero-argument callable returning the loss, or a loss tensor
        recorded by `tape`.
      var_list: The variables to train, or a callable returning them.
      grad_loss: Optional gradient of the loss.
      name: Passed to `apply_gradients`.
      tape: The tape that recorded `loss` (required for a tensor loss).

    Returns:
      What `apply_gradients` returns.

    Raises:
      ValueError: If `loss` is a tensor and no `tape` is given.
    """
    grads, var_list = self.gradients_of_scaled_loss(loss, var_list, tape,
                                                    grad_loss)
    return self.apply_gradients(zip(grads, var_list), name=name)

  def get_config(self) -> Dict[str, Any]:
    """Returns `{'optimizer': ..., 'loss_scale': ...}`, TF 2.3's format."""
    return {
        'optimizer': self._serialize_inner(self.inner_optimizer),
        'loss_scale': loss_scale_lib.serialize(self._loss_scale),
    }

  @classmethod
  def from_config(cls, config: Dict[str, Any],
                  custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    """Recreates the optimizer (without its state) from `get_config()`.

    Args:
      config: `{'optimizer': <serialized optimizer>, 'loss_scale':
        <serialized LossScale>}`, as TF 2.3 wrote it.
      custom_objects: Names to classes, for a custom inner optimizer.

    Returns:
      A new wrapper, not yet built.
    """
    # Deserializing edits the dict it is given; the caller's must stay as
    # it was.
    inner = cls._deserialize_inner(copy.deepcopy(config['optimizer']),
                                   custom_objects=custom_objects)
    return cls(inner, config['loss_scale'])

  def __getattr__(self, name: str) -> Any:
    # Reached only when normal lookup fails.
    names = self.__dict__.get('_hyperparameter_names', ())
    if name in names:
      return getattr(self.inner_optimizer, name)
    raise AttributeError(
        f'{type(self).__name__!r} object has no attribute {name!r}')

  def __setattr__(self, name: str, value: Any) -> None:
    names = self.__dict__.get('_hyperparameter_names', ())
    if (name in names and name not in self.__dict__ and
        not hasattr(type(self), name)):
      setattr(self.inner_optimizer, name, value)
      return
    super().__setattr__(name, value)
