"""Reference executors in numpy: they define the results every back half must produce.

`run_reference(graph, inputs)` runs a float graph in float32 (float64 inside
convolutions and products, rounded back to float32) and a quantized graph with exact
integer arithmetic: int8 x int8 products summed in int64 and reduced as the accelerator's
int32 accumulators do. The integer operators' kernels are defined next to the pass that
creates them (`vdla.compiler.quantization`), layout operators' in `vdla.compiler.layout`;
all of them register here with `@kernel("op")`. A GEMM node in packed layouts
(`vdla.compiler.layout.pack_graph`) runs through the same plain kernel: its inputs are
unpacked and its output packed around the call, so kernels only see plain layouts.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from vdla.compiler.graph import DTYPES, Graph, GraphError, Node

__all__ = ["KERNELS", "check_inputs", "conv2d_accumulate", "kernel", "pool2d_windows",
           "run_reference"]

#: op name -> fn(node, inputs: list[ndarray | None], graph) -> list[ndarray]
KERNELS: dict[str, Callable] = {}


def kernel(op: str):
    """Register the reference implementation of `op`."""
    def register(fn):
        if op in KERNELS:
            raise ValueError(f"reference kernel for {op!r} is registered twice")
        KERNELS[op] = fn
        return fn
    return register


def _load_extensions():
    # Modules that define operators' kernels next to the passes that create those ops.
    import vdla.compiler.layout  # noqa: F401
    import vdla.compiler.quantization  # noqa: F401


def check_inputs(graph: Graph, feed) -> dict[str, np.ndarray]:
    """`feed` (input name -> array) checked against `graph`'s inputs and cast to their
    dtypes: the one input check of `run_reference` and of the back halves' sessions.
    Raises ValueError naming a missing, unknown, wrong-shaped or wrong-typed input and
    what the graph takes; TypeError when `feed` is not a mapping."""
    if not isinstance(feed, Mapping):
        raise TypeError(f"feed must be a dict input name -> array, not {type(feed).__name__}")
    takes = ", ".join(f"{n} {graph.tensors[n].shape} {graph.tensors[n].dtype}"
                      for n in graph.inputs)
    missing = [n for n in graph.inputs if n not in feed]
    if missing:
        raise ValueError(f"missing input(s) {missing}; graph {graph.name!r} takes {takes}")
    unknown = sorted(set(feed) - set(graph.inputs))
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; graph {graph.name!r} takes {takes}")
    values = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        array = np.asarray(feed[name])
        if tuple(array.shape) != t.shape:
            raise ValueError(f"input {name!r} has shape {tuple(array.shape)}; the graph "
                             f"expects {t.shape}")
        if t.dtype == "float32":
            if array.dtype.kind not in "fiu":
                raise ValueError(f"input {name!r} has dtype {array.dtype}; expected a number")
        elif array.dtype != DTYPES[t.dtype]:
            raise ValueError(f"input {name!r} has dtype {array.dtype}; the graph expects "
                             f"{t.dtype}")
        values[name] = array.astype(DTYPES[t.dtype], copy=False)
    return values


def run_reference(graph: Graph, inputs: dict[str, np.ndarray], *,
                  keep: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` (name -> array) and return its outputs (name -> array).

    With `keep`, every intermediate tensor is returned too (for debugging and for the
    per-op comparisons of back halves). Inputs are checked against the graph's input
    shapes and dtypes; a wrong or missing input raises ValueError naming it."""
    _load_extensions()
    values = check_inputs(graph, inputs)
    for name, t in graph.tensors.items():
        if t.is_constant:
            values[name] = t.data
    for node in graph.nodes():
        fn = KERNELS.get(node.op)
        if fn is None:
            raise GraphError(f"node {node.name!r}: no reference kernel for op {node.op!r}")
        args = [values[i] if i else None for i in node.inputs]
        if "data_layout" in node.attrs and node.attrs["data_layout"] not in ("NCHW", "NC"):
            results = _run_packed(fn, node, args, graph)
        else:
            results = fn(node, args, graph)
        for out, value in zip(node.outputs, results):
            dtype = DTYPES[graph.tensors[out].dtype]
            values[out] = np.asarray(value).astype(dtype, copy=False)
    if keep:
        return values
    return {name: values[name] for name in graph.outputs}


def _run_packed(fn, node: Node, args: list, graph: Graph) -> list:
    """Run a GEMM node in packed layouts with its plain kernel: unpack data, weights and
    residual (keeping their zero-padded channels and batch rows), run the kernel with the
    plain layout attributes, and pack the output into ``out_layout``. The padded weights
    are zero, so the real channels come out exactly as the unpacked op computes them."""
    from vdla.compiler.layout import pack, parse_layout, unpack
    a = node.attrs
    data, kern, out = (parse_layout(a[k]) for k in ("data_layout", "kernel_layout", "out_layout"))
    args = list(args) + [None] * (4 - len(args))
    x = unpack(args[0], data, data.base)
    w = unpack(args[1], kern, kern.base) if kern.packed else args[1]
    residual = args[3]
    if residual is not None and out.packed:
        residual = unpack(residual, out, out.base)
    plain = Node(node.name, node.op, list(node.inputs), list(node.outputs),
                 dict(a, data_layout=data.base, kernel_layout=kern.base, out_layout=out.base))
    results = fn(plain, [x, w, args[2], residual][:max(len(node.inputs), 2)], graph)
    return [pack(results[0], out.base, out) if out.packed else results[0]] + list(results[1:])


