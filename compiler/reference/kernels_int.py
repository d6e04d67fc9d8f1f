"""Reference kernels of the integer operators: exactly the arithmetic that
`vdla.compiler.reference.integer` (and, for transformers' operators,
`vdla.compiler.reference.integer_transformer`) defines, which every back half reproduces
bit for bit."""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.tensor import GraphError, Node
from vdla.compiler.reference import integer_transformer
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, QuantizationError,
                                             requantize, round_half_up, wrap32)
from vdla.compiler.reference.numerics import avg_pool_sums, conv2d_accumulate
from vdla.compiler.reference.registry import kernel

__all__: list[str] = []


def _fail(node: Node, message: str):
    raise GraphError(f"node {node.name!r} ({node.op}): {message}")


def _need_int(node: Node, value, what: str, dtypes=(np.int8,)):
    if value is not None and value.dtype not in dtypes:
        _fail(node, f"{what} must be {' or '.join(np.dtype(d).name for d in dtypes)}, "
                    f"not {value.dtype}")


def _requantize(node: Node, acc, multiplier, shift, axis=1) -> np.ndarray:
    try:
        return requantize(acc, multiplier, shift, axis)
    except QuantizationError as e:
        _fail(node, str(e))


def _clip_int8(node: Node, y: np.ndarray, lo=INT8_MIN, hi=INT8_MAX) -> np.ndarray:
    if not (INT8_MIN <= lo <= hi <= INT8_MAX):
        _fail(node, f"out_min {lo} and out_max {hi} must satisfy -128 <= out_min <= out_max "
                    "<= 127")
    return np.clip(y, lo, hi).astype(np.int8)


def _gemm_epilogue(node: Node, acc: np.ndarray, residual) -> np.ndarray:
    a = node.attrs
    y = _requantize(node, acc, a["multiplier"], a["shift"], axis=1)
    if residual is not None:
        r = _requantize(node, residual.astype(np.int32), a["residual_multiplier"],
                        a["residual_shift"], axis=1)
        y = wrap32(y.astype(np.int64) + r)
    return _clip_int8(node, y, a["out_min"], a["out_max"])


@kernel("quantize")
def _quantize_kernel(node, args, graph):
    if node.attrs["dtype"] != "int8":
        _fail(node, f"dtype {node.attrs['dtype']!r} is not supported; only 'int8'")
    x = np.asarray(args[0], dtype=np.float64)
    q = round_half_up(x / float(node.attrs["scale"]))
    return [np.clip(q, INT8_MIN, INT8_MAX).astype(np.int8)]


@kernel("dequantize")
def _dequantize_kernel(node, args, graph):
    return [(args[0].astype(np.float64) * float(node.attrs["scale"])).astype(np.float32)]


@kernel("qconv2d")
def _qconv2d_kernel(node, args, graph):
    x, w, bias, residual = (list(args) + [None, None])[:4]
    _need_int(node, x, "input")
    _need_int(node, w, "weights")
    _need_int(node, bias, "bias", (np.int32,))
    _need_int(node, residual, "residual")
    a = node.attrs
    acc = conv2d_accumulate(x, w, a["strides"], a["pads"], a["dilations"], a["groups"],
                            exact_int=True)
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape(1, -1, 1, 1)
    return [_gemm_epilogue(node, acc, residual)]


@kernel("qdense")
def _qdense_kernel(node, args, graph):
    x, w, bias, residual = (list(args) + [None, None])[:4]
    _need_int(node, x, "input")
    _need_int(node, w, "weights")
    _need_int(node, bias, "bias", (np.int32,))
    _need_int(node, residual, "residual")
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    return [_gemm_epilogue(node, acc, residual)]


@kernel("qadd")
def _qadd_kernel(node, args, graph):
    a, b = args
    _need_int(node, a, "input a")
    _need_int(node, b, "input b")
    at = node.attrs
    ya = _requantize(node, a.astype(np.int32), at["a_multiplier"], at["a_shift"])
    yb = _requantize(node, b.astype(np.int32), at["b_multiplier"], at["b_shift"])
    return [_clip_int8(node, wrap32(ya.astype(np.int64) + yb), at["out_min"], at["out_max"])]


