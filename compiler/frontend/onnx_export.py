"""Export float graphs of the compiler's IR as ONNX models.

`to_onnx(graph, opset=13)` maps every float operator of `vdla.compiler.ir.ops` to ONNX
(a conv2d with fused bias, residual and activation becomes Conv, then Add, then Relu or
Clip; a dense becomes Gemm(transB=1) and the same tail) and returns a checked
`onnx.ModelProto` that onnxruntime runs. `save_onnx(graph, path)` writes one to disk.

The operators of transformers (`vdla.compiler.ir.ops_sequence`) map to their ONNX
namesakes (Gather, Slice, Expand, Where, Cast, Sub, Div, Erf, Reduce*, ...), with token
ids and masks as int64 or bool tensors; ``layer_norm`` is LayerNormalization from opset
17 and written out (ReduceMean, Sub, Mul, Sqrt, Div) before it; ``gelu`` (and a dense
layer's "gelu" / "gelu_tanh" activation) is Gelu from opset 20 and written out with Erf
or Tanh before it, as torch's exporters write them; the fused ``attention`` is written
out as MatMul(q, k^T), Mul by its scale, Add of the mask and of a constant causal mask
(-inf above the diagonal), Softmax and MatMul. An operator the opset lacks is refused
with the opset it needs.

Quantized graphs (integer operators, scales) and packed layouts have no faithful plain
ONNX form here; they are refused with an error naming the node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

import vdla
from vdla._fileio import atomic_write
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node

__all__ = ["OnnxExportError", "save_onnx", "to_onnx"]

#: Opsets `to_onnx` writes (the range the importer is tested on).
MIN_OPSET, MAX_OPSET = 7, 21
#: The IR version written: 8 unless the opset needs a newer one. onnxruntime reads up to
#: 13, and onnx 1.23 would write 14 by default.
IR_VERSION = 8


class OnnxExportError(ValueError):
    """A graph that has no ONNX form here: the message names the node or tensor."""


def to_onnx(graph: Graph, *, opset: int = 13):
    """The ONNX model (`onnx.ModelProto`) of the float graph `graph`, in the default
    domain at `opset` (7 to 21). Tensor names are the graph's; inputs and outputs keep
    their order. Raises `OnnxExportError` for quantized or integer operators, scaled or
    packed tensors, and for operators the opset cannot express; the model passes
    `onnx.checker.check_model`."""

    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise OnnxExportError(f"opset {opset!r} is not supported; to_onnx writes opsets "
                              f"{MIN_OPSET} to {MAX_OPSET}")
    graph.validate()
    exporter = _Exporter(graph, opset)
    for node in graph.nodes():
        exporter.node(node)
    outputs = []
    for name in graph.outputs:
        t = graph.tensors[name]
        if t.is_constant:
            exporter.initializer(name)
        outputs.append(helper.make_tensor_value_info(name, _elem_type(t.dtype), t.shape))
    inputs = [helper.make_tensor_value_info(n, _elem_type(graph.tensors[n].dtype),
                                            graph.tensors[n].shape) for n in graph.inputs]
    proto = helper.make_graph(exporter.nodes, graph.name or "vdla", inputs, outputs,
                              initializer=list(exporter.initializers.values()))
    opset_ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(proto, opset_imports=opset_ids, producer_name="vdla",
                              producer_version=vdla.__version__)
    model.ir_version = max(IR_VERSION, helper.find_min_ir_version_for(opset_ids))
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise OnnxExportError(f"the ONNX model of graph {graph.name!r} does not check: "
                              f"{exc}") from None
    return model


def save_onnx(graph: Graph, path: str | os.PathLike, *, opset: int = 13) -> Path:
    """Export `graph` (see `to_onnx`) and write it to `path` atomically; returns the path."""
    return atomic_write(path, to_onnx(graph, opset=opset).SerializeToString())


# --- the exporter ------------------------------------------------------------------------

#: Element types a float graph's tensors may have: float32 values, and integer or bool
#: token ids, masks and shapes (never the int8 of quantized graphs).
_PLAIN_DTYPES = ("float32", "int64", "int32", "bool")


def _elem_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class _Exporter:
    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.nodes: list = []
        self.initializers: dict[str, object] = {}
        self.taken = set(graph.tensors) | set(graph.nx.nodes)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def initializer(self, name: str) -> str:
        """Make graph constant `name` an ONNX initializer (once); returns its name."""
        if name not in self.initializers:
            t = self.graph.tensors[name]
            self.initializers[name] = numpy_helper.from_array(np.asarray(t.data), name)
        return name

    def constant(self, base: str, value) -> str:
        """A new initializer holding `value` (shapes, pads, clip bounds)."""
        name = self.fresh(base)
        self.initializers[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    def value(self, name: str) -> str:
        if name and self.graph.tensors[name].is_constant:
            return self.initializer(name)
        return name

    def emit(self, op_type: str, inputs: list[str], output: str, name: str, **attrs) -> str:
        # Trailing absent optional inputs are left out; inner ones stay "".
        while inputs and not inputs[-1]:
            inputs = inputs[:-1]
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=self.fresh(name),
                                           **attrs))
        return output

    def check(self, node: Node):
        for name in [*node.inputs, *node.outputs]:
            if not name:
                continue
            t = self.graph.tensors[name]
            if t.layout is not None:
                raise OnnxExportError(f"node {node.name!r} ({node.op}): tensor {name!r} has the "
                                      f"packed layout {t.layout!r}; to_onnx exports plain "
                                      "layouts (NCHW, OIHW)")
            if t.scale is not None:
                raise OnnxExportError(f"node {node.name!r} ({node.op}): tensor {name!r} is "
                                      "quantized (it has a scale); to_onnx exports float graphs")
            if t.dtype not in _PLAIN_DTYPES:
                raise OnnxExportError(f"node {node.name!r} ({node.op}): tensor {name!r} is "
                                      f"{t.dtype}; to_onnx exports float32 graphs (with "
                                      "int64, int32 or bool ids, masks and shapes)")

    def node(self, node: Node):
        fn = _EXPORTERS.get(node.op)
        if fn is None:
            raise OnnxExportError(f"node {node.name!r}: op {node.op!r} has no ONNX export; "
                                  f"to_onnx exports the float ops {', '.join(sorted(_EXPORTERS))}"
                                  " (quantize the graph after exporting, not before)")
        self.check(node)
        fn(self, node)

    def tail(self, node: Node, y: str, residual: str):
        """The fused residual add and activation of conv2d/dense, writing the node's output."""
        out = node.outputs[0]
        act = node.attrs.get("activation")
        if residual:
            y = self.emit("Add", [y, self.value(residual)],
                          out if act is None else self.fresh(f"{out}_sum"), f"{node.name}_add")
        if act == "relu":
            self.emit("Relu", [y], out, f"{node.name}_relu")
        elif act in ("gelu", "gelu_tanh"):
            self.gelu(node, y, out, "tanh" if act == "gelu_tanh" else "none")
        elif act == "clip":
            self.clip(node, y, out, node.attrs.get("clip_min"), node.attrs.get("clip_max"),
                      f"{node.name}_clip")

    def need(self, node: Node, opset: int, what: str):
        if self.opset < opset:
            raise OnnxExportError(f"node {node.name!r} ({node.op}): {what} needs opset "
                                  f"{opset} or later; exporting at opset {self.opset}")

    def scalar(self, node: Node, what: str, value: float) -> str:
        return self.constant(f"{node.name}_{what}", np.float32(value))

    def gelu(self, node: Node, x: str, out: str, approximate: str):
        """GELU of `x` into `out`: opset 20's Gelu, else written out with Erf (or Tanh),
        as torch's exporters write it before opset 20."""
        if self.opset >= 20:
            self.emit("Gelu", [x], out, f"{node.name}_gelu", approximate=approximate)
            return
        t = self.fresh(f"{out}_gelu")
        if approximate == "tanh":
            cube = self.emit("Mul", [self.emit("Mul", [x, x], f"{t}_sq", f"{node.name}_sq"), x],
                             f"{t}_cube", f"{node.name}_cube")
            inner = self.emit("Add", [x, self.emit("Mul", [cube, self.scalar(node, "c",
                                                                            0.044715)],
                                                   f"{t}_cubec", f"{node.name}_cubec")],
                              f"{t}_inner", f"{node.name}_inner")
            inner = self.emit("Mul", [inner, self.scalar(node, "k", np.sqrt(2 / np.pi))],
                              f"{t}_scaled", f"{node.name}_scaled")
            core = self.emit("Tanh", [inner], f"{t}_tanh", f"{node.name}_tanh")
        else:
            self.need(node, 9, "GELU (Erf)")
            scaled = self.emit("Div", [x, self.scalar(node, "sqrt2", np.sqrt(2.0))],
                               f"{t}_div", f"{node.name}_div")
            core = self.emit("Erf", [scaled], f"{t}_erf", f"{node.name}_erf")
        one_plus = self.emit("Add", [core, self.scalar(node, "one", 1.0)], f"{t}_add",
                             f"{node.name}_add1")
        half_x = self.emit("Mul", [x, self.scalar(node, "half", 0.5)], f"{t}_half",
                           f"{node.name}_half")
        self.emit("Mul", [half_x, one_plus], out, f"{node.name}_mul")

    def axes(self, node: Node, rank: int) -> list[int]:
        return [int(a) % rank for a in node.attrs["axes"]]

    def clip(self, node: Node, x: str, out: str, lo, hi, name: str):
        if self.opset < 11:
            attrs = {}
            if lo is not None:
                attrs["min"] = float(lo)
            if hi is not None:
                attrs["max"] = float(hi)
            self.emit("Clip", [x], out, name, **attrs)
            return
        bounds = [self.constant(f"{node.name}_{what}", np.float32(v)) if v is not None else ""
                  for what, v in (("min", lo), ("max", hi))]
        self.emit("Clip", [x, *bounds], out, name)


