"""The integer softmax, LayerNorm and GELU of quantized transformers compiled to C:
``qsoftmax``, ``qlayer_norm``, ``qgelu``, bit for bit the definitions of
`vdla.compiler.reference.integer_transformer` (its docstring has the formulas).

    if qnorm_refusal(node, graph) is None:
        kernel = qnorm_kernel(node, graph, isa)

* ``qgelu`` is a function of the 256 int8 values: the kernel looks each one up in
  ``gelu_table(node)`` (computed by the reference function itself, so equal by
  construction).
* ``qsoftmax``: per row of the last axis, the maximum m, then ``e = exp_table[x - m +
  255]`` (the reference's exponential of ``(x - m) * c`` for the 256 possible
  differences), the int32 sum s, and ``p = ((e << k) + (s >> 1)) // s`` clipped to 127.
  The floor division of non-negative integers runs in double precision: with
  ``e << k <= 2**30`` and s < 2**31 the quotient is below 2**15 + 1, and a quotient
  that is not an integer is at least 1 / s <= 2**-30 away from one, far more than a
  double's rounding there (2**-38), so truncating the double quotient is exact
  (`SOFTMAX_C`, shared with the fused attention).
* ``qlayer_norm``: per row, ``S = sum(x)``, ``Q = sum(x * x)`` (int32), ``w = D Q -
  S**2 + eps`` (int64) normalized into [2**28, 2**30) by an even shift, its floor
  square root (a double square root, exact there), the row's multiplier ``M`` and
  offset ``O`` (int64, the floor of the signed quotient taken with care), then z of
  each int8 value the row holds (a table of at most 256), and per entry the int32 step
  ``y = (z G + B + 2**(R - 1)) >> R``, clipped, in int32 lanes that gcc vectorizes.
  ``>>`` on signed integers is arithmetic (floor), as `vdla_cpu.h` checks.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import QuantizationError
from vdla.compiler.reference.integer_transformer import (LN_NORM_BITS,
                                                         MAX_LAYER_NORM_LENGTH, MAX_LN_EPS,
                                                         MAX_LN_SHIFT, MAX_SOFTMAX_LENGTH,
                                                         exp_table, gelu_table,
                                                         layer_norm_shifts)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.opbase import PARALLEL_MIN, Sources, size

__all__ = ["SOFTMAX_C", "qnorm_kernel", "qnorm_refusal"]

#: C: the integer softmax of one row of scores ``x[0 .. len)`` (int8 values)
#: into int8 ``y``, keys where ``keep`` is 0 left out (a C expression of j valued 0 or 1,
#: evaluated for every j: "1" keeps all), exponentials from the int32 table ``tab``
#: (`exp_table`), ``k`` the prob bits. Needs an int32 scratch row ``e`` of len values.
#: No branch depends on ``keep`` (a left-out key's score counts as -128 for the maximum,
#: its table index is clamped into the table and its exponential multiplied by 0), so
#: that gcc vectorizes all three loops.
SOFTMAX_C = """{{
    int32_t m_ = -128;
    for (int j = 0; j < {length}; j++) {{
        const int32_t v_ = ({keep}) * ({x}[j] + 128) - 128;
        m_ = v_ > m_ ? v_ : m_;
    }}
    int32_t s_ = 0;
    for (int j = 0; j < {length}; j++) {{
        const int32_t d_ = {x}[j] - m_;
        {e}[j] = ({keep}) * {tab}[(d_ < 0 ? d_ : 0) + 255];
        s_ += {e}[j];
    }}
    if (s_ == 0) {{ for (int j = 0; j < {length}; j++) {y}[j] = 0; }}
    else {{
        const double ds = (double)s_;
        const int32_t half = s_ >> 1;
        for (int j = 0; j < {length}; j++) {{
            const int32_t pr_ = (int32_t)((double)(({e}[j] << {k}) + half) / ds);
            {y}[j] = (int8_t)(pr_ < 127 ? pr_ : 127);
        }}
    }}
}}"""


def qnorm_refusal(node: Node, graph: Graph) -> str | None:
    """int8 input and output; the node's integer params valid (the reference's own
    checks); softmax and layer norm over the last axis, rows within the definition's
    lengths."""
    x = graph.tensors[node.inputs[0]]
    out = graph.tensors[node.outputs[0]]
    if x.dtype != "int8" or out.dtype != "int8":
        return (f"{node.op} node {node.name!r} on {x.dtype} -> {out.dtype}: the CPU target "
                "runs it on int8")
    if not x.shape or size(x.shape) == 0:
        return f"{node.op} node {node.name!r}: input of shape {x.shape}"
    if node.op == "qsoftmax" and (node.input(1) or node.attrs.get("causal")):
        return (f"qsoftmax node {node.name!r} leaves positions out (a mask or causal): the "
                "CPU target runs that softmax inside its attention")
    try:
        if node.op == "qgelu":
            gelu_table(node)
        elif node.op == "qsoftmax":
            exp_table(node)
    except (QuantizationError, KeyError, TypeError) as e:
        return f"{node.op} node {node.name!r}: {e}"
    if node.op in ("qsoftmax", "qlayer_norm"):
        if int(node.attrs.get("axis", -1)) % len(x.shape) != len(x.shape) - 1:
            return (f"{node.op} node {node.name!r} over axis {node.attrs['axis']}: the CPU "
                    "target normalizes over the last axis")
        limit = MAX_SOFTMAX_LENGTH if node.op == "qsoftmax" else MAX_LAYER_NORM_LENGTH
        if x.shape[-1] > limit:
            return (f"{node.op} node {node.name!r}: rows of {x.shape[-1]}; the definition "
                    f"holds for at most {limit}")
    if node.op == "qlayer_norm":
        p = node.attrs.get("params")
        if not isinstance(p, dict) or not {"eps", "shift"} <= set(p):
            return f"qlayer_norm node {node.name!r}: params {p!r} must hold eps and shift"
        if not (1 <= int(p["eps"]) <= MAX_LN_EPS and 1 <= int(p["shift"]) <= MAX_LN_SHIFT):
            return f"qlayer_norm node {node.name!r}: eps or shift out of range ({p!r})"
        d = x.shape[-1]
        for i in (1, 2):
            name = node.input(i)
            if name and (graph.tensors[name].dtype != "int32"
                         or tuple(graph.tensors[name].shape) != (d,)):
                return (f"qlayer_norm node {node.name!r}: {name!r} is "
                        f"{graph.tensors[name].dtype} {graph.tensors[name].shape}; the "
                        f"definition takes int32 ({d},)")
    return None


def qnorm_kernel(node: Node, graph: Graph, isa: Isa) -> Kernel:
    """The kernel of a node `qnorm_refusal` accepts."""
    params = Params()
    sources = Sources(graph, params)
    shape = graph.tensors[node.inputs[0]].shape
    x_ptr = sources.pointer(node.inputs[0], "int8_t")
    total = size(shape)
    if node.op == "qgelu":
        table = params.add(gelu_table(node).astype(np.int8))
        pragma = "#pragma omp parallel for schedule(static)" if total >= PARALLEL_MIN else ""
        body = f"""
