"""Convolutions on blocked layouts (``NCHW{c}c``, `vdla.compiler.targets.cpu.layout`),
with vectors along output channels: a schedule with ``layout="nchwc"`` picks them.

    kernel = blocked_kernel(shape, schedule, weights, bias, node, isa, inputs)

The input, the residual and the output are blocked with ``c = vl`` (the schedule's
vector width), so a vector is one pixel's ``vl`` channels of a channel block. A float32
layer with fewer than 8 input channels (a model's RGB input) reads its plain input
instead, each channel a block of one (`schedule.input_block`).

One-group layers: the register tile is ``mr`` output pixels of one row by ``nv``
vectors of output channels; each step of the reduction loads ``nv`` weight vectors and
broadcasts one input value per pixel (int8: one 32-bit word, four consecutive channels,
which ``vpdpbusd`` multiplies with four channels of each output lane). Depthwise layers
(one output per channel): ``mr`` pixels by one channel block, each tap one weight
vector times one input vector per pixel (int8: widened to int32 lanes).

The input is read where it is: no repacking, no padded copy. Padding is handled by
bounds: an output row's kernel rows are clipped to the image once per row (``ky0``,
``ky1``), and the row is cut in tiles from column 0; a tile whose taps all read inside
the image runs the shared tile function, and the one or two tiles at the row's ends get
functions of their own with the taps that would read padding left out of the text (the
shape is known when the C is written, so no test runs in the loops).

int8 one-group layers: the broadcast bytes are the unsigned operand of ``vpdpbusd``
(AVX2: ``vpmaddubsw``, exact for inputs in [0, 127]). An input known non-negative (its
producer's ``out_min`` >= 0, as after a ReLU) is read as it is. An input that may be
negative is read as ``x + 128`` (each broadcast word XOR 0x80808080; AVX2: the
nibble-split dot product, exact for any byte), and the bias takes away ``128 * sum(w)``
over the taps that read inside the image: the sum over every tap, plus a correction
for the output rows and columns whose taps reach into the padding, from a table of
(row class, column class) per channel (`_offset_tables`; a 3x3 layer has at most three
classes of each). The epilogue is the plain kernels' arithmetic on whole
vectors (`vdla.compiler.targets.cpu.epilogue`): bias, requantization per channel,
residual, clamp; float32: bias, residual, activation. Padded output channels come out
as the epilogue of zero sums, finite, and every consumer's weights for them are zero.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.conv import indent, item_count
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Operands, requantizers,
                                               table_pointers, tables)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.layout import PLAIN
from vdla.compiler.targets.cpu.schedule import ConvSchedule, flattens, input_block
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["blocked_kernel", "keeps_rows", "vector_epilogue"]


def _blocks(total: int, size: int) -> int:
    return -(-total // size)


def vector_epilogue(shape: ConvShape, vl: int, acc: str, chan: str, at: str,
                    rq: tuple[str, str] = ("rqv", "rqv")) -> list[str]:
    """C statements that finish vector `acc` of channels [`chan`, `chan` + vl) and store
    it at element offset `at` of ``y`` (the residual at the same offset of ``res``): the
    blocked layout's epilogue (`vdla.compiler.targets.cpu.epilogue`), its constants one
    channel per lane. `rq`: the int8 output's and residual's requantizers."""
    ep = Epilogue.of(shape, vl, rq)
    return ep.statements(acc, Operands.lanes(ep, chan), f"y + {at}", res=f"res + {at}")


# --- dense convolutions -----------------------------------------------------------------------

def _pack_weights(shape: ConvShape, w: np.ndarray, vl: int, nv: int, ib: int) -> np.ndarray:
    """``[channel tile of nv * vl][input block][kh][kw][step of the block][nv * vl][k]``,
    input blocks of `ib` channels, k = 4 input channels (int8) or 1 (float32); padded
    channels are zero."""
    k = 4 if shape.int8 else 1
    width = nv * vl
    op, cp = _blocks(shape.o, width) * width, _blocks(shape.c, ib) * ib
    wp = np.zeros((op, cp, shape.kh, shape.kw), w.dtype)
    wp[:shape.o, :shape.c] = w
    wp = wp.reshape(op // width, width, cp // ib, ib // k, k, shape.kh, shape.kw)
    return np.ascontiguousarray(wp.transpose(0, 2, 5, 6, 3, 1, 4))


def _tile(shape: ConvShape, s: ConvSchedule, mr: int, pointers: str,
          start: int | None = None, offset: "_Offset | None" = None,
          rq: tuple[str, str] = ("rqv", "rqv")) -> str:
    """C of one register tile: `mr` pixels from output column ``ox`` of row ``oy`` by
    ``nv`` channel vectors from block ``cb``, over every input channel and tap, then
    the epilogue (`pointers`: its tables, `epilogue.table_pointers`). With `start`, the
    tile sits at output column `start` and reaches into the padding: the taps that read
    outside the image's columns are left out of its text (known when the C is written).
    `offset`: an int8 input that may be negative (`_offset_tables`); `rq`: the
    requantizers (`epilogue.requantizers`)."""
    vl, nv = s.vl, s.nv
    int8 = shape.int8
    t = f"vi{vl}" if int8 else f"vf{vl}"
    k = 4 if int8 else 1
    ib = input_block(shape, vl)
    steps, width = ib // k, nv * vl
    el = "uint8_t" if int8 else "float"
    wt = "int8_t" if int8 else "float"
    accs = [[f"a{j}_{v}" for v in range(nv)] for j in range(mr)]
    flat = [a for row in accs for a in row]

    def inside(j: int, kx: int) -> bool:
        if start is None:
            return True
        ix = (start + j) * shape.sw - shape.pl + kx * shape.dw
        return 0 <= ix < shape.w

    def step(kx: int) -> list[str]:
        """The statements of one reduction step of tap column `kx`."""
        pixels = [j for j in range(mr) if inside(j, kx)]
        if not pixels:
            return []
        lines = [f"const {t} w{v} = {t}_load(wk + ((size_t){kx * steps} + q) * "
                 f"{width * k} + {v * vl * k});" for v in range(nv)]
        for j in pixels:
            at = f"xk + ((size_t){(j * shape.sw + kx * shape.dw) * ib} + q * {k})"
            if int8:
                flip = " b ^= (int32_t)0x80808080u;" if shape.offset else ""
                dot = f"{t}_dot4vv_any" if shape.offset else f"{t}_dot4vv"
                lines.append(f"{{ int32_t b; memcpy(&b, {at}, 4);{flip} const {t} bv = "
                             f"{t}_bcast(b); "
                             + " ".join(f"{accs[j][v]} = {dot}({accs[j][v]}, bv, w{v});"
                                        for v in range(nv)) + " }")
            elif nv > 1:
                # Each multiply-add reads the input itself, as a folded broadcast
                # (`vf*_fma_bcast`, vdla_cpu.h): a shared broadcast register cost a slot
                # on the multiply-add pipes.
                lines.append(" ".join(f"{t}_fma_bcast({accs[j][v]}, w{v}, {at});"
                                      for v in range(nv)))
            else:
                lines.append(f"{{ const {t} bv = {t}_bcast(*({at})); "
                             f"{accs[j][0]} = {t}_fma(w0, bv, {accs[j][0]}); }}")
        return lines

    taps = "\n            ".join(
        f"""#pragma GCC unroll {s.unroll}
            for (int q = 0; q < {steps}; q++) {{
                {indent(chr(10).join(lines), 16)}
            }}""" for lines in (step(kx) for kx in range(shape.kw)) if lines)
    stores = []
    for j in range(mr):
        for v in range(nv):
            at = f"(((size_t)(cb + {v}) * {shape.ho} + oy) * {shape.wo} + ox + {j}) * {vl}"
            body = vector_epilogue(shape, vl, accs[j][v], f"(cb + {v}) * {vl}", at, rq)
            if offset is not None:
                cc = offset.full_column if start is None else offset.column_class(start + j)
                body.insert(0, f"{accs[j][v]} = ({t})((vu{vl}){accs[j][v]} + (vu{vl}){t}_load("
                               f"cr + {cc * offset.padded} + (cb + {v}) * {vl}));")
            guard = f"if (cb + {v} < {_blocks(shape.o, vl)}) " if v else ""
            stores.append(guard + "{ " + " ".join(body) + " }")
    name = f"NAME_tile{mr}" if start is None else f"NAME_at{start}"
    fixed = "" if start is None else f"    const int ox = {start};\n"
    ox_arg = "int ox, " if start is None else ""
    cbi = _blocks(shape.c, ib)
    out_t = "int8_t" if int8 else "float"
    return f"""
