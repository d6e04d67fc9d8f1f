"""The CPU target's non-GEMM ops compiled to C: pools, elementwise ops, quantize and
dequantize, concat and copies; and, from their own modules, the ops of sequence models
(`matmul`: matmul, qmatmul; `norms`: softmax, layer_norm, gelu; `qnorms`: qsoftmax,
qlayer_norm, qgelu; `attention`: attention, qattention; `sequence`: transpose, slice,
expand, gather, where, cast, comparisons, sub/div/pow, unary math, reductions, and
add/mul with the broadcasts the elementwise kernels refuse), whose C depends on the
instruction set.

    if supports(node, graph).ok:
        kernel = build(node, graph, isa)       # a `Kernel` (vdla.compiler.targets.cpu.kernel)

Every kernel reproduces its reference kernel (`vdla.compiler.reference.kernels_int`,
`kernels_float`): the int8 ops bit for bit (`vdla.compiler.reference.integer`: int32
arithmetic that wraps, computed on ``uint32_t``; rounding half up), quantize and
dequantize bit for bit (double arithmetic, as the reference), float add, mul, relu,
clip and max pool bit for bit too (a float32 sum or product rounded once is what the
reference's float64 result rounds to), and the float average pools within rounding
(sums in double). One difference: max pool does not propagate a NaN as numpy does
(relu and clip do).

Tensors are in plain layouts (C-contiguous, the graph's shapes); a tensor with a packed
``layout`` is refused. The max pool and the global pools also read the CPU target's
blocked layout (NCHW{c}c, `vdla.compiler.targets.cpu.layout`) when their producer
writes it (`build`'s ``in_block``). The C text holds shapes and attribute flags only: requantization
tables, scales, clip bounds and constant operands travel in ``params``, so one source
(and one cached build) serves every model of the same shapes.

How the loops run:

* pools: one output row per work item (OpenMP over planes x rows when the pool is
  large): the window's input rows are first combined column by column into one padded
  row on the stack (max, or sum), then every output column combines ``kw`` neighbours
  of that row. Both loops are contiguous or constant-stride and have no branches, so gcc
  vectorizes them; padding and the ceil-mode overhang are the row's pad columns (the
  dtype's minimum for max, zero for sums) and skipped rows.
* elementwise ops: the output is viewed as (N, C, P) (batch, channels, the rest); an
  operand is full (one value per output element), one sample repeated over the batch,
  or constant over P (a scalar, or one value per channel and/or batch: its value and
  requantization parameters are loaded once per (n, c)). When nothing depends on the
  channel the view is (1, 1, all). The innermost loop runs along P (or along C when P
  is 1) and vectorizes; quantize runs eight values at a time in GCC vector extensions
  (gcc does not vectorize floor() under its default -ftrapping-math).
* copies (concat, flatten, reshape): ``memcpy`` of contiguous runs, split in pieces
  that OpenMP shares when the tensor is large.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES, Node
from vdla.compiler.targets.base import Support
from vdla.compiler.targets.cpu.elementwise import (binary_kernel, binary_refusal,
                                                   quantize_kernel, unary_kernel,
                                                   unary_refusal)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.matmul import matmul_kernel, matmul_refusal, qmatmul_refusal
from vdla.compiler.targets.cpu.attention import attention_kernel, attention_refusal
from vdla.compiler.targets.cpu.norms import norm_kernel, norm_refusal
from vdla.compiler.targets.cpu.qnorms import qnorm_kernel, qnorm_refusal
from vdla.compiler.targets.cpu.sequence import (BROADCAST_OPS, SEQUENCE_OPS, sequence_kernel,
                                               sequence_refusal)
from vdla.compiler.targets.cpu.opbase import (COPY_PARALLEL_MIN, COPY_PIECE, CTYPES,
                                             OK, Sources, dtype_refusal, indent,
                                             kernel, requant_attrs_refusal, size)
from vdla.compiler.targets.cpu.pools import (BLOCKED_POOLS, blocked_global_pool_kernel,
                                            blocked_pool_kernel, global_pool_kernel,
                                            pool_kernel, pool_refusal)

__all__ = ["CAPABILITIES", "OPS", "build", "supports"]

CAPABILITIES: list[tuple[str, str]] = [
    ("max_pool2d", "int8 or float32: any window, stride, padding, ceil mode"),
    ("avg_pool2d", "float32: any window, stride, padding, ceil mode, count_include_pad"),
    ("qavg_pool2d", "int8 window sums, requantized per tensor or per channel"),
    ("global_avg_pool2d", "float32 mean over H and W"),
    ("qglobal_avg_pool2d", "int8 sums over H and W, requantized"),
    ("qadd", ("int8, each operand requantized (per tensor or per channel), clamped; an "
              "operand may be a constant, or broadcast as a scalar, per channel/batch or "
              "over the batch")),
    ("add, mul", ("float32: equal shapes, or one operand (constant or computed) broadcast "
                  "as a scalar, per channel/batch or over the batch")),
    ("relu", "int8 or float32"),
    ("clip", "float32, either bound optional"),
    ("quantize", "float32 -> int8 (round half up, saturated)"),
    ("dequantize", "int8 or int32 -> float32"),
    ("concat", "any axis, any number of inputs (computed or constant), one dtype"),
    ("flatten, reshape", "a copy of the bytes"),
    ("matmul", "float32, batched (numpy broadcasting of the batch axes), either operand "
               "computed or constant; register-tiled"),
    ("qmatmul", "int8 (transpose_b too), exact int32 sums, requantized per tensor"),
    ("softmax, layer_norm", "float32 over the last axis"),
    ("gelu", "float32, erf or tanh form"),
    ("transpose, slice, expand, where, cast, neg, equal, less, greater",
     "any dtype (float32, int8, int32, int64, bool), any broadcast"),
    ("gather", "any table dtype, int32/int64 indices, every index checked (a bad one is "
               "an error, never read)"),
    ("sub, div, pow, sqrt, erf, tanh, exp; add, mul with any broadcast", "float32"),
    ("reduce_mean, reduce_sum, reduce_max", "float32, any axes"),
    ("qsoftmax, qlayer_norm, qgelu", "int8, bit-exact with the integer definitions "
                                     "(last axis; qgelu and the exponentials as tables)"),
    ("attention, qattention", "the fused unit (scores, mask, causal, softmax, times v) in "
                              "one kernel; float32, or int8 bit-exact"),
]


# --- copies --------------------------------------------------------------------------------

def _copy_refusal(node: Node, graph: Graph) -> str | None:
    return dtype_refusal(node, graph, tuple(CTYPES))


def _copy_kernel(node: Node, graph: Graph) -> Kernel:
    """``concat`` (runs of each input into each outer slice of the output), ``flatten``
    and ``reshape`` (one run)."""
    out = graph.tensors[node.outputs[0]].shape
    itemsize = np.dtype(DTYPES[graph.tensors[node.outputs[0]].dtype]).itemsize
    names = [t for t in node.inputs if t]
    if node.op == "concat":
        axis = int(node.attrs["axis"]) % len(out)
        outer, inner = size(out[:axis]), size(out[axis + 1:]) * itemsize
        runs = [graph.tensors[t].shape[axis] * inner for t in names]
    else:
        outer, runs = 1, [size(out) * itemsize]
    row = sum(runs)
    params = Params()
    sources = Sources(graph, params)
    parts, start = [], 0
    for name, run in zip(names, runs):
        if run:
            parts.append(_copy_loop(sources.pointer(name, "unsigned char"), run, start, row,
                                    outer))
        start += run
    body = f"""
