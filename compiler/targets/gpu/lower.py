"""A graph node to the launches of the GPU target's kernels (`kernels`): pure numpy, no
Triton, so a model is lowered (and checked) without it.

    problem = refusal(node, graph)          # None, or why the GPU target does not run it
    kernel = lower(node, graph, schedule=None, float_dtype="float32")   # a `GpuKernel`

The ops of sequence models (transformers: matmul, softmax, layer_norm, gather, attention,
the elementwise and layout ops) are `lower_sequence`'s; their integer forms (qsoftmax,
qlayer_norm, qgelu, qattention) `lower_integer`'s.

A `GpuKernel` (`launches`) names its launches' arguments (`Ref`: the node's inputs and
output, its constants, scratch buffers) rather than holding device memory: the session
binds them (`vdla.compiler.targets.gpu.target.GpuSession`). Requantization parameters become one
int32 per channel (a per-tensor value repeated), so one kernel serves both.
"""

from __future__ import annotations

import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, INT8_PRODUCTS_MAX,
                                             MULTIPLIER_MAX, MULTIPLIER_MIN, SHIFT_MAX,
                                             SHIFT_MIN, per_channel)
from vdla.compiler.targets.gpu import codes, lower_integer, lower_sequence
from vdla.compiler.targets.gpu.launches import GpuKernel, Launch, Ref
from vdla.compiler.targets.gpu.schedule import (MATMUL_OPS, GemmSchedule, ScheduleError, choose,
                                                gemm_shape, next_pow2)

__all__ = ["FLOAT_DTYPES", "GEMM_OPS", "GpuKernel", "Launch", "MATMUL_OPS", "OPS", "Ref",
           "VIEW_OPS", "lower", "refusal"]

#: Storage (and dot) dtypes of the float graph.
FLOAT_DTYPES = ("float32", "float16")
GEMM_OPS = ("qconv2d", "conv2d", "qdense", "dense")
VIEW_OPS = ("flatten", "reshape")
_POOLS = ("max_pool2d", "avg_pool2d", "qavg_pool2d", "global_avg_pool2d", "qglobal_avg_pool2d")
#: Every op the GPU target runs.
OPS = (GEMM_OPS + VIEW_OPS + _POOLS + tuple(codes.BINARY) + tuple(codes.UNARY) + ("concat",)
       + lower_sequence.SEQUENCE_OPS + lower_integer.INTEGER_OPS)
_PLAIN = {"conv": ("NCHW", "OIHW", "NCHW"), "dense": ("NC", "OI", "NC")}
#: Elements per program of the elementwise, pool and copy kernels.
_BLOCK = 1024
_POOL_BLOCK = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- which nodes -----------------------------------------------------------------------------

def refusal(node: Node, graph: Graph) -> str | None:
    """Why the GPU target does not run `node` of `graph`, or None when it does."""
    if node.op not in OPS:
        return f"the GPU target does not run {node.op!r}"
    if node.op in lower_sequence.SEQUENCE_OPS:
        return lower_sequence.refusal(node, graph)
    if node.op in lower_integer.INTEGER_OPS:
        return lower_sequence.refusal(node, graph) or lower_integer.refusal(node, graph)
    dtypes = [graph.tensors[t].dtype for t in node.inputs if t]
    if node.op in GEMM_OPS:
        return _gemm_refusal(node, graph)
    if node.op in _POOLS:
        x = graph.tensors[node.inputs[0]]
        want = ("int8",) if node.op.startswith("q") else (
            ("int8", "float32") if node.op == "max_pool2d" else ("float32",))
        if x.dtype not in want or len(x.shape) != 4:
            return (f"{node.op} on a {len(x.shape)}-D {x.dtype} tensor: the GPU target runs "
                    f"it on 4-D (NCHW) {' or '.join(want)}")
        return _params_refusal(node, graph, "", x.shape[1]) if node.op.startswith("q") else None
    if node.op in ("add", "mul") and _strided(node, graph):
        return lower_sequence.refusal(node, graph)
    if node.op in codes.BINARY:
        want = "int8" if node.op == "qadd" else "float32"
        if any(d != want for d in dtypes):
            return f"{node.op} on {'/'.join(dtypes)}: the GPU target runs it on {want}"
        out = graph.tensors[node.outputs[0]].shape
        if len(out) > 4:
            return f"{node.op} of a {len(out)}-D tensor: the GPU target takes at most 4-D"
        if node.op == "qadd":
            channels = out[1] if len(out) > 1 else 1
            return (_params_refusal(node, graph, "a_", channels)
                    or _params_refusal(node, graph, "b_", channels))
        return None
    if node.op in ("relu", "clip", "quantize", "dequantize"):
        want = {"relu": ("int8", "float32"), "clip": ("float32",), "quantize": ("float32",),
                "dequantize": ("int8", "int32")}[node.op]
        if dtypes[0] not in want:
            return f"{node.op} on {dtypes[0]}: the GPU target runs it on {' or '.join(want)}"
        if node.op == "quantize" and node.attrs["dtype"] != "int8":
            return f"quantize to {node.attrs['dtype']!r}: the GPU target quantizes to int8"
        return None
    if node.op == "concat" and len(set(dtypes)) != 1:
        return f"concat of {'/'.join(dtypes)} parts: the GPU target needs one dtype"
    return None


