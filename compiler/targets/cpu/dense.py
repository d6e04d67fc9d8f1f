"""Dense layers (``dense``, ``qdense``) compiled to C.

    shape = DenseShape.from_node(node, graph)        # vdla.compiler.targets.cpu.shapes
    kernel = dense_kernel(shape, schedule, weights, bias, node, isa, inputs)

Vectors run along the output features: a vector of accumulators is ``vl`` consecutive
outputs of one row, which is how the plain (N, O) output stores them, so the epilogue
works on whole vectors with per-lane requantization tables. Each reduction step
broadcasts one input value (int8: four, as a 32-bit word) and loads ``ov`` weight
vectors from weights packed ``[output tile][k][ov * vl]`` (int8:
``[output tile][k / 4][ov * vl][4]``). A batch-1 dense layer reads every weight once:
it runs at the speed of memory, and the schedule only decides how many output vectors
share each broadcast input.

Layers of several rows (a transformer's tokens: (S, D) x (D, D') with S = 128) run a
register tile of ``row_tile`` rows by ``ov`` vectors: each step's weight vectors serve
every row of the tile (a blocked GEMM; OpenMP shares (output tile, row block) pairs,
output tiles outermost, so a tile's weights stay in the cache while the rows pass).

int8 follows `vdla.compiler.targets.cpu.conv`: an input not known to be non-negative is
read as ``x + 128`` and the bias absorbs ``-128 · sum(w)``. On AVX2 (no VNNI) a layer of
4 rows or more whose input may be negative instead widens its input to int16 once, into
the scratch space, and multiplies pairs of int16 with ``vpmaddwd`` (weights packed
``[output tile][k / 2][ov * vl][2]`` as int16): exact (each pair sum below 2**15 * 2),
no offset, and one instruction and an add per two products of a lane, where the
unsigned-by-signed ``vpmaddubsw`` needs its bytes split in nibbles for ``x + 128`` (it
would saturate otherwise): 1.75 times the instructions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.shapes import DenseShape
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.schedule import DenseSchedule

__all__ = ["dense_kernel", "row_tile", "wide_int8"]


def _pack16(shape: DenseShape, w: np.ndarray, tile: int) -> np.ndarray:
    """int8 weights as int16 ``[output tile][k / 2][tile][2]`` (zeros past o and k)."""
    op, k2 = -(-shape.o // tile) * tile, -(-shape.k // 2)
    wp = np.zeros((op, 2 * k2), np.int16)
    wp[:shape.o, :shape.k] = w
    return np.ascontiguousarray(wp.reshape(op // tile, tile, k2, 2).transpose(0, 2, 1, 3))


def wide_int8(shape: DenseShape, isa: Isa) -> bool:
    """Whether an int8 layer runs on int16 pairs (``vpmaddwd``; module docstring)."""
    return shape.int8 and shape.offset and isa.int8 == "maddubs" and shape.n >= 4


def _pack(shape: DenseShape, w: np.ndarray, tile: int) -> np.ndarray:
    op = -(-shape.o // tile) * tile
    wp = np.zeros((op, shape.k_padded), w.dtype)
    wp[:shape.o, :shape.k] = w
    if shape.int8:
        wp = wp.reshape(op // tile, tile, shape.k_padded // 4, 4).transpose(0, 2, 1, 3)
    else:
        wp = wp.reshape(op // tile, tile, shape.k).transpose(0, 2, 1)
    return np.ascontiguousarray(wp)


def row_tile(n: int, ov: int, isa: Isa) -> int:
    """Rows of the register tile: as many as fit beside ``ov`` weight vectors and one
    broadcast (``rows * ov + ov + 1`` vector registers), at most 6 and at most `n`."""
    return max(1, min(6, n, (isa.registers - 1 - ov) // ov))


def dense_kernel(shape: DenseShape, schedule: DenseSchedule, weights: np.ndarray,
                 bias: np.ndarray | None, node: Node, isa: Isa,
                 inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of dense layer `shape` with `schedule` (checked on `isa`)."""
    s = schedule.check(shape, isa)
    vl, ov = s.vl, s.ov
    tile = vl * ov
    tiles = -(-shape.o // tile)
    o_padded = tiles * tile
    mr = row_tile(shape.n, ov, isa)
    blocks = -(-shape.n // mr)
    params = Params()
    w = np.asarray(weights)
    wide = wide_int8(shape, isa)
    if wide:
        shape = dataclasses.replace(shape, offset=False)    # int16 x: no offset
    w_off = params.add(_pack16(shape, w, tile) if wide else _pack(shape, w, tile))
    offsets = tables(shape, node, w, bias, params, o_padded)
    ep = Epilogue.of(shape, vl)
    t = ep.t
    k = shape.k
    k2 = -(-k // 2)
    shared = shape.n * k2 * 4 if wide else 0
    elem = "int8_t" if shape.int8 else "float"
    loop = _reduction(shape, s, t, wide)
    epilogue = "".join("\n                " + line for line in ep.statements(
        "acc[r][v]", Operands.lanes(ep, "o"), "y + row + o", res="res + row + o",
        lanes=Lanes("first", "n"), var="a"))
    pointers = table_pointers(shape, offsets)
    res_decl = (f"const {elem} *restrict res = (const {elem} *)in[1];" if shape.residual
                else "const void *res = 0; (void)res;")
    cases = "\n".join(f"            case {r}: NAME_block(X + (size_t)b0 * {k}, wt, y, b0, ot, {r}"
                      f", params, res, x16 + (size_t)b0 * {k2}); break;"
                      for r in range(1, mr + 1))
    w_type = "int16_t" if wide else elem
    body = f"""
/* {shape.dtype} dense {shape.describe()}; schedule {s.to_dict()}; {mr} rows a tile */
VDLA_INLINE void NAME_block(const {elem} *restrict x, const {w_type} *restrict wt,
                            {elem} *restrict y, const int b0, const int ot, const int rows,
                            const unsigned char *restrict params, const void *res_,
                            const int32_t *restrict x16) {{
    (void)x; (void)x16;
{pointers}    (void)lim;
    const {elem} *restrict res = (const {elem} *)res_; (void)res;
    {t} acc[{mr}][{ov}];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < {ov}; v++) acc[r][v] = ({t}){{0}};{loop}
    for (int v = 0; v < {ov}; v++) {{
        const int o = ot * {tile} + v * {vl};
        if (o >= {shape.o}) break;
        const int n = vdla_min({vl}, {shape.o} - o);
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {{
            const size_t row = (size_t)(b0 + r) * {shape.o};{epilogue}
        }}
    }}
}}

void NAME{SIGNATURE} {{
    const {elem} *restrict X = (const {elem} *)in[0];
    {res_decl}
    {elem} *restrict y = ({elem} *)out_;
    const {w_type} *restrict wp = (const {w_type} *)(params + {w_off});
    int32_t *restrict x16 = (int32_t *)ws; (void)x16;
    #pragma omp parallel if({0 if s.parallel == "none" else 1})
    {{
{_widen(shape.n, k, k2) if wide else ""}
    #pragma omp for collapse(2) schedule(static)
    for (int ot = 0; ot < {tiles}; ot++)
    for (int rb = 0; rb < {blocks}; rb++) {{
        const int b0 = rb * {mr};
        const {w_type} *restrict wt = wp + (size_t)ot * {tile * (2 * k2 if wide else shape.k_padded)};
        switch (vdla_min({mr}, {shape.n} - b0)) {{
{cases}
        }}
    }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, shared, 0, shape.macs,
                  items=1 if s.parallel == "none" else blocks * tiles)


def _widen(n: int, k: int, k2: int) -> str:
    """C (inside the parallel region): the int8 rows X widened to pairs of int16, one
    int32 word per pair (the odd k's partner 0), into ``x16``."""
    return f"""    #pragma omp for schedule(static)
    for (int b = 0; b < {n}; b++) {{
        const int8_t *restrict xr = X + (size_t)b * {k};
        int16_t *restrict o = (int16_t *)(x16 + (size_t)b * {k2});
        for (int c = 0; c < {k}; c++) o[c] = xr[c];
        if ({k % 2}) o[{k}] = 0;
    }}"""


def _reduction(shape: DenseShape, s: DenseSchedule, t: str, wide: bool) -> str:
    """C: the reduction loop of a register tile (``rows`` rows by ``ov`` vectors of
    accumulators ``acc``): float32 multiply-adds, int8 words of four (``x + 128`` when the
    input may be negative) or, `wide`, pairs of int16 (``x16``)."""
    vl, ov = s.vl, s.ov
    tile = vl * ov
    k = shape.k
    k2 = -(-k // 2)
    if wide:
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {k2}; c++) {{
            {t} wv[{ov}];
            for (int v = 0; v < {ov}; v++) {{ wv[v] = {t}_load(wt + ((size_t)c * {tile} + v * {vl}) * 2); VDLA_IN_REGISTER(wv[v]); }}
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {t} xv = {t}_bcast(x16[(size_t)r * {k2} + c]);
                for (int v = 0; v < {ov}; v++) acc[r][v] = {t}_madd16(acc[r][v], xv, wv[v]);
            }}
        }}"""
    elif shape.int8:
        dot = f"{t}_dot4vv_any" if shape.offset else f"{t}_dot4vv"
        flip = "0x80808080u" if shape.offset else "0u"
        words, tail = divmod(k, 4)

        def step(c: str, read: str) -> str:
            return f"""
            {{
                {t} wv[{ov}];
                for (int v = 0; v < {ov}; v++) wv[v] = {t}_load(wt + ((size_t){c} * {tile} + v * {vl}) * 4);
                #pragma GCC unroll 8
                for (int r = 0; r < rows; r++) {{
                    uint32_t xw; {read}
                    const {t} xv = {t}_bcast((int32_t)(xw ^ {flip}));
                    for (int v = 0; v < {ov}; v++) acc[r][v] = {dot}(acc[r][v], xv, wv[v]);
                }}
            }}"""
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {words}; c++) {step("c", f"memcpy(&xw, x + (size_t)r * {k} + 4 * c, 4);")}"""
        if tail:
            # the last word's bytes past k read as 0 (the weights there are 0 too)
            loop += step(str(words), f"xw = 0; memcpy(&xw, x + (size_t)r * {k} + {4 * words}, "
                                     f"{tail});")
    else:
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {k}; c++) {{
            {t} wv[{ov}];
            for (int v = 0; v < {ov}; v++) {{ wv[v] = {t}_load(wt + (size_t)c * {tile} + v * {vl}); VDLA_IN_REGISTER(wv[v]); }}
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {t} xv = {t}_bcast(x[(size_t)r * {k} + c]);
                for (int v = 0; v < {ov}; v++) acc[r][v] = {t}_fma(xv, wv[v], acc[r][v]);
            }}
        }}"""
    return loop
