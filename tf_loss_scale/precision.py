"""What a mixed precision policy means for loss scaling.

Loss scaling exists for float16, whose narrow exponent range flushes small
gradients to zero; bfloat16 has float32's range, so a loss scale only costs
time there. Every front end asks here when it wraps an optimizer.
"""

import warnings

from absl import logging

_warned_about = set()


def warn_if_scaling_is_not_needed(compute_dtype: str, wrapper: str) -> bool:
  """Warns once per process and wrapper that bfloat16 needs no loss scale.

  Args:
    compute_dtype: The global policy's compute dtype when the wrapper was
      created, e.g. `'bfloat16'`.
    wrapper: The wrapper's class name, named in the message.

  Returns:
    Whether the policy computes in bfloat16 (warned now or before).
  """
  if compute_dtype != 'bfloat16':
    return False
  if wrapper not in _warned_about:
    _warned_about.add(wrapper)
    message = (
        f'{wrapper} was created under a bfloat16 mixed precision policy. '
        'bfloat16 has the exponent range of float32, so its gradients do not '
        'underflow and need no loss scaling: use the inner optimizer on its '
        'own. The wrapper still works, at the cost of a finite check per '
        'step.')
    logging.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)
  return True