def _strided(node: Node, graph: Graph) -> bool:
    """An add or mul that `binary` (float32, up to 4-D) does not take but
    `lower_sequence`'s strided map does: more axes, or integer operands of one dtype."""
    dtypes = {graph.tensors[t].dtype for t in node.inputs}
    out = graph.tensors[node.outputs[0]].shape
    return (len(dtypes) == 1 and dtypes <= {"float32", "int32", "int64"}
            and (len(out) > 4 or dtypes != {"float32"}))


def _gemm_refusal(node: Node, graph: Graph) -> str | None:
    kind = "dense" if node.op.endswith("dense") else "conv"
    for key, want in zip(("data_layout", "kernel_layout", "out_layout"), _PLAIN[kind]):
        if node.attrs[key] != want:
            return (f"{node.op} with {key} {node.attrs[key]!r}: the GPU target takes plain "
                    f"layouts ({want})")
    data = "int8" if node.op.startswith("q") else "float32"
    x = graph.tensors[node.inputs[0]]
    if x.dtype != data:
        return f"{node.op} on {x.dtype} data: the GPU target runs it on {data}"
    w = graph.tensors[node.inputs[1]]
    if not w.is_constant or w.dtype != data:
        return (f"{node.op} with computed or non-{data} weights: the GPU target needs "
                f"constant {data}")
    bias = node.input(2)
    want_bias = "int32" if data == "int8" else "float32"
    if bias and (not graph.tensors[bias].is_constant
                 or graph.tensors[bias].dtype != want_bias):
        return (f"{node.op} with a computed or non-{want_bias} bias: the GPU target needs a "
                f"constant {want_bias} bias")
    res = node.input(3)
    if res and (graph.tensors[res].is_constant or graph.tensors[res].dtype != data
                or graph.tensors[res].shape != graph.tensors[node.outputs[0]].shape):
        return (f"{node.op} with a constant, non-{data} or broadcast residual: the GPU "
                "target adds a computed one of the output's shape")
    if data == "int8":
        terms = int(np.prod(w.shape[1:]))
        if terms > INT8_PRODUCTS_MAX:
            return (f"{node.op} sums {terms} products per output, more than an int32 "
                    f"accumulator holds exactly ({INT8_PRODUCTS_MAX})")
        out = graph.tensors[node.outputs[0]].shape[1]
        return (_params_refusal(node, graph, "", out)
                or (_params_refusal(node, graph, "residual_", out) if res else None))
    return None


def _params_refusal(node: Node, graph: Graph, prefix: str, channels: int) -> str | None:
    """Requantization parameters `prefix`multiplier/`prefix`shift: one value or one per
    channel, in range; out_min/out_max in int8."""
    a = node.attrs
    for name, low, high in ((f"{prefix}multiplier", MULTIPLIER_MIN, MULTIPLIER_MAX),
                            (f"{prefix}shift", SHIFT_MIN, SHIFT_MAX)):
        value = a.get(name)
        if value is None:
            continue
        arr = np.atleast_1d(np.asarray(value))
        if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.size not in (1, channels):
            return (f"{node.op} {name} {value!r}: one integer or one per channel "
                    f"({channels})")
        if arr.min() < low or arr.max() > high:
            return f"{node.op} {name} {value!r}: outside [{low}, {high}]"
    lo, hi = a.get("out_min", INT8_MIN), a.get("out_max", INT8_MAX)
    if not INT8_MIN <= lo <= hi <= INT8_MAX:
        return f"{node.op} out_min {lo} and out_max {hi}: need -128 <= out_min <= out_max <= 127"
    return None


# --- lowering --------------------------------------------------------------------------------

def _requant_consts(attrs, prefix: str, channels: int, consts: dict, key: str):
    """(has multiplier, const key of the multipliers, of the shifts)."""
    m = attrs.get(f"{prefix}multiplier")
    consts[f"{key}mult"] = per_channel(m, channels, 1)
    consts[f"{key}shift"] = per_channel(attrs.get(f"{prefix}shift"), channels, 0)
    return m is not None, Ref("const", f"{key}mult"), Ref("const", f"{key}shift")


