"""Convolutions (``conv2d``, ``qconv2d``) compiled to C.

    shape = ConvShape.from_node(node, graph)        # vdla.compiler.targets.cpu.shapes
    kernel = conv_kernel(shape, schedule, weights, bias, node, isa, inputs)

The output is computed as a grid: output rows of the input's row pitch (the pixels past
the last column are computed and dropped), times output channels. Vectors run along the
grid's pixels, so a vector of outputs is one output channel's consecutive pixels, stored
as they are in the plain NCHW output (only the dropped columns are squeezed out); the
register tile is ``mr`` channels by ``nv`` vectors (`ConvSchedule`). Each step of the
reduction loads ``nv`` input vectors and broadcasts ``mr`` weights.

Before computing, each run repacks its input into scratch planes, one per input channel
(int8: per four channels, interleaved so each 32-bit lane holds four channels of one
pixel) and stride phase: padded, so every tap of a valid output reads inside its plane
and the padding needs no test, and split by stride phase, so a strided convolution
reads consecutive elements too. A tap (kh, kw) reads phase ``(kh·dh mod sh, kw·dw mod
sw)`` at offset ``(kh·dh div sh)·pitch + kw·dw div sw`` from the output pixel's grid
index.

int8: the four products per lane are summed by `vi_dot4` (u8 × s8: AVX-512 VNNI,
AVX2 or portable). An input not known to be non-negative (its producer's ``out_min`` < 0)
is stored as ``x + 128`` (exact in u8) and the bias absorbs ``-128 · sum(w)`` (modulo
2**32, like every other step), so the sums are the reference's sums. The epilogue is
`vdla.compiler.reference.integer`'s, lane by lane (`vdla.compiler.targets.cpu.epilogue`,
which every kernel shares).

float32: fused multiply-adds in float32 (the reference sums in float64; the
difference is the rounding of the sums), then bias, residual and activation.

Depthwise convolutions (one input channel per group) are
`vdla.compiler.targets.cpu.depthwise`'s, float32 pointwise ones with vectors along
output channels (``lanes="co"``) `vdla.compiler.targets.cpu.pointwise`'s;
`vdla.compiler.targets.cpu.lower` picks.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["Code", "conv_kernel", "indent", "item_count", "item_loops"]

# --- weights and tables ---------------------------------------------------------------------

def _pack_weights(shape: ConvShape, w: np.ndarray, mr: int) -> np.ndarray:
    """int8: ``[group][channel tile][input channel / 4][tap][mr][4]``; float32:
    ``[group][channel tile][input channel][tap][mr]``; padded channels are zero."""
    g, og, cg, taps = shape.groups, shape.og, shape.cg, shape.kh * shape.kw
    ogp, cgp = shape.og_padded(mr), shape.cg_padded
    wg = np.zeros((g, ogp, cgp, taps), w.dtype)
    wg[:, :og, :cg] = w.reshape(g, og, cg, taps)
    step = shape.ci_step
    wg = wg.reshape(g, ogp // mr, mr, cgp // step, step, taps)
    return np.ascontiguousarray(wg.transpose(0, 1, 3, 5, 2, 4))


# --- C --------------------------------------------------------------------------------------

class Code:
    """The C spellings of one dtype and vector width (shared with `depthwise`)."""

    def __init__(self, shape: ConvShape, vl: int):
        self.vl = vl
        if shape.int8:
            self.acc, self.plane, self.wt, self.out = f"vi{vl}", "uint8_t", "int8_t", "int8_t"
            self.scalar = "int32_t"
            if shape.depthwise:
                self.plane = "int8_t"
        else:
            self.acc, self.plane, self.wt, self.out = f"vf{vl}", "float", "float", "float"
            self.scalar = "float"
        self.elem = 4 if shape.int8 and not shape.depthwise else 1  # plane values / pixel


def _keep_table(shape: ConvShape, vl: int) -> str:
    """Per grid column a vector starts at: which of its lanes are output columns."""
    pitch, wo = shape.grid_pitch, shape.wo
    masks = []
    for col in range(pitch):
        bits = sum(1 << i for i in range(vl) if (col + i) % pitch < wo)
        masks.append(str(bits) + "u")
    return f"static const uint32_t NAME_keep[{pitch}] = {{{', '.join(masks)}}};\n"


def _prep(shape: ConvShape, code: Code, plane_bytes: int) -> str:
    """C: the function that writes one row of every phase plane of one channel (block);
    planes are `plane_bytes` apart."""
    pitch = shape.grid_pitch
    lines = []
    for p, (ph, pw) in enumerate(shape.phases):
        start = pw - shape.pl
        if code.elem == 4:
            xor = "0x80" if shape.offset else "0"
            lines.append(f"""
    {{   /* phase ({ph}, {pw}) */
        uint8_t *dst = xq + (size_t)(gc * {len(shape.phases)} + {p}) * {plane_bytes}
                          + (size_t)r * {pitch * 4};
        const int ih = r * {shape.sh} + {ph - shape.pt};
        const int8_t *src[4];
        for (int l = 0; l < 4; l++) {{
            const int ch = cb * 4 + l;
            src[l] = (r < {shape.hq} && ch < {shape.cg} && ih >= 0 && ih < {shape.h})
                ? xb + ((size_t)(g * {shape.cg} + ch) * {shape.h} + ih) * {shape.w} : NULL;
        }}
        vdla_pack4(dst, src, {pitch}, {shape.w}, {shape.sw}, {start}, {xor});
    }}""")
        else:
            fn = "vdla_packf" if not shape.int8 else "vdla_packb"
            lines.append(f"""
    {{   /* phase ({ph}, {pw}) */
        {code.plane} *dst = xq + (size_t)(gc * {len(shape.phases)} + {p})
                                 * {plane_bytes // (1 if shape.int8 else 4)} + (size_t)r * {pitch};
        const int ih = r * {shape.sh} + {ph - shape.pt};
        const {"int8_t" if shape.int8 else "float"} *src = (r < {shape.hq} && ih >= 0 && ih < {shape.h})
            ? xb + ((size_t)gc * {shape.h} + ih) * {shape.w} : NULL;
        {fn}(dst, src, {pitch}, {shape.w}, {shape.sw}, {start});
    }}""")
    src_t = "int8_t" if shape.int8 else "float"
    head = ("    const int g = gc / %d, cb = gc %% %d;\n    (void)g; (void)cb;"
            % (shape.cg_padded // 4, shape.cg_padded // 4)) if code.elem == 4 else ""
    return (f"static void NAME_prep(const {src_t} *restrict xb, {code.plane} *restrict xq, "
            f"int gc, int r) {{\n{head}" + "".join(lines) + "\n}\n")


def _epilogue(shape: ConvShape, code: Code, acc: str, chan: str, junk: bool) -> str:
    """C statements for one output vector: `acc` (an expression) of global channel
    `chan` at grid index ``gv``, up to grid index ``ge``, finished (`epilogue`) and
    stored. With `junk`, the grid's columns past the output's width are dropped
    (``NAME_keep``)."""
    vl = code.vl
    full = (1 << vl) - 1
    if junk:
        # unsigned: a division by a constant becomes a multiply
        where = (f"const unsigned gq = (unsigned)gv / {shape.grid_pitch}u, "
                 f"gr = (unsigned)gv % {shape.grid_pitch}u;\n"
                 f"const uint32_t keep = NAME_keep[gr] & "
                 f"(ge - gv >= {vl} ? {full}u : (1u << (ge - gv)) - 1u);\n"
                 f"const size_t o = (size_t)gq * {shape.wo} + (gr < {shape.wo}u ? gr : "
                 f"{shape.wo}u);")
    else:
        where = f"const int n = vdla_min({vl}, ge - gv); const size_t o = (size_t)gv;"
    plane = f"(size_t)({chan}) * {shape.ho * shape.wo}"
    ep = Epilogue.of(shape, vl, ("rq", "rq"))
    lanes = Lanes("keep", "keep") if junk else Lanes("first", "n")
    return "\n".join([where] + ep.statements(acc, Operands.channel(ep, chan),
                                               f"y + {plane} + o", res=f"res + {plane} + o",
                                               lanes=lanes))


def _tile_gemm(shape: ConvShape, s: ConvSchedule, code: Code, plane_bytes: int,
               passes: int, offsets: dict, *, name: str = "NAME_tile",
               limit: int | None = None) -> str:
    """C: one register tile (mr channels x nv vectors) over one pass of input channels.
    The tile is written out statement by statement (one variable per accumulator), so
    the accumulators live in registers whatever the compiler's unrolling limits. With
    `limit`, its input loads stop at grid index `limit` (the tail tile of a convolution
    that reads its input in place: nothing past the tensor's end is read)."""
    vl, t, mr, nv = code.vl, code.acc, s.mr, s.nv
    nph, taps = len(shape.phases), shape.taps
    step_bytes = nph * plane_bytes
    wstep = len(taps) * mr * (4 if shape.int8 else 1)
    accs = [[f"a{i}_{v}" for v in range(nv)] for i in range(mr)]
    flat = [a for row in accs for a in row]
    body = []
    for k, (p, off) in enumerate(taps):
        lines = [f"const unsigned char *px = xc + {p * plane_bytes} + (size_t)(g0 + {off}) * 4;"]
        for v in range(nv):
            if limit is not None:      # float32 only (int8 always repacks)
                lines.append(f"const {t} x{v} = {t}_load_n((const float *)(px + {v * vl * 4}), "
                             f"vdla_max(0, vdla_min({vl}, {limit} - g0 - {v * vl})));")
                continue
            lines.append(f"const {t} x{v} = {t}_load((const void *)(px + {v * vl * 4}));"
                         if shape.int8 else
                         f"const {t} x{v} = {t}_load((const float *)(px + {v * vl * 4}));")
        for i in range(mr):
            if shape.int8:
                dot = f"{t}_dot4_any" if shape.offset else f"{t}_dot4"
                lines.append(f"{{ int32_t w; memcpy(&w, wc + {(k * mr + i) * 4}, 4); "
                             + " ".join(f"{accs[i][v]} = {dot}({accs[i][v]}, x{v}, w);"
                                        for v in range(nv)) + " }")
            else:
                lines.append(f"{{ const {t} w = {t}_bcast(wc[{k * mr + i}]); "
                             + " ".join(f"{accs[i][v]} = {t}_fma(x{v}, w, {accs[i][v]});"
                                      for v in range(nv))
                             + " }")
        body.append("{ " + "\n              ".join(lines) + " }")
    junk = shape.grid_pitch != shape.wo
    ogp = shape.og_padded(mr)
    store = _epilogue(shape, code, "acc[i][v]", "chan", junk)
    guard = f"if (oc0 + i >= {shape.og}) break;" if ogp != shape.og else ""

    def part(i, v):
        return f"part + ((size_t)(mt * {mr} + {i}) * ptile + (g0 - gb) + {v * vl})"

    if passes > 1:
        init = "\n    ".join(f"{accs[i][v]} = first ? ({t}){{0}} : {t}_load({part(i, v)});"
                              for i in range(mr) for v in range(nv))
        save = ("\n    if (!last) {\n        "
                + "\n        ".join(f"memcpy({part(i, v)}, &{accs[i][v]}, sizeof({t}));"
                                    for i in range(mr) for v in range(nv))
                + "\n        return;\n    }")
    else:
        init = "\n    ".join(f"{a} = ({t}){{0}};" for a in flat)
        save = ""
    rows = ", ".join("{" + ", ".join(row) + "}" for row in accs)
    pointer = "unsigned char"
    return f"""
VDLA_INLINE void {name}(const {pointer} *restrict xc, const {code.wt} *restrict wc,
        int nsteps, int g, int oc0, int mt, int g0, int gb, int ge, int first, int last,
        {code.scalar} *restrict part, int ptile, const {code.out} *restrict res,
        {code.out} *restrict y, const unsigned char *restrict params) {{
    (void)mt; (void)gb; (void)first; (void)last; (void)part; (void)ptile; (void)res;
{table_pointers(shape, offsets)}    {t} {", ".join(flat)};
    {init}
    #pragma GCC unroll {s.unroll}
    for (int c = 0; c < nsteps; c++, xc += {step_bytes}, wc += {wstep}) {{
        {(chr(10) + "        ").join(body)}
    }}{save}
    const {t} acc[{mr}][{nv}] = {{{rows}}};
    for (int i = 0; i < {mr}; i++) {{
        {guard}
        const int chan = g * {shape.og} + oc0 + i;
        for (int v = 0; v < {nv}; v++) {{
            const int gv = g0 + v * {vl};
            if (gv >= ge) break;
            {indent(store, 12)}
        }}
    }}
}}
"""


def indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return ("\n" + pad).join(text.splitlines())


def conv_kernel(shape: ConvShape, schedule: ConvSchedule, weights: np.ndarray,
                bias: np.ndarray | None, node: Node, isa: Isa,
                inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of convolution `shape` with `schedule` (checked on `isa`).

    weights : the node's constant weights (OIHW); bias : its constant bias or None
    node : the node (for its requantization attributes)
    inputs : the node's computed inputs (activation, then residual)
    """
    s = schedule.check(shape, isa)
    if shape.depthwise:
        raise ValueError(f"conv_kernel: {shape.describe()} is depthwise; "
                         "vdla.compiler.targets.cpu.depthwise.depthwise_kernel compiles it")
    code = Code(shape, s.vl)
    params = Params()
    w_off = params.add(_pack_weights(shape, np.asarray(weights), s.mr))
    offsets = tables(shape, node, np.asarray(weights), bias, params)
    block = s.nv * s.vl
    plane_rows = shape.plane_rows(block)
    pitch = shape.grid_pitch
    elem_bytes = 4                              # int8: 4 channels; float32: one float
    plane_bytes = align(plane_rows * pitch * elem_bytes, 64)
    nph = len(shape.phases)
    step = shape.ci_step
    cb_per_group = shape.cg_padded // step       # planes (of a phase) per group
    ngc = shape.groups * cb_per_group
    # A float32 1x1 convolution with stride 1 and no padding reads its input in place:
    # its channels are the planes already (the repacking would copy every byte).
    direct = (not shape.int8 and shape.kh == shape.kw == 1 and shape.sh == shape.sw == 1
              and not any((shape.pt, shape.pl, shape.pb, shape.pr)))
    if direct:
        plane_bytes = shape.h * shape.w * 4
    shared = 0 if direct else ngc * nph * plane_bytes
    passes = -(-shape.cg_padded // s.tile_ci)
    ptile = s.tile_h * pitch + block
    thread = s.tile_co * ptile * 4 if passes > 1 else 0
    ct_count = -(-shape.og_padded(s.mr) // s.tile_co)
    rt_count = -(-shape.ho // s.tile_h)
    junk = pitch != shape.wo
    tile = _tile_gemm(shape, s, code, plane_bytes, passes, offsets)
    if direct:
        tile += _tile_gemm(shape, s, code, plane_bytes, passes, offsets,
                           name="NAME_tile_tail", limit=shape.h * shape.w)
    ctt = shape.og_padded(s.mr) // s.mr
    wstride_c = len(shape.taps) * s.mr * (4 if shape.int8 else 1)   # weights per step
    loops = item_loops(s, shape.groups, ct_count, rt_count)
    mt_loop = "for (int mt = 0; mt < mts; mt++)"
    px_loop = f"for (int g0 = gb; g0 < ge; g0 += {block})"
    outer, inner = (mt_loop, px_loop) if s.order == "co" else (px_loop, mt_loop)
    res_decl = (f"const {code.out} *restrict res = (const {code.out} *)in[1];"
                if shape.residual else f"const {code.out} *restrict res = NULL;")
    in_t = "int8_t" if shape.int8 else "float"
    body = f"""
/* {shape.dtype} conv {shape.describe()}; schedule {schedule.to_dict()} */
{_keep_table(shape, s.vl) if junk else ""}{"" if direct else _prep(shape, code, plane_bytes)}{tile}
void NAME{SIGNATURE} {{
    const {in_t} *restrict x = (const {in_t} *)in[0];
    {res_decl}
    {code.out} *restrict y = ({code.out} *)out_;
    const {code.wt} *restrict wp = (const {code.wt} *)(params + {w_off});
    {code.plane} *xq = ({code.plane} *)ws;
    #pragma omp parallel if({0 if s.parallel == "none" else 1}) firstprivate(xq)
    {{
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        {code.scalar} *restrict part = ({code.scalar} *)(ws + {align(shared)} + (size_t)tid * {align(thread)});
        (void)part; (void)tid;
        for (int b = 0; b < {shape.n}; b++) {{
            const {in_t} *xb = x + (size_t)b * {shape.c * shape.h * shape.w};
            {_prep_loop(direct, ngc, plane_rows)}
            {code.out} *yb = y + (size_t)b * {shape.o * shape.ho * shape.wo};
            const {code.out} *rb = res ? res + (size_t)b * {shape.o * shape.ho * shape.wo} : NULL;
            {indent(loops, 12)} {{
                const int gb = rt * {s.tile_h * pitch};
                const int ge = vdla_min((rt + 1) * {s.tile_h}, {shape.ho}) * {pitch};
                const int mts = vdla_min({s.tile_co // s.mr}, {ctt} - ct * {s.tile_co // s.mr});
                for (int cp = 0; cp < {passes}; cp++) {{
                    const int c0 = cp * {s.tile_ci // step};
                    const int nsteps = vdla_min({s.tile_ci // step}, {cb_per_group} - c0);
                    const unsigned char *xc = (const unsigned char *)xq
                        + ((size_t)(g * {cb_per_group} + c0) * {nph}) * {plane_bytes};
                    {outer}
                    {inner} {{
                        const int oct = ct * {s.tile_co // s.mr} + mt;
                        const {code.wt} *wc = wp + ((size_t)(g * {ctt} + oct) * {cb_per_group} + c0)
                                                 * {wstride_c};
                        {_tile_call(direct, block, shape.h * shape.w)}(xc, wc, nsteps, g, oct * {s.mr}, mt, g0, gb, ge, cp == 0,
                                  cp == {passes - 1}, part, {ptile}, rb, yb, params);
                    }}
                }}
            }}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, shared, thread, shape.macs,
                  items=item_count(s, shape.groups, ct_count, rt_count))


def _prep_loop(direct: bool, ngc: int, plane_rows: int) -> str:
    """C: the repacking of image ``xb`` into ``xq`` (shared by the threads), or, for a
    convolution that reads its input in place, ``xq`` pointed at the image."""
    if direct:
        return "xq = (float *)xb;"
    return (f"#pragma omp for collapse(2) schedule(static)\n"
            f"            for (int gc = 0; gc < {ngc}; gc++)\n"
            f"                for (int r = 0; r < {plane_rows}; r++) NAME_prep(xb, xq, gc, r);")


def _tile_call(direct: bool, block: int, size: int) -> str:
    """C: the tile function a block calls (in place: the masked one for the last)."""
    if not direct:
        return "NAME_tile"
    return f"(g0 + {block} > {size} ? NAME_tile_tail : NAME_tile)"


def item_count(s: ConvSchedule, groups: int, cts: int, rts: int) -> int:
    """How many work items `item_loops` shares among the threads (1: none shared)."""
    return {"none": 1, "all": groups * cts * rts, "co": groups * cts, "h": rts}[s.parallel]


def item_loops(s: ConvSchedule, groups: int, cts: int, rts: int) -> str:
    """The work-item loops (g, ct, rt) with the OpenMP pragma the schedule asks for."""
    g = f"for (int g = 0; g < {groups}; g++)"
    ct = f"for (int ct = 0; ct < {cts}; ct++)"
    rt = f"for (int rt = 0; rt < {rts}; rt++)"
    if s.parallel in ("all", "none"):    # "none": the parallel region has one thread
        return f"#pragma omp for collapse(3) schedule(static)\n{g}\n{ct}\n{rt}"
    if s.parallel == "co":
        return f"#pragma omp for collapse(2) schedule(static)\n{g}\n{ct}\n{rt}"
    return f"#pragma omp for schedule(static)\n{rt}\n{g}\n{ct}"
