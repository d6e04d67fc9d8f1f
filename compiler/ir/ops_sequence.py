"""The operators of sequence models (transformers): their inputs, attributes and shape
and dtype inference, registered beside the operators of `vdla.compiler.ir.ops`.

Float operators (numpy semantics; binary ones broadcast)::

    sub(a, b); div(a, b); pow(a, b)      elementwise, broadcasting
    sqrt(x); erf(x); tanh(x); exp(x); neg(x)
    reduce_mean(x); reduce_sum(x); reduce_max(x)
                                         attrs axes (() = all axes), keepdims (True)
    layer_norm(x, scale, [bias])         over the last axis (attr axis: -1 only),
                                         attr epsilon; scale and bias of shape (D,)
    gelu(x)                              attr approximate: "none" (erf form) | "tanh"
    gather(data, indices)                attr axis; ONNX Gather (numpy.take): int32/int64
                                         indices, negative ones count from the end; an
                                         index outside [-n, n) is an error, never wrapped
    slice(x)                             attrs starts, ends, axes, steps: non-negative,
                                         in range, steps >= 1 (the importer normalizes)
    expand(x)                            attr shape: broadcast x to it (bidirectionally)
    where(cond, a, b)                    bool cond, broadcasting
    cast(x)                              attr dtype (a key of DTYPES)
    equal(a, b); less(a, b); greater(a, b)   -> bool, broadcasting
    attention(q, k, v, [mask])           q (..., S, D), k (..., T, D) (not transposed),
                                         v (..., T, Dv); attrs scale, causal.
                                         y = softmax(q @ k^T * scale + mask + causal) @ v,
                                         causal: -inf where key t > query s + (T - S);
                                         mask additive, broadcastable to (..., S, T)

Integer operators (what `quantize` makes of them; `vdla.compiler.reference` defines their
arithmetic)::

    qmatmul(a, b)                        int8 x int8 -> int8: numpy matmul over batch axes
                                         (b swapped on its last two axes when transpose_b),
                                         then qdense's per-tensor requantization
    qsoftmax(x); qgelu(x)                int8 -> int8 (softmax over the last axis; a
                                         qsoftmax's axis may be -2, keys down the
                                         rows of a transposed score matrix)
    qlayer_norm(x, [gamma], [beta])      int8 -> int8 over the last axis
    qattention(q, k, v, [mask])          int8 q, k, v -> int8: qmatmul(q, k^T) ->
                                         qsoftmax (mask and causal exclude keys) ->
                                         qmatmul(p, v), each step's attrs on the node

Each integer operator's ``params`` attribute (None or a dict of name -> int or tuple)
holds the integer constants that the quantize pass chooses for its definition; the other
attributes are the ones every definition shares.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.ops import (OpDef, _broadcast, _dtype, _fail, _matmul_shape, _same,
                                  _shape, register_op)
from vdla.compiler.ir.tensor import DTYPES

__all__ = ["INT_SEQUENCE_OPS", "SEQUENCE_OPS", "normalize_axes"]


def normalize_axes(axes, rank: int, what: str = "axes") -> tuple[int, ...]:
    """`axes` (ints, negative ones counting from the end) as sorted non-negative axes of a
    tensor of `rank`; raises ValueError for one out of range or repeated."""
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ValueError(f"{what} {tuple(axes)}: axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {tuple(axes)} repeat an axis")
    return tuple(sorted(out))


def _float_in(graph, node, i):
    if _dtype(graph, node, i) != "float32":
        _fail(node, f"input {node.inputs[i]!r} is {_dtype(graph, node, i)}; it must be float32")


def _unary_float(graph, node):
    _float_in(graph, node, 0)
    return _same(graph, node)


def _binary(graph, node):
    dtypes = {_dtype(graph, node, i) for i in range(2)}
    if len(dtypes) != 1:
        _fail(node, f"inputs {node.inputs[0]!r} and {node.inputs[1]!r} have different "
                    f"dtypes {sorted(dtypes)}")
    return [(_broadcast(graph, node), _dtype(graph, node, 0))]


def _compare(graph, node):
    _binary(graph, node)
    return [(_broadcast(graph, node), "bool")]


def _infer_reduce(graph, node):
    x = _shape(graph, node, 0)
    try:
        axes = normalize_axes(node.attrs["axes"], len(x)) or tuple(range(len(x)))
    except ValueError as e:
        _fail(node, str(e))
    if node.attrs["keepdims"]:
        out = tuple(1 if k in axes else d for k, d in enumerate(x))
    else:
        out = tuple(d for k, d in enumerate(x) if k not in axes)
    return [(out, _dtype(graph, node, 0))]


def _last_axis(graph, node):
    x = _shape(graph, node, 0)
    if not x:
        _fail(node, f"input {node.inputs[0]!r} is a scalar; it needs an axis to normalize")
    axis = int(node.attrs.get("axis", -1))
    if axis not in (-1, len(x) - 1):
        _fail(node, f"axis {axis}: only the last axis (-1) is supported, of shape {x}")
    return x


def _infer_layer_norm(graph, node):
    _float_in(graph, node, 0)
    x = _last_axis(graph, node)
    for i in (1, 2):
        s = _shape(graph, node, i)
        if s is not None and s != (x[-1],):
            _fail(node, f"{('scale', 'bias')[i - 1]} {node.inputs[i]!r} has shape {s}; it "
                        f"must be ({x[-1]},), the last axis of {x}")
    if not float(node.attrs["epsilon"]) > 0:
        _fail(node, f"epsilon {node.attrs['epsilon']!r} must be > 0")
    return _same(graph, node)


def _infer_gelu(graph, node):
    if node.attrs["approximate"] not in ("none", "tanh"):
        _fail(node, f"approximate {node.attrs['approximate']!r} is not one of 'none', 'tanh'")
    return _unary_float(graph, node)


def check_gather_indices(node, data_name: str, indices_name: str, n: int, indices):
    """Raise ValueError unless every index of `indices` lies in [-n, n): the rows of
    `data_name` along the gather's axis. Names the tensor, the value and the range."""
    indices = np.asarray(indices)
    if indices.size and (indices.min() < -n or indices.max() >= n):
        bad = indices[(indices < -n) | (indices >= n)].ravel()[0]
        raise ValueError(f"node {node.name!r} (gather): index {int(bad)} in {indices_name!r} "
                         f"is outside [{-n}, {n}), the {n} entries of {data_name!r} along "
                         f"axis {node.attrs['axis']}")


