"""Depthwise convolutions (one input channel per group) compiled to C.

Each output channel reads one input plane; vectors run along an output row's pixels, each
tap's weight broadcast over them (int8: products in int32 lanes). A depthwise layer does
few multiply-adds per output, so the kernel walks output rows (``nv`` vectors at a time,
the row's last one masked): no wider grid to squeeze, each channel's constants loaded
once. The input is repacked like a dense convolution's (`vdla.compiler.targets.cpu.conv`:
padded, split by stride phase), int8 without the channel interleave, but by each work
item for its own rows of its channel, into thread-local scratch that stays in L1: a
shared pass over every plane first cost as much memory traffic as the layer itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.conv import Code, indent
from vdla.compiler.targets.cpu.epilogue import Epilogue, Lanes, Operands, table_pointers, tables
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["depthwise_kernel"]


@dataclasses.dataclass(frozen=True)
class _Scratch:
    """A work item's rows of its channel's phase planes, in thread-local scratch: its
    output rows, the rows the taps reach below them, and slack for the last vector.

    reach : input rows (of a phase plane) the taps reach below a work item's last row
    plane_elems, plane_bytes : one phase plane's size (elements, a multiple of 16; bytes)
    thread : the scratch bytes of one thread (every phase's plane)
    """

    reach: int
    plane_elems: int
    plane_bytes: int
    thread: int

    @classmethod
    def of(cls, shape: ConvShape, schedule: ConvSchedule) -> "_Scratch":
        """The scratch of `shape` under `schedule` (its ``tile_h`` rows, ``nv * vl``
        pixels to a step)."""
        pitch = shape.grid_pitch
        reach = ((shape.kh - 1) * shape.dh) // shape.sh
        local_rows = schedule.tile_h + reach
        block = schedule.nv * schedule.vl
        plane_elems = -(-(local_rows * pitch + block + pitch) // 16) * 16
        plane_bytes = plane_elems * (1 if shape.int8 else 4)
        return cls(reach, plane_elems, plane_bytes, len(shape.phases) * plane_bytes)


def depthwise_kernel(shape: ConvShape, schedule: ConvSchedule, weights, bias, node: Node,
                     inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of depthwise convolution `shape` (``shape.depthwise``) with
    `schedule` (checked by the caller); arguments as `conv_kernel`'s."""
    s = schedule
    code = Code(shape, s.vl)
    params = Params()
    w = np.asarray(weights).reshape(shape.o, shape.kh * shape.kw)
    w_off = params.add(w.astype(np.int32) if shape.int8 else w.astype(np.float32))
    plain = dataclasses.replace(shape, offset=False)
    offsets = tables(plain, node, w, bias, params)
    scratch = _Scratch.of(shape, s)
    body = "\n".join([
        f"\n/* {shape.dtype} depthwise conv {shape.describe()}; schedule {s.to_dict()} */",
        _load_function(shape, scratch), _rows_function(shape, s, code, offsets, scratch),
        _entry_function(shape, s, code, w_off, scratch)])
    rts = -(-shape.ho // s.tile_h)
    items = 1 if s.parallel == "none" else rts if s.parallel == "h" else shape.groups * rts
    return Kernel(body, params.blob(), inputs, 0, scratch.thread, shape.macs, items=items)


def _load_function(shape: ConvShape, scratch: _Scratch) -> str:
    """C of ``NAME_load``: a work item's rows of its input channel's phase planes into
    its scratch (`_load_rows`)."""
    el = "int8_t" if shape.int8 else "float"
    return f"""\
/* Rows [r0, r0 + nrows) of input channel gc's phase planes into lp, padded. */
static void NAME_load(const {el} *restrict xb, {el} *restrict lp, int gc, int r0, int nrows) {{
{_load_rows(shape, scratch.plane_elems)}
}}
"""


def _rows_function(shape: ConvShape, s: ConvSchedule, code: Code, offsets,
                   scratch: _Scratch) -> str:
    """C of ``NAME_rows``: output rows [r0, r1) of channel `chan` from the loaded planes
    `xc`, ``nv`` vectors of a row at a time (the row's last one masked), each tap's
    weight broadcast; `offsets` are the epilogue tables' (`epilogue.tables`)."""
    vl, nv, t = s.vl, s.nv, code.acc
    block, pitch, plane_bytes = nv * vl, shape.grid_pitch, scratch.plane_bytes
    wt = "int32_t" if shape.int8 else "float"
    el = "int8_t" if shape.int8 else "float"
    steps = []
    for k, (p, off) in enumerate(shape.taps):
        base = f"(const {el} *)(xc + {p * plane_bytes}) + row + {off} + v * {vl}"
        load = f"{t}_from_s8({base})" if shape.int8 else f"{t}_load({base})"
        steps.append(f"acc[v] += {load} * w{k};" if shape.int8
                     else f"acc[v] = {t}_fma({load}, {t}_bcast(w{k}), acc[v]);")
    weights_c = " ".join(f"const {wt} w{k} = wc[{k}];" for k in range(len(shape.taps)))
    consts, finish = _epilogue(shape, vl, t)
    return f"""\
static void NAME_rows(const unsigned char *restrict xc, const {wt} *restrict wc, int chan,
        int r0, int r1, const {code.out} *restrict res, {code.out} *restrict y,
        const unsigned char *restrict params) {{
    (void)res;
{table_pointers(shape, offsets)}    {consts}
    {weights_c}
    for (int r = r0; r < r1; r++) {{
        for (int c0 = 0; c0 < {shape.wo}; c0 += {block}) {{
            const int row = (r - r0) * {pitch} + c0;
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
"""


def _epilogue(shape: ConvShape, vl: int, t: str) -> tuple[str, list[str]]:
    """C of the output step: the channel's constants (once per call of ``NAME_rows``),
    and the statements that finish accumulator ``acc[v]`` (`epilogue`, its constants
    those scalars) and store its `n` pixels at ``y + out``. `t` is the accumulator's
    vector type, `vl` its lanes."""
    ep = Epilogue.of(shape, vl, ("rq", "rq"))
    if shape.int8:
        consts = ("const uint32_t bv = (uint32_t)bias[chan]; const int32_t m = mul[chan], "
                  "sh = shf[chan];" + (" const int32_t rm = rmul[chan], rs = rshf[chan];"
                                        if shape.residual else "")
                  + f" const {t} lo = {t}_bcast(lim[0]), hi = {t}_bcast(lim[1]);")
    else:
        consts = (f"const float bv = bias[chan]; const {t} lo = {t}_bcast(lim[0]), "
                  f"hi = {t}_bcast(lim[1]); (void)lo; (void)hi;")
    ops = Operands(bias="bv", lo="lo", hi="hi", mul="m", shf="sh", rmul="rm", rshf="rs")
    return consts, ep.statements("acc[v]", ops, "y + out", res="res + out",
                                 lanes=Lanes("first", "n"))


def _entry_function(shape: ConvShape, s: ConvSchedule, code: Code, w_off: int,
                    scratch: _Scratch) -> str:
    """C of the kernel's function ``NAME``: OpenMP shares the work items (a channel's
    rows, ``tile_h`` at a time) of each image; each loads its rows into its thread's
    scratch, then computes every output channel of that input channel. `w_off` is the
    weights' offset in the params."""
    wt = "int32_t" if shape.int8 else "float"
    el = "int8_t" if shape.int8 else "float"
    res_decl = (f"const {code.out} *restrict res = (const {code.out} *)in[1];"
                if shape.residual else f"const {code.out} *restrict res = NULL;")
    rt = f"for (int rt = 0; rt < {-(-shape.ho // s.tile_h)}; rt++)"
    gl = f"for (int g = 0; g < {shape.groups}; g++)"
    loops = (f"#pragma omp for collapse(2) schedule(static)\n{gl}\n{rt}"
             if s.parallel != "h" else f"#pragma omp for schedule(static)\n{rt}\n{gl}")
    return f"""\
void NAME{SIGNATURE} {{
    const {el} *restrict x = (const {el} *)in[0];
    {res_decl}
    {code.out} *restrict y = ({code.out} *)out_;
    const {wt} *restrict wp = (const {wt} *)(params + {w_off});
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    {{
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    {el} *restrict lp = ({el} *)(ws + (size_t)tid * {align(scratch.thread)});
    for (int b = 0; b < {shape.n}; b++) {{
        const {el} *xb = x + (size_t)b * {shape.c * shape.h * shape.w};
        {code.out} *yb = y + (size_t)b * {shape.o * shape.ho * shape.wo};
        const {code.out} *rb = res ? res + (size_t)b * {shape.o * shape.ho * shape.wo} : NULL;
        {indent(loops, 8)} {{
            const unsigned char *xc = (const unsigned char *)lp;
            const int r0 = rt * {s.tile_h}, r1 = vdla_min(r0 + {s.tile_h}, {shape.ho});
            NAME_load(xb, lp, g, r0, r1 - r0 + {scratch.reach});
            for (int m = 0; m < {shape.og}; m++) {{
                const int chan = g * {shape.og} + m;
                NAME_rows(xc, wp + (size_t)chan * {len(shape.taps)}, chan, r0, r1, rb, yb,
                          params);
            }}
        }}
    }}
    }}
}}
"""


def _load_rows(shape: ConvShape, plane_elems: int) -> str:
    """C statements of ``NAME_load``: each used phase's rows, then zero slack."""
    pitch = shape.grid_pitch
    fn = "vdla_packb" if shape.int8 else "vdla_packf"
    el = "int8_t" if shape.int8 else "float"
    lines = []
    for p, (ph, pw) in enumerate(shape.phases):
        lines.append(f"""    for (int q = 0; q < nrows; q++) {{   /* phase ({ph}, {pw}) */
        const int r = r0 + q, ih = r * {shape.sh} + {ph - shape.pt};
        const {el} *src = (r < {shape.hq} && ih >= 0 && ih < {shape.h})
            ? xb + ((size_t)gc * {shape.h} + ih) * {shape.w} : NULL;
        {fn}(lp + {p * plane_elems} + (size_t)q * {pitch}, src, {pitch}, {shape.w}, {shape.sw},
             {pw - shape.pl});
    }}
    memset(lp + {p * plane_elems} + (size_t)nrows * {pitch}, 0,
           sizeof({el}) * (size_t)({plane_elems} - nrows * {pitch}));""")
    return "\n".join(lines)