/* qgelu of {total} values: a 256-entry table */
void NAME{SIGNATURE} {{
    const int8_t *restrict X = {x_ptr};
    const int8_t *restrict T = (const int8_t *)(params + {table}) + 128;
    int8_t *restrict Y = (int8_t *)out_;
    (void)ws;
    {pragma}
    for (size_t j = 0; j < {total}; j++) Y[j] = T[X[j]];
}}
"""
        return Kernel(body, params.blob(), tuple(sources.inputs))
    d = shape[-1]
    rows = total // d
    pragma = ("#pragma omp parallel for schedule(static)"
              if rows > 1 and total >= PARALLEL_MIN // 8 else "")
    if node.op == "qsoftmax":
        table = params.add(exp_table(node).astype(np.int32))
        k = int(node.attrs["params"]["prob_bits"])
        row = SOFTMAX_C.format(length=d, keep="1", x="xr", e="e", tab="tab", y="y", k=k)
        body = f"""
/* qsoftmax over the last axis: {rows} rows of {d} */
void NAME{SIGNATURE} {{
    const int8_t *restrict X = {x_ptr};
    const int32_t *restrict tab = (const int32_t *)(params + {table});
    int8_t *restrict Y = (int8_t *)out_;
    {pragma}
    for (int r = 0; r < {rows}; r++) {{
        int32_t *restrict e = (int32_t *)(ws + (size_t)omp_get_thread_num() * {align(4 * d)});
        const int8_t *restrict xr = X + (size_t)r * {d};
        int8_t *restrict y = Y + (size_t)r * {d};
        {row}
    }}
}}
"""
        return Kernel(body, params.blob(), tuple(sources.inputs), thread_bytes=4 * d,
                      items=rows if pragma else 1)
    # qlayer_norm
    p = node.attrs["params"]
    eps, r = int(p["eps"]), int(p["shift"])
    sh = layer_norm_shifts(d)
    g, b = (sources.pointer(node.input(i), "int32_t") if node.input(i) else
            f"(const int32_t *)(params + {params.add(np.zeros(d, np.int32))})" for i in (1, 2))
    # z depends on a row's x only through the int8 value: a table of z for the values
    # between the row's least and greatest (at most 256, on the stack: in ws, gcc does not
    # vectorize its reads), then int32 arithmetic that gcc vectorizes.
    body = f"""