VDLA_INLINE void {name}(const {el} *restrict x, const {wt} *restrict wc, int oy, {ox_arg}
        int cb, int ky0, int ky1, const {out_t} *restrict res, {out_t} *restrict y,
        const unsigned char *restrict params) {{
    (void)res;
{fixed}{pointers}{"" if offset is None else offset.pointers}    {t} {", ".join(flat)};
    {" ".join(f"{a} = ({t}){{0}};" for a in flat)}
    const int iy0 = oy * {shape.sh} - {shape.pt}, ix0 = ox * {shape.sw} - {shape.pl};
    for (int c = 0; c < {cbi}; c++) {{
        for (int ky = ky0; ky < ky1; ky++) {{
            const {el} *xk = x + (((size_t)c * {shape.h} + iy0 + ky * {shape.dh}) * {shape.w}
                                  + ix0) * {ib};
            const {wt} *wk = wc + ((size_t)c * {shape.kh} + ky) * {shape.kw * steps * width * k};
            (void)xk; (void)wk;
            {taps}
        }}
    }}
    {(chr(10) + "    ").join(stores)}
}}
"""


@dataclasses.dataclass(frozen=True)
class _Offset:
    """An int8 input read as ``x + 128`` (`_offset_tables`): the C that points ``cr`` at
    the output row's corrections, the channels each class's row of the table holds, the
    column class of each output column, and the class of columns whose taps all read
    inside the image."""

    pointers: str
    padded: int
    columns: tuple[int, ...]
    full_column: int

    def column_class(self, ox: int) -> int:
        return self.columns[ox]


def _inside(first: int, stride: int, dil: int, pad: int, size: int, k: int,
            out: int) -> list[tuple[int, int]]:
    """Per output position, the taps [k0, k1) that read inside an input of `size`."""
    spans = []
    for o in range(out):
        taps = [t for t in range(k) if 0 <= o * stride - pad + t * dil < size]
        spans.append((taps[0], taps[-1] + 1) if taps else (0, 0))
    return spans


def _offset_tables(shape: ConvShape, w: np.ndarray, params: Params,
                   padded: int) -> tuple[_Offset, str]:
    """The corrections of an int8 layer whose input is read as ``x + 128``: the bias
    (`epilogue.tables`) takes away ``128 * sum(w)`` over every tap; an output whose
    taps are clipped at the image's edges gets ``128 * sum(w)`` of the clipped taps back.
    Returns the `_Offset` and the C of the row-class table ``NAME_rc``."""
    rows = _inside(0, shape.sh, shape.dh, shape.pt, shape.h, shape.kh, shape.ho)
    cols = _inside(0, shape.sw, shape.dw, shape.pl, shape.w, shape.kw, shape.wo)
    row_kinds, col_kinds = sorted(set(rows)), sorted(set(cols))
    full = (0, shape.kw)
    if full not in col_kinds:
        col_kinds.append(full)
    per_tap = w.reshape(shape.o, shape.c, shape.kh, shape.kw).astype(np.int64).sum(axis=1)
    total = per_tap.sum(axis=(1, 2))
    table = np.zeros((len(row_kinds), len(col_kinds), padded), np.int64)
    for r, (a, b) in enumerate(row_kinds):
        for c, (x0, x1) in enumerate(col_kinds):
            table[r, c, :shape.o] = 128 * (total - per_tap[:, a:b, x0:x1].sum(axis=(1, 2)))
    # Two's complement wrap, as the sums' arithmetic (`epilogue.tables`' bias).
    wrapped = ((table + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)
    off = params.add(wrapped)
    classes = ", ".join(str(row_kinds.index(r)) for r in rows)
    pointers = (f"    const int32_t *restrict cr = (const int32_t *)(params + {off})\n"
                f"        + (size_t)NAME_rc[oy] * {len(col_kinds) * padded};\n")
    offset = _Offset(pointers, padded, tuple(col_kinds.index(c) for c in cols),
                     col_kinds.index(full))
    return offset, f"static const unsigned char NAME_rc[{shape.ho}] = {{{classes}}};\n"


def _tap_rows(shape: ConvShape) -> str:
    """C: ``ky0``, ``ky1``, the kernel rows whose taps read inside the image for output
    row ``oy`` (the rest read padding)."""
    first = f"({shape.pt} - oy * {shape.sh} + {shape.dh - 1}) / {shape.dh}"
    last = f"({shape.h - 1 + shape.pt} - oy * {shape.sh}) / {shape.dh} + 1"
    return (f"const int ky0 = vdla_max(0, {first});\n"
            f"const int ky1 = vdla_min({shape.kh}, {last});")


def _row(shape: ConvShape, s: ConvSchedule, make) -> tuple[str, str]:
    """The tile functions of one output row and the C that calls them: the row cut in
    tiles of ``mr`` pixels from column 0; tiles with every tap inside the image share one
    function (a loop over a run of them), the others get one each. ``make(size, start)``
    writes a tile function (`_tile`, `_depthwise_tile`; `start` None: every tap inside)."""
    mr = s.mr
    functions, calls = {}, []
    run: list[int] = []

    def flush():
        if run:
            calls.append(f"for (int ox = {run[0]}; ox <= {run[-1]}; ox += {mr}) "
                         f"NAME_tile{mr}(xb, wc, oy, ox, cb, ky0, ky1, rb, yb, params);")
            run.clear()

    for start in range(0, shape.wo, mr):
        size = min(mr, shape.wo - start)
        inside = all(0 <= (start + j) * shape.sw - shape.pl + kx * shape.dw < shape.w
                     for j in range(size) for kx in range(shape.kw))
        if inside and size == mr:
            functions.setdefault(f"tile{mr}", lambda: make(mr, None))
            run.append(start)
            continue
        flush()
        if inside:
            functions.setdefault(f"tile{size}", lambda size=size: make(size, None))
            calls.append(f"NAME_tile{size}(xb, wc, oy, {start}, cb, ky0, ky1, rb, yb, params);")
        else:
            functions[f"at{start}"] = lambda start=start, size=size: make(size, start)
            calls.append(f"NAME_at{start}(xb, wc, oy, cb, ky0, ky1, rb, yb, params);")
    flush()
    return "".join(f() for f in functions.values()), "\n".join(calls)


#: A 1x1 layer whose rows waste more than this share of its register tiles' pixels
#: (AVX2's 6-pixel tiles: a 14-pixel row is 6 + 6 + 2, 18 pixel slots for 14; a 7-pixel
#: row 6 + 1) is cut in rows of the width that wastes least (`_row_width`).
_ROW_WASTE = 1 / 8


def _tiles(plane: int, width: int, mr: int) -> int:
    """Register tiles that cover `plane` pixels cut in rows of `width`, `mr` a tile."""
    return plane // width * -(-width // mr)


def _row_width(shape: ConvShape, mr: int, row_tiles: int = 1) -> int:
    """The row width a flattened 1x1 plane is cut in: a divisor of the plane's size of
    at least `mr` pixels (the whole plane when none is) with the fewest register tiles,
    the smallest such, among those that leave at least `row_tiles` rows (the schedule's
    row tiles, which give a large team its work items) where any does; the image's own
    width where that wastes at most `_ROW_WASTE` more pixel slots (the layer then keeps
    its rows, and a fused kernel may take it)."""
    plane = shape.h * shape.w
    widths = [d for d in range(mr, plane + 1) if plane % d == 0] or [plane]
    widths = [d for d in widths if plane // d >= row_tiles] or widths
    best = min(widths, key=lambda d: (_tiles(plane, d, mr), d))
    if shape.w >= mr and (_tiles(plane, shape.w, mr) * mr
                          <= (1 + _ROW_WASTE) * _tiles(plane, best, mr) * mr):
        return shape.w
    return best


def _flattened(shape: ConvShape, s: ConvSchedule) -> tuple[ConvShape, ConvSchedule]:
    """A 1x1 layer with stride 1 and no padding reads input pixel p for output pixel p,
    and the blocked layout keeps a channel block's pixels in one run: its plane can be
    cut in rows of any width (`_row_width`). A narrow plane's tile then reaches over the
    image's rows (a 7x7 plane's tile holds 28 pixels where a row holds 7, four times the
    multiply-adds per weight vector loaded), and a row the tile does not divide stops
    wasting its last tile (AVX2's 6-pixel tiles on 14x14 and 7x7 planes). ``tile_h``
    keeps its share of the plane. Other layers are returned as they are."""
    if not flattens(shape):
        return shape, s
    width = _row_width(shape, s.mr, -(-shape.h // s.tile_h))
    if width == shape.w:
        return shape, s
    plane = shape.h * shape.w
    rows = plane // width
    tile_h = min(rows, max(1, -(-s.tile_h * rows // shape.h)))
    return (dataclasses.replace(shape, h=rows, w=width),
            dataclasses.replace(s, tile_h=tile_h))


def keeps_rows(shape: ConvShape, s: ConvSchedule) -> bool:
    """Whether the kernel of `shape` with `s` computes the layer's own output rows
    (`_flattened` cuts a narrow 1x1 plane in rows of other widths)."""
    return _flattened(shape, s)[0] is shape


def blocked_kernel(shape: ConvShape, schedule: ConvSchedule, weights: np.ndarray,
                   bias: np.ndarray | None, node: Node, isa: Isa,
                   inputs: tuple[str, ...], *, band: bool = False) -> Kernel:
    """The `Kernel` of convolution `shape` (one group) with `schedule` (``layout=
    "nchwc"``, checked on `isa`); arguments as `conv.conv_kernel`'s. Its input, residual
    and output are blocked by ``schedule.vl``. With `band`, its C is a band of rows for a
    fused kernel (`_entry`), not a function of its own."""
    s = schedule.check(shape, isa)
    if shape.depthwise:
        return _depthwise_kernel(shape, s, weights, bias, node, inputs, band)
    if shape.groups != 1:
        raise ValueError(f"blocked_kernel: {shape.describe()} has {shape.groups} groups; "
                         "it computes one-group and depthwise convolutions")
    shape, s = _flattened(shape, s)
    vl, nv = s.vl, s.nv
    width = nv * vl
    params = Params()
    ib = input_block(shape, vl)
    w_off = params.add(_pack_weights(shape, np.asarray(weights), vl, nv, ib))
    cbo = _blocks(shape.o, vl)
    offsets = tables(shape, node, np.asarray(weights), bias, params,
                     _blocks(shape.o, width) * width)
    pointers = table_pointers(shape, offsets)
    offset, rc_table = None, ""
    if shape.int8 and shape.offset:
        offset, rc_table = _offset_tables(shape, np.asarray(weights), params,
                                          _blocks(shape.o, width) * width)
    rq = requantizers(shape, node)
    tiles, calls = _row(shape, s, lambda size, start: _tile(shape, s, size, pointers, start,
                                                            offset, rq))
    tiles = rc_table + tiles
    k = 4 if shape.int8 else 1
    wstride = _blocks(shape.c, ib) * shape.kh * shape.kw * (ib // k) * width * k
    el = "uint8_t" if shape.int8 else "float"
    out_t = "int8_t" if shape.int8 else "float"
    wt = "int8_t" if shape.int8 else "float"
    cts = _blocks(cbo, s.tile_co // vl)           # channel tiles (work items)
    rts = _blocks(shape.ho, s.tile_h)
    per_ct = s.tile_co // width                   # register tiles per channel tile
    in_size = _blocks(shape.c, ib) * shape.h * shape.w * ib
    out_size = cbo * shape.ho * shape.wo * vl
    step = f"""const int cb = (ct * {per_ct} + mt) * {nv};
if (cb >= {cbo}) continue;
const {wt} *wc = wp + (size_t)(cb / {nv}) * {wstride};
{_prefetch(s, wstride * (1 if shape.int8 else 4))}
{_tap_rows(shape)}
{calls}"""
    body = _entry(f"{shape.dtype} conv {shape.describe()}, NCHW{vl}c; schedule "
                  f"{schedule.to_dict()}", s, tiles, (el, out_t, wt), w_off, shape.n,
                  shape.ho, (in_size, out_size), (cts, rts, per_ct), shape.residual, step,
                  band)
    reads = (vl if ib == vl else PLAIN,) + (vl,) * (len(inputs) - 1)
    return Kernel(body, params.blob(), inputs, 0, 0, shape.macs, in_blocks=reads,
                  out_block=vl, items=item_count(s, 1, cts, rts))


def _entry(title: str, s: ConvSchedule, tiles: str, types: tuple[str, str, str], w_off: int,
           images: int, rows: int, sizes: tuple[int, int], items: tuple[int, int, int],
           residual: bool, step: str, band: bool = False) -> str:
    """C of a blocked kernel's function ``NAME`` after its tile functions `tiles`: per
    image, OpenMP shares the work items (channel tiles by row tiles: `items` is their
    counts and the register tiles per channel tile); each runs `step` (C that sets ``cb``
    and ``wc`` and calls the row's tiles) for its register tiles and rows in the
    schedule's order. `types`: input, output and weight C types; `rows`: the output's;
    `sizes`: an image's input and output elements. With `band`, ``NAME`` is instead a
    part of a fused kernel (`vdla.compiler.targets.cpu.fusion`): every channel tile of
    output rows ``oy0`` to ``oy1`` of image ``b``, on the calling thread."""
    el, out_t, wt = types
    cts, rts, per_ct = items
    res_decl = (f"const {out_t} *restrict res = (const {out_t} *)in[1];" if residual
                else f"const {out_t} *restrict res = NULL;")
    mt = f"for (int mt = 0; mt < {per_ct}; mt++)"
    ry = "for (int oy = oy0; oy < oy1; oy++)"
    outer, inner_loop = (mt, ry) if s.order == "co" else (ry, mt)
    if band:
        return f"""
/* {title}: rows oy0 to oy1 of image b */
{tiles}
VDLA_INLINE void NAME(const {el} *restrict x, const {out_t} *restrict res,
        {out_t} *restrict y, const unsigned char *restrict params, int b, int oy0, int oy1) {{
    const {wt} *restrict wp = (const {wt} *)(params + {w_off});
    const {el} *xb = x + (size_t)b * {sizes[0]};
    {out_t} *yb = y + (size_t)b * {sizes[1]};
    const {out_t} *rb = res ? res + (size_t)b * {sizes[1]} : NULL;
    for (int ct = 0; ct < {cts}; ct++) {{
        {outer}
        {inner_loop} {{
            {indent(step, 12)}
        }}
    }}
}}
"""
    return f"""
/* {title} */
{tiles}
void NAME{SIGNATURE} {{
    const {el} *restrict x = (const {el} *)in[0];
    {res_decl}
    {out_t} *restrict y = ({out_t} *)out_;
    const {wt} *restrict wp = (const {wt} *)(params + {w_off});
    (void)ws;
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    for (int b = 0; b < {images}; b++) {{
        const {el} *xb = x + (size_t)b * {sizes[0]};
        {out_t} *yb = y + (size_t)b * {sizes[1]};
        const {out_t} *rb = res ? res + (size_t)b * {sizes[1]} : NULL;
        {indent(_item_loops(s, cts, rts), 8)} {{
            const int oy0 = rt * {s.tile_h}, oy1 = vdla_min(oy0 + {s.tile_h}, {rows});
            {outer}
            {inner_loop} {{
                {indent(step, 16)}
            }}
        }}
    }}
}}
"""


#: Weight bytes of a register tile from which the kernel prefetches the next tile's.
_PREFETCH_MIN = 32 * 1024


def _prefetch(s: ConvSchedule, tile_bytes: int) -> str:
    """C: the next register tile's weights prefetched into L2 at every output row of
    this tile, so that they stream in while this tile computes its rows. The first row
    of the next tile would otherwise wait on them: a tile of a whole 7-pixel row does 7
    multiply-adds per weight vector, about 27 GB/s per core at one vector multiply-add
    per cycle, far more than a shared host's memory gives (ResNet-18's 7x7 float layers
    ran at 175 GOP/s with their weights evicted, against 230 on the layers before; with
    the prefetch 1.1-1.2x faster). Once per tile, or a share per row, was slower (1.15x
    and 1.17x): a burst of thousands of prefetches outruns the core's queue, which drops
    the rest, while asking again each row costs a few percent of the row's
    instructions and on no pipe the multiply-adds use. Only with channel tiles outside the
    rows (``order="co"``) and tiles of at least `_PREFETCH_MIN` bytes."""
    if s.order != "co" or tile_bytes < _PREFETCH_MIN:
        return ""
    return (f"{{   /* the next tile's weights */\n"
            f"    const char *next = (const char *)wc + {tile_bytes};\n"
            f"    for (int o = 0; o < {tile_bytes}; o += 64) __builtin_prefetch(next + o, 0, 2);\n"
            f"}}")


def _item_loops(s: ConvSchedule, cts: int, rts: int) -> str:
    ct = f"for (int ct = 0; ct < {cts}; ct++)"
    rt = f"for (int rt = 0; rt < {rts}; rt++)"
    if s.parallel in ("all", "none"):
        return f"#pragma omp for collapse(2) schedule(static)\n{ct}\n{rt}"
    if s.parallel == "co":
        return f"#pragma omp for schedule(static)\n{ct}\n{rt}"
    return f"#pragma omp for schedule(static)\n{rt}\n{ct}"


# --- depthwise convolutions -------------------------------------------------------------------

def _depthwise_tile(shape: ConvShape, s: ConvSchedule, mr: int, pointers: str,
                    rq: tuple[str, str], start: int | None = None) -> str:
    """C of a depthwise register tile: `mr` pixels from output column ``ox`` of row
    ``oy``, one channel block ``cb``: per tap, one weight vector (a tap's weight of
    each of the block's channels) and one input vector per pixel (int8: widened to
    int32 lanes). `start` and `rq` as in `_tile`."""
    vl, int8 = s.vl, shape.int8
    t = f"vi{vl}" if int8 else f"vf{vl}"
    el = "int8_t" if int8 else "float"
    wt = "int32_t" if int8 else "float"
    accs = [f"a{j}" for j in range(mr)]
    lines = []
    for kx in range(shape.kw):
        pixels = [j for j in range(mr)
                  if start is None or 0 <= (start + j) * shape.sw - shape.pl + kx * shape.dw
                  < shape.w]
        if not pixels:
            continue
        lines.append(f"{{ const {t} w = {t}_load(wk + {kx * vl}); "
                     + " ".join(
                         f"{accs[j]} += "
                         + (f"{t}_from_s8(xk + {(j * shape.sw + kx * shape.dw) * vl})" if int8
                            else f"{t}_load(xk + {(j * shape.sw + kx * shape.dw) * vl})")
                         + " * w;" for j in pixels) + " }")
    stores = []
    for j in range(mr):
        at = f"(((size_t)cb * {shape.ho} + oy) * {shape.wo} + ox + {j}) * {vl}"
        stores.append("{ " + " ".join(vector_epilogue(shape, vl, accs[j], f"cb * {vl}", at,
                                                      rq)) + " }")
    name = f"NAME_tile{mr}" if start is None else f"NAME_at{start}"
    fixed = "" if start is None else f"    const int ox = {start};\n"
    ox_arg = "int ox, " if start is None else ""
    return f"""
VDLA_INLINE void {name}(const {el} *restrict x, const {wt} *restrict wc, int oy, {ox_arg}
        int cb, int ky0, int ky1, const {el} *restrict res, {el} *restrict y,
        const unsigned char *restrict params) {{
    (void)res;
{fixed}{pointers}    {t} {", ".join(accs)};
    {" ".join(f"{a} = ({t}){{0}};" for a in accs)}
    const int iy0 = oy * {shape.sh} - {shape.pt}, ix0 = ox * {shape.sw} - {shape.pl};
    for (int ky = ky0; ky < ky1; ky++) {{
        const {el} *xk = x + (((size_t)cb * {shape.h} + iy0 + ky * {shape.dh}) * {shape.w}
                              + ix0) * {vl};
        const {wt} *wk = wc + (size_t)ky * {shape.kw * vl};
        (void)xk; (void)wk;
        {(chr(10) + "        ").join(lines)}
    }}
    {(chr(10) + "    ").join(stores)}
}}
"""


def _depthwise_kernel(shape: ConvShape, s: ConvSchedule, weights, bias, node: Node,
                      inputs: tuple[str, ...], band: bool = False) -> Kernel:
    """`blocked_kernel` of a depthwise convolution (one channel per group, one output
    per channel): work items are channel blocks by row tiles (``tile_co`` channels,
    ``tile_h`` rows); weights packed ``[block][kh][kw][vl]``."""
    vl = s.vl
    cbo = _blocks(shape.o, vl)
    w = np.zeros((cbo * vl, shape.kh, shape.kw), np.int32 if shape.int8 else np.float32)
    w[:shape.o] = np.asarray(weights).reshape(shape.o, shape.kh, shape.kw)
    params = Params()
    w_off = params.add(np.ascontiguousarray(w.reshape(cbo, vl, shape.kh, shape.kw)
                                            .transpose(0, 2, 3, 1)))
    # The input is read as signed bytes: no offset for the bias to absorb.
    plain = dataclasses.replace(shape, offset=False)
    offsets = tables(plain, node, np.asarray(weights), bias, params, cbo * vl)
    pointers = table_pointers(shape, offsets)
    rq = requantizers(shape, node)
    tiles, calls = _row(shape, s, lambda size, start: _depthwise_tile(shape, s, size,
                                                                        pointers, rq, start))
    el = "int8_t" if shape.int8 else "float"
    wt = "int32_t" if shape.int8 else "float"
    per_ct = s.tile_co // vl
    cts, rts = _blocks(cbo, per_ct), _blocks(shape.ho, s.tile_h)
    in_size = cbo * shape.h * shape.w * vl
    out_size = cbo * shape.ho * shape.wo * vl
    step = f"""const int cb = ct * {per_ct} + mt;
if (cb >= {cbo}) continue;
const {wt} *wc = wp + (size_t)cb * {shape.kh * shape.kw * vl};
{_tap_rows(shape)}
{calls}"""
    body = _entry(f"{shape.dtype} depthwise conv {shape.describe()}, NCHW{vl}c; schedule "
                  f"{s.to_dict()}", s, tiles, (el, el, wt), w_off, shape.n,
                  shape.ho, (in_size, out_size), (cts, rts, per_ct), shape.residual, step,
                  band)
    return Kernel(body, params.blob(), inputs, 0, 0, shape.macs,
                  in_blocks=(vl,) * len(inputs), out_block=vl, items=item_count(s, 1, cts, rts))
