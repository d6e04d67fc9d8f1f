"""Reference kernels of the float operators of sequence models (transformers), and the
GELU that a float ``dense`` may end in.

Arithmetic is float64 inside (the executor rounds results to the output's float32, as
for the other float kernels); the data-movement operators (gather, slice, expand, where,
cast, neg) run on the input dtype, so they work on int8 tensors unchanged. ``erf`` is the
C library's double-precision erf, element by element.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from vdla.compiler.ir.ops_sequence import check_gather_indices
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.reference.registry import kernel

__all__ = ["attention_scores", "erf", "gelu"]

_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x) -> np.ndarray:
    """The error function of every element of `x`, in float64."""
    x = np.asarray(x, dtype=np.float64)
    return _ERF(x).astype(np.float64) if x.size else x.copy()


def gelu(x, approximate: str = "none") -> np.ndarray:
    """GELU in float64: x * Phi(x) (``"none"``), or its tanh approximation (``"tanh"``)."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _f64(a):
    return np.asarray(a).astype(np.float64)


def _arith(a, b):
    # Float tensors compute in float64; integer ones (shape arithmetic) stay integers.
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return _f64(a), _f64(b)
    return a, b


@kernel("sub")
def _sub(node, args, graph):
    a, b = _arith(*args)
    return [a - b]


@kernel("div")
def _div(node, args, graph):
    a, b = args
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        if np.any(b == 0):
            raise ValueError(f"node {node.name!r} (div): integer division by zero in "
                             f"{node.inputs[1]!r}")
        # ONNX integer Div truncates toward zero.
        q = np.abs(a) // np.abs(b)
        return [np.where((a < 0) != (b < 0), -q, q)]
    return [_f64(a) / _f64(b)]


@kernel("pow")
def _pow(node, args, graph):
    a, b = args
    if a.dtype.kind == "f":
        return [np.power(_f64(a), _f64(b))]
    return [np.power(a, b.astype(a.dtype))]


# The kernels made per op are partials of module-level functions, not closures: a
# compiled model holds its host ops' kernels and is pickled into the compile cache.

def _unary_kernel(fn, node, args, graph):
    return [fn(_f64(args[0]))]


def _unary(op, fn):
    kernel(op)(functools.partial(_unary_kernel, fn))


_unary("sqrt", np.sqrt)
_unary("erf", erf)
_unary("tanh", np.tanh)
_unary("exp", np.exp)


@kernel("neg")
def _neg(node, args, graph):
    return [np.negative(args[0])]


def _axes(node, x):
    axes = node.attrs["axes"]
    return tuple(a % x.ndim for a in axes) if axes else None


def _reduce_kernel(fn, node, args, graph):
    x = args[0]
    x = _f64(x) if x.dtype.kind == "f" or node.op == "reduce_mean" else x
    return [fn(x, axis=_axes(node, x), keepdims=bool(node.attrs["keepdims"]))]


def _reduce(op, fn):
    kernel(op)(functools.partial(_reduce_kernel, fn))


_reduce("reduce_mean", np.mean)
_reduce("reduce_sum", np.sum)
_reduce("reduce_max", np.max)


@kernel("layer_norm")
def _layer_norm(node, args, graph):
    x, scale, bias = (list(args) + [None])[:3]
    x = _f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    y = centered / np.sqrt(var + float(node.attrs["epsilon"])) * _f64(scale)
    return [y + _f64(bias) if bias is not None else y]


@kernel("gelu")
def _gelu(node, args, graph):
    return [gelu(args[0], node.attrs["approximate"])]


@kernel("gather")
def _gather(node, args, graph):
    data, indices = args
    axis = int(node.attrs["axis"]) % data.ndim
    check_gather_indices(node, node.inputs[0], node.inputs[1], data.shape[axis], indices)
    return [np.take(data, indices.astype(np.int64), axis=axis)]


@kernel("slice")
def _slice(node, args, graph):
    a = node.attrs
    x = args[0]
    index = [slice(None)] * x.ndim
    axes = a["axes"] or range(len(a["starts"]))
    steps = a["steps"] or (1,) * len(a["starts"])
    for ax, b, e, s in zip(axes, a["starts"], a["ends"], steps):
        index[ax] = slice(int(b), int(e), int(s))
    return [x[tuple(index)]]


@kernel("expand")
def _expand(node, args, graph):
    return [np.broadcast_to(args[0], graph.tensors[node.outputs[0]].shape).copy()]


@kernel("where")
def _where(node, args, graph):
    cond, a, b = args
    return [np.where(cond.astype(bool), a, b)]


@kernel("cast")
def _cast(node, args, graph):
    x = args[0]
    dtype = DTYPES[node.attrs["dtype"]]
    if x.dtype.kind == "f" and np.dtype(dtype).kind in "iu":
        x = np.trunc(x)      # float -> integer truncates toward zero (ONNX Cast)
    return [x.astype(dtype)]


def _compare_kernel(fn, node, args, graph):
    return [fn(*_arith(*args))]


def _compare(op, fn):
    kernel(op)(functools.partial(_compare_kernel, fn))


_compare("equal", np.equal)
_compare("less", np.less)
_compare("greater", np.greater)


def attention_scores(q, k, scale: float, mask=None, causal: bool = False) -> np.ndarray:
    """q @ k^T * scale + mask, with -inf above the causal diagonal (key t > query
    s + (T - S)) when `causal`: the scores the softmax of ``attention`` reads, float64."""
    s = np.matmul(_f64(q), np.swapaxes(_f64(k), -1, -2)) * float(scale)
    if mask is not None:
        s = s + _f64(mask)
    if causal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        above = np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + (n_k - n_q)
        s = np.where(above, -np.inf, s)
    return s


@kernel("attention")
def _attention(node, args, graph):
    q, k, v, mask = (list(args) + [None])[:4]
    s = attention_scores(q, k, node.attrs["scale"], mask, bool(node.attrs["causal"]))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return [np.matmul(p, _f64(v))]
