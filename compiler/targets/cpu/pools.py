"""The CPU target's pools compiled to C (max, average and global average; float32
and int8): see `vdla.compiler.targets.cpu.ops` for how the loops run."""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES, Node
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN)
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.opbase import (PARALLEL_MIN, POOL_ROW_MAX, CTYPES,
                                             RQ_HELPER, Sources, dtype_refusal, indent,
                                             kernel, rq_tables)

__all__ = ["BLOCKED_POOLS", "PoolShape", "blocked_global_pool_kernel", "blocked_pool_kernel",
           "global_pool_kernel", "pool_kernel", "pool_refusal"]


# --- pools ---------------------------------------------------------------------------------

def _ints(value, count: int) -> tuple[int, ...]:
    """A window attribute (one int for every axis, or `count` ints) as `count` ints."""
    return (int(value),) * count if isinstance(value, (int, np.integer)) else \
        tuple(int(v) for v in value)


class PoolShape:
    """A 2-D pool's sizes: input (n, c, h, w), output (oh, ow), window (kh, kw), strides
    (sh, sw), leading pads (pt, pl) and the padded row buffer's width `wp`, of which
    input columns [0, `wc`) land at [pl, pl + wc)."""

    def __init__(self, node: Node, graph: Graph):
        a = node.attrs
        self.n, self.c, self.h, self.w = graph.tensors[node.inputs[0]].shape
        self.oh, self.ow = graph.tensors[node.outputs[0]].shape[2:]
        (self.kh, self.kw), (self.sh, self.sw) = _ints(a["kernel"], 2), _ints(a["strides"], 2)
        self.pt, self.pl, self.pb, self.pr = _ints(a["pads"], 4)
        self.wp = (self.ow - 1) * self.sw + self.kw
        self.wc = max(0, min(self.w, self.wp - self.pl))
        self.elem = {"max_pool2d": np.dtype(DTYPES[graph.tensors[node.inputs[0]].dtype]).itemsize,
                     "avg_pool2d": 8, "qavg_pool2d": 4}[node.op]

    @property
    def row_bytes(self) -> int:
        return self.wp * self.elem

    @property
    def work(self) -> int:
        return self.n * self.c * self.oh * self.ow * self.kh * self.kw


