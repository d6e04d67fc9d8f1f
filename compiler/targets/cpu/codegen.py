"""C source for the CPU target's integer GEMM ops: ``qconv2d`` and ``qdense``.

    source = conv2d_source(fn, node, graph)     # one C function per node

Each node becomes one C function with its shapes, strides and pads, and its
requantization parameters, baked in as constants, so the compiler sees fixed loop bounds:

    void fn(const int8_t *x, const int8_t *w, const int32_t *bias, const int8_t *residual,
            int8_t *y);

(``bias`` and ``residual`` may be NULL when the node has none.) The arithmetic is
`vdla.compiler.reference.integer`'s, step for step: int8 products summed in int32, the
bias added and every requantization step done modulo 2**32 (on ``uint32_t``: signed
overflow is undefined in C, unsigned wrap-around is not), ``>>`` arithmetic on int32
(gcc and clang define it so; `PRELUDE` checks it at compile time).

The default loop nest (the schedule space comes with the tuner): OpenMP over (image,
block of up to 8 output channels of one group), then per output row one int32
accumulator row per channel of the block, into which every tap adds a shifted input row
times its weight; the block's channels share each input row they read. The innermost
loop runs along the output row (unit stride for stride 1), so gcc vectorizes it; an
int8 x int8 product is exact in int16, so it multiplies 16-bit lanes and widens as it
adds (ResNet-18: 0.32 s with 32-bit products, 0.25 s so). The ranges of each tap that
fall in the padding are cut off beforehand instead of tested.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node

__all__ = ["PRELUDE", "conv2d_source", "dense_source", "max_terms"]

#: Shared by every generated file: the requantization step and thread control.
PRELUDE = r"""
#include <stdint.h>
#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

_Static_assert((-3 >> 1) == -2, "vdla's CPU target needs arithmetic >> on signed ints");

/* requantize(a, multiplier, shift) of vdla.compiler.reference.integer; m == 0: none. */
static inline int32_t vdla_rq(int32_t a, int32_t m, int32_t s) {
    uint32_t u = (uint32_t)a;
    if (m) u = (uint32_t)((int64_t)a * (int64_t)m);
    if (s > 0) return ((int32_t)(u + (1u << (s - 1)))) >> s;
    return (int32_t)(u << (-s));
}

static inline int8_t vdla_clamp(int32_t v, int32_t lo, int32_t hi) {
    return (int8_t)(v < lo ? lo : v > hi ? hi : v);
}

void vdla_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

int vdla_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""


def max_terms() -> int:
    """The most int8 x int8 products an int32 accumulator sums without overflow
    (128 * 128 each): the target refuses reductions longer than this."""
    return (2**31 - 1) // (128 * 128)


def _channel(value, count: int, *, none_is: int | None = None) -> list[int]:
    """A requantization attribute (None, one value, or one per channel) as `count` ints."""
    if value is None:
        return [none_is] * count
    arr = np.atleast_1d(np.asarray(value, dtype=np.int64)).reshape(-1)
    if arr.size == 1:
        return [int(arr[0])] * count
    if arr.size != count:
        raise ValueError(f"{arr.size} per-channel values for {count} channels")
    return [int(v) for v in arr]


def _array(name: str, ctype: str, values: list[int]) -> str:
    body = ", ".join(str(v) for v in values)
    return f"    static const {ctype} {name}[{len(values)}] = {{{body}}};\n"


def _epilogue_tables(node: Node, channels: int) -> str:
    a = node.attrs
    out = _array("MUL", "int32_t", _channel(a["multiplier"], channels, none_is=0))
    out += _array("SHF", "int32_t", _channel(a["shift"], channels))
    if node.input(3):
        out += _array("RMUL", "int32_t", _channel(a["residual_multiplier"], channels,
                                                  none_is=0))
        out += _array("RSHF", "int32_t", _channel(a["residual_shift"], channels))
    return out


def _epilogue(node: Node, acc: str, o: str, res_index: str, out_index: str) -> str:
    """C statements: `acc` (+ bias) requantized, the residual added, clamped, stored."""
    a = node.attrs
    lines = [f"uint32_t u = (uint32_t){acc};"]
    if node.input(2):
        lines.append(f"u += (uint32_t)bias[{o}];")
    lines.append(f"int32_t v = vdla_rq((int32_t)u, MUL[{o}], SHF[{o}]);")
    if node.input(3):
        lines.append(f"v = (int32_t)((uint32_t)v + (uint32_t)vdla_rq(residual[{res_index}], "
                     f"RMUL[{o}], RSHF[{o}]));")
    lines.append(f"y[{out_index}] = vdla_clamp(v, {int(a['out_min'])}, {int(a['out_max'])});")
    return " ".join(lines)


