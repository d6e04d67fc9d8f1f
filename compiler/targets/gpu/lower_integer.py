"""The integer softmax, LayerNorm, GELU and attention of transformers
(`vdla.compiler.reference.integer_transformer`) to launches of the GPU target's
`sequence_kernels`: pure numpy, no Triton, like `lower_sequence`, whose helpers it uses.

    problem = refusal(node, graph)      # None, or why the GPU target does not run it
    kernel = lower(node, graph)         # a `GpuKernel`

* qgelu: one `nd_map` look-up in the reference's own 256 values (`gelu_table`);
* qsoftmax: `row_qsoftmax`, its exponentials the reference's (`exp_table`);
* qlayer_norm: `row_qlayer_norm`, the definition's int64 steps a row and int32 ones
  an entry;
* qattention: one `fused_qattention` launch, the definition's three steps: qmatmul(q,
  k^T), the integer softmax with the mask's and the causal bound's keys left out (the
  scores recomputed per pass, never stored), qmatmul(p, v).

Each is bit for bit the reference's; the constants are checked as the reference checks
them, so a node the reference would refuse runs on the host with the reason.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference import integer_transformer
from vdla.compiler.reference.integer import INT8_PRODUCTS_MAX, QuantizationError
from vdla.compiler.targets.gpu import codes
from vdla.compiler.targets.gpu.launches import GpuKernel, Launch, Ref
from vdla.compiler.targets.gpu.lower_sequence import (RANK_MAX, attention_operands,
                                                      dtype_of, nd_launch,
                                                      one_int, operand, requant_refusal,
                                                      row_tile, shape_of, strided_view)
from vdla.compiler.targets.gpu.schedule import next_pow2

__all__ = ["INTEGER_OPS", "lower", "refusal"]

#: The ops this module lowers.
INTEGER_OPS = ("qsoftmax", "qlayer_norm", "qgelu", "qattention")


# --- which nodes -----------------------------------------------------------------------------

def refusal(node: Node, graph: Graph) -> str | None:
    """qsoftmax, qlayer_norm, qgelu, qattention: int8 data (a bool qattention mask, int32
    gamma and beta), rows the definition holds for, valid constants."""
    op = node.op
    dtypes = [dtype_of(graph, t) for t in node.inputs if t]
    data = dtypes[:3] if op == "qattention" else dtypes[:1]
    if any(d != "int8" for d in data):
        return f"{op} on {'/'.join(data)}: the GPU target runs it on int8"
    if op == "qsoftmax" and (node.input(1) or node.attrs.get("causal")):
        return ("qsoftmax that leaves positions out (a mask or causal): the GPU target runs "
                "that softmax inside its attention")
    x = shape_of(graph, node.inputs[0])
    if op == "qsoftmax" and int(node.attrs.get("axis", -1)) % len(x) != len(x) - 1:
        return (f"qsoftmax over axis {node.attrs['axis']}: the GPU target normalizes over "
                "the last axis")
    n = shape_of(graph, node.inputs[1])[-2] if op == "qattention" else x[-1]
    if op in ("qsoftmax", "qattention") and n > integer_transformer.MAX_SOFTMAX_LENGTH:
        return (f"{op} over rows of {n}: the integer softmax holds for at most "
                f"{integer_transformer.MAX_SOFTMAX_LENGTH}")
    if op == "qattention":
        if node.input(3) and dtype_of(graph, node.inputs[3]) != "bool":
            return (f"qattention with a {dtype_of(graph, node.inputs[3])} mask: the GPU target "
                    "takes a bool one (True: excluded)")
        k = shape_of(graph, node.inputs[0])[-1]
        if max(k, n) > INT8_PRODUCTS_MAX:
            return (f"qattention sums {max(k, n)} products per output, more than an int32 "
                    f"accumulator holds exactly ({INT8_PRODUCTS_MAX})")
        problem = requant_refusal(node, "qk_") or requant_refusal(node, "pv_")
        if problem:
            return problem
    if op == "qlayer_norm":
        for i in (1, 2):
            if node.input(i) and dtype_of(graph, node.inputs[i]) != "int32":
                return (f"qlayer_norm with a {dtype_of(graph, node.inputs[i])} "
                        f"{('gamma', 'beta')[i - 1]}: the GPU target takes int32")
    try:
        _integer_constants(node)
        if op == "qlayer_norm":
            # the reference's own checks of the constants (bounds of every intermediate)
            gamma, beta = (graph.tensors[node.input(i)].data if node.input(i) else None
                           for i in (1, 2))
            if gamma is not None and beta is not None:
                integer_transformer.qlayer_norm(np.zeros((1, x[-1]), np.int8), gamma, beta,
                                                node.attrs["params"])
    except (QuantizationError, KeyError, TypeError, ValueError) as e:
        return f"{op} constants: {e}"
    return None


def _integer_constants(node: Node) -> dict:
    """The tables and params of an integer op, checked as the reference checks them."""
    if node.op == "qgelu":
        return {"table": integer_transformer.gelu_table(node)}
    if node.op in ("qsoftmax", "qattention"):
        params = node.attrs["softmax_params" if node.op == "qattention" else "params"]
        return {"table": integer_transformer.exp_table(node),
                "prob_bits": _param(params, "prob_bits", integer_transformer.MAX_PROB_BITS)}
    return {key: _param(node.attrs["params"], key, high, low) for key, low, high in (
        ("eps", 1, integer_transformer.MAX_LN_EPS),
        ("shift", 1, integer_transformer.MAX_LN_SHIFT))}


def _param(params, name: str, high: int, low: int = 0) -> int:
    """params[name], an integer in [low, high] (ValueError naming it otherwise)."""
    if not isinstance(params, dict) or name not in params:
        raise ValueError(f"params must be a dict holding {name!r}, not {params!r}")
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not low <= int(value) <= high:
        raise ValueError(f"params[{name!r}] = {value!r}: an integer in [{low}, {high}]")
    return int(value)

# --- lowering --------------------------------------------------------------------------------

def lower(node: Node, graph: Graph) -> GpuKernel:
    """`node` (which `refusal` accepts) as a `GpuKernel`."""
    return {"qgelu": _lower_qgelu, "qsoftmax": _lower_qsoftmax,
            "qlayer_norm": _lower_qlayer_norm, "qattention": _lower_qattention}[node.op](
                node, graph)


def _lower_qgelu(node, graph):
    """A look-up in the 256 values of the reference's qgelu (`gelu_table`)."""
    out = shape_of(graph, node.outputs[0])
    consts = {"table": _integer_constants(node)["table"].astype(np.int8)}
    ref = operand(graph, node, 0, consts)
    launch = nd_launch(codes.E_TABLE, out, [(ref, strided_view(out, out)),
                                      (Ref("const", "table"), (0, (0,) * RANK_MAX))],
                 float_math=False)
    return GpuKernel(node.name, (launch,), consts)


