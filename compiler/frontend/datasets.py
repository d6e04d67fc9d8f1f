"""Small data sets for the compiler's trained models and their accuracy tests.

`digits_split` is scikit-learn's bundled 8x8 handwritten digits (1,797 images, no
download) split once, the same way for `scripts/train_digits.py` and for the tests, so
accuracy recorded at training time can be checked later on exactly the same images.

`random_inputs` is what models without a data set calibrate and run on: seeded
standard-normal samples (`vdla.compiler.pipeline.load_model` and the named ResNet-18
workloads share it, so both quantize a model identically). `model_inputs` extends it to
every input of a graph: float inputs as `random_inputs` draws them, integer inputs that
index a ``gather`` (token ids) drawn inside the rows of the table they index, and the
other integer and bool inputs (attention masks) all ones.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES

__all__ = ["DIGITS_SPLIT", "digits_split", "index_bound", "model_inputs", "random_inputs"]

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


#: Operators that pass an integer input's values on unchanged (or a subset of them), so
#: a gather after them still indexes with the input's values.
_PASS_THROUGH = frozenset({"reshape", "flatten", "transpose", "slice", "expand", "concat",
                           "cast"})


def index_bound(graph: Graph, name: str) -> tuple[int, str] | None:
    """(rows, table) when the values of tensor `name` reach a ``gather`` as its indices
    (directly or through reshapes, slices, casts, ...): the fewest rows along the gather
    axis of any table they index, and that table's name; None when they index nothing."""
    best, seen, todo = None, set(), [name]
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in graph.consumers(tensor):
            if node.op == "gather" and node.input(1) == tensor:
                data = graph.tensors[node.inputs[0]]
                rows = int(data.shape[int(node.attrs["axis"]) % len(data.shape)])
                if best is None or rows < best[0]:
                    best = (rows, node.inputs[0])
            elif node.op in _PASS_THROUGH:
                todo.extend(node.outputs)
    return best


def model_inputs(graph: Graph, *, seed: int, calibration: int
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """(calibration samples, one feed, a note saying what they are) for every input of
    `graph`, from one generator seeded with `seed`, input by input in graph order:

    * a float input: standard-normal values, the `calibration` samples (stacked on a
      leading axis) drawn first, then the input: for a graph with one float input,
      exactly `random_inputs`;
    * an integer input that indexes a ``gather`` (token ids): integers drawn uniformly
      inside ``[0, rows)`` of the table they index (`index_bound`);
    * any other integer or bool input (an attention mask): all ones (attend to every
      position)."""
    rng = np.random.default_rng(seed)
    samples: dict[str, np.ndarray] = {}
    feed: dict[str, np.ndarray] = {}
    notes = []
    for name in graph.inputs:
        t = graph.tensors[name]
        shape = tuple(t.shape)
        if t.dtype == "float32":
            samples[name] = rng.standard_normal((calibration,) + shape).astype(np.float32)
            feed[name] = rng.standard_normal(shape).astype(np.float32)
            notes.append(f"{name}: standard-normal")
            continue
        dtype = DTYPES[t.dtype]
        bound = index_bound(graph, name) if t.dtype != "bool" else None
        if bound is not None:
            rows, table = bound
            samples[name] = rng.integers(0, rows, (calibration,) + shape).astype(dtype)
            feed[name] = rng.integers(0, rows, shape).astype(dtype)
            notes.append(f"{name}: ids drawn from the {rows} rows of {table!r}")
        else:
            samples[name] = np.ones((calibration,) + shape, dtype)
            feed[name] = np.ones(shape, dtype)
            notes.append(f"{name}: all ones")
    return samples, feed, "; ".join(notes) + f", seed {seed}"