@kernel("qavg_pool2d")
def _qavg_pool_kernel(node, args, graph):
    _need_int(node, args[0], "input")
    sums, _ = avg_pool_sums(node, args[0])       # the count is folded into multiplier/shift
    y = _requantize(node, sums, node.attrs["multiplier"], node.attrs["shift"])
    return [_clip_int8(node, y)]


@kernel("qglobal_avg_pool2d")
def _qglobal_avg_pool_kernel(node, args, graph):
    _need_int(node, args[0], "input")
    sums = args[0].astype(np.int64).sum(axis=(2, 3), keepdims=True)
    y = _requantize(node, sums, node.attrs["multiplier"], node.attrs["shift"])
    return [_clip_int8(node, y)]


# --- transformers' integer operators (`vdla.compiler.reference.integer_transformer`) ------

def _transformer_op(node: Node, fn, *args):
    try:
        return fn(*args)
    except QuantizationError as e:
        _fail(node, str(e))


def _last_axis(node: Node, x):
    axis = node.attrs.get("axis", -1)
    if x is not None and axis not in (-1, x.ndim - 1):
        _fail(node, f"axis {axis} is not supported; only the last axis (-1)")


@kernel("qmatmul")
def _qmatmul_kernel(node, args, graph):
    a, b = args
    _need_int(node, a, "input a")
    _need_int(node, b, "input b")
    at = node.attrs
    return [_transformer_op(node, integer_transformer.qmatmul, a, b, at["multiplier"],
                            at["shift"], at["out_min"], at["out_max"],
                            bool(at["transpose_b"]))]


@kernel("qsoftmax")
def _qsoftmax_kernel(node, args, graph):
    """Over the last axis; with axis -2 (keys down the rows), the softmax of the last two
    axes' transpose, transposed back: the mask broadcasts to x as it is, and causal
    excludes row t where t > column s + (rows - columns)."""
    x = args[0]
    _need_int(node, x, "input")
    axis = node.attrs.get("axis", -1)
    down = x is not None and x.ndim >= 2 and axis in (-2, x.ndim - 2)
    if not down:
        _last_axis(node, x)
    mask = args[1] if len(args) > 1 else None
    if mask is not None:   # bool: True excluded; int8 (as the accelerator reads it): < 0
        mask = np.asarray(mask)
        mask = mask < 0 if mask.dtype == np.int8 else mask.astype(bool)
    excluded = None if mask is None else np.broadcast_to(mask, x.shape)
    if down:   # keys last: x, the exclusion and the result swap their last two axes
        x = np.swapaxes(x, -1, -2)
        excluded = None if excluded is None else np.swapaxes(excluded, -1, -2)
    if node.attrs.get("causal"):
        c = np.broadcast_to(integer_transformer.causal_exclusion(x.shape[-2], x.shape[-1]),
                            x.shape)
        excluded = c if excluded is None else (excluded | c)
    y = _transformer_op(node, integer_transformer.qsoftmax, x, node.attrs["params"],
                        excluded)
    return [np.ascontiguousarray(np.swapaxes(y, -1, -2)) if down else y]


@kernel("qlayer_norm")
def _qlayer_norm_kernel(node, args, graph):
    x, gamma, beta = (list(args) + [None, None])[:3]
    _need_int(node, x, "input")
    _need_int(node, gamma, "gamma", (np.int32,))
    _need_int(node, beta, "beta", (np.int32,))
    _last_axis(node, x)
    return [_transformer_op(node, integer_transformer.qlayer_norm, x, gamma, beta,
                            node.attrs["params"])]


@kernel("qgelu")
def _qgelu_kernel(node, args, graph):
    _need_int(node, args[0], "input")
    return [_transformer_op(node, integer_transformer.qgelu, args[0], node.attrs["params"])]


@kernel("qattention")
def _qattention_kernel(node, args, graph):
    q, k, v, mask = (list(args) + [None])[:4]
    for value, what in ((q, "q"), (k, "k"), (v, "v")):
        _need_int(node, value, what)
    _need_int(node, mask, "mask", (np.bool_,))
    return [_transformer_op(node, integer_transformer.qattention, q, k, v, mask,
                            node.attrs)]
