"""int8 stems without VNNI: a GEMM of int16 im2col rows built a few at a time, written
straight into the blocked layout.

    kernel = stem_kernel(shape, node, graph, isa, inputs)    # patches.runs_as_gemm

A CNN's stem (a 7 x 7 or 3 x 3 kernel over 3 channels, stride 2, padded) has too few
input channels for the blocked kernels' channel vectors, and its input (the quantized
image) may be negative, so AVX2's ``vpmaddubsw`` (unsigned by signed bytes) is not
exact on it. Widened to int16, any byte is: ``vpmaddwd`` multiplies pairs of int16 and
adds each pair into an int32 lane. So the stem is a GEMM of its im2col rows (C x kh x
kw values a pixel, in the weights' (c, i, j) order, a tap in the padding 0) by the
weights, in int16 pairs.

Each work item is a chunk of `CHUNK_TILES` register tiles of one image's output pixels.
Its thread gathers the chunk's rows into its own scratch, widened to int16 as they are
copied (a kernel row of up to eight taps inside the image is one 8-byte load and one
``pmovsxbw``), so the rows never leave L1; then every tile of ``mr`` pixels is
multiplied by every output tile of ``nv`` channel vectors (the weights, a few KB, stay
in L1 too), and the epilogue (bias, requantization per channel, clamp: the blocked
kernels' own, `blocked.vector_epilogue`) stores each pixel's channel vector into the
blocked output (``NCHW{vl}c``), where the max pool and the layers after read it.

The composed form it replaced (`patches`: the int8 im2col rows of the whole image, a
pass widening them to int16, the dense kernel's GEMM with the output tiles outer, then
a transpose to NCHW) moved the 3.7 MB of int16 rows through memory once per output tile
and transposed the output byte by byte: ResNet-18's 7 x 7 stem took 1.67 ms on 2 AVX2
cores (71 GMAC/s, where its 3 x 3 layers reach 150-170). Against it, on an AMD EPYC
(AVX2 only, 2 threads, 15 interleaved rounds of whole graphs): ResNet-18 int8 1.065x,
MobileNet-v1 int8 1.055x; the 7 x 7 stem alone 1.39x (2,290 -> 1,649 us).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.blocked import vector_epilogue
from vdla.compiler.targets.cpu.conv import indent
from vdla.compiler.targets.cpu.dense import pack16
from vdla.compiler.targets.cpu.epilogue import requantizers, table_pointers, tables
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["CHUNK_TILES", "MR", "NV", "stem_kernel"]

#: The register tile: MR pixels by NV channel vectors (12 int32 accumulators, NV weight
#: vectors and a broadcast pair: 15 of AVX2's 16 registers).
MR, NV = 6, 2
#: Register tiles of pixels per work item: 48 pixels of a 7 x 7 stem's 148 int16 are
#: 14 KB of rows, in L1 with the weights.
CHUNK_TILES = 8


def _gather(shape: ConvShape, k2: int) -> str:
    """C of ``NAME_rows``: output pixels [p0, p0 + count) of image ``xb`` as int16 im2col
    rows of ``2 * k2`` values at ``rows`` (the pad past C x kh x kw zero)."""
    kh, kw, row = shape.kh, shape.kw, 2 * k2
    fast = kw <= 8
    # Eight bytes loaded straight from the row: a copy through a stack word (memcpy of
    # kw bytes, then one 8-byte load) stalls on store forwarding, and took 2.3 ms to
    # gather ResNet's stem rows on one core.
    widen = """#if defined(VDLA_X86) && defined(__SSE4_1__)
                _mm_storeu_si128((__m128i *)dst, _mm_cvtepi8_epi16(
                    _mm_loadl_epi64((const __m128i *)(src + ix0))));
#else
                for (int j = 0; j < KW; j++) dst[j] = src[ix0 + j];
#endif""".replace("KW", str(kw)) if fast else f"for (int j = 0; j < {kw}; j++) dst[j] = src[ix0 + j];"
    # The fast copy writes 8 int16 where a kernel row has kw: the extra ones land on the
    # next kernel row's place, written after it, or on the pad, zeroed last (the row has
    # room for them: `_row_room`).
    return f"""
VDLA_INLINE void NAME_rows(const int8_t *restrict xb, int16_t *restrict rows, int p0, int count) {{
    for (int r = 0; r < count; r++) {{
        const int p = p0 + r, oy = p / {shape.wo}, ox = p % {shape.wo};
        const int ix0 = ox * {shape.sw} - {shape.pl};
        const int inside = ix0 >= 0 && ix0 + {8 if fast else kw} <= {shape.w};
        int16_t *restrict out = rows + (size_t)r * {_row_room(shape, k2)};
        for (int c = 0; c < {shape.c}; c++)
            for (int i = 0; i < {kh}; i++) {{
                int16_t *restrict dst = out + (c * {kh} + i) * {kw};
                const int iy = oy * {shape.sh} - {shape.pt} + i * {shape.dh};
                if (iy < 0 || iy >= {shape.h}) {{
                    for (int j = 0; j < {kw}; j++) dst[j] = 0;
                    continue;
                }}
                const int8_t *src = xb + ((size_t)c * {shape.h} + iy) * {shape.w};
                if ({int(shape.dw == 1)} && inside) {{
                {widen}
                    continue;
                }}
                for (int j = 0; j < {kw}; j++) {{
                    const int ix = ix0 + j * {shape.dw};
                    dst[j] = ix >= 0 && ix < {shape.w} ? src[ix] : 0;
                }}
            }}
        for (int j = {shape.c * kh * kw}; j < {row}; j++) out[j] = 0;
    }}
}}
"""


