"""Sequence-model (transformer) nodes to launches of the GPU target's `sequence_kernels`:
pure numpy, no Triton, like `vdla.compiler.targets.gpu.lower` (which hands these ops
here).

    problem = refusal(node, graph)      # None, or why the GPU target does not run it
    kernel = lower(node, graph)         # a `GpuKernel`

How each op runs:

* elementwise ops, casts and the layout ops (transpose, slice, expand) are one `nd_map`
  launch over the output, each operand a strided view of its tensor (broadcast axes
  stride 0, a slice's start an offset and its step a stride, a transpose permuted
  strides), up to 6 axes;
* matmul and qmatmul are one `batched_matmul` launch: each operand's batch offsets are a
  table (numpy broadcasting over any batch axes), a transposed operand swapped strides;
* softmax, layer_norm: one program per row of the last axis; reduce_*: a permuting copy
  that puts the reduced axes last (none when they are last already), then one program
  per output element;
* gather: bounds-checked (`IndexCheck`: a bad index is the reference's ValueError);
* attention: one launch, an online softmax over the keys (FlashAttention's): the scores
  (q @ k^T * scale + mask, -inf above the causal diagonal) never leave the chip.

The integer softmax, LayerNorm, GELU and attention are `lower_integer`'s, built from the
helpers here (strided views, batch offsets, the matmul launch, the row tiles).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, INT8_PRODUCTS_MAX,
                                             MULTIPLIER_MAX, MULTIPLIER_MIN, SHIFT_MAX,
                                             SHIFT_MIN)
from vdla.compiler.targets.gpu import codes
from vdla.compiler.targets.gpu.launches import GpuKernel, IndexCheck, Launch, Ref
from vdla.compiler.targets.gpu.schedule import next_pow2

__all__ = ["RANK_MAX", "SEQUENCE_OPS", "AttentionOperands", "attention_operands",
           "batch_offsets", "dtype_of",
           "lower", "nd_launch", "one_int", "operand", "refusal",
           "requant_refusal", "row_tile", "shape_of", "strided_view"]

#: The most axes an elementwise or layout op's output may have (`nd_map`'s).
RANK_MAX = 6
_UNARY_FLOAT = ("sqrt", "erf", "tanh", "exp", "gelu")
_ARITH = ("sub", "div", "pow")
_COMPARE = ("equal", "less", "greater")
_LAYOUT = ("transpose", "slice", "expand")
_ELEMENTWISE = _UNARY_FLOAT + _ARITH + _COMPARE + ("neg", "where", "cast")
#: Every op this module lowers.
SEQUENCE_OPS = (_ELEMENTWISE + _LAYOUT + tuple(codes.REDUCES) + ("qmatmul",)
                + ("matmul", "softmax", "layer_norm", "gather", "attention"))
#: Elements per program of `nd_map` and `gather_rows`; the largest row block.
_BLOCK = 1024
_ROW_BLOCK = 1024
_NUMERIC = ("float32", "int8", "uint8", "int32", "int64")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shape_of(graph, name) -> tuple[int, ...]:
    return tuple(graph.tensors[name].shape)


def dtype_of(graph, name) -> str:
    return graph.tensors[name].dtype


# --- which nodes -----------------------------------------------------------------------------

def refusal(node: Node, graph: Graph) -> str | None:
    """Why the GPU target does not run `node` (one of `SEQUENCE_OPS`), or None."""
    names = [t for t in node.inputs if t] + list(node.outputs)
    rank = max(len(shape_of(graph, t)) for t in names)
    if rank > RANK_MAX:
        return (f"{node.op} of a {rank}-D tensor: the GPU target takes at most "
                f"{RANK_MAX}-D")
    dtypes = [dtype_of(graph, t) for t in node.inputs if t]
    op = node.op
    if op in _UNARY_FLOAT + _ARITH + tuple(codes.REDUCES) + ("softmax", "layer_norm",
                                                             "matmul", "attention"):
        if any(d != "float32" for d in dtypes):
            return (f"{op} on {'/'.join(dtypes)}: the GPU target runs it on float32 (integer "
                    "shape arithmetic runs on the host)")
    if op in ("neg",) + _COMPARE and dtypes[0] not in _NUMERIC:
        return f"{op} on {dtypes[0]}: the GPU target runs it on {', '.join(_NUMERIC)}"
    if op == "softmax":
        x = shape_of(graph, node.inputs[0])
        axis = int(node.attrs["axis"])
        if not x or axis % len(x) != len(x) - 1:
            return (f"softmax over axis {axis} of {x}: the GPU target normalizes the last "
                    "axis only")
    if op in ("matmul", "qmatmul"):
        a, b = (shape_of(graph, t) for t in node.inputs[:2])
        if len(a) < 2 or len(b) < 2:
            return (f"{op} of shapes {a} and {b}: the GPU target multiplies operands of rank "
                    ">= 2")
    if op == "qmatmul":
        if any(d != "int8" for d in dtypes):
            return f"qmatmul on {'/'.join(dtypes)}: the GPU target runs it on int8"
        k = shape_of(graph, node.inputs[0])[-1]
        if k > INT8_PRODUCTS_MAX:
            return (f"qmatmul sums {k} products per output, more than an int32 accumulator "
                    f"holds exactly ({INT8_PRODUCTS_MAX})")
        return requant_refusal(node, "")
    if op == "gather" and dtypes[0] == "bool":
        return "gather of a bool table: the GPU target gathers numeric tensors"
    return None


def requant_refusal(node: Node, prefix: str) -> str | None:
    """A per-tensor requantization `prefix`multiplier / `prefix`shift, out_min/out_max."""
    a = node.attrs
    m, shift = a.get(f"{prefix}multiplier"), one_int(a.get(f"{prefix}shift"))
    if shift is None:
        return (f"{node.op} {prefix}shift {a.get(f'{prefix}shift')!r}: one integer per tensor "
                "on the GPU target")
    if not SHIFT_MIN <= shift <= SHIFT_MAX:
        return f"{node.op} {prefix}shift {shift}: outside [{SHIFT_MIN}, {SHIFT_MAX}]"
    if m is not None and (one_int(m) is None or not MULTIPLIER_MIN <= one_int(m) <= MULTIPLIER_MAX):
        return (f"{node.op} {prefix}multiplier {m!r}: one integer in [{MULTIPLIER_MIN}, "
                f"{MULTIPLIER_MAX}]")
    lo, hi = a.get(f"{prefix}out_min", INT8_MIN), a.get(f"{prefix}out_max", INT8_MAX)
    if not INT8_MIN <= lo <= hi <= INT8_MAX:
        return (f"{node.op} {prefix}out_min {lo} and {prefix}out_max {hi}: need -128 <= "
                "out_min <= out_max <= 127")
    return None


def one_int(value) -> int | None:
    """A per-tensor integer given as an int or a one-element sequence; None otherwise."""
    arr = np.atleast_1d(np.asarray(value))
    if arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr[0])


# --- operands --------------------------------------------------------------------------------

def operand(graph: Graph, node: Node, i: int, consts: dict) -> Ref:
    """Input `i` of `node`: its uploaded copy when constant, else the activation."""
    t = graph.tensors[node.inputs[i]]
    if t.is_constant:
        consts[f"in{i}"] = np.ascontiguousarray(t.data)
        return Ref("const", f"in{i}")
    return Ref("in", i)


def _contiguous(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def strided_view(shape, out, strides=None, offset: int = 0) -> tuple[int, tuple[int, ...]]:
    """An operand of `shape` (element `strides`, contiguous by default) read over the
    output `out` as numpy broadcasts it, as (offset, 6 strides): axes aligned on the
    right, padded on the left, stride 0 where the operand's axis is 1."""
    strides = _contiguous(shape) if strides is None else tuple(strides)
    pad = len(out) - len(shape)
    own = [0] * pad + [s if d != 1 else 0 for d, s in zip(shape, strides)]
    return offset, tuple([0] * (RANK_MAX - len(out)) + own)


