"""Import ONNX models into the compiler's graph IR.

`from_onnx(path_or_model, input_shapes=None)` reads a model (a file path, its bytes, or an
`onnx.ModelProto`) and returns a validated `Graph` of the float operators of
`vdla.compiler.ops`. It covers the layer operators of image classifiers over ONNX opsets
7 to 21, as torch's legacy exporter (opsets 9-17) and its dynamo exporter (18+) write
them: Conv, BatchNormalization, Relu, Clip, Add, Mul, Sum, MaxPool, AveragePool,
GlobalAveragePool, ReduceMean over H and W, Gemm, MatMul, Flatten, Reshape, Transpose,
Concat, Softmax, Pad, LRN; Dropout and Identity disappear (their outputs alias their
inputs).

Exporters also emit small computations on shapes (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape`` for ``x.view(x.size(0), -1)``). Every tensor here has a static shape
(symbolic dimensions become 1 unless `input_shapes` says otherwise), so any node whose
inputs are all constants, or a ``Shape`` of a computed tensor, is evaluated at import time
with numpy and never reaches the graph.

Every failure is an `OnnxImportError` (a ValueError) naming the file, or the node (its
name, index and op type) and the attribute or input at fault.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vdla.compiler.graph import DTYPES, Graph, GraphError

__all__ = ["OnnxImportError", "from_onnx", "supported_ops"]

#: The oldest default-domain opset the importer understands (opset 7 brought numpy
#: broadcasting to Add/Mul/Gemm; older models use a different convention).
MIN_OPSET = 7


class OnnxImportError(ValueError):
    """An ONNX model vdla cannot import: the message says which node or file and why."""


def from_onnx(path_or_model, *, input_shapes: dict[str, tuple] | None = None) -> Graph:
    """Import an ONNX model as a float `Graph`.

    path_or_model : a file path (str or os.PathLike), the serialized model (bytes), or an
        `onnx.ModelProto`.
    input_shapes : optional ``{input name: shape}`` for inputs with symbolic or missing
        dimensions (a dimension without a fixed value otherwise becomes 1); a dimension the
        model fixes must agree.

    Returns a validated graph whose tensors keep their ONNX names, whose outputs are the
    model's in ONNX order, and whose ``metadata["onnx"]`` holds the opset and producer.
    Raises `OnnxImportError` for an unreadable file, an unsupported operator or attribute.
    """
    model, source = _load(path_or_model)
    return _Importer(model, source, input_shapes).run()


def supported_ops() -> list[str]:
    """The ONNX op types `from_onnx` accepts (some only on constant inputs), sorted."""
    return sorted(set(_CONVERTERS) | set(_FOLDERS))


# --- loading -------------------------------------------------------------------------------

def _load(path_or_model):
    """(ModelProto, description of where it came from) for any accepted argument."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, "the given ModelProto"
    if isinstance(path_or_model, (bytes, bytearray, memoryview)):
        data, source, folder = bytes(path_or_model), "the given bytes", None
    elif isinstance(path_or_model, (str, os.PathLike)):
        path = Path(path_or_model)
        source, folder = str(path), path.parent
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise OnnxImportError(f"cannot read ONNX model {source!r}: "
                                  f"{exc.strerror or exc}") from None
    else:
        raise OnnxImportError("from_onnx takes a path, bytes or an onnx.ModelProto, not "
                              f"{type(path_or_model).__name__}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OnnxImportError(f"cannot parse {source!r} as an ONNX model ({len(data)} bytes; "
                              f"truncated or not ONNX: {exc})") from None
    # Arbitrary bytes sometimes decode as a protobuf message by chance: insist on the
    # parts every ONNX model has.
    if not model.HasField("graph") or not model.opset_import or not model.graph.output:
        raise OnnxImportError(f"cannot parse {source!r} as an ONNX model ({len(data)} bytes): "
                              "it has no graph, outputs or opset (truncated or not ONNX)")
    if folder is not None and _uses_external_data(model):
        from onnx.external_data_helper import load_external_data_for_model
        try:
            load_external_data_for_model(model, str(folder))
        except (OSError, ValueError) as exc:
            raise OnnxImportError(f"cannot read the external data of {source!r}: {exc}") from None
    return model, source


def _uses_external_data(model) -> bool:
    from onnx import TensorProto
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


# --- the importer ----------------------------------------------------------------------------

@dataclass
class _OnnxNode:
    """An ONNX node with its attributes decoded to Python values."""

    index: int
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]

    def where(self) -> str:
        return f"node {self.name!r} (#{self.index}, {self.op})"

    def fail(self, message: str):
        raise OnnxImportError(f"{self.where()}: {message}")

    def input(self, i: int) -> str:
        return self.inputs[i] if i < len(self.inputs) else ""


