"""Float32 3x3 convolutions (stride 1, one group) on blocked layouts by Winograd's
minimal filtering F(2x2, 3x3): a schedule with ``layout="nchwc"`` and ``wino=2``.

    kernel = winograd_kernel(shape, schedule, weights, bias, node, inputs)

The output is cut in 2x2 tiles, each computed from a 4x4 input tile: per channel, the
input tile is transformed (``V = B^T d B``), multiplied point by point with the
transformed weights (``U = G g G^T``, computed once when the kernel is built) and
summed over the input channels, and the 4x4 sums are transformed back (``Y = A^T M A``).
That is 16 multiply-adds per tile and channel pair where the direct convolution does
36: 2.25x fewer, and the 16 point-wise products of all channels are 16 matrix products
(tiles by input channels, times input channels by output channels) which run as the
blocked 1x1 kernel does: ``mr`` tiles by one vector of output channels in registers,
one weight vector load per ``mr`` broadcast multiply-adds.

The blocked layout (``NCHW{vl}c``) makes every pixel a vector of ``vl`` channels, so
the transforms are additions of whole vectors. Two phases per image, separated by the
OpenMP barrier of the first's loop:

1. the input transform, shared by the threads over (input block, tile row), into the
   workspace ``V[16][input block][tile][vl]`` (padding read as zeros; each point's
   slice one vector longer, `_point_stride`);
2. the products and the output transform, shared over work items of ``tile_co``
   output channels by ``tile_h`` output rows: per register tile of ``mr`` tiles, the
   16 products into the thread's scratch ``M[16][mr][vl]``, then each tile's 2x2
   outputs with the blocked kernels' epilogue (bias, residual, activation).

Numerics: the transforms add and subtract values and halve the weights' (exact in
float32 but for rounding of the sums), so results differ from the direct sums by a
few units in the last place of the larger terms; the float tolerance (1e-5 relative to
the output's largest value) holds on ResNet-18 with a wide margin (see the tests).
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.blocked import vector_epilogue
from vdla.compiler.targets.cpu.conv import indent, item_count, item_loops
from vdla.compiler.targets.cpu.epilogue import table_pointers, tables
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["transform_weights", "winograd_kernel"]

#: F(2x2, 3x3)'s matrices (Lavin and Gray, "Fast Algorithms for Convolutional Neural
#: Networks", 2016): weights G (4x3); the input's B^T and the output's A^T are written
#: out as additions in `_input_transform` and `_output_transform`.
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def _blocks(total: int, size: int) -> int:
    return -(-total // size)


def transform_weights(weights: np.ndarray, vl: int) -> np.ndarray:
    """``U = G g G^T`` of every (output, input) channel pair, packed
    ``[output block][16 points][input channels, padded to vl][vl output lanes]``."""
    w = np.asarray(weights, np.float64)
    o, c = w.shape[:2]
    u = np.einsum("ik,ockl,jl->ocij", _G, w, _G).astype(np.float32)
    op, cp = _blocks(o, vl) * vl, _blocks(c, vl) * vl
    padded = np.zeros((op, cp, 4, 4), np.float32)
    padded[:o, :c] = u
    return np.ascontiguousarray(padded.reshape(op // vl, vl, cp, 16).transpose(0, 3, 2, 1))


def _point_stride(shape: ConvShape, vl: int, tiles: int) -> int:
    """Floats from one point's slice of ``V`` to the next: its input blocks' tiles, and
    one vector more. Without it the 16 slices of a 56x56 layer of 64 channels start
    49 x 4 KB apart, all in the same cache sets, and each tile's 16 stores fought over
    them."""
    return _blocks(shape.c, vl) * tiles * vl + vl


def _input_transform(shape: ConvShape, vl: int, tiles: int, tw: int) -> str:
    """C of ``NAME_in``: tile row ``tr`` of input block ``cb`` into ``V``."""
    t = f"vf{vl}"
    loads = []
    for i in range(4):
        for j in range(4):
            loads.append(f"const {t} d{i}{j} = (r{i} && c{j}) ? {t}_load(row{i} + {j * vl}) "
                         f": ({t}){{0}};")
    rows = "\n        ".join(
        f"const int r{i} = iy0 + {i} >= 0 && iy0 + {i} < {shape.h}; "
        f"const float *row{i} = xb + (((size_t)cb * {shape.h} + iy0 + {i}) * {shape.w} "
        f"+ ix0) * {vl};" for i in range(4))
    cols = " ".join(f"const int c{j} = ix0 + {j} >= 0 && ix0 + {j} < {shape.w};"
                    for j in range(4))
    # B^T d: rows 0-2, 1+2, 2-1, 1-3; then the same along the columns.
    bt = []
    for j in range(4):
        bt.append(f"const {t} s0{j} = d0{j} - d2{j}, s1{j} = d1{j} + d2{j}, "
                  f"s2{j} = d2{j} - d1{j}, s3{j} = d1{j} - d3{j};")
    stores = []
    for i in range(4):
        v = [f"s{i}0 - s{i}2", f"s{i}1 + s{i}2", f"s{i}2 - s{i}1", f"s{i}1 - s{i}3"]
        for j in range(4):
            xi = 4 * i + j
            stores.append(f"{t}_store(v + (size_t){xi} * {_point_stride(shape, vl, tiles)}, "
                          f"{v[j]});")
    return f"""
