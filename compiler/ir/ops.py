"""The operator set of the graph IR: for each op its inputs, attributes with defaults, and
shape and dtype inference.

Float operators (what importers and the model zoo produce)::

    conv2d(x, w, [bias], [residual])   NCHW x, OIHW w (I = C / groups); attrs strides,
                                       pads (top, left, bottom, right), dilations, groups,
                                       activation (None | "relu" | "clip"), clip_min,
                                       clip_max. y = act(conv(x, w) + bias + residual).
    dense(x, w, [bias], [residual])    x (N, K), w (M, K): y = act(x @ w.T + bias + residual);
                                       dense alone also takes activation "gelu" (erf
                                       form) and "gelu_tanh"
    matmul(a, b)                       numpy matmul
    batch_norm(x, scale, bias, mean, var)   attr epsilon, over axis 1
    relu(x); clip(x) attrs min, max (None: unbounded)
    add(a, b); mul(a, b)               numpy broadcasting
    max_pool2d(x), avg_pool2d(x)       attrs kernel, strides, pads, ceil_mode;
                                       avg_pool2d also count_include_pad
    global_avg_pool2d(x)               (N, C, H, W) -> (N, C, 1, 1)
    flatten(x) attr axis; reshape(x) attr shape (-1 allowed once); transpose(x) attr perm
    concat(*xs) attr axis; softmax(x) attr axis; lrn(x) attrs size, alpha, beta, bias
    pad(x) attrs pads (begins then ends, one per axis), value

Integer operators (what `quantize` produces; `vdla.compiler.reference.integer` defines their
arithmetic, which `run_reference` executes exactly)::

    quantize(x) float -> int8, attr scale; dequantize(x) int -> float32, attr scale
    qconv2d(x, w, [bias], [residual])  int8 x and w, int32 bias, int8 residual -> int8;
                                       the conv2d attrs without activation, plus
                                       multiplier, shift, residual_multiplier,
                                       residual_shift, out_min, out_max
    qdense(x, w, [bias], [residual])   likewise for dense
    qadd(a, b)                         int8 + int8 -> int8 with a requantization of each
    qavg_pool2d(x), qglobal_avg_pool2d(x)  int8 -> int8 (sum, then requantization)

The operators of sequence models (transformers: layer_norm, gelu, gather, attention,
qmatmul, qsoftmax, ...) are in `vdla.compiler.ir.ops_sequence`.

Layout operators: ``layout_transform(x)`` attrs src, dst, channels and batch (the
unpadded sizes of axes 1 and 0, needed to crop a tensor whose channels or batch were
padded; see `vdla.compiler.ir.layout`).

The GEMM operators (conv2d, dense, qconv2d, qdense) also take ``data_layout``,
``kernel_layout`` and ``out_layout`` (the last for output and residual): plain ``NCHW`` /
``OIHW`` / ``NCHW`` (``NC`` / ``OI`` / ``NC`` for dense) by default;
`vdla.compiler.passes.pack.pack_graph` sets blocked layouts such as ``NCHW1n16c`` / ``OIHW16o16i``, in which the tensors hold
zero-padded channels and the bias and per-channel attributes have the padded output
channel count.

Every attribute has a default; `OpDef.normalize_attrs` fills them and rejects unknown
names, so a typo is an error rather than a silently ignored option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from vdla.compiler.ir.layout import parse_layout, transform_shape
from vdla.compiler.ir.tensor import GraphError, Node, Tensor

__all__ = ["OPS", "OpDef", "conv_output_size", "get_op", "infer_node", "register_op"]


class TensorTable(Protocol):
    """What operator inference reads of a graph: its tensors by name. A
    `vdla.compiler.ir.graph.Graph` is one (the graph holds the ops, so the ops do not
    import it)."""

    tensors: dict[str, Tensor]


@dataclass(frozen=True)
class OpDef:
    """An operator: `inputs` are the names of its positional inputs, the first
    `required` of which must be present (``variadic``: any number >= `required`);
    `attrs` maps each attribute to its default; `infer(graph, node)` returns the output
    shapes and dtypes as a list of (shape, dtype)."""

    name: str
    inputs: tuple[str, ...]
    required: int
    attrs: dict[str, Any]
    infer: Callable[[TensorTable, Node], list[tuple[tuple[int, ...], str]]]
    variadic: bool = False
    outputs: int = 1
    doc: str = ""

    def normalize_attrs(self, attrs: dict, node_name: str = "?") -> dict:
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise GraphError(f"node {node_name!r} ({self.name}): unknown attribute(s) "
                             f"{sorted(unknown)}; {self.name} takes {sorted(self.attrs) or 'none'}")
        out = dict(self.attrs)
        out.update(attrs)
        for key, value in out.items():
            if isinstance(value, (list, np.ndarray)) and key not in ("multiplier", "shift"):
                out[key] = tuple(int(v) if isinstance(v, (np.integer,)) else v for v in value)
        return out

    def check_arity(self, node: Node):
        present = len(node.inputs)
        if present < self.required or (not self.variadic and present > len(self.inputs)):
            want = (f"at least {self.required}" if self.variadic else
                    f"{self.required}" if self.required == len(self.inputs) else
                    f"{self.required} to {len(self.inputs)}")
            raise GraphError(f"node {node.name!r} ({self.name}) has {present} inputs; it takes "
                             f"{want} ({', '.join(self.inputs)})")
        for i in range(self.required):
            if not node.inputs[i]:
                raise GraphError(f"node {node.name!r} ({self.name}): input {i} "
                                 f"({self.inputs[min(i, len(self.inputs) - 1)]}) is required")
        if len(node.outputs) != self.outputs:
            raise GraphError(f"node {node.name!r} ({self.name}) has {len(node.outputs)} outputs; "
                             f"it makes {self.outputs}")


OPS: dict[str, OpDef] = {}


def register_op(opdef: OpDef) -> OpDef:
    if opdef.name in OPS:
        raise ValueError(f"operator {opdef.name!r} is registered twice")
    OPS[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown operator {name!r}; known: {', '.join(sorted(OPS))}") from None


def infer_node(graph: TensorTable, node: Node):
    """Set the shapes and dtypes of `node`'s outputs from its inputs (raises GraphError
    when the inputs do not fit the op)."""
    opdef = get_op(node.op)
    opdef.check_arity(node)
    for tensor in node.inputs:
        if tensor and (tensor not in graph.tensors or graph.tensors[tensor].shape is None):
            raise GraphError(f"node {node.name!r} ({node.op}): the shape of input {tensor!r} "
                             "is unknown")
    results = opdef.infer(graph, node)
    for out, (shape, dtype) in zip(node.outputs, results):
        t = graph.tensors[out]
        t.shape, t.dtype = tuple(int(d) for d in shape), dtype


# --- helpers -----------------------------------------------------------------------------

def _shape(graph: TensorTable, node: Node, i: int) -> tuple[int, ...] | None:
    name = node.input(i)
    return graph.tensors[name].shape if name else None


def _dtype(graph: TensorTable, node: Node, i: int) -> str:
    return graph.tensors[node.inputs[i]].dtype


def _fail(node: Node, message: str):
    raise GraphError(f"node {node.name!r} ({node.op}): {message}")


def conv_output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                     dilation: int = 1, ceil_mode: bool = False) -> int:
    """Output length of a convolution/pooling window along one axis."""
    span = dilation * (kernel - 1) + 1
    room = size + pad_begin + pad_end - span
    out = (math.ceil(room / stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1          # the last window must start inside the input or its begin pad
    return out


def _pair(node: Node, key: str, n: int = 2) -> tuple[int, ...]:
    value = node.attrs[key]
    if isinstance(value, int):
        value = (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        _fail(node, f"attribute {key} must have {n} values, not {value}")
    return value


def _check_4d(graph, node, i, what="input"):
    shape = _shape(graph, node, i)
    if len(shape) != 4:
        _fail(node, f"{what} {node.inputs[i]!r} must be 4-D (N, C, H, W), not shape {shape}")
    return shape


def _window(graph: TensorTable, node: Node, kernel, shape=None) -> tuple[int, int]:
    # `shape`: the plain (N, C, H, W) of input 0 when its tensor is in a packed layout.
    n, c, h, w = shape if shape is not None else _check_4d(graph, node, 0)
    strides, pads = _pair(node, "strides"), _pair(node, "pads", 4)
    dil = _pair(node, "dilations") if "dilations" in node.attrs else (1, 1)
    ceil = bool(node.attrs.get("ceil_mode", False))
    if min(strides) < 1 or min(kernel) < 1 or min(pads) < 0 or min(dil) < 1:
        _fail(node, f"kernel {kernel}, strides {strides}, dilations {dil} must be >= 1 and "
                    f"pads {pads} >= 0")
    ho = conv_output_size(h, kernel[0], strides[0], pads[0], pads[2], dil[0], ceil)
    wo = conv_output_size(w, kernel[1], strides[1], pads[1], pads[3], dil[1], ceil)
    if ho < 1 or wo < 1:
        _fail(node, f"the window {kernel} does not fit the padded input {h}x{w} "
                    f"(pads {pads})")
    return ho, wo


# --- inference functions -----------------------------------------------------------------

def _packed_layouts(node, conv: bool):
    """The parsed (data, kernel, out) layouts of a GEMM node, or None when its data is
    in the plain layout; raises GraphError for layouts that do not fit together."""
    try:
        layouts = [parse_layout(node.attrs[k])
                   for k in ("data_layout", "kernel_layout", "out_layout")]
    except ValueError as e:
        _fail(node, str(e))
    act, wgt = ("NCHW", "OIHW") if conv else ("NC", "OI")
    want = (act, wgt, act)
    for key, layout, base in zip(("data_layout", "kernel_layout", "out_layout"), layouts, want):
        if layout.base != base:
            _fail(node, f"{key} {layout.name!r} is not a {base} layout")
    if not layouts[0].packed:
        if layouts[1].packed or layouts[2].packed:
            _fail(node, f"layouts {tuple(l.name for l in layouts)}: a plain data_layout "
                        "needs plain kernel_layout and out_layout")
        return None
    if not (layouts[1].packed and layouts[2].packed):
        _fail(node, f"layouts {tuple(l.name for l in layouts)}: a packed data_layout needs "
                    "packed kernel_layout and out_layout")
    return layouts


def _plain_of(graph, node, i, layout):
    # The padded plain shape of input i, which is stored in `layout`.
    try:
        return transform_shape(_shape(graph, node, i), layout, layout.base)
    except ValueError as e:
        _fail(node, f"input {node.inputs[i]!r}: {e}")


def _infer_packed_gemm(graph, node, layouts, conv: bool, out_dtype):
    """Shapes of a GEMM node in packed layouts: the plain checks on the padded shapes."""
    data, kernel, out = layouts
    if conv and int(node.attrs["groups"]) != 1:
        _fail(node, f"groups={node.attrs['groups']}: only groups=1 has a packed form")
    x, w = _plain_of(graph, node, 0, data), _plain_of(graph, node, 1, kernel)
    if x[1] != w[1]:
        _fail(node, f"input has {x[1]} channels (padded, layout {data.name}) but weights "
                    f"{node.inputs[1]!r} expect {w[1]} (padded, layout {kernel.name})")
    if conv:
        ho, wo = _window(graph, node, w[2:], shape=x)
        plain_out = (x[0], w[0], ho, wo)
    else:
        plain_out = (x[0], w[0])
    bias = _shape(graph, node, 2)
    if bias is not None and bias != (w[0],):
        _fail(node, f"bias {node.inputs[2]!r} has shape {bias}; it must be ({w[0]},), the "
                    "padded output channels")
    y = transform_shape(plain_out, out.base, out)
    residual = _shape(graph, node, 3)
    if residual is not None and residual != y:
        _fail(node, f"residual {node.inputs[3]!r} has shape {residual}; the output is {y} "
                    f"(layout {out.name})")
    _check_activation(node)
    return [(y, out_dtype or _dtype(graph, node, 0))]


def _infer_conv(graph, node, out_dtype=None):
    layouts = _packed_layouts(node, conv=True)
    if layouts is not None:
        return _infer_packed_gemm(graph, node, layouts, True, out_dtype)
    n, c, h, w = _check_4d(graph, node, 0)
    wshape = _shape(graph, node, 1)
    if len(wshape) != 4:
        _fail(node, f"weights {node.inputs[1]!r} must be 4-D (O, I, kH, kW), not {wshape}")
    o, i, kh, kw = wshape
    groups = int(node.attrs["groups"])
    if groups < 1 or c % groups or o % groups:
        _fail(node, f"groups={groups} must divide the input channels ({c}) and the output "
                    f"channels ({o})")
    if i * groups != c:
        _fail(node, f"input has {c} channels but weights {node.inputs[1]!r} {wshape} expect "
                    f"{i * groups} ({i} per group x {groups} groups)")
    ho, wo = _window(graph, node, (kh, kw))
    bias = _shape(graph, node, 2)
    if bias is not None and bias != (o,):
        _fail(node, f"bias {node.inputs[2]!r} has shape {bias}; it must be ({o},)")
    residual = _shape(graph, node, 3)
    if residual is not None and residual != (n, o, ho, wo):
        _fail(node, f"residual {node.inputs[3]!r} has shape {residual}; the output is "
                    f"{(n, o, ho, wo)}")
    _check_activation(node)
    return [((n, o, ho, wo), out_dtype or _dtype(graph, node, 0))]


def _check_activation(node, extra=()):
    act = node.attrs.get("activation")
    allowed = (None, "relu", "clip") + tuple(extra)
    if act not in allowed:
        _fail(node, f"activation {act!r} is not one of {', '.join(map(repr, allowed))}")


def _infer_dense(graph, node, out_dtype=None):
    layouts = _packed_layouts(node, conv=False)
    if layouts is not None:
        return _infer_packed_gemm(graph, node, layouts, False, out_dtype)
    x, wshape = _shape(graph, node, 0), _shape(graph, node, 1)
    if len(x) != 2 or len(wshape) != 2:
        _fail(node, f"input {x} and weights {wshape} must both be 2-D")
    if x[1] != wshape[1]:
        _fail(node, f"input has {x[1]} features but weights {node.inputs[1]!r} {wshape} "
                    f"expect {wshape[1]}")
    bias = _shape(graph, node, 2)
    if bias is not None and bias != (wshape[0],):
        _fail(node, f"bias {node.inputs[2]!r} has shape {bias}; it must be ({wshape[0]},)")
    residual = _shape(graph, node, 3)
    if residual is not None and residual != (x[0], wshape[0]):
        _fail(node, f"residual has shape {residual}; the output is {(x[0], wshape[0])}")
    # A float dense may end in a GELU (fused from a transformer's feed-forward layer).
    _check_activation(node, ("gelu", "gelu_tanh") if node.op == "dense" else ())
    return [((x[0], wshape[0]), out_dtype or _dtype(graph, node, 0))]


def _broadcast(graph, node):
    shapes = [_shape(graph, node, i) for i in range(len(node.inputs))]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        _fail(node, f"input shapes {shapes} do not broadcast")
    return shape


def _same(graph, node):
    return [(_shape(graph, node, 0), _dtype(graph, node, 0))]


def _infer_matmul(graph, node):
    a, b = _shape(graph, node, 0), _shape(graph, node, 1)
    try:
        shape = _matmul_shape(a, b)
    except ValueError:
        _fail(node, f"shapes {a} and {b} do not multiply")
    return [(shape, _dtype(graph, node, 0))]


def _matmul_shape(a, b):
    """numpy.matmul's result shape (1-D operands promoted, then their axis dropped)."""
    if not a or not b:
        raise ValueError
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise ValueError
    shape = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return shape