def _row_room(shape: ConvShape, k2: int) -> int:
    """int16 values a gathered row takes in the scratch: its ``2 * k2`` and room for the
    fast copy's overhang past the last kernel row (8 values written for kw), rounded
    to whole pairs."""
    over = max(0, 8 - shape.kw) if shape.kw <= 8 else 0
    return 2 * k2 + (over + 1) // 2 * 2


def _tile(shape: ConvShape, vl: int, mr: int, k2: int, room: int, pointers: str,
          rq: tuple[str, str]) -> str:
    """C of ``NAME_tile{mr}``: `mr` gathered rows (``xt``) by the output tile of ``NV``
    channel vectors from block ``cb`` (its weights ``wt``), then the epilogue into the
    blocked output of one image, ``y``, at pixel ``p0``."""
    width, plane = NV * vl, shape.ho * shape.wo
    cbo = -(-shape.o // vl)
    accs = [[f"a{j}_{v}" for v in range(NV)] for j in range(mr)]
    flat = [a for row in accs for a in row]
    step = [f"const vi{vl} w{v} = vi{vl}_load(wt + ((size_t)q * {width} + {v * vl}) * 2);"
            for v in range(NV)]
    for j in range(mr):
        step.append(f"{{ int32_t b; memcpy(&b, xt + (size_t){j * room} + 2 * q, 4); "
                    f"const vi{vl} bv = vi{vl}_bcast(b); "
                    + " ".join(f"{accs[j][v]} = vi{vl}_madd16({accs[j][v]}, bv, w{v});"
                               for v in range(NV)) + " }")
    stores = []
    for j in range(mr):
        for v in range(NV):
            at = f"((size_t)(cb + {v}) * {plane} + p0 + {j}) * {vl}"
            body = vector_epilogue(shape, vl, accs[j][v], f"(cb + {v}) * {vl}", at, rq)
            guard = f"if (cb + {v} < {cbo}) " if v else ""
            stores.append(guard + "{ " + " ".join(body) + " }")
    sep = "\n        "
    return f"""
VDLA_INLINE void NAME_tile{mr}(const int16_t *restrict xt, const int16_t *restrict wt,
        int8_t *restrict y, int p0, int cb, const unsigned char *restrict params) {{
{pointers}    const int8_t *restrict res = NULL; (void)res;
    vi{vl} {", ".join(flat)};
    {" ".join(f"{a} = (vi{vl}){{0}};" for a in flat)}
    for (int q = 0; q < {k2}; q++) {{
        {sep.join(step)}
    }}
    {(chr(10) + "    ").join(stores)}
}}
"""


def stem_kernel(shape: ConvShape, node: Node, graph: Graph, isa: Isa,
                inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of int8 convolution `shape` (one group, no residual; its input may
    be negative) as the module docstring's GEMM on `isa`'s vectors (``vl`` lanes), its
    output blocked by ``vl``."""
    if not shape.int8 or shape.groups != 1 or shape.residual:
        raise ValueError(f"stem_kernel: {shape.describe()} is not an int8 convolution of "
                         "one group without a residual")
    vl = isa.lanes[0]
    shape = dataclasses.replace(shape, offset=False)    # read as it is, signed, in int16
    k = shape.c * shape.kh * shape.kw
    k2, width = -(-k // 2), NV * vl
    room = _row_room(shape, k2)
    plane = shape.ho * shape.wo
    ots, cbo = -(-shape.o // width), -(-shape.o // vl)
    w = np.asarray(graph.constant(node.inputs[1]))
    bias = graph.constant(node.input(2)) if node.input(2) else None
    params = Params()
    w_off = params.add(pack16(w, shape.o, k, width))
    pointers = table_pointers(shape, tables(shape, node, w, bias, params, ots * width))
    rq = requantizers(shape, node)
    chunk = MR * CHUNK_TILES
    chunks = -(-plane // chunk)
    tail = plane - (chunks - 1) * chunk
    sizes = sorted({MR, *([tail % MR] if tail % MR else [])}, reverse=True)
    tiles = "".join(_tile(shape, vl, mr, k2, room, pointers, rq) for mr in sizes)
    calls = "\n".join(
        f"for (; t + {mr} <= count; t += {mr}) for (int ot = 0; ot < {ots}; ot++) "
        f"NAME_tile{mr}(rows + (size_t)t * {room}, wp + (size_t)ot * {k2 * width * 2}, yb, "
        f"p0 + t, ot * {NV}, params);" for mr in sizes)
    in_size, out_size = shape.c * shape.h * shape.w, cbo * plane * vl
    thread_bytes = align(chunk * room * 2)
    body = f"""{_gather(shape, k2)}{tiles}
/* int8 convolution {shape.describe()}: a GEMM of its int16 im2col rows,
   {plane} x {k} @ {k} x {shape.o}, the output NCHW{vl}c */
void NAME{SIGNATURE} {{
    const int8_t *restrict x = (const int8_t *)in[0];
    int8_t *restrict y = (int8_t *)out_;
    const int16_t *restrict wp = (const int16_t *)(params + {w_off});
    #pragma omp parallel
    {{
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        int16_t *restrict rows = (int16_t *)(ws + (size_t)tid * {thread_bytes});
        #pragma omp for schedule(static)
        for (int item = 0; item < {shape.n * chunks}; item++) {{
            const int b = item / {chunks}, p0 = item % {chunks} * {chunk};
            const int count = vdla_min({chunk}, {plane} - p0);
            const int8_t *restrict xb = x + (size_t)b * {in_size};
            int8_t *restrict yb = y + (size_t)b * {out_size};
            NAME_rows(xb, rows, p0, count);
            int t = 0;
            {indent(calls, 12)}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, thread_bytes=thread_bytes,
                  macs=shape.macs, in_blocks=(0,), out_block=vl, items=chunks)