# --- shared numerics ---------------------------------------------------------------------

def _pad_nchw(x: np.ndarray, pads, value=0) -> np.ndarray:
    top, left, bottom, right = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def pool2d_windows(x: np.ndarray, kernel, strides, pads, dilations=(1, 1), *,
                   ceil_mode=False, value=0) -> np.ndarray:
    """A read-only (N, C, Ho, Wo, kH, kW) view of the windows of the padded NCHW `x`.
    With `ceil_mode`, the input is padded further at the end (with `value`) so the last
    partial window exists."""
    from vdla.compiler.ops import conv_output_size
    n, c, h, w = x.shape
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    ho = conv_output_size(h, kh, sh, pads[0], pads[2], dh, ceil_mode)
    wo = conv_output_size(w, kw, sw, pads[1], pads[3], dw, ceil_mode)
    need_h = (ho - 1) * sh + dh * (kh - 1) + 1
    need_w = (wo - 1) * sw + dw * (kw - 1) + 1
    extra_b = max(0, need_h - (h + pads[0] + pads[2]))
    extra_r = max(0, need_w - (w + pads[1] + pads[3]))
    xp = _pad_nchw(x, (pads[0], pads[1], pads[2] + extra_b, pads[3] + extra_r), value)
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, c, ho, wo, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw),
        writeable=False)


def conv2d_accumulate(x: np.ndarray, w: np.ndarray, strides, pads, dilations, groups: int,
                      *, exact_int: bool = False, dtype=np.float64) -> np.ndarray:
    """conv2d of NCHW `x` with OIHW `w`, without bias, computed in `dtype` (float64 by
    default; the graph builder asks for float32 to build deep models fast). With
    `exact_int`, int64 sums of integer products (computed through float64 BLAS, exact
    while every sum stays below 2**53, far beyond int8 x int8 over any real layer)."""
    work = np.float64 if exact_int else dtype
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    cols = pool2d_windows(x.astype(work, copy=False), (kh, kw), strides, pads, dilations)
    _, _, ho, wo, _, _ = cols.shape
    wf = w.astype(work, copy=False)
    if ig == 1 and groups == c == o:
        # Depthwise: one multiply-add per tap over all channels beats per-channel products.
        out = np.zeros((n, c, ho, wo), dtype=work)
        for i in range(kh):
            for j in range(kw):
                out += cols[..., i, j] * wf[None, :, 0, i, j, None, None]
    else:
        og = o // groups
        out = np.empty((n, o, ho, wo), dtype=work)
        for g in range(groups):
            part = cols[:, g * ig:(g + 1) * ig]                   # N, ig, Ho, Wo, kh, kw
            mat = part.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, ig * kh * kw)
            res = mat @ wf[g * og:(g + 1) * og].reshape(og, -1).T  # N*Ho*Wo, og
            out[:, g * og:(g + 1) * og] = res.reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    if exact_int:
        return np.rint(out).astype(np.int64)
    return out


def _activation(node: Node, y: np.ndarray) -> np.ndarray:
    act = node.attrs.get("activation")
    if act == "relu":
        return np.maximum(y, 0)
    if act == "clip":
        lo, hi = node.attrs.get("clip_min"), node.attrs.get("clip_max")
        return np.clip(y, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    return y


# --- float kernels -----------------------------------------------------------------------

@kernel("conv2d")
def _conv2d(node, args, graph):
    x, w, bias, residual = (args + [None, None])[:4]
    a = node.attrs
    y = conv2d_accumulate(x, w, a["strides"], a["pads"], a["dilations"], a["groups"])
    if bias is not None:
        y = y + bias.astype(np.float64).reshape(1, -1, 1, 1)
    if residual is not None:
        y = y + residual
    return [_activation(node, y)]


@kernel("dense")
def _dense(node, args, graph):
    x, w, bias, residual = (args + [None, None])[:4]
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return [_activation(node, y)]


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


def avg_pool_sums(node, x):
    """Window sums and element counts of an average pool (the count excludes padding
    unless count_include_pad; the ceil_mode overhang never counts)."""
    a = node.attrs
    xf = x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)
    sums = pool2d_windows(xf, a["kernel"], a["strides"], a["pads"],
                          ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.int64)
    if a["count_include_pad"]:
        h, w = x.shape[2:]
        p = a["pads"]
        ones = np.ones((1, 1, h + p[0] + p[2], w + p[1] + p[3]), dtype=np.int64)
        counts = pool2d_windows(ones, a["kernel"], a["strides"], (0, 0, 0, 0),
                                ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
        counts = counts[:, :, :sums.shape[2], :sums.shape[3]]
    else:
        counts = pool2d_windows(ones, a["kernel"], a["strides"], a["pads"],
                                ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
    return sums, counts


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