def _decode_attrs(proto) -> dict[str, Any]:
    from onnx import AttributeProto, helper, numpy_helper
    attrs = {}
    for a in proto.attribute:
        if a.type == AttributeProto.TENSOR:
            value = numpy_helper.to_array(a.t)
        else:
            value = helper.get_attribute_value(a)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif a.type in (AttributeProto.INTS, AttributeProto.FLOATS):
                value = list(value)
        attrs[a.name] = value
    return attrs


_ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64"}


class _Importer:
    def __init__(self, model, source: str, input_shapes):
        self.model = model
        self.source = source
        self.input_shapes = dict(input_shapes or {})
        self.opset = self._opset()
        self.graph = Graph(model.graph.name or "onnx_model")
        self.consts: dict[str, np.ndarray] = {}      # ONNX name -> value known at import
        self.names: dict[str, str] = {}              # ONNX name -> graph tensor name
        self.const_tensors: dict[str, str] = {}      # ONNX name -> graph constant's name
        g = model.graph
        self.reserved = ({i.name for i in g.input} | {t.name for t in g.initializer}
                         | {o for n in g.node for o in n.output})
        self.used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        self.preferred = self._preferred_names()

    def _opset(self) -> int:
        versions = [o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")]
        if not versions:
            raise OnnxImportError(f"{self.source!r} imports no default-domain (ai.onnx) opset; "
                                  f"it imports {[o.domain for o in self.model.opset_import]}")
        if versions[0] < MIN_OPSET:
            raise OnnxImportError(f"{self.source!r} uses opset {versions[0]}; vdla imports "
                                  f"opset {MIN_OPSET} and later (tested up to 21)")
        return int(versions[0])

    def _preferred_names(self) -> dict[str, str]:
        # An Identity/Dropout in front of a graph output would leave the output named after
        # the aliased tensor; name the tensor after the output instead.
        outputs = {o.name for o in self.model.graph.output}
        fixed = {i.name for i in self.model.graph.input} | \
            {t.name for t in self.model.graph.initializer} | outputs
        preferred: dict[str, str] = {}
        for node in reversed(self.model.graph.node):
            if node.op_type not in ("Identity", "Dropout") or not node.input or \
                    node.domain not in ("", "ai.onnx"):
                continue
            src, dst = node.input[0], node.output[0]
            if (dst in outputs or dst in preferred) and src not in fixed and \
                    src not in preferred:
                preferred[src] = preferred.get(dst, dst)
        return preferred

    # --- tensors ------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """A graph tensor/node name starting with `base`, clear of every ONNX name."""
        base = base or "t"
        name, k = self.graph.unique_name(base), 0
        while name in self.reserved:
            k += 1
            name = self.graph.unique_name(f"{base}_{k}")
        return name

    def output_name(self, onnx_name: str) -> str:
        want = self.preferred.get(onnx_name, onnx_name)
        if want and want not in self.graph.tensors and want not in self.graph.nx:
            return want
        return self.graph.unique_name(want or "t")

    def known(self, onnx_name: str) -> bool:
        return onnx_name in self.consts or onnx_name in self.names

    def const(self, onnx_name: str) -> np.ndarray | None:
        return self.consts.get(onnx_name) if onnx_name else None

    def shape(self, onnx_name: str) -> tuple[int, ...]:
        if onnx_name in self.consts:
            return tuple(self.consts[onnx_name].shape)
        return self.graph.tensors[self.names[onnx_name]].shape

    def tensor(self, node: _OnnxNode, onnx_name: str) -> str:
        """The graph tensor for an ONNX value; constants become graph constants (once)."""
        if onnx_name in self.names:
            return self.names[onnx_name]
        if onnx_name in self.consts:
            return self.materialize(onnx_name, self.consts[onnx_name], node)
        node.fail(f"reads {onnx_name!r}, which no earlier node produces and which is neither "
                  "a graph input nor an initializer")

    def materialize(self, onnx_name: str, value: np.ndarray, node: _OnnxNode | None, *,
                    derived: bool = False) -> str:
        """A graph constant holding `value`, named after `onnx_name`. The constant of an
        ONNX value is made once; a `derived` one (transposed or scaled weights) each time."""
        if not derived and onnx_name in self.const_tensors:
            return self.const_tensors[onnx_name]
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = value.astype(np.float32)
        elif value.dtype not in (np.int8, np.uint8, np.int32, np.int64):
            what = node.where() if node else "graph output"
            raise OnnxImportError(f"{what}: constant {onnx_name!r} has dtype {value.dtype}; "
                                  "graph constants are float32, int8, uint8, int32 or int64")
        base = self.preferred.get(onnx_name, onnx_name) or "const"
        free = base not in self.graph.tensors and base not in self.graph.nx
        # An ONNX value keeps its own name; a derived one must not take a later value's.
        name = base if free and not derived else self.fresh(base)
        name = self.graph.add_constant(name, value)
        if not derived:
            self.const_tensors[onnx_name] = name
        return name

    def emit(self, node: _OnnxNode, op: str, inputs: list[str], out: str | None = None,
             **attrs) -> str:
        """Add graph op `op`; `out` is the ONNX output it defines (None: an intermediate).
        Returns the graph name of the output."""
        name = self.output_name(out) if out else self.fresh(f"{node.name}_{op}")
        try:
            self.graph.add_node(op, inputs, [name], name=self.fresh(node.name), **attrs)
        except GraphError as exc:
            node.fail(str(exc))
        if out:
            self.names[out] = name
        return name

    def alias(self, out: str, source: str):
        if source in self.consts:
            self.consts[out] = self.consts[source]
        else:
            self.names[out] = self.names[source]

    # --- the walk ----------------------------------------------------------------------------

    def run(self) -> Graph:
        g = self.model.graph
        if len(g.sparse_initializer):
            raise OnnxImportError(f"{self.source!r} has sparse initializers, which vdla does "
                                  "not import")
        from onnx import numpy_helper
        for init in g.initializer:
            try:
                self.consts[init.name] = numpy_helper.to_array(init)
            except (ValueError, TypeError, OSError) as exc:
                raise OnnxImportError(f"cannot read initializer {init.name!r} of "
                                      f"{self.source!r} (truncated, or external data not "
                                      f"loaded): {exc}") from None
        self._add_inputs()
        for index, proto in enumerate(g.node):
            name = proto.name or f"{proto.op_type.lower()}_{index}"
            node = _OnnxNode(index, proto.op_type, name, list(proto.input), list(proto.output),
                             _decode_attrs(proto))
            if proto.domain not in ("", "ai.onnx"):
                node.fail(f"op domain {proto.domain!r} is not supported; vdla imports the "
                          f"default ONNX domain: {', '.join(supported_ops())}")
            self._convert(node)
        outputs = []
        for out in g.output:
            if out.name in self.names:
                outputs.append(self.names[out.name])
            elif out.name in self.consts:
                outputs.append(self.materialize(out.name, self.consts[out.name], None))
            else:
                raise OnnxImportError(f"graph output {out.name!r} of {self.source!r} is not "
                                      "produced by any node (is the model truncated?)")
        self.graph.set_outputs(outputs)
        self.graph.prune()
        self.graph.metadata["onnx"] = {"opset": self.opset,
                                       "producer": self.model.producer_name,
                                       "producer_version": self.model.producer_version}
        try:
            return self.graph.validate()
        except GraphError as exc:
            raise OnnxImportError(f"the graph imported from {self.source!r} is not valid: "
                                  f"{exc}") from None

    def _add_inputs(self):
        g = self.model.graph
        names = [i.name for i in g.input if i.name not in self.consts]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            raise OnnxImportError(f"input_shapes names {unknown}, which are not inputs of "
                                  f"{self.source!r}; its inputs are {names}")
        for value in g.input:
            if value.name in self.consts:
                continue                      # an input with a default: a constant here
            if not value.type.HasField("tensor_type"):
                raise OnnxImportError(f"graph input {value.name!r} is not a tensor")
            ttype = value.type.tensor_type
            dtype = _ELEM_TYPES.get(ttype.elem_type)
            if dtype is None:
                from onnx import helper
                raise OnnxImportError(
                    f"graph input {value.name!r} has element type "
                    f"{helper.tensor_dtype_to_string(ttype.elem_type)}; vdla imports float32, "
                    "int8, uint8, int32 and int64 inputs")
            fixed = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                     for d in ttype.shape.dim] if ttype.HasField("shape") else None
            given = self.input_shapes.get(value.name)
            if given is not None:
                given = tuple(int(d) for d in given)
                if min(given, default=1) < 1:
                    raise OnnxImportError(f"input_shapes[{value.name!r}] = {given} must have "
                                          "positive dimensions")
                if fixed is not None and (len(fixed) != len(given) or any(
                        f is not None and f != d for f, d in zip(fixed, given))):
                    model_shape = tuple(f if f is not None else "?" for f in fixed)
                    raise OnnxImportError(f"input_shapes[{value.name!r}] = {given} does not fit "
                                          f"the model's input shape {model_shape}")
                shape = given
            elif fixed is None:
                raise OnnxImportError(f"graph input {value.name!r} has no shape in the model; "
                                      f"pass input_shapes={{{value.name!r}: (...)}}")
            else:
                shape = tuple(f if f is not None else 1 for f in fixed)
            name = self.output_name(value.name)
            self.graph.add_input(name, shape, dtype)
            self.names[value.name] = name

    def _convert(self, node: _OnnxNode):
        for i in node.inputs:
            if i and not self.known(i):
                node.fail(f"reads {i!r}, which no earlier node produces and which is neither a "
                          "graph input nor an initializer (nodes must be in topological order)")
        folder = _FOLDERS.get(node.op)
        meta_only = _META_INPUTS.get(node.op, ())
        if folder is not None and all(not i or i in self.consts or k in meta_only
                                      for k, i in enumerate(node.inputs)):
            args = [self._fold_arg(node, k, i) for k, i in enumerate(node.inputs)]
            try:
                results = folder(self, node, args)
            except OnnxImportError:
                raise
            except (ValueError, IndexError, TypeError, KeyError) as exc:
                node.fail(f"cannot evaluate it on its constant inputs: {exc}")
            for out, value in zip(node.outputs, results):
                if out:
                    self.consts[out] = np.asarray(value)
            return
        converter = _CONVERTERS.get(node.op)
        if converter is None:
            if folder is not None:
                computed = [i for i in node.inputs if i and i not in self.consts]
                node.fail(f"vdla imports {node.op} only on constant inputs (shape "
                          f"computations), but input {computed[0]!r} is computed by the model")
            node.fail(f"op type {node.op!r} is not supported; vdla imports "
                      f"{', '.join(supported_ops())}")
        converter(self, node)

    def _fold_arg(self, node, k, name):
        if not name:
            return None
        if name in self.consts:
            return self.consts[name]
        # An input of which only the shape and dtype count: a zero-strided stand-in.
        dtype = np.dtype(DTYPES[self.graph.tensors[self.names[name]].dtype])
        return np.broadcast_to(np.zeros((), dtype), self.shape(name))

    # --- helpers for converters -----------------------------------------------------------

    def unused(self, node: _OnnxNode, k: int, what: str):
        """Fail when optional output `k` of `node` is read by anything."""
        out = node.outputs[k] if k < len(node.outputs) else ""
        if out and out in self.used:
            node.fail(f"its output {k} ({what}, {out!r}) is used; vdla imports inference "
                      "graphs where it is not")

    def const_input(self, node: _OnnxNode, k: int, what: str) -> np.ndarray | None:
        """The value of optional input `k`, which must be a constant when present."""
        name = node.input(k)
        if not name:
            return None
        if name not in self.consts:
            node.fail(f"input {k} ({what}, {name!r}) must be a constant; it is computed by the "
                      "model")
        return self.consts[name]