VDLA_INLINE void NAME_in(const float *restrict xb, float *restrict V, int cb, int tr) {{
    const int iy0 = tr * 2 - {shape.pt};
    for (int tc = 0; tc < {tw}; tc++) {{
        const int ix0 = tc * 2 - {shape.pl};
        {cols}
        {rows}
        (void)row0; (void)row1; (void)row2; (void)row3;
        {indent(chr(10).join(loads), 8)}
        {indent(chr(10).join(bt), 8)}
        float *v = V + ((size_t)cb * {tiles} + tr * {tw} + tc) * {vl};
        {indent(chr(10).join(stores), 8)}
    }}
}}
"""


def _products(shape: ConvShape, s: ConvSchedule, n: int, tiles: int) -> str:
    """C of ``NAME_mm{n}``: the 16 products of `n` tiles from ``t0`` by output block
    ``ob``, into ``M[16][mr][vl]``."""
    vl, t = s.vl, f"vf{s.vl}"
    cb = _blocks(shape.c, vl)
    accs = [f"a{j}" for j in range(n)]
    fmas = " ".join(f"{a} = {t}_fma(w, {t}_bcast(vx[(size_t){j * vl} + q]), {a});"
                    for j, a in enumerate(accs))
    stores = " ".join(f"{t}_store(m + {j * vl}, {a});" for j, a in enumerate(accs))
    return f"""
VDLA_INLINE void NAME_mm{n}(const float *restrict V, const float *restrict U,
        float *restrict M, int ob, int t0) {{
    for (int xi = 0; xi < 16; xi++) {{
        {t} {", ".join(accs)};
        {" ".join(f"{a} = ({t}){{0}};" for a in accs)}
        const float *uw = U + ((size_t)ob * 16 + xi) * {cb * vl * vl};
        for (int c = 0; c < {cb}; c++) {{
            const float *vx = V + (size_t)xi * {_point_stride(shape, vl, tiles)}
                              + ((size_t)c * {tiles} + t0) * {vl};
            const float *wc = uw + (size_t)c * {vl * vl};
            #pragma GCC unroll {s.unroll}
            for (int q = 0; q < {vl}; q++) {{
                const {t} w = {t}_load(wc + q * {vl});
                {fmas}
            }}
        }}
        float *m = M + (size_t)xi * {s.mr * vl};
        {stores}
    }}
}}
"""


def _output_transform(shape: ConvShape, s: ConvSchedule, pointers: str, tw: int) -> str:
    """C of ``NAME_out``: tile ``t0 + j``'s 2x2 outputs of block ``ob`` from ``M``,
    through the epilogue."""
    vl, t = s.vl, f"vf{s.vl}"
    loads = " ".join(f"const {t} m{xi} = {t}_load(M + {xi * s.mr * vl} + (size_t)j * {vl});"
                     for xi in range(16))
    # A^T M: rows 0+1+2 and 1-2-3; then the same along the columns.
    rows = " ".join(f"const {t} r0{k} = m{k} + m{4 + k} + m{8 + k}, "
                    f"r1{k} = m{4 + k} - m{8 + k} - m{12 + k};" for k in range(4))
    outs = []
    for dy in range(2):
        for dx, expr in enumerate((f"r{dy}0 + r{dy}1 + r{dy}2", f"r{dy}1 - r{dy}2 - r{dy}3")):
            at = f"(((size_t)ob * {shape.ho} + oy + {dy}) * {shape.wo} + ox + {dx}) * {vl}"
            body = vector_epilogue(shape, vl, f"y{dy}{dx}", f"ob * {vl}", at)
            guard = [c for c, need in ((f"oy + {dy} < {shape.ho}", dy and shape.ho % 2),
                                       (f"ox + {dx} < {shape.wo}", dx and shape.wo % 2))
                     if need]
            cond = f"if ({' && '.join(guard)}) " if guard else ""
            outs.append(f"{{ const {t} y{dy}{dx} = {expr}; {cond}{{ {' '.join(body)} }} }}")
    return f"""
