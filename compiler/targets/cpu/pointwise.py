"""Float32 pointwise convolutions (1x1, stride 1, no padding, one group) with vectors
along the output channels: a GEMM of the weights by the image's pixels.

A schedule with ``lanes="co"`` (`ConvSchedule`) picks this kernel. Its register tile is
``mr`` pixels (a multiple of 8) by ``nv`` vectors of output channels: each step of the
reduction loads ``nv`` weight vectors (the packed weights hold ``nv * vl`` channels of
one input channel side by side) and broadcasts ``mr`` input pixels. The kernel of
`vdla.compiler.targets.cpu.conv` runs the other way (vectors along pixels, the weights
broadcast), and must cover a plane's pixels with whole vectors; a small plane (14x14:
196 pixels) is covered far better by 8-pixel tiles, and the weight panel of one channel
vector (``vl`` channels by the input channels) stays in L1 while a tile sweeps the
pixels. In MobileNet-v1 its 14x14 and 7x7 layers ran 1.15-1.3x faster this way; its
larger planes did not (`vdla.compiler.targets.cpu.schedule` holds the rule).

The input is read in place (NCHW: a pixel's channels are planes apart, so a broadcast
reads one float per channel), and the output is written in place too: bias is added to
the channel vectors, then each block of 8 pixels x 8 channels is transposed in
registers (`vf8_transpose8` of ``vdla_cpu.h``) into 8 output rows of 8 pixels, which
take the residual and the activation and are stored. (Measured cache-hot with a 6x4
tile and a scalar transposed store instead: a 128->128 layer at 56x56 took 655 us
against 462 us with no store at all; a transpose does the work of 64 scalar moves with
24 shuffles and 8 row stores.)

Passes over the input channels (``tile_ci``) keep partial sums in each thread's scratch,
as vectors in the tile's own order.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.conv import Code, item_count, item_loops
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["pointwise_kernel"]


def _pack_weights(shape: ConvShape, w: np.ndarray, block: int) -> np.ndarray:
    """``[channel tile of block][input channel][block]``; padded channels are zero."""
    o, c = shape.o, shape.c
    op = shape.og_padded(block)
    wp = np.zeros((op, c), np.float32)
    wp[:o] = np.asarray(w, np.float32).reshape(o, c)
    return np.ascontiguousarray(wp.reshape(op // block, block, c).transpose(0, 2, 1))


def _tile(shape: ConvShape, s: ConvSchedule, code: Code, offsets: dict, passes: int,
          *, tail: bool) -> str:
    """C: one register tile (mr pixels x nv channel vectors) over one pass of input
    channels, then its epilogue (`_epilogue`). With `tail`, the pixels past the image's
    end are not read (the image's last pixel is re-read instead), so the last channel's
    plane is never overrun."""
    vl, t, mr, nv = s.vl, code.acc, s.mr, s.nv
    plane = shape.h * shape.w
    accs = [[f"a{j}_{v}" for v in range(nv)] for j in range(mr)]
    flat = [a for row in accs for a in row]
    if tail:
        where = "".join(f"    const int q{j} = vdla_min({j}, {plane - 1} - p0);\n"
                        for j in range(mr))
        pix = [f"x[q{j}]" for j in range(mr)]
    else:
        where = ""
        pix = [f"x[{j}]" for j in range(mr)]
    body = [f"const {t} w{v} = {t}_load(wc + {v * vl});" for v in range(nv)]
    for j in range(mr):
        body.append(f"{{ const {t} b = {t}_bcast({pix[j]}); "
                    + " ".join(f"{accs[j][v]} = {t}_fma(w{v}, b, {accs[j][v]});"
                               for v in range(nv)) + " }")
    width = nv * vl
    part = "part + (size_t)({k}) * {vl}"
    if passes > 1:
        init = "\n    ".join(
            f"{accs[j][v]} = first ? ({t}){{0}} : {t}_load({part.format(k=j * nv + v, vl=vl)});"
            for j in range(mr) for v in range(nv))
        save = ("\n    if (!last) {\n        "
                + "\n        ".join(f"{t}_store({part.format(k=j * nv + v, vl=vl)}, "
                                    f"{accs[j][v]});" for j in range(mr) for v in range(nv))
                + "\n        return;\n    }")
    else:
        init = "\n    ".join(f"{a} = ({t}){{0}};" for a in flat)
        save = ""
    epi = _epilogue(shape, s, code)
    return f"""
VDLA_INLINE void NAME_tile{"_tail" if tail else ""}(const float *restrict x,
        const float *restrict wc, int nsteps, int oc0, int p0, int np, int first, int last,
        float *restrict part, const float *restrict res, float *restrict y,
        const unsigned char *restrict params) {{
    (void)first; (void)last; (void)part; (void)res;
{table_pointers(shape, offsets)}{where}    {t} {", ".join(flat)};
    {init}
    #pragma GCC unroll {s.unroll}
    for (int c = 0; c < nsteps; c++, x += {plane}, wc += {width}) {{
        {(chr(10) + "        ").join(body)}
    }}{save}
    const int nch = vdla_min({width}, {shape.o} - oc0);
    {epi}
}}
"""


def _epilogue(shape: ConvShape, s: ConvSchedule, code: Code) -> str:
    """C: the tile's epilogue. Bias is added to the channel vectors; each block of 8
    pixels x 8 channels is then transposed in registers (`vf8_transpose8`) into 8
    channel rows of 8 pixels, which take the residual and the activation and are
    stored (the tile's last pixels masked by ``np``, its channels past the layer's
    end skipped by ``nch``): the steps of `vdla.compiler.targets.cpu.epilogue` after its
    first, on rows of 8 lanes."""
    vl, t, mr, nv = s.vl, code.acc, s.mr, s.nv
    plane = shape.h * shape.w
    rows_ep = Epilogue.of(shape, 8)
    ops = Operands.channel(rows_ep, "k")    # its clip bounds: the bias went in before
    lanes = Lanes("first", "n8")
    act = rows_ep.bound(ops, "r")
    out = [f"const {t} bias{v} = {t}_load(bias + oc0 + {v * vl});" for v in range(nv)]
    for q in range(mr // 8):
        block = [f"const int n8 = vdla_min(8, np - {q * 8});"]
        for v in range(nv):
            for h in range(vl // 8):
                cb = v * vl + h * 8
                rows = []
                for j in range(8):
                    acc = f"a{q * 8 + j}_{v} + bias{v}"
                    rows.append(acc if vl == 8 else f"vf16_half({acc}, {h})")
                rp = f"res + (size_t)(oc0 + {cb} + k) * {plane} + p0 + {q * 8}"
                res = rows_ep.add_residual(ops, rp, lanes, "r")
                yp = f"y + (size_t)(oc0 + {cb} + k) * {plane} + p0 + {q * 8}"
                block.append(f"""if ({cb} < nch) {{
            vf8 rows[8] = {{{", ".join(rows)}}};
            vf8_transpose8(rows);
            for (int k = 0; k < vdla_min(8, nch - {cb}); k++) {{
                vf8 r = rows[k];
                {res} {act}
                {rows_ep.store(yp, lanes, "r")}
            }}
        }}""")
        out.append("if (np > %d) {\n        %s\n    }" % (q * 8, "\n        ".join(block)))
    return "\n    ".join(out)


def pointwise_kernel(shape: ConvShape, schedule: ConvSchedule, weights: np.ndarray,
                     bias: np.ndarray | None, node: Node, isa: Isa,
                     inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of pointwise convolution `shape` with `schedule` (``lanes="co"``,
    checked on `isa`); arguments as `vdla.compiler.targets.cpu.conv.conv_kernel`'s."""
    s = schedule.check(shape, isa)
    if s.lanes != "co":
        raise ValueError(f"pointwise_kernel: schedule lanes={s.lanes!r}; "
                         "vdla.compiler.targets.cpu.conv.conv_kernel compiles it")
    code = Code(shape, s.vl)
    width = s.nv * s.vl
    params = Params()
    w_off = params.add(_pack_weights(shape, weights, width))
    # The bias table padded to whole channel vectors (the tile loads it as vectors).
    b = np.zeros(shape.og_padded(width), np.float32)
    if bias is not None:
        b[:shape.o] = np.asarray(bias, np.float32)
    offsets = tables(shape, node, weights, b, params)
    plane = shape.h * shape.w
    passes = -(-shape.c // s.tile_ci)
    ct_count = -(-shape.og_padded(width) // s.tile_co)
    rt_count = -(-shape.ho // s.tile_h)
    tiles_co = s.tile_co // width
    item_px = s.tile_h * shape.wo
    item_tiles = -(-item_px // s.mr)
    thread = tiles_co * item_tiles * s.mr * width * 4 if passes > 1 else 0
    ctt = shape.og_padded(width) // width
    tile = (_tile(shape, s, code, offsets, passes, tail=False)
            + _tile(shape, s, code, offsets, passes, tail=True))
    mt_loop = "for (int mt = 0; mt < mts; mt++)"
    px_loop = f"for (int p0 = gb; p0 < ge; p0 += {s.mr})"
    outer, inner = (mt_loop, px_loop) if s.order == "co" else (px_loop, mt_loop)
    res_decl = ("const float *restrict res = (const float *)in[1];" if shape.residual
                else "const float *restrict res = NULL;")
    loops = item_loops(s, 1, ct_count, rt_count)
    body = f"""
/* float32 pointwise conv {shape.describe()}; schedule {schedule.to_dict()} */
{tile}
void NAME{SIGNATURE} {{
    const float *restrict x = (const float *)in[0];
    {res_decl}
    float *restrict y = (float *)out_;
    const float *restrict wp = (const float *)(params + {w_off});
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    {{
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *restrict part = (float *)(ws + (size_t)tid * {align(thread)});
        (void)part;
        for (int b = 0; b < {shape.n}; b++) {{
            const float *xb = x + (size_t)b * {shape.c * plane};
            float *yb = y + (size_t)b * {shape.o * plane};
            const float *rb = res ? res + (size_t)b * {shape.o * plane} : NULL;
            {loops.replace(chr(10), chr(10) + "            ")} {{
                (void)g;
                const int gb = rt * {item_px};
                const int ge = vdla_min(gb + {item_px}, {plane});
                const int mts = vdla_min({tiles_co}, {ctt} - ct * {tiles_co});
                for (int cp = 0; cp < {passes}; cp++) {{
                    const int c0 = cp * {s.tile_ci};
                    const int nsteps = vdla_min({s.tile_ci}, {shape.c} - c0);
                    {outer}
                    {inner} {{
                        const int oct = ct * {tiles_co} + mt;
                        const float *wc = wp + ((size_t)oct * {shape.c} + c0) * {width};
                        float *pt = part + ((size_t)mt * {item_tiles} + (p0 - gb) / {s.mr})
                                           * {s.mr * width};
                        const int np = vdla_min({s.mr}, ge - p0);
                        (p0 + {s.mr} > {plane} ? NAME_tile_tail : NAME_tile)(
                            xb + (size_t)c0 * {plane} + p0, wc, nsteps, oct * {width}, p0,
                            np, cp == 0, cp == {passes - 1}, pt, rb, yb, params);
                    }}
                }}
            }}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, 0, thread, shape.macs,
                  items=item_count(s, 1, ct_count, rt_count))
