"""Softmax, LayerNorm and GELU of sequence models compiled to C, float32.

    if norm_refusal(node, graph) is None:
        kernel = norm_kernel(node, graph, isa)

* ``softmax`` over the last axis: one row per work item (OpenMP over rows when the
  tensor is large): the row's maximum, ``exp(x - max)`` stored and summed, then every
  value times ``1 / sum``.
* ``layer_norm`` over the last axis: the row's mean, the mean of the squared
  deviations, then ``(x - mean) * (1 / sqrt(var + epsilon)) * scale + bias``.
* ``gelu``: ``0.5 x (1 + erf(x / sqrt 2))`` or the tanh form, elementwise.

Every loop runs on whole vectors of the ISA's width and a last partial one (read into a
vector whose other lanes cannot change the result), with `vdla_cpu.h`'s vector exp, erf
and tanh; sums are float32 vector sums. Results differ from the float64 reference by
float32 rounding (checked within 1e-5 relative in the tests; the pipeline allows 1e-4).
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.opbase import PARALLEL_MIN, Sources, dtype_refusal, size

__all__ = ["GELU_C", "norm_kernel", "norm_refusal"]


def norm_refusal(node: Node, graph: Graph) -> str | None:
    """softmax (last axis), layer_norm (last axis, scale and bias of the row's length)
    and gelu, on float32."""
    bad = dtype_refusal(node, graph, ("float32",))
    if bad:
        return bad
    shape = graph.tensors[node.inputs[0]].shape
    if not shape or size(shape) == 0:
        return f"{node.op} node {node.name!r}: input of shape {shape}; the CPU target needs " \
               "a non-empty tensor of rank >= 1"
    if node.op in ("softmax", "layer_norm"):
        axis = int(node.attrs["axis"])
        if axis % len(shape) != len(shape) - 1:
            return (f"{node.op} node {node.name!r} over axis {axis} of shape {shape}: the CPU "
                    "target normalizes over the last axis")
    if node.op == "layer_norm":
        for name in [t for t in node.inputs[1:] if t]:
            if tuple(graph.tensors[name].shape) != (shape[-1],):
                return (f"layer_norm node {node.name!r}: {name!r} has shape "
                        f"{graph.tensors[name].shape}; the CPU target needs ({shape[-1]},)")
    if node.op == "gelu" and node.attrs["approximate"] not in ("none", "tanh"):
        return (f"gelu node {node.name!r}: approximate {node.attrs['approximate']!r}; allowed "
                "'none', 'tanh'")
    return None


def GELU_C(v: str, x: str, approximate: str) -> str:
    """C: the GELU of vector expression `x` of C vector type `v` (``vf8``/``vf16``)."""
    if approximate == "tanh":
        return (f"({x}) * 0.5f * (1.0f + {v}_tanh(0.7978845608028654f * (({x}) + "
                f"0.044715f * ({x}) * ({x}) * ({x}))))")
    return f"({x}) * 0.5f * (1.0f + {v}_erf(({x}) * 0.7071067811865476f))"


def _rows_pragma(rows: int, length: int) -> str:
    return ("#pragma omp parallel for schedule(static)"
            if rows > 1 and rows * length >= PARALLEL_MIN // 4 else "")


def norm_kernel(node: Node, graph: Graph, isa: Isa) -> Kernel:
    """The kernel of a node `norm_refusal` accepts."""
    vl = isa.lanes[0]
    v = f"vf{vl}"
    params = Params()
    sources = Sources(graph, params)
    shape = graph.tensors[node.inputs[0]].shape
    x_ptr = sources.pointer(node.inputs[0], "float")
    length = shape[-1]
    rows = size(shape) // length
    full, tail = divmod(length, vl)
    if node.op == "gelu":
        total = size(shape)
        pragma = "#pragma omp parallel for schedule(static)" if total >= PARALLEL_MIN // 8 else ""
        g = GELU_C(v, "xv", node.attrs["approximate"])
        body = f"""
/* gelu ({node.attrs['approximate']}) of {total} values */
void NAME{SIGNATURE} {{
    const float *restrict X = {x_ptr};
    float *restrict Y = (float *)out_;
    (void)ws;
    {pragma}
    for (size_t b = 0; b < {total // vl}; b++) {{
        const {v} xv = {v}_load(X + b * {vl});
        {v}_store(Y + b * {vl}, {g});
    }}
    if ({total % vl}) {{
        const {v} xv = {v}_load_n(X + {total // vl * vl}, {total % vl});
        {v}_store_n(Y + {total // vl * vl}, {g}, {total % vl});
    }}
}}
"""
        return Kernel(body, params.blob(), tuple(sources.inputs))
    hsum = f"float s_ = 0; for (int l = 0; l < {vl}; l++) s_ += "
    if node.op == "softmax":
        body = f"""
/* softmax over the last axis: {rows} rows of {length} */
void NAME{SIGNATURE} {{
    const float *restrict X = {x_ptr};
    float *restrict Y = (float *)out_;
    (void)ws;
    {_rows_pragma(rows, length)}
    for (int r = 0; r < {rows}; r++) {{
        const float *restrict x = X + (size_t)r * {length};
        float *restrict y = Y + (size_t)r * {length};
        {v} mv = {v}_bcast(-INFINITY);
        for (int j = 0; j < {full}; j++) mv = {v}_max(mv, {v}_load(x + j * {vl}));
        float m = -INFINITY;
        for (int l = 0; l < {vl}; l++) m = mv[l] > m ? mv[l] : m;
        for (int j = {full * vl}; j < {length}; j++) m = x[j] > m ? x[j] : m;
        const {v} mb = {v}_bcast(m);
        {v} sv = {{0}};
        for (int j = 0; j < {full}; j++) {{
            const {v} e = {v}_exp({v}_load(x + j * {vl}) - mb);
            {v}_store(y + j * {vl}, e);
            sv += e;
        }}
        if ({tail}) {{
            float t[{vl}];
            for (int l = 0; l < {vl}; l++) t[l] = -INFINITY;
            memcpy(t, x + {full * vl}, {tail * 4});
            const {v} e = {v}_exp({v}_load(t) - mb);
            {v}_store_n(y + {full * vl}, e, {tail});
            sv += e;
        }}
        {hsum}sv[l];
        const {v} inv = {v}_bcast(1.0f / s_);
        for (int j = 0; j < {full}; j++) {v}_store(y + j * {vl}, {v}_load(y + j * {vl}) * inv);
        for (int j = {full * vl}; j < {length}; j++) y[j] *= inv[0];
    }}
}}
"""
        return Kernel(body, params.blob(), tuple(sources.inputs), items=rows)
    # layer_norm
    scale = sources.pointer(node.inputs[1], "float")
    has_bias = bool(node.input(2))
    bias = sources.pointer(node.input(2), "float") if has_bias else None
    if not has_bias:
        bias = f"(const float *)(params + {params.add(np.zeros(length, np.float32))})"
    eps = params.add(np.array([float(node.attrs["epsilon"])], np.float32))
    body = f"""
/* layer_norm over the last axis: {rows} rows of {length} */
void NAME{SIGNATURE} {{
    const float *restrict X = {x_ptr};
    const float *restrict g = {scale};
    const float *restrict bb = {bias};
    const float eps = *(const float *)(params + {eps});
    float *restrict Y = (float *)out_;
    (void)ws;
    {_rows_pragma(rows, length)}
    for (int r = 0; r < {rows}; r++) {{
        const float *restrict x = X + (size_t)r * {length};
        float *restrict y = Y + (size_t)r * {length};
        {v} sv = {{0}};
        for (int j = 0; j < {full}; j++) sv += {v}_load(x + j * {vl});
        if ({tail}) sv += {v}_load_n(x + {full * vl}, {tail});
        float mean; {{ {hsum}sv[l]; mean = s_ / {length}.0f; }}
        const {v} mb = {v}_bcast(mean);
        {v} qv = {{0}};
        for (int j = 0; j < {full}; j++) {{ const {v} d = {v}_load(x + j * {vl}) - mb; qv = {v}_fma(d, d, qv); }}
        float var;
        {{
            {hsum}qv[l];
            for (int j = {full * vl}; j < {length}; j++) s_ += (x[j] - mean) * (x[j] - mean);
            var = s_ / {length}.0f;
        }}
        const float inv = 1.0f / sqrtf(var + eps);
        const {v} ib = {v}_bcast(inv);
        for (int j = 0; j < {full}; j++)
            {v}_store(y + j * {vl}, ({v}_load(x + j * {vl}) - mb) * ib * {v}_load(g + j * {vl})
                                    + {v}_load(bb + j * {vl}));
        for (int j = {full * vl}; j < {length}; j++) y[j] = (x[j] - mean) * inv * g[j] + bb[j];
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), items=rows)