# --- converters ------------------------------------------------------------------------------

_CONVERTERS: dict[str, Callable[[_Importer, _OnnxNode], None]] = {}


def _converter(*ops: str):
    def register(fn):
        for op in ops:
            _CONVERTERS[op] = fn
        return fn
    return register


def _ints(node: _OnnxNode, key: str, default, n: int | None = None) -> tuple[int, ...]:
    value = node.attrs.get(key, default)
    value = tuple(int(v) for v in value)
    if n is not None and len(value) != n:
        node.fail(f"attribute {key}={list(value)} must have {n} values for a 2-D window")
    return value


def _spatial_input(imp: _Importer, node: _OnnxNode) -> tuple[int, ...]:
    shape = imp.shape(node.inputs[0])
    if len(shape) != 4:
        node.fail(f"input {node.inputs[0]!r} must be 4-D (N, C, H, W), not shape {shape}; vdla "
                  "imports 2-D convolutions and pools only")
    return shape


def _window_pads(imp: _Importer, node: _OnnxNode, kernel, strides, dilations) -> tuple[int, ...]:
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
def _conv(imp: _Importer, node: _OnnxNode):
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
def _batch_norm(imp: _Importer, node: _OnnxNode):
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
def _relu(imp: _Importer, node: _OnnxNode):
    imp.emit(node, "relu", [imp.tensor(node, node.inputs[0])], node.outputs[0])


