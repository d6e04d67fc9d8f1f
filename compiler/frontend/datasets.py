"""Small data sets for the compiler's trained models and their accuracy tests.

`digits_split` is scikit-learn's bundled 8x8 handwritten digits (1,797 images, no
download) split once, the same way for `scripts/train_digits.py` and for the tests, so
accuracy recorded at training time can be checked later on exactly the same images.

`random_inputs` is what models without a data set calibrate and run on: seeded
standard-normal samples (`vdla.compiler.pipeline.load_model` and the named ResNet-18
workloads share it, so both quantize a model identically).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DIGITS_SPLIT", "digits_split", "random_inputs"]

#: How `digits_split` divides the data (recorded with the trained model).
DIGITS_SPLIT = {"source": "sklearn.datasets.load_digits", "test_size": 0.25,
                "random_state": 0, "stratify": True, "scale": "pixels / 16"}


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits data set as ``(x_train, y_train, x_test, y_test)``.

    x: float32 (N, 1, 8, 8), pixels scaled from 0..16 to [0, 1]; y: int64 labels 0..9.
    A stratified split with test_size=0.25 and random_state=0: 1,347 training and 450
    test images, identical on every call."""
    # scikit-learn is a heavy import that only the digits model's users need.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=DIGITS_SPLIT["test_size"], random_state=DIGITS_SPLIT["random_state"],
        stratify=y)
    return (np.ascontiguousarray(x_train), np.ascontiguousarray(y_train),
            np.ascontiguousarray(x_test), np.ascontiguousarray(y_test))


def random_inputs(shape: tuple[int, ...], *, seed: int, calibration: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(calibration samples, one input) for a model input of `shape`: float32
    standard-normal values from a generator seeded with `seed`, the `calibration` samples
    stacked on a leading axis (``(calibration,) + shape``) drawn first, then the input."""
    rng = np.random.default_rng(seed)
    samples = rng.standard_normal((calibration,) + tuple(shape)).astype(np.float32)
    return samples, rng.standard_normal(shape).astype(np.float32)