/* qlayer_norm over the last axis: {rows} rows of {d} (int32 per entry) */
void NAME{SIGNATURE} {{
    const int8_t *restrict X = {x_ptr};
    const int32_t *restrict G = {g};
    const int32_t *restrict B = {b};
    int8_t *restrict Y = (int8_t *)out_;
    (void)ws;
    {pragma}
    for (int r = 0; r < {rows}; r++) {{
        const int8_t *restrict x = X + (size_t)r * {d};
        int8_t *restrict y = Y + (size_t)r * {d};
        int32_t s = 0, q = 0;
        for (int j = 0; j < {d}; j++) {{ s += x[j]; q += x[j] * x[j]; }}
        const int64_t w = (int64_t){d} * q - (int64_t)s * s + {eps}LL;   /* < 2**47 */
        const int e = ({LN_NORM_BITS} - (64 - __builtin_clzll((uint64_t)w))) >> 1;  /* floor */
        const int64_t wn = e >= 0 ? w << (2 * e) : w >> (-2 * e);
        int64_t sd = (int64_t)sqrt((double)wn);    /* wn < 2**30: the double root is exact */
        while (sd * sd > wn) sd--;
        while ((sd + 1) * (sd + 1) <= wn) sd++;
        int64_t m = ((int64_t){d} << ({sh["k"]} + e)) / sd;
        m = m < 2147483647LL ? m : 2147483647LL;
        const int64_t sm = (int64_t)s * m;         /* floor(S M / D), S M signed */
        const int64_t fl = sm >= 0 ? sm / {d} : -((-sm + {d - 1}) / {d});
        const int64_t o = ((int64_t)1 << {sh["z_shift"] - 1}) - fl;
        int32_t ztab[256];
        int32_t *restrict zt = ztab + 128;
        int32_t lo = 127, hi = -128;
        for (int j = 0; j < {d}; j++) {{ lo = x[j] < lo ? x[j] : lo; hi = x[j] > hi ? x[j] : hi; }}
        for (int a = lo; a <= hi; a++)             /* P = a M + O fits int32 */
            zt[a] = (int32_t)(((int64_t)a * m + o) >> {sh["z_shift"]});
        for (int j = 0; j < {d}; j++) {{
            const int32_t t = (zt[x[j]] * G[j] + B[j] + {1 << (r - 1)}) >> {r};
            y[j] = (int8_t)(t < -128 ? -128 : t > 127 ? 127 : t);
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), items=rows if pragma else 1)