def _bound(value) -> float | None:
    # float32's extremes (ONNX's defaults for Clip's attributes) mean "unbounded".
    value = float(np.asarray(value).reshape(-1)[0])
    return None if math.isinf(value) or abs(value) >= 3.4e38 else value


@_converter("Clip")
def _clip(imp: _Importer, node: _OnnxNode):
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
def _eltwise(imp: _Importer, node: _OnnxNode):
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
def _pool(imp: _Importer, node: _OnnxNode):
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
def _global_avg_pool(imp: _Importer, node: _OnnxNode):
    _spatial_input(imp, node)
    imp.emit(node, "global_avg_pool2d", [imp.tensor(node, node.inputs[0])], node.outputs[0])


@_converter("ReduceMean")
def _reduce_mean(imp: _Importer, node: _OnnxNode):
    shape = imp.shape(node.inputs[0])
    if imp.opset < 18:
        axes = node.attrs.get("axes")
    else:
        axes = imp.const_input(node, 1, "axes")
    if axes is None or len(np.asarray(axes).reshape(-1)) == 0:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            imp.alias(node.outputs[0], node.inputs[0])
            return
        axes = list(range(len(shape)))
    axes = sorted(int(a) + len(shape) if int(a) < 0 else int(a)
                  for a in np.asarray(axes).reshape(-1))
    if len(shape) != 4 or axes != [2, 3]:
        node.fail(f"ReduceMean over axes {axes} of a shape {shape} tensor is not supported; "
                  "vdla imports the mean over the spatial axes [2, 3] of an NCHW tensor "
                  "(global average pooling)")
    x = imp.tensor(node, node.inputs[0])
    if int(node.attrs.get("keepdims", 1)):
        imp.emit(node, "global_avg_pool2d", [x], node.outputs[0])
    else:
        pooled = imp.emit(node, "global_avg_pool2d", [x])
        imp.emit(node, "reshape", [pooled], node.outputs[0], shape=shape[:2])


