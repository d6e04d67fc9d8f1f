"""Import-time evaluation of constant (shape) computations: the ``Shape -> Gather ->
Unsqueeze -> Concat -> Reshape`` chains exporters write, and the masks transformers build
from constants (Trilu, Equal, Where, ...), evaluated with numpy so they never reach the
graph (`@_folder("Shape")`, ...)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
from onnx import helper

from vdla.compiler.frontend.onnx_import.nodes import OnnxNode, reshape_target

if TYPE_CHECKING:  # annotations only: the importer calls the folders
    from vdla.compiler.frontend.onnx_import.importer import Importer

__all__ = ["FOLDERS", "META_INPUTS"]

FOLDERS: dict[str, Callable[[Importer, OnnxNode, list], list]] = {}
#: The most elements a folded value may have: shape computations are small, and a
#: corrupted size must not make the importer allocate gigabytes before it fails.
MAX_FOLDED_ELEMENTS = 1 << 24
#: Inputs whose values these folders never read, only their (static) shape and dtype, so
#: they may be computed tensors.
META_INPUTS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}


def _folder(*ops: str):
    def register(fn):
        for op in ops:
            FOLDERS[op] = fn
        return fn
    return register


def _check_size(node: OnnxNode, shape) -> tuple[int, ...]:
    """`shape`, after failing when a value of that shape is too big to fold."""
    shape = tuple(int(d) for d in shape)
    if min(shape, default=1) >= 0 and np.prod(shape, dtype=object) > MAX_FOLDED_ELEMENTS:
        node.fail(f"evaluating it on its constant inputs would make a tensor of shape {shape}, "
                  f"more than the {MAX_FOLDED_ELEMENTS} elements of a shape computation")
    return shape


def _axes_arg(imp: Importer, node: OnnxNode, args, k: int = 1) -> list[int] | None:
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
    # asarray: a model of an opset before ConstantOfShape may give `value` any type.
    value = np.asarray(node.attrs.get("value", np.zeros(1, np.float32)))
    return [np.full(_check_size(node, args[0].reshape(-1)), value.reshape(-1)[0],
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
    if delta != 0:
        _check_size(node, [max(0, int(np.ceil((limit - start) / delta)))])
    return [np.arange(start, limit, delta).astype(np.asarray(args[0]).dtype)]


def _binary(fn):
    def fold(imp, node, args):
        a, b = args
        _check_size(node, np.broadcast_shapes(np.shape(a), np.shape(b)))
        return [np.asarray(fn(a, b)).astype(a.dtype)]
    return fold


def _divide(a, b):
    if a.dtype.kind in "iu":
        return np.trunc(a.astype(np.float64) / b).astype(a.dtype)   # C-style int division
    return a / b


for _op, _fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                 ("Div", _divide), ("Min", np.minimum), ("Max", np.maximum)):
    FOLDERS[_op] = _binary(_fn)


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
    shape = _check_size(node, np.broadcast_shapes(
        args[0].shape, tuple(int(d) for d in args[1].reshape(-1))))
    return [np.broadcast_to(args[0], shape).copy()]


@_folder("Reshape")
def _f_reshape(imp, node, args):
    target = node.attrs["shape"] if len(args) < 2 else args[1]
    shape = reshape_target(node, args[0].shape, target, bool(node.attrs.get("allowzero", 0)))
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


@_folder("Trilu")
def _f_trilu(imp, node, args):
    k = 0 if len(args) < 2 or args[1] is None else int(np.asarray(args[1]).reshape(()))
    fn = np.triu if int(node.attrs.get("upper", 1)) else np.tril
    return [fn(args[0], k)]


@_folder("Pow")
def _f_pow(imp, node, args):
    a, b = args
    _check_size(node, np.broadcast_shapes(np.shape(a), np.shape(b)))
    if a.dtype.kind in "iu":
        return [np.power(a.astype(np.float64), b).astype(a.dtype)]
    return [np.power(a, b.astype(a.dtype)).astype(a.dtype)]


@_folder("Mod")
def _f_mod(imp, node, args):
    a, b = args
    if a.dtype.kind in "iu" and np.any(b == 0):
        node.fail("integer Mod by zero")
    fn = np.fmod if int(node.attrs.get("fmod", 0)) else np.mod
    return [np.asarray(fn(a, b)).astype(a.dtype)]


@_folder("Exp", "Tanh", "Erf")
def _f_float_unary(imp, node, args):
    x = np.asarray(args[0], dtype=np.float64)
    fn = {"Exp": np.exp, "Tanh": np.tanh, "Erf": np.frompyfunc(math.erf, 1, 1)}[node.op]
    return [np.asarray(fn(x), dtype=np.float64).astype(args[0].dtype)]


@_folder("And", "Or", "Xor")
def _f_logical(imp, node, args):
    fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}[node.op]
    return [fn(args[0], args[1])]


@_folder("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")
def _f_reduce(imp, node, args):
    x = args[0]
    axes = _axes_arg(imp, node, args)
    if not axes and int(node.attrs.get("noop_with_empty_axes", 0)):
        return [x]
    if axes:
        rank = max(x.ndim, 1)
        if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
            node.fail(f"axes {list(axes)} must be distinct axes of a rank-{x.ndim} input "
                      f"(each in [{-rank}, {rank}))")
        axes = tuple(a % rank for a in axes)
    else:
        axes = None
    fn = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max,
          "ReduceMin": np.min, "ReduceProd": np.prod}[node.op]
    return [np.asarray(fn(x, axis=axes, keepdims=bool(int(node.attrs.get("keepdims", 1)))))
            .astype(x.dtype)]