_EXPORTERS: dict[str, Callable[[_Exporter, Node], None]] = {}


def _exporter(*ops: str):
    def register(fn):
        for op in ops:
            _EXPORTERS[op] = fn
        return fn
    return register


def _fused_output(ex: _Exporter, node: Node) -> str:
    # The core op writes the node's output unless a residual add or activation follows.
    if node.input(3) or node.attrs.get("activation") is not None:
        return ex.fresh(f"{node.outputs[0]}_pre")
    return node.outputs[0]


@_exporter("conv2d")
def _conv2d(ex: _Exporter, node: Node):
    a = node.attrs
    w = ex.graph.tensors[node.inputs[1]]
    y = ex.emit("Conv", [ex.value(node.inputs[0]), ex.value(node.inputs[1]),
                         ex.value(node.input(2))], _fused_output(ex, node), node.name,
                kernel_shape=list(w.shape[2:]), strides=list(a["strides"]),
                pads=list(a["pads"]), dilations=list(a["dilations"]), group=int(a["groups"]))
    ex.tail(node, y, node.input(3))


@_exporter("dense")
def _dense(ex: _Exporter, node: Node):
    bias = ex.value(node.input(2))
    if not bias and ex.opset < 11:          # Gemm's C is optional from opset 11 on
        rows = ex.graph.tensors[node.inputs[1]].shape[0]
        bias = ex.constant(f"{node.name}_bias", np.zeros(rows, np.float32))
    y = ex.emit("Gemm", [ex.value(node.inputs[0]), ex.value(node.inputs[1]), bias],
                _fused_output(ex, node), node.name, transB=1)
    ex.tail(node, y, node.input(3))


