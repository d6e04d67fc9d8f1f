"""Depthwise convolutions (one input channel per group) compiled to C.

Each output channel reads one input plane; vectors run along an output row's pixels, each
tap's weight broadcast over them (int8: products in int32 lanes). A depthwise layer does
few multiply-adds per output, so the kernel walks output rows (``nv`` vectors at a time,
the row's last one masked): no wider grid to squeeze, each channel's constants loaded
once. The input is repacked like a dense convolution's (`vdla.compiler.targets.cpu.conv`:
padded, split by stride phase), int8 without the channel interleave.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.conv import _Code, _indent, _prep, _tables, _tables_c
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["depthwise_kernel"]


def depthwise_kernel(shape: ConvShape, schedule: ConvSchedule, weights, bias, node: Node,
                     inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of depthwise convolution `shape` (``shape.depthwise``) with
    `schedule` (checked by the caller); arguments as `conv_kernel`'s."""
    s = schedule
    code = _Code(shape, s.vl)
    vl, nv, t = s.vl, s.nv, code.acc
    params = Params()
    w = np.asarray(weights).reshape(shape.o, shape.kh * shape.kw)
    w_off = params.add(w.astype(np.int32) if shape.int8 else w.astype(np.float32))
    plain = dataclasses.replace(shape, offset=False)
    offsets = _tables(plain, node, w, bias, params)
    block = nv * vl
    plane_rows = shape.plane_rows(block)
    pitch = shape.grid_pitch
    plane_bytes = align(plane_rows * pitch * (1 if shape.int8 else 4), 64)
    nph = len(shape.phases)
    shared = shape.c * nph * plane_bytes
    rt_count = -(-shape.ho // s.tile_h)
    wt = "int32_t" if shape.int8 else "float"
    el = "int8_t" if shape.int8 else "float"
    steps = []
    for k, (p, off) in enumerate(shape.taps):
        base = f"(const {el} *)(xc + {p * plane_bytes}) + row + {off} + v * {vl}"
        load = f"{t}_from_s8({base})" if shape.int8 else f"{t}_load({base})"
        steps.append(f"acc[v] += {load} * w{k};")
    weights_c = " ".join(f"const {wt} w{k} = wc[{k}];" for k in range(len(shape.taps)))
    if shape.int8:
        consts = ("const uint32_t bv = (uint32_t)bias[chan]; const int32_t m = mul[chan], "
                  "sh = shf[chan];" + (" const int32_t rm = rmul[chan], rs = rshf[chan];"
                                        if shape.residual else "")
                  + f" const {t} lo = {t}_bcast(lim[0]), hi = {t}_bcast(lim[1]);")
        rp = "res + out"
        finish = [f"{t} a = {t}_rq(({t})((vu{vl})acc[v] + bv), m, sh);"]
        if shape.residual:
            finish.append(f"a = ({t})((vu{vl})a + (vu{vl}){t}_rq(n == {vl} ? "
                          f"{t}_from_s8({rp}) : {t}_from_s8_n({rp}, n), rm, rs));")
        finish.append(f"a = {t}_max({t}_min(a, hi), lo);")
        finish.append(f"if (n == {vl}) {t}_store_s8(y + out, a); "
                      f"else {t}_store_s8_n(y + out, a, n);")
    else:
        consts = (f"const float bv = bias[chan]; const {t} lo = {t}_bcast(lim[0]), "
                  f"hi = {t}_bcast(lim[1]); (void)lo; (void)hi;")
        finish = [f"{t} a = acc[v] + bv;"]
        if shape.residual:
            finish.append(f"a += n == {vl} ? {t}_load(res + out) : {t}_load_n(res + out, n);")
        if shape.activation == "relu":
            finish.append(f"a = {t}_max(a, ({t}){{0}});")
        elif shape.activation == "clip":
            finish.append(f"a = {t}_max({t}_min(a, hi), lo);")
        finish.append(f"if (n == {vl}) {t}_store(y + out, a); else {t}_store_n(y + out, a, n);")
    res_decl = (f"const {code.out} *restrict res = (const {code.out} *)in[1];"
                if shape.residual else f"const {code.out} *restrict res = NULL;")
    rt = f"for (int rt = 0; rt < {rt_count}; rt++)"
    gl = f"for (int g = 0; g < {shape.groups}; g++)"
    loops = (f"#pragma omp for collapse(2) schedule(static)\n{gl}\n{rt}"
             if s.parallel != "h" else f"#pragma omp for schedule(static)\n{rt}\n{gl}")
    body = f"""
/* {shape.dtype} depthwise conv {shape.describe()}; schedule {s.to_dict()} */
{_prep(plain, code, plane_bytes)}
static void NAME_rows(const unsigned char *restrict xc, const {wt} *restrict wc, int chan,
        int r0, int r1, const {code.out} *restrict res, {code.out} *restrict y,
        const unsigned char *restrict params) {{
    (void)res;
{_tables_c(shape, offsets, code)}    {consts}
    {weights_c}
    for (int r = r0; r < r1; r++) {{
        for (int c0 = 0; c0 < {shape.wo}; c0 += {block}) {{
            const int row = r * {pitch} + c0;
            {t} acc[{nv}];
            for (int v = 0; v < {nv}; v++) {{
                acc[v] = ({t}){{0}};
                {" ".join(steps)}
            }}
            for (int v = 0; v < {nv}; v++) {{
                const int c = c0 + v * {vl};
                if (c >= {shape.wo}) break;
                const int n = vdla_min({vl}, {shape.wo} - c);
                const size_t out = (size_t)chan * {shape.ho * shape.wo} + (size_t)r * {shape.wo} + c;
                {" ".join(finish)}
            }}
        }}
    }}
}}

void NAME{SIGNATURE} {{
    const {el} *restrict x = (const {el} *)in[0];
    {res_decl}
    {code.out} *restrict y = ({code.out} *)out_;
    const {wt} *restrict wp = (const {wt} *)(params + {w_off});
    {code.plane} *restrict xq = ({code.plane} *)ws;
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    for (int b = 0; b < {shape.n}; b++) {{
        const {el} *xb = x + (size_t)b * {shape.c * shape.h * shape.w};
        #pragma omp for collapse(2) schedule(static)
        for (int gc = 0; gc < {shape.c}; gc++)
            for (int r = 0; r < {plane_rows}; r++) NAME_prep(xb, xq, gc, r);
        {code.out} *yb = y + (size_t)b * {shape.o * shape.ho * shape.wo};
        const {code.out} *rb = res ? res + (size_t)b * {shape.o * shape.ho * shape.wo} : NULL;
        {_indent(loops, 8)} {{
            const unsigned char *xc = (const unsigned char *)xq + (size_t)g * {nph * plane_bytes};
            const int r0 = rt * {s.tile_h}, r1 = vdla_min(r0 + {s.tile_h}, {shape.ho});
            for (int m = 0; m < {shape.og}; m++) {{
                const int chan = g * {shape.og} + m;
                NAME_rows(xc, wp + (size_t)chan * {len(shape.taps)}, chan, r0, r1, rb, yb,
                          params);
            }}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, shared, 0, shape.macs)