def _opening(fn: str, node: Node, channels: int) -> str:
    """A GEMM op's function signature, its epilogue tables, and the OpenMP pragma of
    the (image, output channels) loop pair that follows."""
    return f"""
void {fn}(const int8_t *restrict x, const int8_t *restrict w,
          const int32_t *restrict bias, const int8_t *restrict residual,
          int8_t *restrict y) {{
{_epilogue_tables(node, channels)}    (void)bias; (void)residual;
    #pragma omp parallel for collapse(2) schedule(static)"""


def conv2d_source(fn: str, node: Node, graph: Graph) -> str:
    """The C function `fn` computing ``qconv2d`` node `node` (plain NCHW/OIHW layouts)."""
    a = node.attrs
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    o, cg, kh, kw = graph.tensors[node.inputs[1]].shape
    sh, sw = a["strides"]
    dh, dw = a["dilations"]
    pt, pl, pb, pr = a["pads"]
    groups = int(a["groups"])
    oh = conv_output_size(h, kh, sh, pt, pb, dh)
    ow = conv_output_size(w, kw, sw, pl, pr, dw)
    og = o // groups
    # Output channels computed together (they share every input row they read): the
    # largest of 8, 4, 2, 1 that divides a group's channels.
    ob = next(b for b in (8, 4, 2, 1) if og % b == 0)
    res = f"((size_t)(b * {o} + oc) * {oh} + r) * {ow} + q"
    return f"""{_opening(fn, node, o)}
    for (int b = 0; b < {n}; b++)
    for (int ob = 0; ob < {o // ob}; ob++) {{
        const int o0 = ob * {ob}, g = o0 / {og};
        int32_t acc[{ob}][{ow}];
        for (int r = 0; r < {oh}; r++) {{
            for (int t = 0; t < {ob}; t++)
                for (int q = 0; q < {ow}; q++) acc[t][q] = 0;
            for (int ci = 0; ci < {cg}; ci++) {{
                const int8_t *xc = x + (size_t)(b * {c} + g * {cg} + ci) * {h * w};
                for (int i = 0; i < {kh}; i++) {{
                    const int ih = r * {sh} - {pt} + i * {dh};
                    if (ih < 0 || ih >= {h}) continue;
                    const int8_t *xr = xc + ih * {w};
                    for (int j = 0; j < {kw}; j++) {{
                        const int off = j * {dw} - {pl};
                        /* the outputs whose input column off + q*stride is inside */
                        int lo = off >= 0 ? 0 : (-off + {sw} - 1) / {sw};
                        int hi = {w} - 1 - off < 0 ? 0 : ({w} - 1 - off) / {sw} + 1;
                        if (hi > {ow}) hi = {ow};
                        for (int t = 0; t < {ob}; t++) {{
                            const int16_t wv = w[((size_t)(o0 + t) * {cg} + ci) * {kh * kw}
                                                 + i * {kw} + j];
                            int32_t *restrict at = acc[t];
                            /* an int8 x int8 product fits int16 exactly: 16-bit
                               multiplies (twice the lanes of 32-bit ones), widened as
                               they are added */
                            for (int q = lo; q < hi; q++)
                                at[q] += (int16_t)(wv * (int16_t)xr[off + q * {sw}]);
                        }}
                    }}
                }}
            }}
            for (int t = 0; t < {ob}; t++) {{
                const int oc = o0 + t;
                for (int q = 0; q < {ow}; q++) {{
                    {_epilogue(node, "acc[t][q]", "oc", res, res)}
                }}
            }}
        }}
    }}
}}
"""


def dense_source(fn: str, node: Node, graph: Graph) -> str:
    """The C function `fn` computing ``qdense`` node `node` (plain NC/OI layouts)."""
    n, c = graph.tensors[node.inputs[0]].shape
    o, _ = graph.tensors[node.inputs[1]].shape
    return f"""{_opening(fn, node, o)}
    for (int b = 0; b < {n}; b++)
    for (int oc = 0; oc < {o}; oc++) {{
        const int8_t *xr = x + (size_t)b * {c};
        const int8_t *wr = w + (size_t)oc * {c};
        int32_t acc = 0;
        for (int k = 0; k < {c}; k++) acc += (int32_t)xr[k] * (int32_t)wr[k];
        {_epilogue(node, "acc", "oc", f"(size_t)b * {o} + oc", f"(size_t)b * {o} + oc")}
    }}
}}
"""