def _rank(graph: Graph, node: Node) -> int:
    return len(graph.tensors[node.inputs[0]].shape)


def _axis(axis, rank: int) -> int:
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def _simple(op_type: str, attrs: Callable[[Node, Graph], dict] = lambda node, graph: {},
            opset: int = MIN_OPSET):
    """An op that is one ONNX operator on the same inputs (from `opset` on)."""
    def export(ex: _Exporter, node: Node):
        ex.need(node, opset, op_type)
        ex.emit(op_type, [ex.value(i) for i in node.inputs], node.outputs[0], node.name,
                **attrs(node, ex.graph))
    return export


_EXPORTERS.update({
    "matmul": _simple("MatMul"),
    "batch_norm": _simple("BatchNormalization",
                          lambda n, g: {"epsilon": float(n.attrs["epsilon"])}),
    "relu": _simple("Relu"),
    "add": _simple("Add"),
    "mul": _simple("Mul"),
    "global_avg_pool2d": _simple("GlobalAveragePool"),
    # Negative axes need opset 11; the rank makes them non-negative for every opset.
    "flatten": _simple("Flatten", lambda n, g: {"axis": _axis(n.attrs["axis"], _rank(g, n))}),
    "concat": _simple("Concat", lambda n, g: {"axis": _axis(n.attrs["axis"], _rank(g, n))}),
    "lrn": _simple("LRN", lambda n, g: {"size": int(n.attrs["size"]),
                                     "alpha": float(n.attrs["alpha"]),
                                     "beta": float(n.attrs["beta"]),
                                     "bias": float(n.attrs["bias"])}),
    "transpose": _simple("Transpose", lambda n, g: {"perm": list(n.attrs["perm"])}
                         if n.attrs["perm"] else {}),
})


@_exporter("clip")
def _clip(ex: _Exporter, node: Node):
    ex.clip(node, ex.value(node.inputs[0]), node.outputs[0], node.attrs["min"],
            node.attrs["max"], node.name)