@_converter("Gemm")
def _gemm(imp: _Importer, node: _OnnxNode):
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
def _matmul(imp: _Importer, node: _OnnxNode):
    a, b = node.inputs[0], node.inputs[1]
    b_value = imp.const(b)
    if b_value is not None and b_value.ndim == 2 and a not in imp.consts and \
            len(imp.shape(a)) == 2:
        w = np.ascontiguousarray(b_value.T.astype(np.float32))
        imp.emit(node, "dense", [imp.tensor(node, a),
                                 imp.materialize(f"{b}_t", w, node, derived=True)],
                 node.outputs[0])
        return
    imp.emit(node, "matmul", [imp.tensor(node, a), imp.tensor(node, b)], node.outputs[0])


@_converter("Flatten")
def _flatten(imp: _Importer, node: _OnnxNode):
    imp.emit(node, "flatten", [imp.tensor(node, node.inputs[0])], node.outputs[0],
             axis=int(node.attrs.get("axis", 1)))


def _reshape_target(node: _OnnxNode, in_shape, target, allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's output shape: 0 copies the input's dimension (unless allowzero),
    -1 takes what is left."""
    target = [int(d) for d in np.asarray(target).reshape(-1)]
    out = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                node.fail(f"shape {target} copies dimension {i} (a 0), but the input has shape "
                          f"{tuple(in_shape)}")
            d = in_shape[i]
        elif d < -1:
            node.fail(f"shape {target} has {d}; dimensions are >= -1")
        out.append(d)
    total = int(np.prod(in_shape))
    if out.count(-1) > 1:
        node.fail(f"shape {target} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or total % known:
            node.fail(f"cannot reshape {tuple(in_shape)} ({total} elements) to {target}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != total:
        node.fail(f"cannot reshape {tuple(in_shape)} ({total} elements) to {target} "
                  f"(resolved to {tuple(out)})")
    return tuple(out)


def _reshape_shape_arg(imp: _Importer, node: _OnnxNode):
    if "shape" in node.attrs and len(node.inputs) < 2:      # Reshape-1's attribute
        return node.attrs["shape"]
    return imp.const_input(node, 1, "shape")


@_converter("Reshape")
def _reshape(imp: _Importer, node: _OnnxNode):
    target = _reshape_shape_arg(imp, node)
    if target is None:
        node.fail("has no target shape")
    shape = _reshape_target(node, imp.shape(node.inputs[0]), target,
                            bool(node.attrs.get("allowzero", 0)))
    imp.emit(node, "reshape", [imp.tensor(node, node.inputs[0])], node.outputs[0], shape=shape)


@_converter("Transpose")
def _transpose(imp: _Importer, node: _OnnxNode):
    perm = tuple(int(p) for p in node.attrs.get("perm", ()))
    imp.emit(node, "transpose", [imp.tensor(node, node.inputs[0])], node.outputs[0], perm=perm)


@_converter("Concat")
def _concat(imp: _Importer, node: _OnnxNode):
    if "axis" not in node.attrs:
        node.fail("attribute axis is required")
    inputs = [imp.tensor(node, i) for i in node.inputs if i]
    imp.emit(node, "concat", inputs, node.outputs[0], axis=int(node.attrs["axis"]))


@_converter("Softmax")
def _softmax(imp: _Importer, node: _OnnxNode):
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
def _dropout(imp: _Importer, node: _OnnxNode):
    training = imp.const_input(node, 2, "training_mode") if imp.opset >= 12 else None
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        node.fail("training_mode=True (random dropout) is not supported; export in eval mode")
    imp.unused(node, 1, "mask")
    imp.alias(node.outputs[0], node.inputs[0])


@_converter("Identity")
def _identity(imp: _Importer, node: _OnnxNode):
    imp.alias(node.outputs[0], node.inputs[0])


@_converter("Cast")
def _cast(imp: _Importer, node: _OnnxNode):
    # A float-to-float cast of an activation changes nothing in a float32 graph.
    from onnx import TensorProto
    to = int(node.attrs.get("to", 0))
    if to != TensorProto.FLOAT or imp.graph.tensors[imp.names[node.inputs[0]]].dtype != "float32":
        node.fail(f"Cast of the computed tensor {node.inputs[0]!r} to element type {to} is not "
                  "supported; only float32 to float32")
    imp.alias(node.outputs[0], node.inputs[0])


@_converter("Pad")
def _pad(imp: _Importer, node: _OnnxNode):
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
def _lrn(imp: _Importer, node: _OnnxNode):
    if "size" not in node.attrs:
        node.fail("attribute size is required")
    imp.emit(node, "lrn", [imp.tensor(node, node.inputs[0])], node.outputs[0],
             size=int(node.attrs["size"]), alpha=float(node.attrs.get("alpha", 1e-4)),
             beta=float(node.attrs.get("beta", 0.75)), bias=float(node.attrs.get("bias", 1.0)))


# --- import-time evaluation of constant (shape) computations ----------------------------------

_FOLDERS: dict[str, Callable[[_Importer, _OnnxNode, list], list]] = {}
#: Inputs whose values these folders never read, only their (static) shape and dtype, so
#: they may be computed tensors.
_META_INPUTS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}


def _folder(*ops: str):
    def register(fn):
        for op in ops:
            _FOLDERS[op] = fn
        return fn
    return register


def _axes_arg(imp: _Importer, node: _OnnxNode, args, k: int = 1) -> list[int] | None:
    """Axes from the attribute (before opset 13) or from input `k` (13 and later)."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(args) > k and args[k] is not None:
        return [int(a) for a in np.asarray(args[k]).reshape(-1)]
    return None


@_folder("Constant")
def _f_constant(imp, node, args):
    a = node.attrs
    if "value" in a:
        return [a["value"]]
    if "value_float" in a:
        return [np.array(a["value_float"], np.float32)]
    if "value_floats" in a:
        return [np.array(a["value_floats"], np.float32)]
    if "value_int" in a:
        return [np.array(a["value_int"], np.int64)]
    if "value_ints" in a:
        return [np.array(a["value_ints"], np.int64)]
    node.fail(f"Constant with attribute(s) {sorted(a)} is not supported; vdla reads value, "
              "value_float(s) and value_int(s)")


@_folder("ConstantOfShape")
def _f_constant_of_shape(imp, node, args):
    value = node.attrs.get("value", np.zeros(1, np.float32))
    return [np.full([int(d) for d in args[0].reshape(-1)], value.reshape(-1)[0],
                    dtype=value.dtype)]


@_folder("Shape")
def _f_shape(imp, node, args):
    shape = np.array(args[0].shape, np.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return [shape[start:end]]


@_folder("Size")
def _f_size(imp, node, args):
    return [np.array(args[0].size, np.int64)]


@_folder("Identity")
def _f_identity(imp, node, args):
    return [args[0]]


@_folder("Gather")
def _f_gather(imp, node, args):
    return [np.take(args[0], args[1].astype(np.int64), axis=int(node.attrs.get("axis", 0)))]


@_folder("Unsqueeze")
def _f_unsqueeze(imp, node, args):
    axes = _axes_arg(imp, node, args)
    if axes is None:
        node.fail("has no axes")
    rank = args[0].ndim + len(axes)
    return [np.expand_dims(args[0], tuple(sorted(a % rank for a in axes)))]


@_folder("Squeeze")
def _f_squeeze(imp, node, args):
    axes = _axes_arg(imp, node, args)
    return [np.squeeze(args[0]) if axes is None else
            np.squeeze(args[0], tuple(a % max(args[0].ndim, 1) for a in axes))]


@_folder("Concat")
def _f_concat(imp, node, args):
    return [np.concatenate([a for a in args if a is not None], axis=int(node.attrs["axis"]))]


def _np_dtype(elem_type: int):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(int(elem_type))


@_folder("Cast")
def _f_cast(imp, node, args):
    return [args[0].astype(_np_dtype(node.attrs["to"]))]


@_folder("CastLike")
def _f_cast_like(imp, node, args):
    return [args[0].astype(args[1].dtype)]


@_folder("Slice")
def _f_slice(imp, node, args):
    data = args[0]
    if imp.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = args[1].reshape(-1), args[2].reshape(-1)
        axes = args[3] if len(args) > 3 else None
        steps = args[4] if len(args) > 4 else None
    axes = list(range(len(starts))) if axes is None else [int(a) for a in np.reshape(axes, -1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.reshape(steps, -1)]
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a % data.ndim] = slice(int(s), int(e), st)
    return [data[tuple(index)]]


@_folder("Range")
def _f_range(imp, node, args):
    start, limit, delta = (np.asarray(a).reshape(()) for a in args)
    return [np.arange(start, limit, delta).astype(np.asarray(args[0]).dtype)]


def _binary(fn):
    def fold(imp, node, args):
        a, b = args
        return [np.asarray(fn(a, b)).astype(a.dtype)]
    return fold


def _divide(a, b):
    if a.dtype.kind in "iu":
        return np.trunc(a.astype(np.float64) / b).astype(a.dtype)   # C-style int division
    return a / b


for _op, _fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                 ("Div", _divide), ("Min", np.minimum), ("Max", np.maximum)):
    _FOLDERS[_op] = _binary(_fn)


@_folder("Sum")
def _f_sum(imp, node, args):
    return [np.sum(np.broadcast_arrays(*args), axis=0).astype(args[0].dtype)]


@_folder("Neg", "Sqrt", "Floor", "Ceil", "Abs", "Not", "Relu")
def _f_unary(imp, node, args):
    fn = {"Neg": np.negative, "Sqrt": np.sqrt, "Floor": np.floor, "Ceil": np.ceil,
          "Abs": np.abs, "Not": np.logical_not, "Relu": lambda x: np.maximum(x, 0)}[node.op]
    return [fn(args[0]).astype(args[0].dtype)]


@_folder("Equal", "Less", "Greater")
def _f_compare(imp, node, args):
    fn = {"Equal": np.equal, "Less": np.less, "Greater": np.greater}[node.op]
    return [fn(args[0], args[1])]


@_folder("Where")
def _f_where(imp, node, args):
    return [np.where(args[0], args[1], args[2])]


@_folder("Expand")
def _f_expand(imp, node, args):
    shape = np.broadcast_shapes(args[0].shape, tuple(int(d) for d in args[1].reshape(-1)))
    return [np.broadcast_to(args[0], shape).copy()]


@_folder("Reshape")
def _f_reshape(imp, node, args):
    target = node.attrs["shape"] if len(args) < 2 else args[1]
    shape = _reshape_target(node, args[0].shape, target, bool(node.attrs.get("allowzero", 0)))
    return [args[0].reshape(shape)]


@_folder("Flatten")
def _f_flatten(imp, node, args):
    axis = int(node.attrs.get("axis", 1))
    axis += args[0].ndim if axis < 0 else 0
    return [args[0].reshape(int(np.prod(args[0].shape[:axis])), -1)]


@_folder("Transpose")
def _f_transpose(imp, node, args):
    perm = node.attrs.get("perm")
    return [np.transpose(args[0], perm if perm else None)]
