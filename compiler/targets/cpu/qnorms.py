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
* ``qlayer_norm``: per row, ``S = sum(x)``, ``Q = sum(x * x)`` (int32), ``v = D Q -
  S**2`` and the floor square root of ``(v + eps) << 2P`` (int64; from a double square
  root corrected by comparing squares, exact), ``inv = 2**(40 + P) // sd``, then per
  value the int64 steps of the definition: ``z = (xc * inv + 2**23) >> 24``, ``y = (z *
  G + B + 2**(R - 1)) >> R``, clipped. ``>>`` on signed int64 is arithmetic (floor),
  as `vdla_cpu.h` checks.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import QuantizationError
from vdla.compiler.reference.integer_transformer import (LN_RECIP_BITS, LN_VARIANCE_BOUND,
                                                         LN_Z_BITS, MAX_LAYER_NORM_LENGTH,
                                                         MAX_SOFTMAX_LENGTH, exp_table,
                                                         gelu_table)
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
        if not isinstance(p, dict) or not {"eps", "sqrt_bits", "shift"} <= set(p):
            return (f"qlayer_norm node {node.name!r}: params {p!r} must hold eps, sqrt_bits "
                    "and shift")
        d = x.shape[-1]
        if (LN_VARIANCE_BOUND * d * d + int(p["eps"])) << (2 * int(p["sqrt_bits"])) >= 1 << 62:
            return f"qlayer_norm node {node.name!r}: eps and sqrt_bits out of range"
        for i, want in ((1, "int32"), (2, "int64")):
            name = node.input(i)
            if name and (graph.tensors[name].dtype != want
                         or tuple(graph.tensors[name].shape) != (d,)):
                return (f"qlayer_norm node {node.name!r}: {name!r} is "
                        f"{graph.tensors[name].dtype} {graph.tensors[name].shape}; the "
                        f"definition takes {want} ({d},)")
    return None


def _exact_in_double(gamma: np.ndarray, beta: np.ndarray, shift: int) -> bool:
    """Whether a qlayer_norm with these G, B and R computes exactly in double precision:
    then every step's integer is below 2**53 (``|xc * inv| < 2**49`` and ``|z| < 2**25``
    for any G and B; ``|z G| + |B| + 2**(R - 1)`` checked here), so the shifts are exact
    floors of exact products, and a row is vectors of doubles. AVX2 has no 64-bit
    multiply or arithmetic shift: int64 lanes ran BERT-base's layer norms 2.3x slower."""
    g = int(np.abs(np.asarray(gamma, np.int64)).max(initial=0))
    b = int(np.abs(np.asarray(beta, np.int64)).max(initial=0))
    return (g << 25) + b + (1 << (shift - 1)) < 1 << 53


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
    eps, bits, r = int(p["eps"]), int(p["sqrt_bits"]), int(p["shift"])
    consts = [graph.tensors[node.input(i)].data if node.input(i) else np.zeros(d, np.int64)
              for i in (1, 2)]
    if all(c is not None for c in consts) and _exact_in_double(*consts, r):
        gd, bd = (params.add(np.asarray(c, np.float64).reshape(-1)) for c in consts)
        value = f"""const double xc = {d}.0 * (double)x[j] - (double)s;     /* |xc| < 2**18 */
            const double z = floor((xc * invd + 8388608.0) * 0x1p-24);  /* |xc inv| < 2**49 */
            const double t = floor((z * G[j] + B[j] + 0x1p{r - 1}) * 0x1p-{r});
            y[j] = (int8_t)(t < -128 ? -128 : t > 127 ? 127 : t);"""
        g, b, g_type, b_type, table = (f"(const double *)(params + {gd})",
                                       f"(const double *)(params + {bd})", "double", "double",
                                       "")
    else:
        g = (sources.pointer(node.input(1), "int32_t") if node.input(1) else
             f"(const int32_t *)(params + {params.add(np.zeros(d, np.int32))})")
        b = (sources.pointer(node.input(2), "int64_t") if node.input(2) else
             f"(const int64_t *)(params + {params.add(np.zeros(d, np.int64))})")
        g_type, b_type = "int32_t", "int64_t"
        zs = LN_RECIP_BITS - LN_Z_BITS
        # z depends on a row's x only through the int8 value: a table of z for the values
        # between the row's least and greatest (at most 256), then int64 arithmetic that
        # gcc vectorizes (the table on the stack: in ws, gcc does not vectorize its reads)
        table = f"""
        int32_t ztab[256];
        int32_t *restrict zt = ztab + 128;
        int32_t lo = 127, hi = -128;
        for (int j = 0; j < {d}; j++) {{ lo = x[j] < lo ? x[j] : lo; hi = x[j] > hi ? x[j] : hi; }}
        for (int a = lo; a <= hi; a++) {{     /* |z| < 2**25 */
            const int64_t xc = (int64_t){d} * a - s;
            zt[a] = (int32_t)((xc * inv + ((int64_t)1 << {zs - 1})) >> {zs});
        }}"""
        value = f"""const int64_t t = ((int64_t)zt[x[j]] * G[j] + B[j] + ((int64_t)1 << {r - 1})) >> {r};
            y[j] = (int8_t)(t < -128 ? -128 : t > 127 ? 127 : t);"""
    body = f"""
/* qlayer_norm over the last axis: {rows} rows of {d} ({"double" if g_type == "double" else "int64"} arithmetic) */
{"VDLA_NO_TRAPPING_MATH " if g_type == "double" else ""}void NAME{SIGNATURE} {{
    const int8_t *restrict X = {x_ptr};
    const {g_type} *restrict G = {g};
    const {b_type} *restrict B = {b};
    int8_t *restrict Y = (int8_t *)out_;
    (void)ws;
    {pragma}
    for (int r = 0; r < {rows}; r++) {{
        const int8_t *restrict x = X + (size_t)r * {d};
        int8_t *restrict y = Y + (size_t)r * {d};
        int32_t s = 0, q = 0;
        for (int j = 0; j < {d}; j++) {{ s += x[j]; q += x[j] * x[j]; }}
        const int64_t v = (int64_t){d} * q - (int64_t)s * s;
        const int64_t n = (v + {eps}LL) << {2 * bits};
        int64_t sd = (int64_t)sqrt((double)n);
        while (sd * sd > n) sd--;
        while ((sd + 1) * (sd + 1) <= n) sd++;
        const int64_t inv = ((int64_t)1 << {LN_RECIP_BITS + bits}) / sd;
        const double invd = (double)inv; (void)invd;      /* exact: inv <= 2**40 */{table}
        for (int j = 0; j < {d}; j++) {{
            {value}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), items=rows if pragma else 1)