@_exporter("max_pool2d", "avg_pool2d")
def _pool(ex: _Exporter, node: Node):
    a = node.attrs
    attrs = dict(kernel_shape=list(a["kernel"]), strides=list(a["strides"]), pads=list(a["pads"]))
    if a["ceil_mode"]:
        if ex.opset < 10:
            raise OnnxExportError(f"node {node.name!r} ({node.op}): ceil_mode needs opset 10 or "
                                  f"later; exporting at opset {ex.opset}")
        attrs["ceil_mode"] = 1
    if node.op == "avg_pool2d":
        attrs["count_include_pad"] = int(bool(a["count_include_pad"]))
    ex.emit("MaxPool" if node.op == "max_pool2d" else "AveragePool",
            [ex.value(node.inputs[0])], node.outputs[0], node.name, **attrs)


@_exporter("reshape")
def _reshape(ex: _Exporter, node: Node):
    # The recorded output shape, fully resolved (no -1, no 0 to copy).
    shape = np.array(ex.graph.tensors[node.outputs[0]].shape, np.int64)
    ex.emit("Reshape", [ex.value(node.inputs[0]), ex.constant(f"{node.name}_shape", shape)],
            node.outputs[0], node.name)


@_exporter("softmax")
def _softmax(ex: _Exporter, node: Node):
    axis = int(node.attrs["axis"])
    rank = len(ex.graph.tensors[node.inputs[0]].shape)
    if ex.opset < 13 and axis % rank != rank - 1:
        # Softmax before opset 13 normalizes over all axes from `axis` on.
        raise OnnxExportError(f"node {node.name!r} (softmax): a softmax over axis {axis} of a "
                              f"rank-{rank} tensor needs opset 13 or later (opset {ex.opset}'s "
                              "Softmax normalizes over every axis from `axis` to the last)")
    ex.emit("Softmax", [ex.value(node.inputs[0])], node.outputs[0], node.name,
            axis=axis % rank if ex.opset < 13 else axis)


@_exporter("pad")
def _pad(ex: _Exporter, node: Node):
    pads, value = [int(p) for p in node.attrs["pads"]], float(node.attrs["value"])
    x = ex.value(node.inputs[0])
    if ex.opset < 11:
        ex.emit("Pad", [x], node.outputs[0], node.name, mode="constant", pads=pads,
                value=value)
        return
    ex.emit("Pad", [x, ex.constant(f"{node.name}_pads", np.array(pads, np.int64)),
                    ex.constant(f"{node.name}_value", np.float32(value))],
            node.outputs[0], node.name, mode="constant")


# --- transformers ------------------------------------------------------------------------

_EXPORTERS.update({
    "sub": _simple("Sub"),
    "div": _simple("Div"),
    "pow": _simple("Pow"),
    "sqrt": _simple("Sqrt"),
    "erf": _simple("Erf", opset=9),
    "tanh": _simple("Tanh"),
    "exp": _simple("Exp"),
    "neg": _simple("Neg"),
    "where": _simple("Where", opset=9),
    "less": _simple("Less", opset=9),
    "greater": _simple("Greater", opset=9),
    "equal": _simple("Equal", opset=11),          # Equal on floats: opset 11
    "gather": _simple("Gather", lambda n, g: {"axis": _axis(n.attrs["axis"],
                                                             len(g.tensors[n.inputs[0]].shape))}),
    "cast": _simple("Cast", lambda n, g: {"to": _elem_type(n.attrs["dtype"])}),
})


@_exporter("reduce_mean", "reduce_sum", "reduce_max")
def _reduce(ex: _Exporter, node: Node):
    op_type = {"reduce_mean": "ReduceMean", "reduce_sum": "ReduceSum",
               "reduce_max": "ReduceMax"}[node.op]
    axes = ex.axes(node, _rank(ex.graph, node))
    inputs = [ex.value(node.inputs[0])]
    attrs = {"keepdims": int(bool(node.attrs["keepdims"]))}
    # Axes became an input in opset 13 (ReduceSum) and 18 (the others); none: all axes.
    as_input = ex.opset >= (13 if node.op == "reduce_sum" else 18)
    if axes and as_input:
        inputs.append(ex.constant(f"{node.name}_axes", np.array(axes, np.int64)))
    elif axes:
        attrs["axes"] = axes
    ex.emit(op_type, inputs, node.outputs[0], node.name, **attrs)