def lower(node: Node, graph: Graph, schedule: GemmSchedule | None = None, *,
          float_dtype: str = "float32") -> tuple[GpuKernel, GemmSchedule | None]:
    """`node` (which `refusal` accepts) as a `GpuKernel`, and the GEMM schedule used (None
    for other ops). `schedule` is for GEMM ops and the batched matmuls only (None:
    `choose`'s); `float_dtype` is how float tensors are stored and multiplied (float32,
    or float16 with float32 sums).
    ValueError for a schedule that does not fit (`GemmSchedule.check`)."""
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, not {float_dtype!r}")
    problem = refusal(node, graph)
    if problem:
        raise ValueError(f"node {node.name!r}: {problem}")
    if node.op in GEMM_OPS:
        return _lower_gemm(node, graph, schedule, float_dtype)
    if node.op in MATMUL_OPS:
        return _lower_matmul(node, graph, schedule, float_dtype)
    if schedule is not None:
        raise ValueError(f"node {node.name!r} ({node.op}) takes no schedule; only "
                         f"{', '.join(GEMM_OPS + MATMUL_OPS)} have one")
    if node.op in VIEW_OPS:
        return GpuKernel(node.name, (), {}, view=True), None
    if node.op in lower_sequence.SEQUENCE_OPS:
        return lower_sequence.lower(node, graph, float_dtype), None
    if node.op in lower_integer.INTEGER_OPS:
        return lower_integer.lower(node, graph), None
    if node.op in _POOLS:
        return _lower_pool(node, graph), None
    if node.op in ("add", "mul") and _strided(node, graph):
        return lower_sequence.lower(node, graph, float_dtype), None
    if node.op in codes.BINARY:
        return _lower_binary(node, graph), None
    if node.op in codes.UNARY:
        return _lower_unary(node, graph), None
    return _lower_concat(node, graph), None


def _act(attrs) -> tuple[int, float, float]:
    act = attrs.get("activation")
    lo = attrs.get("clip_min")
    hi = attrs.get("clip_max")
    code = codes.ACTIVATIONS[act]
    return code, -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)