def pool_kernel(node: Node, graph: Graph) -> Kernel:
    """``max_pool2d`` (int8, float32), ``avg_pool2d`` (float32) and ``qavg_pool2d``."""
    p = PoolShape(node, graph)
    params = Params()
    sources = Sources(graph, params)
    t_in = CTYPES[graph.tensors[node.inputs[0]].dtype]
    x = sources.pointer(node.inputs[0], t_in)
    tables, helper, rows_decl = "", "", ""
    if node.op == "max_pool2d":
        acc, fill = t_in, ("-128" if t_in == "int8_t" else "-INFINITY")
        load = ""

        def comb(a: str, b: str) -> str:
            return f"({a} > {b} ? {a} : {b})"
        finish = "yr[q] = m;"
    else:
        acc, fill = ("double", "0") if node.op == "avg_pool2d" else ("uint32_t", "0")
        load = "(double)" if node.op == "avg_pool2d" else "(uint32_t)(int32_t)"

        def comb(a: str, b: str) -> str:
            return f"({a} + {b})"
    if node.op == "avg_pool2d":
        # The reference divides float64 sums by the count of elements the window covers:
        # the input only, or the padded input too (count_include_pad); never the ceil-mode
        # overhang. A window with none gives 0 / 0 = NaN, as there.
        if node.attrs["count_include_pad"]:
            lo_r, hi_r, lo_c, hi_c = -p.pt, p.h + p.pb, -p.pl, p.w + p.pr
        else:
            lo_r, hi_r, lo_c, hi_c = 0, p.h, 0, p.w
        rows_decl = (f"const int rows = vdla_max(0, vdla_min(r0 + {p.kh}, {hi_r}) - "
                     f"vdla_max(r0, {lo_r}));")
        finish = (f"const int c0 = q * {p.sw} - {p.pl}; "
                  f"const int cols = vdla_max(0, vdla_min(c0 + {p.kw}, {hi_c}) - "
                  f"vdla_max(c0, {lo_c})); "
                  "yr[q] = (float)(m / (double)(rows * cols));")
    elif node.op == "qavg_pool2d":
        off = params.add(rq_tables(node.attrs["multiplier"], node.attrs["shift"], p.c))
        tables = f"    const uint32_t *restrict rq = (const uint32_t *)(params + {off});\n"
        helper = RQ_HELPER
        finish = ("yr[q] = vdla_clamp8(NAME_rq((int32_t)m, rq[ch], "
                  f"rq[{p.c} + ch], rq[{2 * p.c} + ch], rq[{3 * p.c} + ch]), "
                  f"{INT8_MIN}, {INT8_MAX});")
    pragma = ("#pragma omp parallel for collapse(2) schedule(static)"
              if p.work >= PARALLEL_MIN else "")
    t_out = "float" if node.op == "avg_pool2d" else t_in
    pl, wc, w = p.pl, p.wc, p.w
    body = f"""
/* {node.op} {p.n}x{p.c}x{p.h}x{p.w} -> {p.oh}x{p.ow}, window {p.kh}x{p.kw}, strides
   {p.sh}x{p.sw}, pads {p.pt},{p.pl},{p.pb},{p.pr} */{helper}
void NAME{SIGNATURE} {{
    const {t_in} *restrict x = {x};
    {t_out} *restrict y = ({t_out} *)out_;
{tables}    (void)ws;
    {pragma}
    for (int plane = 0; plane < {p.n * p.c}; plane++)
    for (int r = 0; r < {p.oh}; r++) {{
        const int ch = plane % {p.c}; (void)ch;
        const {t_in} *restrict xc = x + (size_t)plane * {p.h * w};
        {t_out} *restrict yr = y + ((size_t)plane * {p.oh} + r) * {p.ow};
        /* the window's rows combined column by column into t; its pad and overhang
           columns hold {fill}, which never changes the result */
        {acc} t[{p.wp}] __attribute__((aligned(64)));
        for (int k = 0; k < {min(pl, p.wp)}; k++) t[k] = {fill};
        for (int k = {min(pl + wc, p.wp)}; k < {p.wp}; k++) t[k] = {fill};
        const int r0 = r * {p.sh} - {p.pt};
        {rows_decl}
        if (r0 >= 0 && r0 + {p.kh} <= {p.h}) {{
            /* the whole window inside: one pass */
            const {t_in} *restrict xr = xc + (size_t)r0 * {w};
            for (int j = 0; j < {wc}; j++) {{
                {acc} v = {load}xr[j];
                for (int i = 1; i < {p.kh}; i++) v = {comb("v", f"{load}xr[i * {w} + j]")};
                t[j + {pl}] = v;
            }}
        }} else {{
            const int lo = vdla_max(r0, 0), hi = vdla_min(r0 + {p.kh}, {p.h});
            for (int j = 0; j < {wc}; j++) t[j + {pl}] = {fill};
            for (int i = lo; i < hi; i++) {{
                const {t_in} *restrict xr = xc + (size_t)i * {w};
                for (int j = 0; j < {wc}; j++)
                    t[j + {pl}] = {comb(f"t[j + {pl}]", f"{load}xr[j]")};
            }}
        }}
        for (int q = 0; q < {p.ow}; q++) {{
            const {acc} *tq = t + q * {p.sw};
            {acc} m = tq[0];
            for (int i = 1; i < {p.kw}; i++) m = {comb("m", "tq[i]")};
            {finish}
        }}
    }}
}}
"""
    return kernel(body, params, sources)


def global_pool_kernel(node: Node, graph: Graph) -> Kernel:
    """``global_avg_pool2d`` (float32: the mean in double, as the reference) and
    ``qglobal_avg_pool2d`` (int8: the sum modulo 2**32, requantized, clipped)."""
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    hw = h * w
    params = Params()
    sources = Sources(graph, params)
    pragma = "#pragma omp parallel for schedule(static)" if n * c * hw >= PARALLEL_MIN else ""
    if node.op == "global_avg_pool2d":
        x = sources.pointer(node.inputs[0], "float")
        # Eight partial sums: independent adds the compiler keeps in one vector (a
        # single running double sum would be one long dependency chain).
        body = f"""
/* global_avg_pool2d {n}x{c}x{h}x{w} */
void NAME{SIGNATURE} {{
    const float *restrict x = {x};
    float *restrict y = (float *)out_;
    (void)params; (void)ws;
    {pragma}
    for (int plane = 0; plane < {n * c}; plane++) {{
        const float *restrict xc = x + (size_t)plane * {hw};
        double part[8] = {{0}};
        int i = 0;
        for (; i + 8 <= {hw}; i += 8)
            for (int k = 0; k < 8; k++) part[k] += (double)xc[i + k];
        for (; i < {hw}; i++) part[0] += (double)xc[i];
        const double s = ((part[0] + part[1]) + (part[2] + part[3]))
                       + ((part[4] + part[5]) + (part[6] + part[7]));
        y[plane] = (float)(s / {float(hw)!r});
    }}
}}
"""
        return kernel(body, params, sources)
    x = sources.pointer(node.inputs[0], "int8_t")
    off = params.add(rq_tables(node.attrs["multiplier"], node.attrs["shift"], c))
    body = f"""{RQ_HELPER}
/* qglobal_avg_pool2d {n}x{c}x{h}x{w} */
void NAME{SIGNATURE} {{
    const int8_t *restrict x = {x};
    int8_t *restrict y = (int8_t *)out_;
    const uint32_t *restrict rq = (const uint32_t *)(params + {off});
    (void)ws;
    {pragma}
    for (int plane = 0; plane < {n * c}; plane++) {{
        const int8_t *restrict xc = x + (size_t)plane * {hw};
        const int ch = plane % {c};
        uint32_t s = 0;
        for (int i = 0; i < {hw}; i++) s += (uint32_t)(int32_t)xc[i];
        y[plane] = vdla_clamp8(NAME_rq((int32_t)s, rq[ch], rq[{c} + ch], rq[{2 * c} + ch],
                                       rq[{3 * c} + ch]), {INT8_MIN}, {INT8_MAX});
    }}
}}
"""
    return kernel(body, params, sources)


