"""Converters: one function per supported ONNX op type, writing the graph IR's float
operators through the `Importer` (`@_converter("Conv")`, ...). Those of sequence models
(LayerNormalization, Gather, Slice, Cast, the reductions, ...) are in `converters_sequence`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from vdla.compiler.frontend.onnx_import.nodes import OnnxNode, reshape_target

if TYPE_CHECKING:  # annotations only: the importer calls the converters
    from vdla.compiler.frontend.onnx_import.importer import Importer

__all__ = ["CONVERTERS"]

CONVERTERS: dict[str, Callable[[Importer, OnnxNode], None]] = {}


def _converter(*ops: str):
    def register(fn):
        for op in ops:
            CONVERTERS[op] = fn
        return fn
    return register


def _ints(node: OnnxNode, key: str, default, n: int | None = None) -> tuple[int, ...]:
    value = node.attrs.get(key, default)
    value = tuple(int(v) for v in value)
    if n is not None and len(value) != n:
        node.fail(f"attribute {key}={list(value)} must have {n} values for a 2-D window")
    return value


def _spatial_input(imp: Importer, node: OnnxNode) -> tuple[int, ...]:
    shape = imp.shape(node.inputs[0])
    if len(shape) != 4:
        node.fail(f"input {node.inputs[0]!r} must be 4-D (N, C, H, W), not shape {shape}; vdla "
                  "imports 2-D convolutions and pools only")
    return shape


def _window_pads(imp: Importer, node: OnnxNode, kernel, strides, dilations) -> tuple[int, ...]:
    """The (top, left, bottom, right) pads of a Conv/pool from `pads` or `auto_pad`."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = _ints(node, "pads", (0, 0, 0, 0), 4)
        if min(pads) < 0:
            node.fail(f"pads {list(pads)} must be >= 0")
        return pads
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        node.fail(f"auto_pad {auto!r} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    _, _, h, w = _spatial_input(imp, node)
    begin, end = [], []
    for size, k, s, d in zip((h, w), kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        # SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the beginning.
        b, e = (small, large) if auto == "SAME_UPPER" else (large, small)
        begin.append(b)
        end.append(e)
    return (begin[0], begin[1], end[0], end[1])


@_converter("Conv")
def _conv(imp: Importer, node: OnnxNode):
    _spatial_input(imp, node)
    w_shape = imp.shape(node.inputs[1])
    if len(w_shape) != 4:
        node.fail(f"weights {node.inputs[1]!r} must be 4-D (O, I, kH, kW), not {w_shape}")
    kernel = _ints(node, "kernel_shape", w_shape[2:], 2)
    if kernel != tuple(w_shape[2:]):
        node.fail(f"kernel_shape {list(kernel)} disagrees with the weights' shape {w_shape}")
    strides = _ints(node, "strides", (1, 1), 2)
    dilations = _ints(node, "dilations", (1, 1), 2)
    pads = _window_pads(imp, node, kernel, strides, dilations)
    inputs = [imp.tensor(node, node.inputs[0]), imp.tensor(node, node.inputs[1])]
    if node.input(2):
        inputs.append(imp.tensor(node, node.inputs[2]))
    imp.emit(node, "conv2d", inputs, node.outputs[0], strides=strides, pads=pads,
             dilations=dilations, groups=int(node.attrs.get("group", 1)))


@_converter("BatchNormalization")
def _batch_norm(imp: Importer, node: OnnxNode):
    if int(node.attrs.get("training_mode", 0)):
        node.fail("training_mode=1 (batch statistics) is not supported; export the model in "
                  "eval mode (training_mode=0)")
    if not int(node.attrs.get("spatial", 1)):
        node.fail("spatial=0 (per-element statistics) is not supported; only spatial=1")
    for k, what in ((1, "running mean"), (2, "running var"), (3, "saved mean"),
                    (4, "saved var")):
        imp.unused(node, k, what)
    inputs = [imp.tensor(node, i) for i in node.inputs[:5]]
    imp.emit(node, "batch_norm", inputs, node.outputs[0],
             epsilon=float(node.attrs.get("epsilon", 1e-5)))


@_converter("Relu")
def _relu(imp: Importer, node: OnnxNode):
    imp.emit(node, "relu", [imp.tensor(node, node.inputs[0])], node.outputs[0])


def _bound(value) -> float | None:
    # float32's extremes (ONNX's defaults for Clip's attributes) mean "unbounded".
    value = float(np.asarray(value).reshape(-1)[0])
    return None if math.isinf(value) or abs(value) >= 3.4e38 else value


@_converter("Clip")
def _clip(imp: Importer, node: OnnxNode):
    if imp.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        lo, hi = imp.const_input(node, 1, "min"), imp.const_input(node, 2, "max")
        for value, what in ((lo, "min"), (hi, "max")):
            if value is not None and value.size != 1:
                node.fail(f"{what} must be a scalar, not shape {value.shape}")
    lo = None if lo is None else _bound(lo)
    hi = None if hi is None else _bound(hi)
    imp.emit(node, "clip", [imp.tensor(node, node.inputs[0])], node.outputs[0], min=lo, max=hi)


@_converter("Add", "Mul", "Sum")
def _eltwise(imp: Importer, node: OnnxNode):
    op = "mul" if node.op == "Mul" else "add"
    inputs = [i for i in node.inputs if i]
    if not inputs:
        node.fail("has no inputs")
    if len(inputs) == 1:
        imp.alias(node.outputs[0], inputs[0])
        return
    acc = imp.tensor(node, inputs[0])
    for k, other in enumerate(inputs[1:], 2):
        out = node.outputs[0] if k == len(inputs) else None
        acc = imp.emit(node, op, [acc, imp.tensor(node, other)], out)


@_converter("MaxPool", "AveragePool")
def _pool(imp: Importer, node: OnnxNode):
    _spatial_input(imp, node)
    if "kernel_shape" not in node.attrs:
        node.fail("attribute kernel_shape is required")
    kernel = _ints(node, "kernel_shape", None, 2)
    strides = _ints(node, "strides", (1, 1), 2)
    dilations = _ints(node, "dilations", (1, 1), 2)
    if dilations != (1, 1):
        node.fail(f"dilations {list(dilations)} are not supported for pools; only [1, 1]")
    if int(node.attrs.get("storage_order", 0)):
        node.fail("storage_order=1 (column-major indices) is not supported; only 0")
    imp.unused(node, 1, "indices")
    pads = _window_pads(imp, node, kernel, strides, dilations)
    attrs = dict(kernel=kernel, strides=strides, pads=pads,
                 ceil_mode=bool(node.attrs.get("ceil_mode", 0)))
    if node.op == "AveragePool":
        attrs["count_include_pad"] = bool(node.attrs.get("count_include_pad", 0))
    imp.emit(node, "max_pool2d" if node.op == "MaxPool" else "avg_pool2d",
             [imp.tensor(node, node.inputs[0])], node.outputs[0], **attrs)


@_converter("GlobalAveragePool")
def _global_avg_pool(imp: Importer, node: OnnxNode):
    _spatial_input(imp, node)
    imp.emit(node, "global_avg_pool2d", [imp.tensor(node, node.inputs[0])], node.outputs[0])


@_converter("Gemm")
def _gemm(imp: Importer, node: OnnxNode):
    a, b, c = node.inputs[0], node.inputs[1], node.input(2)
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    trans_a, trans_b = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    a_shape, b_shape = imp.shape(a), imp.shape(b)
    if len(a_shape) != 2 or len(b_shape) != 2:
        node.fail(f"A {a_shape} and B {b_shape} must both be 2-D")
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    kb, n = (b_shape[1], b_shape[0]) if trans_b else b_shape
    if k != kb:
        node.fail(f"A {a_shape} (transA={trans_a}) and B {b_shape} (transB={trans_b}) do not "
                  "multiply")
    if c:
        try:
            np.broadcast_shapes(imp.shape(c), (m, n))
        except ValueError:
            node.fail(f"C {imp.shape(c)} does not broadcast to the output ({m}, {n})")
    out, b_value, c_value = node.outputs[0], imp.const(b), imp.const(c)

    def scaled(name: str, factor: float, what: str) -> str:
        # `name` times `factor`: folded into a new constant when `name` is one.
        if factor == 1:
            return imp.tensor(node, name)
        value = imp.const(name)
        if value is not None:
            return imp.materialize(f"{name}_{what}", value.astype(np.float32) * np.float32(factor),
                                   node, derived=True)
        factor_name = imp.materialize(f"{node.name}_{what}", np.float32(factor), node,
                                      derived=True)
        return imp.emit(node, "mul", [imp.tensor(node, name), factor_name])

    x = imp.tensor(node, a)
    if trans_a:
        x = imp.emit(node, "transpose", [x], perm=(1, 0))
    if a not in imp.consts and b_value is not None:
        # A layer: dense(x, w) with w = alpha * op(B) as (N, K), and beta * C as its bias
        # when C is the same for every row.
        if alpha == 1 and trans_b:
            w = imp.tensor(node, b)
        else:
            w_value = (b_value if trans_b else b_value.T).astype(np.float32) * np.float32(alpha)
            w = imp.materialize(f"{b}_w", np.ascontiguousarray(w_value), node, derived=True)
        inputs, extra = [x, w], None
        if c_value is not None and (c_value.ndim < 2 or c_value.shape[0] == 1):
            row = np.broadcast_to(c_value.astype(np.float32) * np.float32(beta), (m, n))[0]
            inputs.append(imp.tensor(node, c) if beta == 1 and c_value.shape == (n,) else
                          imp.materialize(f"{c}_bias", np.ascontiguousarray(row), node,
                                          derived=True))
        elif c:
            extra = scaled(c, beta, "beta")
        if extra is None:
            imp.emit(node, "dense", inputs, out)
        else:
            imp.emit(node, "add", [imp.emit(node, "dense", inputs), extra], out)
        return
    # General case (B computed, or A constant): matmul, then scale and add.
    y_in = imp.tensor(node, b)
    if trans_b:
        y_in = imp.emit(node, "transpose", [y_in], perm=(1, 0))
    y = imp.emit(node, "matmul", [x, y_in], out if not c and alpha == 1 else None)
    if alpha != 1:
        alpha_name = imp.materialize(f"{node.name}_alpha", np.float32(alpha), node, derived=True)
        y = imp.emit(node, "mul", [y, alpha_name], None if c else out)
    if c:
        imp.emit(node, "add", [y, scaled(c, beta, "beta")], out)


@_converter("MatMul")
def _matmul(imp: Importer, node: OnnxNode):
    a, b = node.inputs[0], node.inputs[1]
    b_value = imp.const(b)
    a_shape = imp.shape(a)
    if b_value is not None and b_value.ndim == 2 and a not in imp.consts and \
            len(a_shape) >= 2:
        # A layer: dense on (rows, K); a (..., S, K) input is reshaped to 2-D around it
        # (the linear layers of transformers).
        w = imp.materialize(f"{b}_t", np.ascontiguousarray(b_value.T.astype(np.float32)),
                            node, derived=True)
        x = imp.tensor(node, a)
        if len(a_shape) == 2:
            imp.emit(node, "dense", [x, w], node.outputs[0])
            return
        if a_shape[-1] != b_value.shape[0]:
            node.fail(f"A {a_shape} and B {b_value.shape} do not multiply")
        rows = int(np.prod(a_shape[:-1]))
        flat = imp.emit(node, "reshape", [x], shape=(rows, a_shape[-1]))
        y = imp.emit(node, "dense", [flat, w])
        imp.emit(node, "reshape", [y], node.outputs[0],
                 shape=tuple(a_shape[:-1]) + (b_value.shape[1],))
        return
    imp.emit(node, "matmul", [imp.tensor(node, a), imp.tensor(node, b)], node.outputs[0])


@_converter("Flatten")
def _flatten(imp: Importer, node: OnnxNode):
    imp.emit(node, "flatten", [imp.tensor(node, node.inputs[0])], node.outputs[0],
             axis=int(node.attrs.get("axis", 1)))


def _reshape_shape_arg(imp: Importer, node: OnnxNode):
    if "shape" in node.attrs and len(node.inputs) < 2:      # Reshape-1's attribute
        return node.attrs["shape"]
    return imp.const_input(node, 1, "shape")


@_converter("Reshape")
def _reshape(imp: Importer, node: OnnxNode):
    target = _reshape_shape_arg(imp, node)
    if target is None:
        node.fail("has no target shape")
    shape = reshape_target(node, imp.shape(node.inputs[0]), target,
                            bool(node.attrs.get("allowzero", 0)))
    imp.emit(node, "reshape", [imp.tensor(node, node.inputs[0])], node.outputs[0], shape=shape)


@_converter("Transpose")
def _transpose(imp: Importer, node: OnnxNode):
    perm = tuple(int(p) for p in node.attrs.get("perm", ()))
    imp.emit(node, "transpose", [imp.tensor(node, node.inputs[0])], node.outputs[0], perm=perm)


@_converter("Concat")
def _concat(imp: Importer, node: OnnxNode):
    if "axis" not in node.attrs:
        node.fail("attribute axis is required")
    inputs = [imp.tensor(node, i) for i in node.inputs if i]
    imp.emit(node, "concat", inputs, node.outputs[0], axis=int(node.attrs["axis"]))


@_converter("Softmax")
def _softmax(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    rank = len(shape)
    if imp.opset >= 13:
        axis = int(node.attrs.get("axis", -1))
    else:
        # Before opset 13, Softmax flattens the input to 2-D at `axis` and normalizes each
        # row: a softmax over one axis exactly when the other axes from `axis` on are 1.
        axis = int(node.attrs.get("axis", 1))
        a = axis + rank if axis < 0 else axis
        if not 0 <= a < rank:
            node.fail(f"axis {axis} is out of range for shape {shape}")
        wide = [i for i in range(a, rank) if shape[i] != 1]
        if len(wide) > 1:
            node.fail(f"Softmax-{imp.opset} with axis={axis} normalizes over the flattened axes "
                      f"{a}.. of shape {shape}, which is not a softmax over one axis; vdla "
                      "imports it when all but one of those axes are 1")
        axis = wide[0] if wide else -1
    imp.emit(node, "softmax", [imp.tensor(node, node.inputs[0])], node.outputs[0], axis=axis)


@_converter("Dropout")
def _dropout(imp: Importer, node: OnnxNode):
    training = imp.const_input(node, 2, "training_mode") if imp.opset >= 12 else None
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        node.fail("training_mode=True (random dropout) is not supported; export in eval mode")
    imp.unused(node, 1, "mask")
    imp.alias(node.outputs[0], node.inputs[0])


@_converter("Identity")
def _identity(imp: Importer, node: OnnxNode):
    imp.alias(node.outputs[0], node.inputs[0])


@_converter("Pad")
def _pad(imp: Importer, node: OnnxNode):
    rank = len(imp.shape(node.inputs[0]))
    if imp.opset < 11:
        pads = node.attrs.get("pads")
        value = float(node.attrs.get("value", 0.0))
    else:
        pads = imp.const_input(node, 1, "pads")
        cv = imp.const_input(node, 2, "constant_value")
        value = 0.0 if cv is None or cv.size == 0 else float(cv.reshape(-1)[0])
    if pads is None:
        node.fail("has no pads")
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = imp.const_input(node, 3, "axes") if imp.opset >= 18 else None
    if axes is not None:
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1)]
        if len(pads) != 2 * len(axes) or any(not 0 <= a < rank for a in axes):
            node.fail(f"pads {pads} and axes {axes} do not fit a rank-{rank} input")
        full = [0] * (2 * rank)
        for j, a in enumerate(axes):
            full[a], full[a + rank] = pads[j], pads[j + len(axes)]
        pads = full
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":
        node.fail(f"mode {mode!r} is not supported; only 'constant'")
    if len(pads) != 2 * rank:
        node.fail(f"pads {pads} must have {2 * rank} values for a rank-{rank} input")
    if min(pads) < 0:
        node.fail(f"negative pads {pads} (cropping) are not supported")
    imp.emit(node, "pad", [imp.tensor(node, node.inputs[0])], node.outputs[0],
             pads=tuple(pads), value=value)


@_converter("LRN")
def _lrn(imp: Importer, node: OnnxNode):
    if "size" not in node.attrs:
        node.fail("attribute size is required")
    imp.emit(node, "lrn", [imp.tensor(node, node.inputs[0])], node.outputs[0],
             size=int(node.attrs["size"]), alpha=float(node.attrs.get("alpha", 1e-4)),
             beta=float(node.attrs.get("beta", 0.75)), bias=float(node.attrs.get("bias", 1.0)))