def nd_launch(code: int, out, operands, *, float_math: bool, pow_n: int = 1) -> Launch:
    """One `nd_map` launch over contiguous `out` of operands [(Ref, (offset, strides))]."""
    dims = (1,) * (RANK_MAX - len(out)) + tuple(out)
    refs = [r for r, _ in operands] + [Ref("dummy", "int8")] * (3 - len(operands))
    views = [v for _, v in operands] + [(0, (0,) * RANK_MAX)] * (3 - len(operands))
    total = int(np.prod(out))
    scalars = [x for off, st in views for x in (off, *st)]
    return Launch("nd_map", (max(1, _cdiv(total, _BLOCK)),),
                  (*refs, Ref("out"), total, *dims[1:], *scalars),
                  dict(OP=code, NIN=len(operands), FLOAT=float_math, POW_N=pow_n,
                       BLOCK=_BLOCK, num_warps=4))


def _row_block(n: int) -> int:
    return min(_ROW_BLOCK, max(16, next_pow2(n)))


def row_tile(rows: int, n: int) -> dict:
    """A row kernel's ROWS x BLOCK tile (rows of `n` entries, `rows` of them), at most
    4096 entries, and its grid."""
    block = _row_block(n)
    per = min(next_pow2(rows), max(1, 4096 // block))
    return dict(ROWS=per, BLOCK=block, num_warps=4), (_cdiv(rows, per),)


# --- lowering --------------------------------------------------------------------------------

def lower(node: Node, graph: Graph, float_dtype: str = "float32",
          schedule=None) -> GpuKernel:
    """`node` (which `refusal` accepts) as a `GpuKernel`; `float_dtype` float16: the
    matmuls' dots on float16 (float32 sums); `schedule`: a matmul's `GemmSchedule`
    (checked by the caller; None: 64 x 64 tiles, K steps of 32). Also an add or mul past
    the CNN kernels' 4-D float32 (`vdla.compiler.targets.gpu.lower` hands those here)."""
    op = node.op
    fp16 = float_dtype == "float16"
    if op in _ELEMENTWISE + ("add", "mul"):
        return _lower_elementwise(node, graph)
    if op in _LAYOUT:
        return _lower_layout(node, graph)
    if op in codes.REDUCES:
        return _lower_reduce(node, graph)
    if op in ("matmul", "qmatmul"):
        return _lower_matmul(node, graph, fp16, schedule)
    if op == "softmax":
        return _lower_softmax(node, graph)
    if op == "layer_norm":
        return _lower_layer_norm(node, graph)
    if op == "gather":
        return _lower_gather(node, graph)
    if op == "attention":
        return _lower_attention(node, graph, fp16)
    raise ValueError(f"node {node.name!r}: the GPU target's sequence kernels do not run "
                     f"{op!r}")


def _lower_elementwise(node, graph):
    out = shape_of(graph, node.outputs[0])
    consts: dict = {}
    operands = [(operand(graph, node, i, consts), strided_view(shape_of(graph, t), out))
                for i, t in enumerate(node.inputs)]
    op, pow_n = node.op, 1
    float_math = op in _UNARY_FLOAT + _ARITH or (op in ("neg", "add", "mul") and
                                                 dtype_of(graph, node.inputs[0]) == "float32")
    if op == "cast":
        code = codes.E_TO_BOOL if node.attrs["dtype"] == "bool" else codes.E_COPY
    elif op == "gelu":
        code = codes.E_GELU_TANH if node.attrs["approximate"] == "tanh" else codes.E_GELU
    else:
        code = codes.ELEMENTWISE[op]
    if op == "pow":
        b = graph.tensors[node.inputs[1]]
        if b.is_constant and b.data.size == 1 and float(b.data.flat[0]) in range(1, 9):
            # x**2, x**3: products, as exact as numpy's
            code, pow_n = codes.E_POW_INT, int(b.data.flat[0])
            operands, consts = operands[:1], {k: v for k, v in consts.items() if k == "in0"}
    return GpuKernel(node.name, (nd_launch(code, out, operands, float_math=float_math,
                                     pow_n=pow_n),), consts)


def _lower_layout(node, graph):
    x = shape_of(graph, node.inputs[0])
    out = shape_of(graph, node.outputs[0])
    consts: dict = {}
    ref = operand(graph, node, 0, consts)
    strides = _contiguous(x)
    a = node.attrs
    if node.op == "transpose":
        perm = tuple(a["perm"]) or tuple(reversed(range(len(x))))
        view = strided_view(out, out, [strides[p] for p in perm])
    elif node.op == "slice":
        axes = tuple(a["axes"]) or tuple(range(len(a["starts"])))
        steps = tuple(a["steps"]) or (1,) * len(axes)
        own, offset = list(strides), 0
        for ax, start, step in zip(axes, a["starts"], steps):
            own[ax] = strides[ax] * int(step)
            offset += int(start) * strides[ax]
        view = strided_view(out, out, own, offset)
    else:                                                   # expand
        view = strided_view(x, out)
    return GpuKernel(node.name, (nd_launch(codes.E_COPY, out, [(ref, view)], float_math=False),),
                     consts)


def _lower_reduce(node, graph):
    x = shape_of(graph, node.inputs[0])
    axes = tuple(sorted(a % len(x) for a in node.attrs["axes"])) or tuple(range(len(x)))
    kept = [k for k in range(len(x)) if k not in axes]
    r = int(np.prod([x[k] for k in axes]))
    rows = int(np.prod([x[k] for k in kept]))
    consts: dict = {}
    src = operand(graph, node, 0, consts)
    launches, buffers = [], {}
    if axes != tuple(range(len(x) - len(axes), len(x))):
        # The reduced axes last: a permuting copy into a buffer.
        perm = kept + list(axes)
        shape = tuple(x[k] for k in perm)
        strides = _contiguous(x)
        buffers["perm"] = (shape, "float32")
        launches.append(nd_launch(codes.E_COPY, shape, [(src, strided_view(shape, shape,
                                                               [strides[k] for k in perm]))],
                            float_math=False))
        launches[-1] = _bind_out(launches[-1], Ref("buf", "perm"))
        src = Ref("buf", "perm")
    launches.append(Launch("reduce_rows", (rows,), (src, Ref("out"), r),
                           dict(OP=codes.REDUCES[node.op], BLOCK=_row_block(r), num_warps=4)))
    return GpuKernel(node.name, tuple(launches), consts, buffers=buffers)


def _bind_out(launch: Launch, ref: Ref) -> Launch:
    """`launch` writing `ref` instead of the node's output."""
    return Launch(launch.kernel, launch.grid,
                  tuple(ref if a == Ref("out") else a for a in launch.args), launch.meta)


def batch_offsets(shape, batch, step: int) -> np.ndarray:
    """Element offsets, for each index of the broadcast `batch` axes (flattened), of an
    operand whose batch axes are `shape` and whose matrices have `step` elements."""
    own = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    own = own.reshape((1,) * (len(batch) - len(shape)) + tuple(shape))
    return np.ascontiguousarray(np.broadcast_to(own, batch).reshape(-1) * step)


def _lower_matmul(node, graph, fp16, schedule):
    a, b = (shape_of(graph, t) for t in node.inputs[:2])
    out = shape_of(graph, node.outputs[0])
    int8 = node.op == "qmatmul"
    swap = bool(node.attrs.get("transpose_b"))
    m, k = a[-2:]
    n = b[-2] if swap else b[-1]
    batch = out[:-2]
    consts: dict = {"a_off": batch_offsets(a[:-2], batch, m * k),
                    "b_off": batch_offsets(b[:-2], batch, k * n)}
    refs = [operand(graph, node, i, consts) for i in (0, 1)]
    sbk, sbn = (1, k) if swap else (n, 1)
    if int8:
        mult = node.attrs.get("multiplier")
        requant = (1 if mult is None else one_int(mult), one_int(node.attrs["shift"]),
                   int(node.attrs["out_min"]), int(node.attrs["out_max"]))
    else:
        requant = (1, 0, 0, 0)
    launch = _matmul_launch(refs[0], refs[1], Ref("out"), Ref("const", "a_off"),
                            Ref("const", "b_off"), int(np.prod(batch)), m, n, k,
                            (k, 1), (sbk, sbn), int8=int8, requant=requant,
                            has_mult=int8 and node.attrs.get("multiplier") is not None,
                            fp16=fp16 and not int8, schedule=schedule)
    return GpuKernel(node.name, (launch,), consts, macs=int(np.prod(out)) * k)


def _matmul_launch(a, b, out, a_off, b_off, batches, m, n, k, a_strides, b_strides, *,
                   int8=False, requant=(1, 0, 0, 0), has_mult=False, fp16=False,
                   schedule=None) -> Launch:
    """One `batched_matmul` launch; `schedule`: a `GemmSchedule` (its tile, warps and
    stages), or None for tiles of up to 64 x 64 and K steps of 32."""
    if schedule is None:
        bm = min(64, max(16, next_pow2(m)))
        bn = min(64, max(16, next_pow2(n)))
        bk, warps, stages = 32, 4, 2
    else:
        bm, bn, bk = schedule.block_m, schedule.block_n, schedule.block_k
        warps, stages = schedule.num_warps, schedule.num_stages
    mult, shift, lo, hi = requant
    return Launch("batched_matmul", (_cdiv(m, bm) * _cdiv(n, bn), batches),
                  (a, b, out, a_off, b_off, m, n, k, *a_strides, *b_strides, mult, shift, lo,
                   hi),
                  dict(BM=bm, BN=bn, BK=bk, INT8=int8, FP16=fp16, HAS_MULT=has_mult,
                       num_warps=warps, num_stages=stages))


def _lower_softmax(node, graph):
    x = shape_of(graph, node.inputs[0])
    consts: dict = {}
    src = operand(graph, node, 0, consts)
    n, rows = x[-1], int(np.prod(x[:-1]))
    meta, grid = row_tile(rows, n)
    launch = Launch("row_softmax", grid, (src, Ref("out"), rows, n), meta)
    return GpuKernel(node.name, (launch,), consts)


def _lower_layer_norm(node, graph):
    x = shape_of(graph, node.inputs[0])
    consts: dict = {}
    refs = [operand(graph, node, i, consts) for i in range(len(node.inputs)) if
            node.input(i)]
    has_bias = bool(node.input(2))
    n, rows = x[-1], int(np.prod(x[:-1]))
    meta, grid = row_tile(rows, n)
    launch = Launch("row_layer_norm", grid,
                    (refs[0], refs[1], refs[2] if has_bias else Ref("dummy", "float32"),
                     Ref("out"), rows, n, float(node.attrs["epsilon"])),
                    dict(HAS_BIAS=has_bias, **meta))
    return GpuKernel(node.name, (launch,), consts)


def _lower_gather(node, graph):
    data = shape_of(graph, node.inputs[0])
    idx = shape_of(graph, node.inputs[1])
    axis = int(node.attrs["axis"]) % len(data)
    outer = int(np.prod(data[:axis]))
    n = data[axis]
    inner = int(np.prod(data[axis + 1:]))
    j = int(np.prod(idx))
    consts: dict = {}
    refs = [operand(graph, node, i, consts) for i in (0, 1)]
    total = outer * j * inner
    launch = Launch("gather_rows", (max(1, _cdiv(total, _BLOCK)),),
                    (refs[0], refs[1], Ref("out"), Ref("buf", "err"), total, inner, j, n),
                    dict(BLOCK=_BLOCK, num_warps=4))
    return GpuKernel(node.name, (launch,), consts, buffers={"err": ((1,), "int32")},
                     zeroed=("err",), checks=(IndexCheck("err", 1, n),))


class AttentionOperands(NamedTuple):
    """What both attention launches (`flash_attention`, `fused_qattention`) take of an
    `attention`/`qattention` node: its sizes (queries ``s``, keys ``t``, depths ``d`` and
    ``dv``, ``nb`` batch indices), the q, k, v operands and their per-batch offsets (const
    Refs), and the mask (its Ref, its offsets' Ref, its (S, T) strides; dummies and zero
    strides without one)."""

    s: int
    t: int
    d: int
    dv: int
    nb: int
    qkv: tuple
    offsets: tuple
    mask: tuple
    strides: tuple
    has_mask: bool


def attention_operands(graph, node, consts, mask_dtype: str) -> AttentionOperands:
    """`AttentionOperands` of `node`, its constants added to `consts`; a missing mask
    is a dummy Ref of `mask_dtype`."""
    q, k, v = (shape_of(graph, t) for t in node.inputs[:3])
    batch = shape_of(graph, node.outputs[0])[:-2]
    s, d = q[-2:]
    t, dv = v[-2:]
    consts.update({"q_off": batch_offsets(q[:-2], batch, s * d),
                   "k_off": batch_offsets(k[:-2], batch, t * d),
                   "v_off": batch_offsets(v[:-2], batch, t * dv)})
    qkv = tuple(operand(graph, node, i, consts) for i in range(3))
    offsets = tuple(Ref("const", f"{n}_off") for n in "qkv")
    if not node.input(3):
        return AttentionOperands(s, t, d, dv, int(np.prod(batch)), qkv, offsets,
                                 (Ref("dummy", mask_dtype), Ref("dummy", "int64")), (0, 0),
                                 False)
    mshape = shape_of(graph, node.inputs[3])
    mshape = (1,) * (len(batch) + 2 - len(mshape)) + mshape
    consts["m_off"] = batch_offsets(mshape[:-2], batch, mshape[-2] * mshape[-1])
    return AttentionOperands(s, t, d, dv, int(np.prod(batch)), qkv, offsets,
                             (operand(graph, node, 3, consts), Ref("const", "m_off")),
                             (mshape[-1] if mshape[-2] > 1 else 0, 1 if mshape[-1] > 1 else 0),
                             True)


def _lower_attention(node, graph, fp16):
    """One `flash_attention` launch: BM queries of one batch index a program."""
    consts: dict = {}
    a = attention_operands(graph, node, consts, "float32")
    s, t, d, dv, nb = a.s, a.t, a.d, a.dv, a.nb
    bm = min(64, max(16, next_pow2(s)))
    launch = Launch("flash_attention", (_cdiv(s, bm), nb),
                    (*a.qkv, Ref("out"), *a.offsets, *a.mask, s, t, d, dv, *a.strides,
                     float(node.attrs["scale"])),
                    dict(BM=bm, BN=min(64, max(16, next_pow2(t))), BD=max(16, next_pow2(d)),
                         BDV=max(16, next_pow2(dv)), HAS_MASK=a.has_mask,
                         CAUSAL=bool(node.attrs["causal"]), FP16=fp16, num_warps=4))
    return GpuKernel(node.name, (launch,), consts, macs=nb * s * t * (d + dv))