def _lower_qsoftmax(node, graph):
    x = shape_of(graph, node.inputs[0])
    c = _integer_constants(node)
    consts = {"table": c["table"].astype(np.int32)}
    src = operand(graph, node, 0, consts)
    rows = int(np.prod(x[:-1]))
    meta, grid = row_tile(rows, x[-1])
    launch = Launch("row_qsoftmax", grid, (src, Ref("out"), Ref("const", "table"), rows, x[-1],
                                           c["prob_bits"]), meta)
    return GpuKernel(node.name, (launch,), consts)


def _lower_qlayer_norm(node, graph):
    x = shape_of(graph, node.inputs[0])
    d = x[-1]
    c = _integer_constants(node)
    consts: dict = {}
    refs = [operand(graph, node, 0, consts)]
    for i in (1, 2):
        if node.input(i):
            refs.append(operand(graph, node, i, consts))
        else:                                    # the reference's None: zeros
            consts[f"in{i}"] = np.zeros(d, np.int32)
            refs.append(Ref("const", f"in{i}"))
    rows = int(np.prod(x[:-1]))
    meta, grid = row_tile(rows, d)
    sh = integer_transformer.layer_norm_shifts(d)
    launch = Launch("row_qlayer_norm", grid,
                    (*refs, Ref("out"), rows, d, c["eps"], sh["k"], sh["z_shift"], c["shift"]),
                    meta)
    return GpuKernel(node.name, (launch,), consts)


def _requant(node, prefix: str) -> tuple[bool, tuple[int, int, int, int]]:
    """(has a multiplier, (multiplier, shift, out_min, out_max)) of a per-tensor
    requantization `prefix`*."""
    a = node.attrs
    mult = a.get(f"{prefix}multiplier")
    return mult is not None, (1 if mult is None else one_int(mult), one_int(a[f"{prefix}shift"]),
                              int(a[f"{prefix}out_min"]), int(a[f"{prefix}out_max"]))


def _lower_qattention(node, graph):
    """One `fused_qattention` launch (BM queries of one batch index a program): the
    definition's three steps, qmatmul(q, k^T), the integer softmax with the mask's and
    the causal bound's keys left out, qmatmul(p, v), bit for bit."""
    c = _integer_constants(node)
    consts: dict = {"table": c["table"].astype(np.int32)}
    a = attention_operands(graph, node, consts, "bool")
    s, t, d, dv, nb = a.s, a.t, a.d, a.dv, a.nb
    qk_mult, qk = _requant(node, "qk_")
    pv_mult, pv = _requant(node, "pv_")
    bm = min(64, max(16, next_pow2(s)))
    # int8 dots: K sides (D, then the keys) of at least 32
    launch = Launch("fused_qattention", (-(-s // bm), nb),
                    (*a.qkv, Ref("out"), Ref("const", "table"), *a.offsets, *a.mask, s, t,
                     d, dv, *a.strides, c["prob_bits"], *qk, *pv),
                    dict(BM=bm, BN=min(64, max(32, next_pow2(t))), BD=max(32, next_pow2(d)),
                         BDV=max(16, next_pow2(dv)), QK_MULT=qk_mult, PV_MULT=pv_mult,
                         HAS_MASK=a.has_mask, CAUSAL=bool(node.attrs["causal"]),
                         num_warps=4))
    return GpuKernel(node.name, (launch,), consts, macs=nb * s * t * (d + dv))