def pool_refusal(node: Node, graph: Graph, allowed: tuple[str, ...]) -> str | None:
    bad = dtype_refusal(node, graph, allowed)
    if bad:
        return bad
    if len(graph.tensors[node.inputs[0]].shape) != 4:
        return (f"{node.op} node {node.name!r}: input shape "
                f"{graph.tensors[node.inputs[0]].shape} is not 4-D NCHW")
    if node.op in ("global_avg_pool2d", "qglobal_avg_pool2d"):
        return None
    row = PoolShape(node, graph).row_bytes
    if row > POOL_ROW_MAX:
        return (f"{node.op} node {node.name!r}: a padded input row of {row} bytes exceeds "
                f"the {POOL_ROW_MAX} bytes a pool keeps on the stack")
    return None


# --- blocked layouts -------------------------------------------------------------------------

#: The pools that read a blocked input (`vdla.compiler.targets.cpu.layout`): a max pool
#: keeps it blocked, the global pools write their (N, C, 1, 1) output plain.
BLOCKED_POOLS = frozenset({"max_pool2d", "global_avg_pool2d", "qglobal_avg_pool2d"})


def blocked_pool_kernel(node: Node, graph: Graph, block: int, *,
                        band: bool = False) -> Kernel:
    """``max_pool2d`` on an input in layout NCHW{block}c, its output in the same layout:
    each output pixel the maximum of the window's pixel vectors, the window clipped to
    the image (a max over the taps inside equals one over the padding's minimum). With
    `band`, its C is ``NAME(x, y, b, r0, r1)``: output rows ``r0`` to ``r1`` of image
    ``b``, every channel block, on the calling thread (a part of a fused kernel,
    `vdla.compiler.targets.cpu.fusion`)."""
    p = PoolShape(node, graph)
    t = CTYPES[graph.tensors[node.inputs[0]].dtype]
    cb = -(-p.c // block)
    params = Params()
    size = 1 if t == "int8_t" else 4
    # Pixel vectors of GCC's vector types (a plain loop over the lanes stays scalar:
    # gcc does not vectorize its select); a > b ? a : b lane by lane, as before.
    types = f"""typedef {t} NAME_v __attribute__((vector_size({block * size})));
typedef {"int8_t" if size == 1 else "int32_t"} NAME_m __attribute__((vector_size({block * size})));
VDLA_INLINE NAME_v NAME_max(NAME_v a, NAME_v b) {{
    NAME_m m = a > b; return (NAME_v)(((NAME_m)a & m) | ((NAME_m)b & ~m)); }}
"""
    fill = "-128" if t == "int8_t" else "-INFINITY"
    row = f"""const {t} *restrict xc = x + (size_t)plane * {p.h * p.w * block};
const int r0 = r * {p.sh} - {p.pt};
const int i0 = vdla_max(r0, 0), i1 = vdla_min(r0 + {p.kh}, {p.h});
for (int q = 0; q < {p.ow}; q++) {{
    const int c0 = q * {p.sw} - {p.pl};
    const int j0 = vdla_max(c0, 0), j1 = vdla_min(c0 + {p.kw}, {p.w});
    NAME_v m = (NAME_v){{0}} + ({t}){fill};
    for (int i = i0; i < i1; i++)
        for (int j = j0; j < j1; j++) {{
            NAME_v v;
            memcpy(&v, xc + ((size_t)i * {p.w} + j) * {block}, sizeof v);
            m = NAME_max(v, m);
        }}
    memcpy(y + (((size_t)plane * {p.oh} + r) * {p.ow} + q) * {block}, &m, sizeof m);
}}"""
    title = (f"max_pool2d {p.n}x{p.c}x{p.h}x{p.w} -> {p.oh}x{p.ow}, NCHW{block}c, window "
             f"{p.kh}x{p.kw},\n   strides {p.sh}x{p.sw}, pads {p.pt},{p.pl},{p.pb},{p.pr}")
    if band:
        body = f"""
/* {title}: rows r0 to r1 of image b */
{types}
VDLA_INLINE void NAME(const {t} *restrict x, {t} *restrict y, int b, int r0_, int r1_) {{
    for (int plane = b * {cb}; plane < (b + 1) * {cb}; plane++)
    for (int r = r0_; r < r1_; r++) {{
        {indent(row, 8)}
    }}
}}
"""
        return Kernel(body, params.blob(), (node.inputs[0],), 0, 0, None,
                      in_blocks=(block,), out_block=block)
    sources = Sources(graph, params)
    x = sources.pointer(node.inputs[0], t)
    pragma = ("#pragma omp parallel for collapse(2) schedule(static)"
              if p.work >= PARALLEL_MIN else "")
    body = f"""
/* {title} */
{types}
void NAME{SIGNATURE} {{
    const {t} *restrict x = {x};
    {t} *restrict y = ({t} *)out_;
    (void)params; (void)ws;
    {pragma}
    for (int plane = 0; plane < {p.n * cb}; plane++)
    for (int r = 0; r < {p.oh}; r++) {{
        {indent(row, 8)}
    }}
}}
"""
    return dataclasses.replace(kernel(body, params, sources), in_blocks=(block,),
                               out_block=block)


def blocked_global_pool_kernel(node: Node, graph: Graph, block: int) -> Kernel:
    """``global_avg_pool2d`` / ``qglobal_avg_pool2d`` on an input in layout NCHW{block}c,
    their (N, C, 1, 1) output plain: per channel block, the lanes' sums (float32: in
    double, as the plain kernel; int8: modulo 2**32), then the mean or the requantized,
    clipped sum of each of the block's real channels."""
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    hw, cb = h * w, -(-c // block)
    params = Params()
    sources = Sources(graph, params)
    pragma = "#pragma omp parallel for schedule(static)" if n * c * hw >= PARALLEL_MIN else ""
    int8 = node.op == "qglobal_avg_pool2d"
    t, acc = ("int8_t", "uint32_t") if int8 else ("float", "double")
    x = sources.pointer(node.inputs[0], t)
    helper, tables, finish = "", "", f"y[(size_t)b * {c} + ch] = (float)(s[l] / {float(hw)!r});"
    if int8:
        off = params.add(rq_tables(node.attrs["multiplier"], node.attrs["shift"], c))
        helper = RQ_HELPER
        tables = f"    const uint32_t *restrict rq = (const uint32_t *)(params + {off});\n"
        finish = (f"y[(size_t)b * {c} + ch] = vdla_clamp8(NAME_rq((int32_t)s[l], rq[ch], "
                  f"rq[{c} + ch], rq[{2 * c} + ch], rq[{3 * c} + ch]), {INT8_MIN}, {INT8_MAX});")
    load = "(uint32_t)(int32_t)" if int8 else "(double)"
    body = f"""{helper}
/* {node.op} {n}x{c}x{h}x{w}, NCHW{block}c -> plain */
void NAME{SIGNATURE} {{
    const {t} *restrict x = {x};
    {t} *restrict y = ({t} *)out_;
{tables}    (void)ws;
    {pragma}
    for (int plane = 0; plane < {n * cb}; plane++) {{
        const int b = plane / {cb}, blk = plane % {cb};
        const {t} *restrict xc = x + (size_t)plane * {hw * block};
        {acc} s[{block}] = {{0}};
        for (int i = 0; i < {hw}; i++)
            for (int l = 0; l < {block}; l++) s[l] += {load}xc[(size_t)i * {block} + l];
        for (int l = 0; l < {block}; l++) {{
            const int ch = blk * {block} + l;
            if (ch < {c}) {{ {finish} }}
        }}
    }}
}}
"""
    return dataclasses.replace(kernel(body, params, sources), in_blocks=(block,))