VDLA_INLINE void NAME_out(const float *restrict M, int ob, int t0, int n,
        const float *restrict res, float *restrict y, const unsigned char *restrict params) {{
    (void)res;
{pointers}    for (int j = 0; j < n; j++) {{
        const int tile = t0 + j, oy = tile / {tw} * 2, ox = tile % {tw} * 2;
        {loads}
        {rows}
        {indent(chr(10).join(outs), 8)}
    }}
}}
"""


def winograd_kernel(shape: ConvShape, schedule: ConvSchedule, weights, bias, node: Node,
                    inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of float32 convolution `shape` (3x3, stride 1, one group) with
    `schedule` (``layout="nchwc"``, ``wino=2``, checked by the caller); arguments as
    `conv.conv_kernel`'s. Its input, residual and output are blocked by ``vl``."""
    s, vl = schedule, schedule.vl
    th, tw = _blocks(shape.ho, 2), _blocks(shape.wo, 2)
    tiles = th * tw
    cbi, cbo = _blocks(shape.c, vl), _blocks(shape.o, vl)
    params = Params()
    u_off = params.add(transform_weights(weights, vl))
    offsets = tables(shape, node, np.asarray(weights), bias, params, cbo * vl)
    pointers = table_pointers(shape, offsets)
    # Work items: tile_co channels by tile_h output rows (whole tile rows).
    rows_per = _blocks(s.tile_h, 2)
    per_ct = s.tile_co // vl
    cts, rts = _blocks(cbo, per_ct), _blocks(th, rows_per)
    sizes = sorted({min(s.mr, rows_per * tw), (rows_per * tw) % s.mr,
                    ((th - (rts - 1) * rows_per) * tw) % s.mr,
                    min(s.mr, (th - (rts - 1) * rows_per) * tw)} - {0})
    products = "".join(_products(shape, s, n, tiles) for n in sizes)
    dispatch = " ".join(f"case {n}: NAME_mm{n}(V, U, M, ob, t0); break;" for n in sizes)
    v_bytes = 16 * _point_stride(shape, vl, tiles) * 4
    m_bytes = 16 * s.mr * vl * 4
    in_size, out_size = cbi * shape.h * shape.w * vl, cbo * shape.ho * shape.wo * vl
    res_decl = ("const float *restrict res = (const float *)in[1];" if shape.residual
                else "const float *restrict res = NULL;")
    chunk = f"""for (int t0 = tt0; t0 < tt1; t0 += {s.mr}) {{
    const int n = vdla_min({s.mr}, tt1 - t0);
    switch (n) {{ {dispatch} default: break; }}
    NAME_out(M, ob, t0, n, rb, yb, params);
}}"""
    block = f"""for (int ob = ob0; ob < ob1; ob++) {{
    {indent(chunk, 4)}
}}"""
    if s.order == "px":
        block = f"""for (int c0 = tt0; c0 < tt1; c0 += {s.mr}) {{
    for (int ob = ob0; ob < ob1; ob++) {{
        const int t0 = c0, n = vdla_min({s.mr}, tt1 - t0);
        switch (n) {{ {dispatch} default: break; }}
        NAME_out(M, ob, t0, n, rb, yb, params);
    }}
}}"""
    body = f"""
/* float32 conv {shape.describe()}, NCHW{vl}c, Winograd F(2x2,3x3); schedule {s.to_dict()} */
{_input_transform(shape, vl, tiles, tw)}{products}{_output_transform(shape, s, pointers, tw)}
void NAME{SIGNATURE} {{
    const float *restrict x = (const float *)in[0];
    {res_decl}
    float *restrict y = (float *)out_;
    const float *restrict U = (const float *)(params + {u_off});
    float *restrict V = (float *)ws;
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    {{
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *restrict M = (float *)(ws + {align(v_bytes)} + (size_t)tid * {align(m_bytes)});
        for (int b = 0; b < {shape.n}; b++) {{
            const float *xb = x + (size_t)b * {in_size};
            float *yb = y + (size_t)b * {out_size};
            const float *rb = res ? res + (size_t)b * {out_size} : NULL;
            #pragma omp for collapse(2) schedule(static)
            for (int cb = 0; cb < {cbi}; cb++)
                for (int tr = 0; tr < {th}; tr++) NAME_in(xb, V, cb, tr);
            {indent(item_loops(s, 1, cts, rts), 12)} {{
                const int ob0 = ct * {per_ct}, ob1 = vdla_min(ob0 + {per_ct}, {cbo});
                const int tt0 = rt * {rows_per * tw};
                const int tt1 = vdla_min(tt0 + {rows_per * tw}, {tiles});
                {indent(block, 16)}
            }}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, v_bytes, m_bytes, shape.macs,
                  in_blocks=(vl,) * len(inputs), out_block=vl,
                  items=item_count(s, 1, cts, rts))