# --- pools and elementwise ops -------------------------------------------------------------
# Same signature as the GEMM ops (x, second operand, unused, unused, y), so a session calls
# every function alike: the pools and relu read x, qadd reads x and the second operand.

def _plain_opening(fn: str, tables: str = "") -> str:
    return f"""
void {fn}(const int8_t *restrict x, const int8_t *restrict x2,
          const int32_t *restrict unused, const int8_t *restrict unused2,
          int8_t *restrict y) {{
{tables}    (void)x2; (void)unused; (void)unused2;"""


def pool2d_source(fn: str, node: Node, graph: Graph) -> str:
    """``max_pool2d`` (int8; padding and the ceil-mode overhang are -128, i.e. skipped),
    ``qavg_pool2d`` (window sums over zero padding, requantized) and
    ``qglobal_avg_pool2d``, on NCHW int8."""
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    _, _, oh, ow = graph.tensors[node.outputs[0]].shape
    a = node.attrs
    if node.op == "qglobal_avg_pool2d":
        (kh, kw), (sh, sw), (pt, pl) = (h, w), (1, 1), (0, 0)
    else:
        (kh, kw), (sh, sw), (pt, pl) = a["kernel"], a["strides"], a["pads"][:2]
    tables = ""
    if node.op == "max_pool2d":
        start, step, finish = "int32_t m = -128;", "if (v > m) m = v;", "y[o] = (int8_t)m;"
    else:
        tables = (_array("MUL", "int32_t", _channel(a["multiplier"], c, none_is=0))
                  + _array("SHF", "int32_t", _channel(a["shift"], c)))
        start, step = "uint32_t s = 0;", "s += (uint32_t)v;"
        finish = "y[o] = vdla_clamp(vdla_rq((int32_t)s, MUL[ch], SHF[ch]), -128, 127);"
    return f"""{_plain_opening(fn, tables)}
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < {n}; b++)
    for (int ch = 0; ch < {c}; ch++) {{
        const int8_t *xc = x + (size_t)(b * {c} + ch) * {h * w};
        for (int r = 0; r < {oh}; r++)
        for (int q = 0; q < {ow}; q++) {{
            const size_t o = ((size_t)(b * {c} + ch) * {oh} + r) * {ow} + q;
            {start}
            for (int i = 0; i < {kh}; i++) {{
                const int ih = r * {sh} - {pt} + i;
                if (ih < 0 || ih >= {h}) continue;
                for (int j = 0; j < {kw}; j++) {{
                    const int iw = q * {sw} - {pl} + j;
                    if (iw < 0 || iw >= {w}) continue;
                    const int32_t v = xc[ih * {w} + iw];
                    {step}
                }}
            }}
            {finish}
        }}
    }}
}}
"""


def qadd_source(fn: str, node: Node, graph: Graph) -> str:
    """``qadd`` of two int8 tensors of one shape (NCHW or NC; per-channel parameters
    along axis 1)."""
    shape = graph.tensors[node.outputs[0]].shape
    c = shape[1] if len(shape) > 1 else 1
    inner = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    total = int(np.prod(shape))
    a = node.attrs
    tables = "".join(_array(name, "int32_t", _channel(a[attr], c, none_is=none))
                     for name, attr, none in (("AM", "a_multiplier", 0), ("AS", "a_shift", None),
                                              ("BM", "b_multiplier", 0), ("BS", "b_shift", None)))
    return f"""{_plain_opening(fn, tables)}
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < {total}; i++) {{
        const int ch = (int)((i / {inner}) % {c});
        const uint32_t s = (uint32_t)vdla_rq(x[i], AM[ch], AS[ch])
                         + (uint32_t)vdla_rq(x2[i], BM[ch], BS[ch]);
        y[i] = vdla_clamp((int32_t)s, {int(a['out_min'])}, {int(a['out_max'])});
    }}
}}
"""


def relu_source(fn: str, node: Node, graph: Graph) -> str:
    """``relu`` on int8."""
    total = int(np.prod(graph.tensors[node.outputs[0]].shape))
    return f"""{_plain_opening(fn)}
    for (size_t i = 0; i < {total}; i++) y[i] = x[i] > 0 ? x[i] : 0;
}}
"""
