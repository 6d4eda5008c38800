"""The demo's data: scikit-learn's bundled 8x8 digits, no download needed."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Digits:
  """The 1,797 digits images, split into a training and a test set.

  Attributes:
    x_train: float32 `[n, 64]` pixel values in [0, 1].
    y_train: int32 `[n]` labels 0-9.
    x_test: Like `x_train`, for the test set.
    y_test: Like `y_train`, for the test set.
  """
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Digits:
  """Loads the digits and splits them the same way every time.

  Args:
    test_fraction: The share of images held out for testing, in (0, 1).
    seed: Seed of the stratified split.

  Returns:
    A `Digits`.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
      x, y, test_size=test_fraction, random_state=seed, stratify=y)
  return Digits(x_train, y_train, x_test, y_test)


def batch_indices(num_examples: int, batch_size: int, steps: int,
                  seed: int) -> np.ndarray:
  """Draws the training batches: shuffled epochs, concatenated.

  Every run uses the same batches, so the runs differ only in precision and
  loss scaling.

  Args:
    num_examples: Size of the training set.
    batch_size: Examples per step.
    steps: Number of steps.
    seed: Seed of the shuffles.

  Returns:
    An int array `[steps, batch_size]` of example indices.
  """
  rng = np.random.default_rng(seed)
  needed = steps * batch_size
  epochs = -(-needed // num_examples)
  order = np.concatenate([rng.permutation(num_examples) for _ in range(epochs)])
  return order[:needed].reshape(steps, batch_size)