@_exporter("layer_norm")
def _layer_norm(ex: _Exporter, node: Node):
    x, scale, bias = (ex.value(node.input(i)) for i in range(3))
    eps = float(node.attrs["epsilon"])
    out = node.outputs[0]
    if ex.opset >= 17:
        ex.emit("LayerNormalization", [x, scale, bias], out, node.name, axis=-1, epsilon=eps)
        return
    # Written out as torch's exporter writes it before opset 17: the mean and the biased
    # variance over the last axis.
    t = ex.fresh(f"{out}_ln")
    rank = _rank(ex.graph, node)

    def mean(v: str, what: str) -> str:
        return ex.emit("ReduceMean", [v], f"{t}_{what}", f"{node.name}_{what}",
                       axes=[rank - 1], keepdims=1)
    centered = ex.emit("Sub", [x, mean(x, "mean")], f"{t}_centered", f"{node.name}_sub")
    square = ex.emit("Mul", [centered, centered], f"{t}_square", f"{node.name}_square")
    std = ex.emit("Sqrt", [ex.emit("Add", [mean(square, "var"), ex.scalar(node, "eps", eps)],
                                   f"{t}_vareps", f"{node.name}_add_eps")],
                  f"{t}_std", f"{node.name}_sqrt")
    normed = ex.emit("Div", [centered, std], f"{t}_normed", f"{node.name}_div")
    if bias:
        scaled = ex.emit("Mul", [normed, scale], f"{t}_scaled", f"{node.name}_scale")
        ex.emit("Add", [scaled, bias], out, f"{node.name}_bias")
    else:
        ex.emit("Mul", [normed, scale], out, f"{node.name}_scale")


@_exporter("gelu")
def _gelu(ex: _Exporter, node: Node):
    ex.gelu(node, ex.value(node.inputs[0]), node.outputs[0], node.attrs["approximate"])


@_exporter("slice")
def _slice(ex: _Exporter, node: Node):
    a = node.attrs
    n = len(a["starts"])
    axes = list(a["axes"] or range(n))
    steps = list(a["steps"] or (1,) * n)
    x = ex.value(node.inputs[0])
    if ex.opset < 10:
        if any(st != 1 for st in steps):
            ex.need(node, 10, f"slicing with steps {tuple(steps)}")
        ex.emit("Slice", [x], node.outputs[0], node.name, starts=list(a["starts"]),
                ends=list(a["ends"]), axes=axes)
        return
    ex.emit("Slice", [x] + [ex.constant(f"{node.name}_{what}", np.array(v, np.int64))
                            for what, v in (("starts", a["starts"]), ("ends", a["ends"]),
                                            ("axes", axes), ("steps", steps))],
            node.outputs[0], node.name)


@_exporter("expand")
def _expand(ex: _Exporter, node: Node):
    ex.need(node, 8, "Expand")
    shape = np.array(ex.graph.tensors[node.outputs[0]].shape, np.int64)
    ex.emit("Expand", [ex.value(node.inputs[0]), ex.constant(f"{node.name}_shape", shape)],
            node.outputs[0], node.name)


@_exporter("attention")
def _attention(ex: _Exporter, node: Node):
    """The fused attention core written out: MatMul(q, k^T) * scale [+ mask] [+ the causal
    mask: -inf above the diagonal], Softmax over the keys, MatMul with v."""
    q, k, v, mask = (ex.value(node.input(i)) for i in range(4))
    t = ex.fresh(f"{node.outputs[0]}_attn")
    rank = len(ex.graph.tensors[node.inputs[1]].shape)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    kt = ex.emit("Transpose", [k], f"{t}_kt", f"{node.name}_kt", perm=perm)
    scores = ex.emit("MatMul", [q, kt], f"{t}_qk", f"{node.name}_qk")
    scores = ex.emit("Mul", [scores, ex.scalar(node, "scale", float(node.attrs["scale"]))],
                     f"{t}_scores", f"{node.name}_scale")
    if mask:
        scores = ex.emit("Add", [scores, mask], f"{t}_masked", f"{node.name}_mask")
    if node.attrs["causal"]:
        n_q = ex.graph.tensors[node.inputs[0]].shape[-2]
        n_k = ex.graph.tensors[node.inputs[1]].shape[-2]
        above = np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + (n_k - n_q)
        bias = ex.constant(f"{node.name}_causal",
                           np.where(above, -np.inf, 0.0).astype(np.float32))
        scores = ex.emit("Add", [scores, bias], f"{t}_causal", f"{node.name}_causal")
    axis = rank - 1 if ex.opset < 13 else -1
    probs = ex.emit("Softmax", [scores], f"{t}_probs", f"{node.name}_softmax", axis=axis)
    ex.emit("MatMul", [probs, v], node.outputs[0], node.name)