/* {node.op} {[graph.tensors[t].shape for t in names]} -> {out} */
void NAME{SIGNATURE} {{
    unsigned char *restrict y = (unsigned char *)out_;
    (void)params; (void)ws; (void)in;
    {indent(chr(10).join(parts), 4)}
}}
"""
    return kernel(body, params, sources)


def _copy_loop(src: str, run: int, start: int, row: int, outer: int) -> str:
    """C: ``outer`` runs of `run` bytes from `src` (consecutive) to ``y + start`` (every
    `row` bytes), cut in `COPY_PIECE` pieces that OpenMP shares when the copy is big."""
    pieces = -(-run // COPY_PIECE)
    pragma = ("#pragma omp parallel for schedule(static)\n"
              if outer * run >= COPY_PARALLEL_MIN and outer * pieces > 1 else "")
    return f"""{{
    const unsigned char *restrict src = {src};
    {pragma}for (size_t t = 0; t < {outer * pieces}; t++) {{
        const size_t o = t / {pieces}, at = t % {pieces} * {COPY_PIECE};
        const size_t len = {run} - at < {COPY_PIECE} ? {run} - at : {COPY_PIECE};
        memcpy(y + o * {row} + {start} + at, src + o * {run} + at, len);
    }}
}}"""


# --- the table ------------------------------------------------------------------------------

_Check = Callable[[Node, Graph], "str | None"]
_OPS: dict[str, tuple[_Check, Callable[[Node, Graph], Kernel]]] = {
    "max_pool2d": (lambda n, g: pool_refusal(n, g, ("int8", "float32")), pool_kernel),
    "avg_pool2d": (lambda n, g: pool_refusal(n, g, ("float32",)), pool_kernel),
    "qavg_pool2d": (lambda n, g: pool_refusal(n, g, ("int8",))
                    or requant_attrs_refusal(n, g), pool_kernel),
    "global_avg_pool2d": (lambda n, g: pool_refusal(n, g, ("float32",)), global_pool_kernel),
    "qglobal_avg_pool2d": (lambda n, g: pool_refusal(n, g, ("int8",))
                           or requant_attrs_refusal(n, g), global_pool_kernel),
    "qadd": (binary_refusal, binary_kernel),
    "add": (binary_refusal, binary_kernel),
    "mul": (binary_refusal, binary_kernel),
    "relu": (unary_refusal, unary_kernel),
    "clip": (unary_refusal, unary_kernel),
    "quantize": (unary_refusal, quantize_kernel),
    "dequantize": (unary_refusal, unary_kernel),
    "concat": (_copy_refusal, _copy_kernel),
    "flatten": (_copy_refusal, _copy_kernel),
    "reshape": (_copy_refusal, _copy_kernel),
}

#: Ops whose C depends on the instruction set: (refusal, builder(node, graph, isa)).
_ISA_OPS: dict[str, tuple[_Check, Callable[[Node, Graph, Isa], Kernel]]] = {
    "matmul": (matmul_refusal, matmul_kernel),
    "qmatmul": (qmatmul_refusal, matmul_kernel),
    "softmax": (norm_refusal, norm_kernel),
    "layer_norm": (norm_refusal, norm_kernel),
    "gelu": (norm_refusal, norm_kernel),
    "qsoftmax": (qnorm_refusal, qnorm_kernel),
    "qlayer_norm": (qnorm_refusal, qnorm_kernel),
    "qgelu": (qnorm_refusal, qnorm_kernel),
    "attention": (attention_refusal, attention_kernel),
    "qattention": (attention_refusal, attention_kernel),
    **{op: (sequence_refusal, sequence_kernel) for op in SEQUENCE_OPS},
}

#: The ops this module compiles.
OPS: frozenset[str] = frozenset(_OPS) | frozenset(_ISA_OPS)


def supports(node: Node, graph: Graph) -> Support:
    """Whether `build` compiles `node` of `graph`, and if not, why.

    node : a node of `graph` whose output shapes are inferred
    graph : the graph (its tensors' shapes, dtypes, layouts and constants)
    Returns a `Support` whose reason names the op, the node and what is refused."""
    if node.op not in OPS:
        return Support(False, f"the CPU target's generic kernels do not run {node.op!r}; "
                              f"they run {', '.join(sorted(OPS))}")
    for name in [t for t in node.inputs if t] + list(node.outputs):
        t = graph.tensors[name]
        if t.layout:
            return Support(False, f"{node.op} node {node.name!r}: tensor {name!r} is in "
                                  f"the packed layout {t.layout!r}; the CPU target runs "
                                  f"{node.op} on plain layouts")
        if t.shape is None:
            return Support(False, f"{node.op} node {node.name!r}: the shape of {name!r} is "
                                  "unknown (infer shapes first)")
    reason = (_OPS.get(node.op) or _ISA_OPS[node.op])[0](node, graph)
    if reason and node.op in BROADCAST_OPS:
        # any other broadcast: the sequence module's strided loops
        reason = sequence_refusal(node, graph) and reason
    return Support(False, reason) if reason else Support(True, OK)


def build(node: Node, graph: Graph, isa: Isa, in_block: int = 0) -> Kernel:
    """`node`'s kernel: one C function and its params (`vdla.compiler.targets.cpu.kernel`).

    node : a node of `graph` that `supports` accepts
    graph : its graph
    isa : the instruction set the library is built for; these kernels are plain C loops
        that gcc vectorizes for whatever the ISA's flags select, so the text is the same
        for every ISA
    in_block : the layout its first input's producer writes (`vdla.compiler.targets.cpu
        .layout`); the pools of `BLOCKED_POOLS` read a blocked input where it is, the
        other ops read it plain (the program converts it)
    Raises ValueError with `supports`' reason for a node it refuses."""
    support = supports(node, graph)
    if not support.ok:
        raise ValueError(support.reason)
    if in_block and node.op in BLOCKED_POOLS:
        if node.op == "max_pool2d":
            return blocked_pool_kernel(node, graph, in_block)
        return blocked_global_pool_kernel(node, graph, in_block)
    if node.op in _ISA_OPS:
        return _ISA_OPS[node.op][1](node, graph, isa)
    if node.op in BROADCAST_OPS and _OPS[node.op][0](node, graph):
        return sequence_kernel(node, graph, isa)
    return _OPS[node.op][1](node, graph)