def _infer_bn(graph, node):
    x = _shape(graph, node, 0)
    if len(x) < 2:
        _fail(node, f"input must have a channel axis, not shape {x}")
    for i in range(1, 5):
        if _shape(graph, node, i) != (x[1],):
            _fail(node, f"{get_op('batch_norm').inputs[i]} {node.inputs[i]!r} has shape "
                        f"{_shape(graph, node, i)}; it must be ({x[1]},)")
    return _same(graph, node)


def _infer_pool(graph, node):
    n, c, _, _ = _check_4d(graph, node, 0)
    ho, wo = _window(graph, node, _pair(node, "kernel"))
    return [((n, c, ho, wo), _dtype(graph, node, 0))]


def _infer_global_pool(graph, node):
    n, c, _, _ = _check_4d(graph, node, 0)
    return [((n, c, 1, 1), _dtype(graph, node, 0))]


def _infer_flatten(graph, node):
    x = _shape(graph, node, 0)
    axis = int(node.attrs["axis"])
    if not -len(x) <= axis <= len(x):
        _fail(node, f"axis {axis} is out of range for shape {x}")
    if axis < 0:
        axis += len(x)
    return [((int(np.prod(x[:axis])), int(np.prod(x[axis:]))), _dtype(graph, node, 0))]


