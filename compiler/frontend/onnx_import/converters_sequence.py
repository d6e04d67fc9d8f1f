"""Converters of the ONNX ops of sequence models (transformers), registered with the
others of `vdla.compiler.frontend.onnx_import.converters`: LayerNormalization, Gather on
activations and token ids, Squeeze/Unsqueeze/Split/Slice/Expand/Where/Cast on
activations, SplitToSequence/SequenceAt (a split into a sequence, then picks from it), the
elementwise ops (Sub, Div, Pow, Sqrt, Erf, Tanh, Exp, Neg, Gelu), the comparisons
(Equal, Less, Greater), Not, Where, and the reductions (ReduceMean, ReduceSum, ReduceMax).

Every op here on constant inputs only is evaluated at import by the folders
(`vdla.compiler.frontend.onnx_import.folding`); these converters see computed tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vdla.compiler.frontend.onnx_import.converters import _converter
from vdla.compiler.frontend.onnx_import.nodes import ELEM_TYPES, OnnxNode, elem_type_name

if TYPE_CHECKING:  # annotations only: the importer calls the converters
    from vdla.compiler.frontend.onnx_import.importer import Importer

__all__: list[str] = []


def _axes_of(imp: Importer, node: OnnxNode, k: int, rank: int, attr_until: int):
    """A node's axes: the attribute before opset `attr_until`, else constant input `k`;
    None when absent. Negative axes count from the end; out of range fails."""
    if imp.opset < attr_until or "axes" in node.attrs:
        axes = node.attrs.get("axes")
    else:
        axes = imp.const_input(node, k, "axes")
    if axes is None:
        return None
    out = []
    for a in np.asarray(axes).reshape(-1):
        a = int(a)
        if not -rank <= a < rank:
            node.fail(f"axis {a} is out of range for a rank-{rank} tensor")
        out.append(a % rank)
    return sorted(out)


def _x(imp: Importer, node: OnnxNode, k: int = 0) -> str:
    return imp.tensor(node, node.inputs[k])


@_converter("LayerNormalization")
def _layer_norm(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", -1))
    if not -len(shape) <= axis < len(shape):
        node.fail(f"axis {axis} is out of range for shape {shape}")
    if axis % len(shape) != len(shape) - 1:
        axes = list(range(axis % len(shape), len(shape)))
        node.fail(f"axis {axis} normalizes over the axes {axes} of shape {shape}; vdla "
                  "imports LayerNormalization over the last axis only")
    d = shape[-1]
    inputs = [_x(imp, node)]
    for k, what in ((1, "scale"), (2, "bias")):
        name = node.input(k)
        if not name:
            continue
        if imp.shape(name) != (d,):
            if int(np.prod(imp.shape(name))) != d:
                node.fail(f"{what} {name!r} has shape {imp.shape(name)}; it must hold {d} "
                          "values, one per element of the last axis")
            value = imp.const(name)
            inputs.append(imp.materialize(f"{name}_{what}", value.reshape(d), node, derived=True)
                          if value is not None else
                          imp.emit(node, "reshape", [imp.tensor(node, name)], shape=(d,)))
        else:
            inputs.append(imp.tensor(node, name))
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    imp.emit(node, "layer_norm", inputs, node.outputs[0], epsilon=epsilon)
    _layer_norm_statistics(imp, node, inputs[0], len(shape), epsilon)


def _layer_norm_statistics(imp: Importer, node: OnnxNode, x: str, rank: int, epsilon: float):
    # The optional outputs Mean and InvStdDev, when read: written out in float ops.
    mean_out, inv_out = (node.outputs[k] if len(node.outputs) > k and node.outputs[k] in
                         imp.used else None for k in (1, 2))
    if not (mean_out or inv_out):
        return
    axes = dict(axes=(rank - 1,), keepdims=True)
    mean = imp.emit(node, "reduce_mean", [x], mean_out, **axes)
    if inv_out:
        centered = imp.emit(node, "sub", [x, mean])
        var = imp.emit(node, "reduce_mean", [imp.emit(node, "mul", [centered, centered])],
                       **axes)
        eps = imp.materialize(f"{node.name}_epsilon", np.float32(epsilon), node, derived=True)
        one = imp.materialize(f"{node.name}_one", np.float32(1.0), node, derived=True)
        root = imp.emit(node, "sqrt", [imp.emit(node, "add", [var, eps])])
        imp.emit(node, "div", [one, root], inv_out)


@_converter("Gather")
def _gather(imp: Importer, node: OnnxNode):
    data, indices = node.inputs[0], node.inputs[1]
    shape = imp.shape(data)
    axis = int(node.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        node.fail(f"axis {axis} is out of range for data {data!r} of shape {shape}")
    axis %= len(shape)
    value = imp.const(indices)
    if value is not None and value.ndim == 0 and data not in imp.consts:
        # x[:, i]: one element along an axis, then the axis dropped (views, no gather).
        i = int(value)
        if not -shape[axis] <= i < shape[axis]:
            node.fail(f"index {i} in {indices!r} is outside [{-shape[axis]}, {shape[axis]}), "
                      f"the {shape[axis]} entries of {data!r} along axis {axis}")
        i %= shape[axis]
        sliced = imp.emit(node, "slice", [_x(imp, node)], starts=(i,), ends=(i + 1,),
                          axes=(axis,), steps=(1,))
        imp.emit(node, "reshape", [sliced], node.outputs[0],
                 shape=shape[:axis] + shape[axis + 1:])
        return
    if value is not None and value.dtype not in (np.int32, np.int64):
        value = value.astype(np.int64)
        idx = imp.materialize(f"{indices}_int64", value, node, derived=True)
    else:
        idx = imp.tensor(node, indices)
    imp.emit(node, "gather", [_x(imp, node), idx], node.outputs[0], axis=axis)


def _reshape_to(imp: Importer, node: OnnxNode, shape):
    imp.emit(node, "reshape", [_x(imp, node)], node.outputs[0], shape=tuple(shape))


@_converter("Unsqueeze")
def _unsqueeze(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    raw = node.attrs.get("axes") if imp.opset < 13 or "axes" in node.attrs else \
        imp.const_input(node, 1, "axes")
    if raw is None or np.asarray(raw).size == 0:
        node.fail("has no axes")
    rank = len(shape) + np.asarray(raw).size
    axes = _axes_of(imp, node, 1, rank, 13)
    if len(set(axes)) != len(axes):
        node.fail(f"axes {axes} repeat an axis")
    out = list(shape)
    for a in axes:
        out.insert(a, 1)
    _reshape_to(imp, node, out)


@_converter("Squeeze")
def _squeeze(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    axes = _axes_of(imp, node, 1, len(shape), 13)
    if axes is None:
        axes = [k for k, d in enumerate(shape) if d == 1]
    for a in axes:
        if shape[a] != 1:
            node.fail(f"axis {a} of shape {shape} has size {shape[a]}; Squeeze removes axes "
                      "of size 1")
    _reshape_to(imp, node, [d for k, d in enumerate(shape) if k not in axes])


def _slice_range(node: OnnxNode, axis: int, n: int, start: int, end: int, step: int):
    if step < 1:
        node.fail(f"step {step} on axis {axis}: vdla imports Slice with steps >= 1 only")
    b, e, _ = slice(start, end, step).indices(n)
    if e <= b:
        node.fail(f"start {start}, end {end} on axis {axis} (size {n}) select nothing")
    return b, e


@_converter("Slice")
def _slice(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    if imp.opset < 10:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = imp.const_input(node, 1, "starts"), imp.const_input(node, 2, "ends")
        axes, steps = imp.const_input(node, 3, "axes"), imp.const_input(node, 4, "steps")
    if starts is None or ends is None:
        node.fail("has no starts or ends")
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else \
        [int(a) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else \
        [int(s) for s in np.asarray(steps).reshape(-1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        node.fail(f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
    out_axes, out_starts, out_ends, out_steps = [], [], [], []
    for a, b, e, s in zip(axes, starts, ends, steps):
        if not -len(shape) <= a < len(shape):
            node.fail(f"axis {a} is out of range for shape {shape}")
        a %= len(shape)
        b, e = _slice_range(node, a, shape[a], b, e, s)
        if (b, e, s) == (0, shape[a], 1):
            continue                       # the whole axis
        out_axes.append(a)
        out_starts.append(b)
        out_ends.append(e)
        out_steps.append(s)
    if not out_axes:
        imp.alias(node.outputs[0], node.inputs[0])
        return
    imp.emit(node, "slice", [_x(imp, node)], node.outputs[0], starts=tuple(out_starts),
             ends=tuple(out_ends), axes=tuple(out_axes), steps=tuple(out_steps))


@_converter("Split")
def _split(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        node.fail(f"axis {axis} is out of range for shape {shape}")
    axis %= len(shape)
    split = node.attrs.get("split") if imp.opset < 13 else imp.const_input(node, 1, "split")
    n_out = len(node.outputs)
    if split is None:
        parts = int(node.attrs.get("num_outputs", n_out))
        size = -(-shape[axis] // parts)
        split = [min(size, shape[axis] - k * size) for k in range(parts)]
    split = [int(s) for s in np.asarray(split).reshape(-1)]
    if sum(split) != shape[axis] or len(split) != n_out or min(split) < 1:
        node.fail(f"split {split} does not cut axis {axis} (size {shape[axis]}) into "
                  f"{n_out} non-empty parts")
    x, begin = _x(imp, node), 0
    for out, size in zip(node.outputs, split):
        if out:
            imp.emit(node, "slice", [x], out, starts=(begin,), ends=(begin + size,),
                     axes=(axis,), steps=(1,))
        begin += size


@_converter("SplitToSequence")
def _split_to_sequence(imp: Importer, node: OnnxNode):
    # A sequence of slices, each a tensor of its own; SequenceAt picks one.
    shape = imp.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        node.fail(f"axis {axis} is out of range for shape {shape}")
    axis %= len(shape)
    split = imp.const_input(node, 1, "split")
    keep = bool(int(node.attrs.get("keepdims", 1)))
    if split is None:
        sizes = [1] * shape[axis]
    elif split.ndim == 0:
        size = int(split)
        if size < 1:
            node.fail(f"split {size} must be >= 1")
        sizes = [min(size, shape[axis] - b) for b in range(0, shape[axis], size)]
        keep = True
    else:
        sizes = [int(v) for v in split.reshape(-1)]
        keep = True
    if sum(sizes) != shape[axis] or min(sizes) < 1:
        node.fail(f"split {sizes} does not cut axis {axis} (size {shape[axis]}) into "
                  "non-empty parts")
    x, begin, parts = _x(imp, node), 0, []
    for k, size in enumerate(sizes):
        part = imp.emit(node, "slice", [x], starts=(begin,), ends=(begin + size,),
                        axes=(axis,), steps=(1,))
        if not keep:
            part = imp.emit(node, "reshape", [part], shape=shape[:axis] + shape[axis + 1:])
        onnx_name = imp.fresh(f"{node.outputs[0]}_{k}")
        imp.names[onnx_name] = part
        parts.append(onnx_name)
        begin += size
    imp.sequences[node.outputs[0]] = parts


@_converter("SequenceAt")
def _sequence_at(imp: Importer, node: OnnxNode):
    parts = imp.sequences.get(node.inputs[0])
    if parts is None:
        node.fail(f"input {node.inputs[0]!r} is not a sequence made by SplitToSequence, "
                  "the only sequences vdla imports")
    position = imp.const_input(node, 1, "position")
    if position is None or position.size != 1:
        node.fail("position must be a constant scalar")
    k = int(position.reshape(()))
    if not -len(parts) <= k < len(parts):
        node.fail(f"position {k} is outside the {len(parts)} tensors of {node.inputs[0]!r}")
    imp.alias(node.outputs[0], parts[k])


@_converter("Expand")
def _expand(imp: Importer, node: OnnxNode):
    shape = imp.shape(node.inputs[0])
    target = imp.const_input(node, 1, "shape")
    target = tuple(int(d) for d in np.asarray(target).reshape(-1))
    try:
        out = tuple(np.broadcast_shapes(shape, target))
    except ValueError:
        node.fail(f"input shape {shape} does not broadcast with the shape {target}")
    if out == shape:
        imp.alias(node.outputs[0], node.inputs[0])
        return
    imp.emit(node, "expand", [_x(imp, node)], node.outputs[0], shape=out)


#: ONNX element types a computed tensor may be cast to, as the graph's dtypes.
_CAST_TYPES = dict(ELEM_TYPES)


@_converter("Cast", "CastLike")
def _cast(imp: Importer, node: OnnxNode):
    dtype = imp.graph.tensors[imp.tensor(node, node.inputs[0])].dtype
    if node.op == "Cast":
        to = int(node.attrs.get("to", 0))
        target = _CAST_TYPES.get(to)
        if target is None:
            node.fail(f"Cast of the computed {dtype} tensor {node.inputs[0]!r} to "
                      f"{elem_type_name(to)} is not supported; vdla casts to "
                      f"{', '.join(elem_type_name(t) for t in _CAST_TYPES)}")
    else:
        like = np.dtype(imp.const(node.inputs[1]).dtype) if node.inputs[1] in imp.consts \
            else np.dtype(imp.graph.tensors[imp.names[node.inputs[1]]].dtype)
        target = "bool" if like == np.bool_ else str(like)
        if target not in _CAST_TYPES.values():
            node.fail(f"CastLike to {like} is not supported")
    if target == dtype:
        imp.alias(node.outputs[0], node.inputs[0])
        return
    imp.emit(node, "cast", [_x(imp, node)], node.outputs[0], dtype=target)


def _operand(imp: Importer, node: OnnxNode, k: int, dtype: str | None) -> str:
    """Input `k`; a constant is made a graph constant of `dtype` (the computed input's)."""
    name = node.inputs[k]
    value = imp.const(name)
    if value is not None and dtype is not None and value.dtype != np.dtype(
            "bool" if dtype == "bool" else dtype):
        return imp.materialize(f"{name}_{dtype}", value.astype(dtype), node, derived=True)
    return imp.tensor(node, name)


def _computed_dtype(imp: Importer, node: OnnxNode, ks) -> str | None:
    for k in ks:
        if node.inputs[k] in imp.names:
            return imp.graph.tensors[imp.names[node.inputs[k]]].dtype
    return None


_BINARY = {"Sub": "sub", "Div": "div", "Pow": "pow", "Equal": "equal", "Less": "less",
           "Greater": "greater"}


@_converter(*_BINARY)
def _binary(imp: Importer, node: OnnxNode):
    if node.op == "Pow":
        # Pow allows an exponent of another type than the base: cast it to the base's.
        a = _operand(imp, node, 0, None)
        b = _operand(imp, node, 1, imp.graph.tensors[a].dtype)
        if imp.graph.tensors[b].dtype != imp.graph.tensors[a].dtype:
            b = imp.emit(node, "cast", [b], dtype=imp.graph.tensors[a].dtype)
    else:
        dtype = _computed_dtype(imp, node, (0, 1))
        a, b = _operand(imp, node, 0, dtype), _operand(imp, node, 1, dtype)
    imp.emit(node, _BINARY[node.op], [a, b], node.outputs[0])


@_converter("Not")
def _not(imp: Importer, node: OnnxNode):
    # not x == (x == False): a computed boolean mask inverted.
    x = _x(imp, node)
    if imp.graph.tensors[x].dtype != "bool":
        node.fail(f"input {node.inputs[0]!r} is {imp.graph.tensors[x].dtype}; Not takes bool")
    false = imp.materialize(f"{node.name}_false", np.zeros((), np.bool_), node, derived=True)
    imp.emit(node, "equal", [x, false], node.outputs[0])


_UNARY = {"Sqrt": "sqrt", "Erf": "erf", "Tanh": "tanh", "Exp": "exp", "Neg": "neg"}


@_converter(*_UNARY)
def _unary(imp: Importer, node: OnnxNode):
    if node.op != "Neg":
        _unary_float_input(imp, node)
    imp.emit(node, _UNARY[node.op], [_x(imp, node)], node.outputs[0])


@_converter("Gelu")
def _gelu(imp: Importer, node: OnnxNode):
    approximate = node.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        node.fail(f"approximate {approximate!r} is not one of 'none', 'tanh'")
    _unary_float_input(imp, node)
    imp.emit(node, "gelu", [_x(imp, node)], node.outputs[0], approximate=approximate)


def _unary_float_input(imp: Importer, node: OnnxNode):
    dtype = imp.graph.tensors[_x(imp, node)].dtype
    if dtype != "float32":
        node.fail(f"input {node.inputs[0]!r} is {dtype}; vdla imports {node.op} on float32")


@_converter("Where")
def _where(imp: Importer, node: OnnxNode):
    dtype = _computed_dtype(imp, node, (1, 2))
    if dtype is None:
        value = np.asarray(imp.const(node.inputs[1]))
        dtype = "float32" if value.dtype.kind == "f" else str(value.dtype)
    imp.emit(node, "where", [_operand(imp, node, 0, "bool"), _operand(imp, node, 1, dtype),
                             _operand(imp, node, 2, dtype)], node.outputs[0])


_REDUCE = {"ReduceMean": ("reduce_mean", 18), "ReduceSum": ("reduce_sum", 13),
           "ReduceMax": ("reduce_max", 18)}


@_converter(*_REDUCE)
def _reduce(imp: Importer, node: OnnxNode):
    op, attr_until = _REDUCE[node.op]
    shape = imp.shape(node.inputs[0])
    axes = _axes_of(imp, node, 1, len(shape), attr_until)
    keepdims = bool(int(node.attrs.get("keepdims", 1)))
    if not axes:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            imp.alias(node.outputs[0], node.inputs[0])
            return
        axes = list(range(len(shape)))
    x = _x(imp, node)
    if op == "reduce_mean" and len(shape) == 4 and axes == [2, 3]:
        # The mean over H and W of an NCHW tensor: global average pooling.
        if keepdims:
            imp.emit(node, "global_avg_pool2d", [x], node.outputs[0])
        else:
            pooled = imp.emit(node, "global_avg_pool2d", [x])
            imp.emit(node, "reshape", [pooled], node.outputs[0], shape=shape[:2])
        return
    imp.emit(node, op, [x], node.outputs[0], axes=tuple(axes), keepdims=keepdims)