def _infer_gather(graph, node):
    data, idx = _shape(graph, node, 0), _shape(graph, node, 1)
    if not data:
        _fail(node, f"data {node.inputs[0]!r} is a scalar; it needs an axis to gather on")
    if _dtype(graph, node, 1) not in ("int32", "int64"):
        _fail(node, f"indices {node.inputs[1]!r} are {_dtype(graph, node, 1)}; they must be "
                    "int32 or int64")
    axis = int(node.attrs["axis"])
    if not -len(data) <= axis < len(data):
        _fail(node, f"axis {axis} is out of range for data of shape {data}")
    axis %= len(data)
    if data[axis] < 1:
        _fail(node, f"data {node.inputs[0]!r} has no entries along axis {axis}")
    indices = graph.tensors[node.inputs[1]]
    if indices.is_constant:
        try:
            check_gather_indices(node, node.inputs[0], node.inputs[1], data[axis],
                                 indices.data)
        except ValueError as e:
            _fail(node, str(e).split(": ", 1)[1])
    return [(data[:axis] + tuple(idx) + data[axis + 1:], _dtype(graph, node, 0))]


def _infer_slice(graph, node):
    x = _shape(graph, node, 0)
    a = node.attrs
    starts, ends = tuple(a["starts"]), tuple(a["ends"])
    axes = tuple(a["axes"]) or tuple(range(len(starts)))
    steps = tuple(a["steps"]) or (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        _fail(node, f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have "
                    "one value per sliced axis")
    if len(set(axes)) != len(axes) or any(not 0 <= ax < len(x) for ax in axes):
        _fail(node, f"axes {axes} must be distinct axes in [0, {len(x)}) of shape {x}")
    out = list(x)
    for ax, b, e, s in zip(axes, starts, ends, steps):
        if s < 1:
            _fail(node, f"step {s} on axis {ax}: only steps >= 1 are supported")
        if not (0 <= b <= x[ax] and 0 <= e <= x[ax]):
            _fail(node, f"start {b} and end {e} on axis {ax} must lie in [0, {x[ax]}]")
        out[ax] = max(0, -(-(e - b) // s))
        if out[ax] == 0:
            _fail(node, f"start {b}, end {e}, step {s} select nothing on axis {ax} of {x}")
    return [(tuple(out), _dtype(graph, node, 0))]


def _infer_expand(graph, node):
    x, shape = _shape(graph, node, 0), tuple(int(d) for d in node.attrs["shape"])
    try:
        out = tuple(np.broadcast_shapes(x, shape))
    except ValueError:
        _fail(node, f"input shape {x} does not broadcast to {shape}")
    return [(out, _dtype(graph, node, 0))]


def _infer_where(graph, node):
    if _dtype(graph, node, 0) != "bool":
        _fail(node, f"condition {node.inputs[0]!r} is {_dtype(graph, node, 0)}; it must be bool")
    if _dtype(graph, node, 1) != _dtype(graph, node, 2):
        _fail(node, f"{node.inputs[1]!r} and {node.inputs[2]!r} have different dtypes "
                    f"{_dtype(graph, node, 1)} and {_dtype(graph, node, 2)}")
    return [(_broadcast(graph, node), _dtype(graph, node, 1))]


def _infer_cast(graph, node):
    if node.attrs["dtype"] not in DTYPES:
        _fail(node, f"dtype {node.attrs['dtype']!r} is not one of {', '.join(DTYPES)}")
    return [(_shape(graph, node, 0), node.attrs["dtype"])]


def _attention_shape(graph, node):
    q, k, v = (_shape(graph, node, i) for i in range(3))
    if not len(q) == len(k) == len(v) >= 2:
        _fail(node, f"q {q}, k {k} and v {v} must have the same rank, at least 2 "
                    "(..., S, D), (..., T, D), (..., T, Dv)")
    if q[-1] != k[-1] or k[-2] != v[-2]:
        _fail(node, f"q {q}, k {k}, v {v} do not fit: need q (..., S, D), k (..., T, D), "
                    "v (..., T, Dv)")
    try:
        batch = tuple(np.broadcast_shapes(q[:-2], k[:-2], v[:-2]))
    except ValueError:
        _fail(node, f"the batch axes of q {q}, k {k}, v {v} do not broadcast")
    scores = batch + (q[-2], k[-2])
    mask = _shape(graph, node, 3)
    if mask is not None:
        try:
            if tuple(np.broadcast_shapes(mask, scores)) != scores:
                raise ValueError
        except ValueError:
            _fail(node, f"mask {node.inputs[3]!r} of shape {mask} does not broadcast to the "
                        f"scores' shape {scores}")
    if node.attrs["causal"] and k[-2] < q[-2]:
        _fail(node, f"causal attention needs at least as many keys ({k[-2]}) as queries "
                    f"({q[-2]})")
    return batch + (q[-2], v[-1])


def _infer_attention(graph, node):
    for i in range(3):
        _float_in(graph, node, i)
    if node.attrs["scale"] is None or not np.isfinite(float(node.attrs["scale"])):
        _fail(node, f"scale {node.attrs['scale']!r} must be a finite number")
    return [(_attention_shape(graph, node), "float32")]


# --- integer operators -------------------------------------------------------------------

def _int8_in(graph, node, *indices):
    for i in indices:
        if node.input(i) and _dtype(graph, node, i) != "int8":
            _fail(node, f"input {node.inputs[i]!r} is {_dtype(graph, node, i)}; it must be int8")


def _infer_qmatmul(graph, node):
    _int8_in(graph, node, 0, 1)
    a, b = _shape(graph, node, 0), _shape(graph, node, 1)
    if node.attrs["transpose_b"]:
        if len(b) < 2:
            _fail(node, f"transpose_b needs b of rank >= 2, not {b}")
        b = b[:-2] + (b[-1], b[-2])
    try:
        shape = _matmul_shape(a, b)
    except ValueError:
        _fail(node, f"shapes {a} and {b} (b transposed: {node.attrs['transpose_b']}) do not "
                    "multiply")
    return [(shape, "int8")]


def _softmax_axis(graph, node):
    """A qsoftmax's input shape; its axis is the last (-1) or, on rank >= 2, the one
    before (-2: the softmax of the matrix's transpose, transposed back)."""
    x = _shape(graph, node, 0)
    if not x:
        _fail(node, f"input {node.inputs[0]!r} is a scalar; it needs an axis to normalize")
    axis = int(node.attrs.get("axis", -1))
    allowed = {-1, len(x) - 1} | ({-2, len(x) - 2} if len(x) >= 2 else set())
    if axis not in allowed:
        _fail(node, f"axis {axis}: a qsoftmax normalizes its last axis (-1) or, on rank "
                    f">= 2, the one before it (-2), of shape {x}")
    return x


def _infer_qunary(graph, node):
    _int8_in(graph, node, 0)
    if node.op == "qsoftmax":
        x = _softmax_axis(graph, node)
        if node.input(1):
            mask = _shape(graph, node, 1)
            if graph.tensors[node.inputs[1]].dtype not in ("bool", "int8"):
                _fail(node, f"mask {node.inputs[1]!r} is {graph.tensors[node.inputs[1]].dtype}"
                            "; it must be bool (True: excluded) or int8 (negative: "
                            "excluded)")
            try:
                np.broadcast_shapes(mask, x)
            except ValueError:
                _fail(node, f"mask {node.inputs[1]!r} of shape {mask} does not broadcast to "
                            f"the input's {x}")
        if node.attrs.get("causal") and len(x) < 2:
            _fail(node, f"causal needs rows of queries and keys: an input of rank >= 2, not {x}")
    elif node.op == "qlayer_norm":
        x = _last_axis(graph, node)
        for i in (1, 2):
            s = _shape(graph, node, i)
            if s is not None and s != (x[-1],):
                _fail(node, f"input {node.inputs[i]!r} has shape {s}; it must be "
                            f"({x[-1]},), the last axis of {x}")
    return [(_shape(graph, node, 0), "int8")]


def _infer_qattention(graph, node):
    _int8_in(graph, node, 0, 1, 2)
    return [(_attention_shape(graph, node), "int8")]


_REDUCE = {"axes": (), "keepdims": True}
_QREQUANT = {"multiplier": None, "shift": (0,), "out_min": -128, "out_max": 127}
#: Attributes every integer sequence op has: the input and output scales the quantize
#: pass chose (floats, for reports) and its integer constants (``params``).
_QCOMMON = {"in_scale": None, "out_scale": None, "params": None}

SEQUENCE_OPS = (
    OpDef("sub", ("a", "b"), 2, {}, _binary),
    OpDef("div", ("a", "b"), 2, {}, _binary),
    OpDef("pow", ("a", "b"), 2, {}, _binary),
    OpDef("sqrt", ("x",), 1, {}, _unary_float),
    OpDef("erf", ("x",), 1, {}, _unary_float),
    OpDef("tanh", ("x",), 1, {}, _unary_float),
    OpDef("exp", ("x",), 1, {}, _unary_float),
    OpDef("neg", ("x",), 1, {}, _same),
    OpDef("reduce_mean", ("x",), 1, dict(_REDUCE), _infer_reduce),
    OpDef("reduce_sum", ("x",), 1, dict(_REDUCE), _infer_reduce),
    OpDef("reduce_max", ("x",), 1, dict(_REDUCE), _infer_reduce),
    OpDef("layer_norm", ("x", "scale", "bias"), 2, {"axis": -1, "epsilon": 1e-5},
          _infer_layer_norm),
    OpDef("gelu", ("x",), 1, {"approximate": "none"}, _infer_gelu),
    OpDef("gather", ("data", "indices"), 2, {"axis": 0}, _infer_gather),
    OpDef("slice", ("x",), 1, {"starts": (), "ends": (), "axes": (), "steps": ()},
          _infer_slice),
    OpDef("expand", ("x",), 1, {"shape": ()}, _infer_expand),
    OpDef("where", ("cond", "a", "b"), 3, {}, _infer_where),
    OpDef("cast", ("x",), 1, {"dtype": "float32"}, _infer_cast),
    OpDef("equal", ("a", "b"), 2, {}, _compare),
    OpDef("less", ("a", "b"), 2, {}, _compare),
    OpDef("greater", ("a", "b"), 2, {}, _compare),
    OpDef("attention", ("q", "k", "v", "mask"), 3, {"scale": 1.0, "causal": False},
          _infer_attention),
)

INT_SEQUENCE_OPS = (
    OpDef("qmatmul", ("a", "b"), 2, {**_QREQUANT, "transpose_b": False, "a_scale": None,
                                     "b_scale": None, "out_scale": None, "params": None},
          _infer_qmatmul),
    # qsoftmax's optional bool mask (True: excluded) and causal flag leave positions out
    # as qattention's do: what that op's softmax is, split from its products.
    OpDef("qsoftmax", ("x", "mask"), 1, {"axis": -1, "causal": False, **_QCOMMON},
          _infer_qunary),
    OpDef("qlayer_norm", ("x", "gamma", "beta"), 1, {"axis": -1, "epsilon": 1e-5,
                                                     **_QCOMMON}, _infer_qunary),
    OpDef("qgelu", ("x",), 1, {"approximate": "none", **_QCOMMON}, _infer_qunary),
    OpDef("qattention", ("q", "k", "v", "mask"), 3,
          {"scale": 1.0, "causal": False, "q_scale": None, "k_scale": None, "v_scale": None,
           "out_scale": None,
           "qk_multiplier": None, "qk_shift": (0,), "qk_out_min": -128, "qk_out_max": 127,
           "qk_scale": None, "softmax_params": None, "softmax_scale": None,
           "pv_multiplier": None, "pv_shift": (0,), "pv_out_min": -128, "pv_out_max": 127,
           "params": None}, _infer_qattention),
)

for _op in SEQUENCE_OPS + INT_SEQUENCE_OPS:
    register_op(_op)