def _infer_reshape(graph, node):
    x = _shape(graph, node, 0)
    target = list(node.attrs["shape"])
    if target.count(-1) > 1:
        _fail(node, f"shape {tuple(target)} has more than one -1")
    total = int(np.prod(x))
    known = int(np.prod([d for d in target if d != -1]))
    if -1 in target:
        if known == 0 or total % known:
            _fail(node, f"cannot reshape {x} ({total} elements) to {tuple(target)}")
        target[target.index(-1)] = total // known
    if int(np.prod(target)) != total:
        _fail(node, f"cannot reshape {x} ({total} elements) to {tuple(target)}")
    return [(tuple(target), _dtype(graph, node, 0))]


def _infer_transpose(graph, node):
    x = _shape(graph, node, 0)
    perm = node.attrs["perm"] or tuple(reversed(range(len(x))))
    if sorted(perm) != list(range(len(x))):
        _fail(node, f"perm {perm} is not a permutation of the {len(x)} axes")
    return [(tuple(x[p] for p in perm), _dtype(graph, node, 0))]


def _infer_concat(graph, node):
    shapes = [_shape(graph, node, i) for i in range(len(node.inputs))]
    rank = len(shapes[0])
    axis = int(node.attrs["axis"])
    if not -rank <= axis < rank:
        _fail(node, f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    for s in shapes:
        if len(s) != rank or any(a != b for k, (a, b) in enumerate(zip(s, shapes[0]))
                                 if k != axis):
            _fail(node, f"input shapes {shapes} differ outside axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [(tuple(out), _dtype(graph, node, 0))]


def _infer_softmax(graph, node):
    x = _shape(graph, node, 0)
    axis = int(node.attrs["axis"])
    if not -len(x) <= axis < len(x):
        _fail(node, f"axis {axis} is out of range for shape {x}")
    return _same(graph, node)


def _infer_pad(graph, node):
    x = _shape(graph, node, 0)
    pads = tuple(int(p) for p in node.attrs["pads"])
    if len(pads) != 2 * len(x):
        _fail(node, f"pads {pads} must have {2 * len(x)} values (begins, then ends)")
    out = tuple(d + pads[i] + pads[i + len(x)] for i, d in enumerate(x))
    if min(out) < 1:
        _fail(node, f"pads {pads} leave an empty tensor from {x}")
    if node.attrs["mode"] != "constant":
        _fail(node, f"mode {node.attrs['mode']!r} is not supported; only 'constant'")
    return [(out, _dtype(graph, node, 0))]


def _infer_lrn(graph, node):
    _check_4d(graph, node, 0)
    if int(node.attrs["size"]) < 1:
        _fail(node, f"size {node.attrs['size']} must be >= 1")
    return _same(graph, node)


def _infer_quantize(graph, node):
    if not node.attrs["scale"] or node.attrs["scale"] <= 0:
        _fail(node, f"scale {node.attrs['scale']!r} must be a positive number")
    return [(_shape(graph, node, 0), node.attrs["dtype"])]


def _infer_dequantize(graph, node):
    return [(_shape(graph, node, 0), "float32")]


def _infer_layout(graph, node):
    try:
        return [(transform_shape(_shape(graph, node, 0), node.attrs["src"], node.attrs["dst"],
                                 node.attrs["channels"], node.attrs["batch"]),
                 _dtype(graph, node, 0))]
    except ValueError as e:
        _fail(node, str(e))


_CONV_ATTRS = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1}
_ACT_ATTRS = {"activation": None, "clip_min": None, "clip_max": None}
_REQUANT_ATTRS = {"multiplier": None, "shift": (0,), "residual_multiplier": None,
                  "residual_shift": 0, "out_min": -128, "out_max": 127}
# Layouts of a GEMM op's data, weights and output/residual (`vdla.compiler.ir.layout`):
# `pack_graph` sets blocked ones such as NCHW1n16c / OIHW16o16i.
_CONV_LAYOUTS = {"data_layout": "NCHW", "kernel_layout": "OIHW", "out_layout": "NCHW"}
_DENSE_LAYOUTS = {"data_layout": "NC", "kernel_layout": "OI", "out_layout": "NC"}
_POOL_ATTRS = {"kernel": (1, 1), "strides": (1, 1), "pads": (0, 0, 0, 0), "ceil_mode": False}
_ELTWISE = lambda g, n: [(_broadcast(g, n), _dtype(g, n, 0))]  # noqa: E731

for _op in [
    OpDef("conv2d", ("x", "w", "bias", "residual"), 2,
          {**_CONV_ATTRS, **_ACT_ATTRS, **_CONV_LAYOUTS}, _infer_conv),
    OpDef("dense", ("x", "w", "bias", "residual"), 2, {**_ACT_ATTRS, **_DENSE_LAYOUTS},
          _infer_dense),
    OpDef("matmul", ("a", "b"), 2, {}, _infer_matmul),
    OpDef("batch_norm", ("x", "scale", "bias", "mean", "var"), 5, {"epsilon": 1e-5}, _infer_bn),
    OpDef("relu", ("x",), 1, {}, _same),
    OpDef("clip", ("x",), 1, {"min": None, "max": None}, _same),
    OpDef("add", ("a", "b"), 2, {}, _ELTWISE),
    OpDef("mul", ("a", "b"), 2, {}, _ELTWISE),
    OpDef("max_pool2d", ("x",), 1, dict(_POOL_ATTRS), _infer_pool),
    OpDef("avg_pool2d", ("x",), 1, {**_POOL_ATTRS, "count_include_pad": False}, _infer_pool),
    OpDef("global_avg_pool2d", ("x",), 1, {}, _infer_global_pool),
    OpDef("flatten", ("x",), 1, {"axis": 1}, _infer_flatten),
    OpDef("reshape", ("x",), 1, {"shape": ()}, _infer_reshape),
    OpDef("transpose", ("x",), 1, {"perm": ()}, _infer_transpose),
    OpDef("concat", ("inputs",), 1, {"axis": 1}, _infer_concat, variadic=True),
    OpDef("softmax", ("x",), 1, {"axis": -1}, _infer_softmax),
    OpDef("pad", ("x",), 1, {"pads": (), "value": 0.0, "mode": "constant"}, _infer_pad),
    OpDef("lrn", ("x",), 1, {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, _infer_lrn),
    # integer operators
    OpDef("quantize", ("x",), 1, {"scale": None, "dtype": "int8"}, _infer_quantize),
    OpDef("dequantize", ("x",), 1, {"scale": None}, _infer_dequantize),
    OpDef("qconv2d", ("x", "w", "bias", "residual"), 2,
          {**_CONV_ATTRS, **_REQUANT_ATTRS, **_CONV_LAYOUTS},
          lambda g, n: _infer_conv(g, n, "int8")),
    OpDef("qdense", ("x", "w", "bias", "residual"), 2, {**_REQUANT_ATTRS, **_DENSE_LAYOUTS},
          lambda g, n: _infer_dense(g, n, "int8")),
    OpDef("qadd", ("a", "b"), 2, {"a_multiplier": None, "a_shift": 0, "b_multiplier": None,
                                  "b_shift": 0, "out_min": -128, "out_max": 127},
          lambda g, n: [(_broadcast(g, n), "int8")]),
    OpDef("qavg_pool2d", ("x",), 1, {**_POOL_ATTRS, "count_include_pad": False,
                                     "multiplier": None, "shift": (0,)}, _infer_pool),
    OpDef("qglobal_avg_pool2d", ("x",), 1, {"multiplier": None, "shift": (0,)},
          _infer_global_pool),
    OpDef("layout_transform", ("x",), 1, {"src": "NCHW", "dst": "NCHW", "channels": None,
                                          "batch": None}, _infer_layout),
]:
    register_op(_op)

#: Operators whose first input is an activation and second a weight: the ones the
#: accelerator's GEMM core runs.
GEMM_OPS = frozenset({"conv2d", "dense", "qconv2d", "qdense"})
