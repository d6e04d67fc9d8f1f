"""Reference kernels of the float operators and of ``layout_transform``.

Convolutions and products are computed in float64 and rounded back to float32 by the
executor; everything else is numpy on the input dtype, so the int8-capable operators
(max pooling, ReLU, flatten, reshape, transpose, concat, pad) run on int8 unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from vdla.compiler.ir.layout import transform
from vdla.compiler.reference.numerics import (activation, avg_pool_sums, conv2d_accumulate,
                                              pool2d_windows)
from vdla.compiler.reference.kernels_sequence import gelu
from vdla.compiler.reference.registry import kernel

__all__: list[str] = []


@kernel("conv2d")
def _conv2d(node, args, graph):
    x, w, bias, residual = (args + [None, None])[:4]
    a = node.attrs
    y = conv2d_accumulate(x, w, a["strides"], a["pads"], a["dilations"], a["groups"])
    if bias is not None:
        y = y + bias.astype(np.float64).reshape(1, -1, 1, 1)
    if residual is not None:
        y = y + residual
    return [activation(node, y)]


@kernel("dense")
def _dense(node, args, graph):
    x, w, bias, residual = (args + [None, None])[:4]
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    act = node.attrs.get("activation")
    if act in ("gelu", "gelu_tanh"):
        return [gelu(y, "tanh" if act == "gelu_tanh" else "none")]
    return [activation(node, y)]


@kernel("matmul")
def _matmul(node, args, graph):
    return [np.matmul(args[0].astype(np.float64), args[1].astype(np.float64))]


@kernel("batch_norm")
def _batch_norm(node, args, graph):
    x, scale, bias, mean, var = [a.astype(np.float64) for a in args]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + node.attrs["epsilon"])
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


@kernel("relu")
def _relu(node, args, graph):
    return [np.maximum(args[0], 0)]


@kernel("clip")
def _clip(node, args, graph):
    lo, hi = node.attrs["min"], node.attrs["max"]
    return [np.clip(args[0], -np.inf if lo is None else lo, np.inf if hi is None else hi)]


@kernel("add")
def _add(node, args, graph):
    return [args[0].astype(np.float64) + args[1]]


@kernel("mul")
def _mul(node, args, graph):
    return [args[0].astype(np.float64) * args[1]]


@kernel("max_pool2d")
def _max_pool(node, args, graph):
    x = args[0]
    a = node.attrs
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    win = pool2d_windows(x, a["kernel"], a["strides"], a["pads"], ceil_mode=a["ceil_mode"],
                         value=low)
    return [win.max(axis=(4, 5))]



@kernel("avg_pool2d")
def _avg_pool(node, args, graph):
    sums, counts = avg_pool_sums(node, args[0])
    return [sums / counts]


@kernel("global_avg_pool2d")
def _global_avg_pool(node, args, graph):
    return [args[0].astype(np.float64).mean(axis=(2, 3), keepdims=True)]


@kernel("flatten")
def _flatten(node, args, graph):
    return [args[0].reshape(graph.tensors[node.outputs[0]].shape)]


@kernel("reshape")
def _reshape(node, args, graph):
    return [args[0].reshape(graph.tensors[node.outputs[0]].shape)]


@kernel("transpose")
def _transpose(node, args, graph):
    perm = node.attrs["perm"] or None
    return [np.transpose(args[0], perm)]


@kernel("concat")
def _concat(node, args, graph):
    return [np.concatenate([a for a in args if a is not None], axis=node.attrs["axis"])]


@kernel("softmax")
def _softmax(node, args, graph):
    x = args[0].astype(np.float64)
    axis = node.attrs["axis"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return [e / e.sum(axis=axis, keepdims=True)]


@kernel("pad")
def _pad(node, args, graph):
    x = args[0]
    pads = node.attrs["pads"]
    r = x.ndim
    return [np.pad(x, [(pads[i], pads[i + r]) for i in range(r)],
                   constant_values=node.attrs["value"])]


@kernel("lrn")
def _lrn(node, args, graph):
    # ONNX LRN: square_sum over channels c - floor((size-1)/2) .. c + ceil((size-1)/2).
    x = args[0].astype(np.float64)
    a = node.attrs
    size = int(a["size"])
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    sq = np.pad(x * x, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    c = x.shape[1]
    window = sum(sq[:, i:i + c] for i in range(size))
    return [x / (a["bias"] + a["alpha"] / size * window) ** a["beta"]]


@kernel("layout_transform")
def _layout_transform(node, args, graph):
    a = node.attrs
    return [transform(args[0], a["src"], a["dst"], a["channels"], a.get("batch"))]