def _lower_gemm(node, graph, schedule, float_dtype):
    a = node.attrs
    int8 = node.op.startswith("q")
    dense = node.op.endswith("dense")
    x = graph.tensors[node.inputs[0]].shape
    out = graph.tensors[node.outputs[0]].shape
    weights = graph.constant(node.inputs[1])
    oc = weights.shape[0]
    if dense:
        n, c, h, w, ho, wo, kh, kw, groups = x[0], x[1], 1, 1, 1, 1, 1, 1, 1
        strides, pads, dil = (1, 1), (0, 0, 0, 0), (1, 1)
    else:
        n, c, h, w = x
        ho, wo = out[2], out[3]
        kh, kw = weights.shape[2:]
        groups = int(a["groups"])
        strides, pads, dil = a["strides"], a["pads"], a["dilations"]
    dot = "int8" if int8 else float_dtype
    store = np.int8 if int8 else np.dtype(float_dtype)
    consts = {"w": np.ascontiguousarray(weights, dtype=store)}
    bias = node.input(2)
    if bias:
        consts["bias"] = np.ascontiguousarray(graph.constant(bias),
                                              dtype=np.int32 if int8 else np.float32)
    acc_dtype = "int32" if int8 else "float32"
    if int8:
        has_mult, mult, shift = _requant_consts(a, "", oc, consts, "")
        has_rmult, rmult, rshift = (_requant_consts(a, "residual_", oc, consts, "r")
                                    if node.input(3) else (False, Ref("dummy", "int32"),
                                                           Ref("dummy", "int32")))
        bounds, act, lo, hi = ((int(a["out_min"]), int(a["out_max"])), codes.ACT_NONE, 0.0,
                               0.0)
    else:
        has_mult = has_rmult = False
        mult = shift = rmult = rshift = Ref("dummy", "int32")
        bounds = (0, 0)
        act, lo, hi = _act(a)
    epilogue = dict(INT8=int8, HAS_BIAS=bool(bias), HAS_MULT=has_mult,
                    HAS_RES=bool(node.input(3)), HAS_RMULT=has_rmult, ACT=act)
    ptrs = (Ref("const", "bias") if bias else Ref("dummy", acc_dtype), mult, shift,
            Ref("in", 3) if node.input(3) else Ref("dummy", "int8"), rmult, rshift)
    scalars = (*bounds, lo, hi)
    macs = n * oc * ho * wo * (c // groups) * kh * kw
    m = n * ho * wo
    if not dense and c // groups == 1 and groups > 1:
        # Depthwise: tap by tap (K = kh*kw is too short for a dot); not scheduled.
        if schedule is not None:
            raise ValueError(f"node {node.name!r}: a depthwise convolution runs the direct "
                             "kernel, which takes no GEMM schedule")
        bm, bn = 128, 16
        launch = Launch("conv_direct", (_cdiv(m, bm), _cdiv(oc, bn)),
                        (Ref("in", 0), Ref("const", "w"), Ref("out"), *ptrs,
                         n, c, h, w, oc, ho, wo, oc // groups, *strides, pads[0], pads[1],
                         *dil, *scalars),
                        dict(KH=kh, KW=kw, BM=bm, BN=bn, num_warps=4, **epilogue))
        return GpuKernel(node.name, (launch,), consts, macs=macs), None
    shape = gemm_shape(node, graph, dot)
    if schedule is None:
        schedule = choose(shape)
    elif not isinstance(schedule, GemmSchedule):
        raise TypeError(f"node {node.name!r}: a GPU GEMM schedule must be a GemmSchedule, "
                        f"not {type(schedule).__name__}")
    schedule.check(shape)
    s = schedule
    splits = s.splits(shape)
    grid = (_cdiv(m, s.block_m) * _cdiv(shape.n, s.block_n), groups, splits)
    launches = [Launch(
        "conv_gemm", grid,
        (Ref("in", 0), Ref("const", "w"), Ref("out"),
         Ref("scratch") if splits > 1 else Ref("dummy", acc_dtype), *ptrs,
         n, c, h, w, oc, ho, wo, c // groups, shape.n, shape.k, s.k_split(shape),
         *strides, pads[0], pads[1], *dil, *scalars),
        dict(KH=kh, KW=kw, BM=s.block_m, BN=s.block_n, BK=s.block_k, SPLIT_K=splits,
             FP16=dot == "float16", num_warps=s.num_warps, num_stages=s.num_stages,
             **epilogue))]
    scratch = None
    if splits > 1:
        scratch = ((splits, m, oc), acc_dtype)
        launches.append(Launch("gemm_finish", (_cdiv(m, 32), _cdiv(oc, 32)),
                               (Ref("scratch"), Ref("out"), *ptrs, m, oc, ho * wo, *scalars,
                                splits),
                               dict(BM=32, BN=32, num_warps=4, **epilogue)))
    return GpuKernel(node.name, tuple(launches), consts, scratch, macs), s


def _lower_matmul(node, graph, schedule, float_dtype):
    """A matmul or qmatmul with `schedule` (None: `choose`'s, without split-K): the
    batched matmul kernel's tile, warps and stages."""
    dot = "int8" if node.op == "qmatmul" else float_dtype
    shape = gemm_shape(node, graph, dot)
    if schedule is None:
        schedule = choose(shape, split_k=False)
    elif not isinstance(schedule, GemmSchedule):
        raise TypeError(f"node {node.name!r}: a GPU GEMM schedule must be a GemmSchedule, "
                        f"not {type(schedule).__name__}")
    schedule.check(shape)
    if schedule.split_k != 1:
        raise ScheduleError(f"split_k {schedule.split_k!r}: a batched matmul ({node.op}) "
                            "runs in one K slice (split_k 1)")
    return lower_sequence.lower(node, graph, float_dtype, schedule), schedule


def _lower_pool(node, graph):
    a = node.attrs
    x = graph.tensors[node.inputs[0]]
    out = graph.tensors[node.outputs[0]].shape
    n, c, h, w = x.shape
    int8 = x.dtype == "int8"
    consts = {}
    if node.op.startswith("q"):
        has_mult, mult, shift = _requant_consts(a, "", c, consts, "")
    else:
        has_mult, mult, shift = False, Ref("dummy", "int32"), Ref("dummy", "int32")
    if node.op.endswith("global_avg_pool2d"):
        hw = h * w
        bc, bhw = 16, min(256, max(16, next_pow2(hw)))
        launch = Launch("global_pool", (_cdiv(n * c, bc),),
                        (Ref("in", 0), Ref("out"), mult, shift, n * c, c, hw),
                        dict(INT8=int8, HAS_MULT=has_mult, BC=bc, BHW=bhw, num_warps=4))
        return GpuKernel(node.name, (launch,), consts)
    mode = (codes.POOL_MAX if node.op == "max_pool2d" else
            codes.POOL_QSUM if int8 else codes.POOL_MEAN)
    pads = a["pads"]
    total = int(np.prod(out))
    launch = Launch("pool2d", (_cdiv(total, _POOL_BLOCK),),
                    (Ref("in", 0), Ref("out"), mult, shift, total, c, h, w, out[2], out[3],
                     *a["strides"], pads[0], pads[1], h + pads[2], w + pads[3]),
                    dict(KH=a["kernel"][0], KW=a["kernel"][1], MODE=mode, INT8=int8,
                         HAS_MULT=has_mult, INCLUDE_PAD=bool(a.get("count_include_pad")),
                         BLOCK=_POOL_BLOCK, num_warps=4))
    return GpuKernel(node.name, (launch,), consts)


def _view4(shape, out) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An operand of `shape` broadcast over `out`, both as 4-D (aligned on the right as
    numpy broadcasts, then padded on the right so axis 1 stays the channels): the
    output's dims and the operand's element strides (0 where broadcast)."""
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    dims4 = tuple(out) + (1,) * (4 - len(out))
    shape4 = shape + (1,) * (4 - len(shape))
    strides, step = [0] * 4, 1
    for k in range(3, -1, -1):
        strides[k] = step if shape4[k] == dims4[k] and dims4[k] > 1 else 0
        step *= shape4[k]
    return dims4, tuple(strides)


def _lower_binary(node, graph):
    out = graph.tensors[node.outputs[0]].shape
    consts, refs, strides = {}, [], []
    for i, name in enumerate(node.inputs):
        t = graph.tensors[name]
        if t.is_constant:
            consts[f"in{i}"] = np.ascontiguousarray(t.data)
            refs.append(Ref("const", f"in{i}"))
        else:
            refs.append(Ref("in", i))
        dims, st = _view4(t.shape, out)
        strides.append(st)
    channels = dims[1]
    a = node.attrs
    if node.op == "qadd":
        a_mult, a_m, a_s = _requant_consts(a, "a_", channels, consts, "a")
        b_mult, b_m, b_s = _requant_consts(a, "b_", channels, consts, "b")
        bounds = (int(a["out_min"]), int(a["out_max"]))
    else:
        a_mult = b_mult = False
        a_m = a_s = b_m = b_s = Ref("dummy", "int32")
        bounds = (0, 0)
    total = int(np.prod(out))
    launch = Launch("binary", (_cdiv(total, _BLOCK),),
                    (refs[0], refs[1], Ref("out"), a_m, a_s, b_m, b_s, total, *dims[1:],
                     *strides[0], *strides[1], *bounds),
                    dict(OP=codes.BINARY[node.op], A_MULT=a_mult, B_MULT=b_mult, BLOCK=_BLOCK,
                         num_warps=4))
    return GpuKernel(node.name, (launch,), consts)


def _lower_unary(node, graph):
    x = graph.tensors[node.inputs[0]]
    total = int(np.prod(x.shape))
    consts, lo, hi = {}, 0.0, 0.0
    if node.op in ("quantize", "dequantize"):
        consts["scale"] = np.array([float(node.attrs["scale"])], np.float64)
    if node.op == "clip":
        lo = -math.inf if node.attrs["min"] is None else float(node.attrs["min"])
        hi = math.inf if node.attrs["max"] is None else float(node.attrs["max"])
    scale = Ref("const", "scale") if consts else Ref("dummy", "float64")
    launch = Launch("unary", (_cdiv(total, _BLOCK),),
                    (Ref("in", 0), Ref("out"), scale, total, lo, hi),
                    dict(OP=codes.UNARY[node.op], INT8=x.dtype == "int8", BLOCK=_BLOCK,
                         num_warps=4))
    return GpuKernel(node.name, (launch,), consts)


def _lower_concat(node, graph):
    out = graph.tensors[node.outputs[0]].shape
    axis = node.attrs["axis"] % len(out)
    inner = int(np.prod(out[axis + 1:]))
    outer = int(np.prod(out[:axis]))
    consts, launches, offset = {}, [], 0
    for i, name in enumerate(node.inputs):
        t = graph.tensors[name]
        row = t.shape[axis] * inner
        if t.is_constant:
            consts[f"in{i}"] = np.ascontiguousarray(t.data)
            src = Ref("const", f"in{i}")
        else:
            src = Ref("in", i)
        if row:
            launches.append(Launch("copy_rows", (_cdiv(outer * row, _BLOCK),),
                                   (src, Ref("out"), outer * row, row, out[axis] * inner,
                                    offset),
                                   dict(BLOCK=_BLOCK, num_warps=4)))
        offset += row
    return GpuKernel(node.name, tuple(launches), consts)
