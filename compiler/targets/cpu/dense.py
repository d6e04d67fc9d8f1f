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

On AMX (the ``amx`` instruction set) an int8 layer runs on tiles instead
(`vdla.compiler.targets.cpu.amx`: the weights packed as B tiles when the C is written).

int8 follows `vdla.compiler.targets.cpu.conv`: an input not known to be non-negative is
read as ``x + 128`` and the bias absorbs ``-128 · sum(w)`` (AVX-512 VNNI ``vpdpbusd``;
portable C). On AVX2 (no VNNI; `int8_path`), where the unsigned-by-signed
``vpmaddubsw`` would saturate on ``x + 128`` (and splitting its bytes in nibbles costs
ten instructions per four products), an input that may be negative is multiplied signed:

* "sign", up to `SIGN_ROWS_MAX` rows when no weight is -128 (the quantizer's weights
  are in [-127, 127]): ``x * w = |x| * (w * sgn(x))``, ``|x|`` once per broadcast word
  of four inputs, the sign applied to each weight vector, then ``vpmaddubsw`` and
  ``vpmaddwd`` with ones: each product at most 128 * 127 in magnitude, a pair at most
  32512 < 2**15, so nothing saturates and the int32 sums are exact (the proof:
  `vdla_cpu.h`, ``viN_dot4vv_sign``); no offset. It reads half the weight bytes of
  "wide" but spends five vector instructions per four products of a lane where "wide"
  spends four, so it wins where the weights' bytes bound the layer (few rows: 1.3-2x
  faster) and loses where the multiply-adds do (0.8x at 128 rows; `SIGN_ROWS_MAX`).
* "wide", more rows, or 4 rows or more with a -128 weight: the input widened to int16
  once, into the scratch space, and pairs of int16 multiplied with ``vpmaddwd``
  (weights packed ``[output tile][k / 2][ov * vl][2]`` as int16): exact, no offset.
* "offset" below 4 rows with a -128 weight: ``x + 128`` split in nibbles
  (``viN_dot4vv_any``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.shapes import DenseShape
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule

__all__ = ["AVX2_INT8", "SIGN_ROWS_MAX", "dense_kernel", "int8_path", "pack16", "row_tile",
           "signed_weights", "tile_rows"]


def pack16(w: np.ndarray, o: int, k: int, tile: int) -> np.ndarray:
    """int8 weights ``(o, k)`` as int16 ``[output tile][k / 2][tile][2]``, zeros past o
    and k: the layout ``vpmaddwd``'s pairs read (the dense layers' and `stem`'s)."""
    op, k2 = -(-o // tile) * tile, -(-k // 2)
    wp = np.zeros((op, 2 * k2), np.int16)
    wp[:o, :k] = np.asarray(w).reshape(o, k)
    return np.ascontiguousarray(wp.reshape(op // tile, tile, k2, 2).transpose(0, 2, 1, 3))


#: How an int8 layer whose input may be negative multiplies on AVX2 (no VNNI; module
#: docstring): "sign" (up to `SIGN_ROWS_MAX` rows, where the weights allow it), "wide"
#: (int16 pairs) or "offset" (``x + 128`` split in nibbles). `int8_path` picks;
#: ``dense_kernel(..., avx2_int8=...)`` forces one (benchmarks and tests compare them).
AVX2_INT8 = ("sign", "wide", "offset")
#: Rows up to which "sign" is the default: measured against "wide" on an AMD Zen 4 host
#: (AVX2 only, one thread, weights evicted before each run; 768 -> 3072 unless said)
#: 1 row 1.96x, 4 rows 1.36x, 8 1.31x, 12 1.09x faster; 16 rows 0.98x (768 -> 768:
#: 1.00x, 3072 -> 768: 0.87x), 32 0.90x, 128 0.80x.
SIGN_ROWS_MAX = 12


def signed_weights(w: np.ndarray) -> bool:
    """Whether int8 weights `w` can take the sign trick: none is -128 (whose negation
    wraps to -128). `vdla.compiler.passes.quantize` writes weights in [-127, 127]."""
    return w.size == 0 or int(np.min(w)) > -128


def int8_path(shape: DenseShape, isa: Isa, w: np.ndarray, avx2_int8: str | None = None) -> str:
    """How int8 layer `shape` with weights `w` multiplies: "plain" (an input known
    non-negative: ``dot4`` words as they are), "offset" on VNNI and portable code
    (``x + 128``), or on AVX2 one of `AVX2_INT8`: "sign" up to `SIGN_ROWS_MAX` rows
    when no weight is -128, else "wide" for 4 rows or more and "offset" below.
    `avx2_int8` forces an AVX2 path (ValueError: "sign" with a -128 weight, or an
    unknown name)."""
    if not (shape.int8 and shape.offset and isa.int8 == "maddubs"):
        return "offset" if shape.int8 and shape.offset else "plain"
    if avx2_int8 is None:
        if shape.n <= SIGN_ROWS_MAX and signed_weights(w):
            return "sign"
        return "wide" if shape.n >= 4 else "offset"
    if avx2_int8 not in AVX2_INT8:
        raise ValueError(f"avx2_int8={avx2_int8!r}: allowed {list(AVX2_INT8)}")
    if avx2_int8 == "sign" and not signed_weights(w):
        raise ValueError(f"avx2_int8='sign' needs int8 weights in [-127, 127]; this "
                         f"layer's weights hold -128")
    return avx2_int8


def _pack(shape: DenseShape, w: np.ndarray, tile: int) -> np.ndarray:
    op = -(-shape.o // tile) * tile
    wp = np.zeros((op, shape.k_padded), w.dtype)
    wp[:shape.o, :shape.k] = w
    if shape.int8:
        wp = wp.reshape(op // tile, tile, shape.k_padded // 4, 4).transpose(0, 2, 1, 3)
    else:
        wp = wp.reshape(op // tile, tile, shape.k).transpose(0, 2, 1)
    return np.ascontiguousarray(wp)


#: Vector registers the "sign" int8 reduction needs beside its accumulators and weight
#: vectors (the broadcast word, its absolute value, the ones of ``vpmaddwd``, the signed
#: weights); the others need one (the broadcast).
_SIGN_SPARE = 4


def row_tile(n: int, ov: int, isa: Isa, spare: int = 1) -> int:
    """Rows of the register tile: as many as fit beside ``ov`` weight vectors and
    `spare` others (``rows * ov + ov + spare`` vector registers), at most 6 and at most
    `n`."""
    return max(1, min(6, n, (isa.registers - spare - ov) // ov))


def tile_rows(n: int, ov: int, isa: Isa, path: str | None) -> int:
    """Rows of the register tile `dense_kernel` runs for `n` rows, ``ov`` output vectors
    and int8 path `path` (`int8_path`; None for float32): the "sign" path keeps
    `_SIGN_SPARE` registers beside its tile, the others one."""
    return row_tile(n, ov, isa, _SIGN_SPARE if path == "sign" else 1)


def dense_kernel(shape: DenseShape, schedule: DenseSchedule, weights: np.ndarray,
                 bias: np.ndarray | None, node: Node, isa: Isa,
                 inputs: tuple[str, ...], *, avx2_int8: str | None = None) -> Kernel:
    """The `Kernel` of dense layer `shape` with `schedule` (checked on `isa`);
    `avx2_int8` forces an int8 path on AVX2 (`int8_path`); on AMX an int8 layer runs on
    tiles (`vdla.compiler.targets.cpu.amx`)."""
    s = schedule.check(shape, isa)
    if shape.int8 and isa.tiles:
        return amx.qdense_kernel(shape, s, weights, bias, node, inputs)
    vl, ov = s.vl, s.ov
    tile = vl * ov
    tiles = -(-shape.o // tile)
    o_padded = tiles * tile
    params = Params()
    w = np.asarray(weights)
    path = int8_path(shape, isa, w, avx2_int8)
    mr = tile_rows(shape.n, ov, isa, path)
    blocks = -(-shape.n // mr)
    wide, sign = path == "wide", path == "sign"
    if wide or sign:
        shape = dataclasses.replace(shape, offset=False)    # signed x: no offset
    if sign and not signed_weights(w):      # the C's exactness rests on this
        raise ValueError(f"dense node {node.name!r}: the sign-trick int8 kernel needs "
                         f"weights in [-127, 127]; they hold -128")
    w_off = params.add(pack16(w, shape.o, shape.k, tile) if wide else _pack(shape, w, tile))
    offsets = tables(shape, node, w, bias, params, o_padded)
    ep = Epilogue.of(shape, vl)
    t = ep.t
    k = shape.k
    k2 = -(-k // 2)
    shared = shape.n * k2 * 4 if wide else 0
    elem = "int8_t" if shape.int8 else "float"
    panel = tile * (4 * k2 if wide else shape.k_padded * (1 if shape.int8 else 4))
    share = _prefetch_share(panel, tiles, blocks)
    loop = _reduction(shape, s, t, path, share)
    epilogue = "".join("\n                " + line for line in ep.statements(
        "acc[r][v]", Operands.lanes(ep, "o"), "y + row + o", res="res + row + o",
        lanes=Lanes("first", "n"), var="a"))
    pointers = table_pointers(shape, offsets)
    res_decl = (f"const {elem} *restrict res = (const {elem} *)in[1];" if shape.residual
                else "const void *res = 0; (void)res;")
    cases = "\n".join(f"            case {r}: NAME_block(X + (size_t)b0 * {k}, wt, y, b0, ot, {r}"
                      f", params, res, x16 + (size_t)b0 * {k2}, pf); break;"
                      for r in range(1, mr + 1))
    w_type = "int16_t" if wide else elem
    body = f"""
/* {shape.dtype} dense {shape.describe()}; schedule {s.to_dict()}; {mr} rows a tile{"; int8 " + path if shape.int8 else ""} */
VDLA_INLINE void NAME_block(const {elem} *restrict x, const {w_type} *restrict wt,
                            {elem} *restrict y, const int b0, const int ot, const int rows,
                            const unsigned char *restrict params, const void *res_,
                            const int32_t *restrict x16, const char *restrict pf) {{
    (void)x; (void)x16; (void)pf;
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
        /* this item's share of the next panel's bytes (`_prefetch_share`) */
        const char *pf = (const char *)wp + (size_t)vdla_min(ot + 1, {tiles - 1}) * {panel}
                         + (size_t)rb * {share}; (void)pf;
        switch (vdla_min({mr}, {shape.n} - b0)) {{
{cases}
        }}
    }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, shared, 0, shape.macs,
                  items=1 if s.parallel == "none" else blocks * tiles)


#: Bytes of a weight panel (one output tile's weights over the whole reduction) from
#: which the row blocks prefetch the next panel's.
_PREFETCH_MIN = 32 * 1024


def _prefetch_share(panel: int, tiles: int, blocks: int) -> int:
    """Bytes of the next output tile's weight panel that each row block's call
    prefetches into L2 as its reduction runs (0: none), so that the next panel's first
    row block finds its weights there instead of waiting on memory.

    The first row block over a panel reads every weight once while the others re-read it
    from L2; read from memory, a step of ``ov`` weight vectors for ``rows`` x ``ov``
    multiply-adds asks for tens of GB/s a core, more than a shared host gives, and the
    hardware's streamer stops at each 4 KiB page. A model whose weights outgrow the
    last-level cache (BERT-base float32: 340 MB) reads every panel from memory. Each
    call prefetches an equal share, one line every few reduction steps: spread over
    the calls, no burst outruns the core's queue of misses (the convolutions' lesson,
    `blocked._prefetch`). Only with two row blocks or more (one block is a plain stream)
    and panels of at least `_PREFETCH_MIN` bytes.

    Measured with `bench/cpu_dense.py` (on and off, whole graph, interleaved) on an
    Intel Xeon with AMX at 2 threads: BERT-base float32 1.12x faster (its dense layers
    1.13x), ViT-tiny float32's dense layers 1.04x (its 23 MB of weights stay in L3)."""
    if blocks < 2 or tiles < 2 or panel < _PREFETCH_MIN or not PREFETCH_NEXT_PANEL:
        return 0
    return -(-panel // (blocks * 64)) * 64


#: Whether the dense kernels prefetch the next panel (`_prefetch_share`): always, but
#: for `bench/cpu_dense.py`, which turns it off to measure what it is worth.
PREFETCH_NEXT_PANEL = True


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


def _fetch(share: int, steps: int) -> str:
    """C: reduction step ``c``'s part of this call's `share` bytes of the next panel
    (``pf``), spread evenly over the `steps` steps; nothing without a share."""
    if not share:
        return ""
    lines = -(-share // (steps * 64))
    return " ".join(f"__builtin_prefetch(pf + (size_t)c * {share} / {steps} + {64 * j}, 0, 2);"
                    for j in range(lines))


def _reduction(shape: DenseShape, s: DenseSchedule, t: str, path: str,
               share: int = 0) -> str:
    """C: the reduction loop of a register tile (``rows`` rows by ``ov`` vectors of
    accumulators ``acc``): float32 multiply-adds, int8 words of four (`path` "offset":
    ``x + 128`` when the input may be negative; "sign": signed words, the sign moved
    onto the weights) or, "wide", pairs of int16 (``x16``); each step prefetches its
    part of `share` bytes of the next panel (`_prefetch_share`)."""
    wide = path == "wide"
    vl, ov = s.vl, s.ov
    tile = vl * ov
    k = shape.k
    k2 = -(-k // 2)
    if wide:
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {k2}; c++) {{
            {_fetch(share, k2)}
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
        # "sign": |x| once per broadcast word, the sign applied to each weight vector
        # (`vdla_cpu.h` viN_dot4vv_sign; exact because no weight is -128, `int8_path`)
        xa = f" const {t} xa = {t}_abs8(xv);" if path == "sign" else ""
        mul = (f"{t}_dot4vv_sign(acc[r][v], xa, xv, wv[v])" if path == "sign" else
               f"{dot}(acc[r][v], xv, wv[v])")
        keep = " VDLA_IN_REGISTER(wv[v]);" if path == "sign" else ""

        def step(c: str, read: str, fetch: str = "") -> str:
            return f"""
            {{
                {fetch}
                {t} wv[{ov}];
                for (int v = 0; v < {ov}; v++) {{ wv[v] = {t}_load(wt + ((size_t){c} * {tile} + v * {vl}) * 4);{keep} }}
                #pragma GCC unroll 8
                for (int r = 0; r < rows; r++) {{
                    uint32_t xw; {read}
                    const {t} xv = {t}_bcast((int32_t)(xw ^ {flip}));{xa}
                    for (int v = 0; v < {ov}; v++) acc[r][v] = {mul};
                }}
            }}"""
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {words}; c++) {step("c", f"memcpy(&xw, x + (size_t)r * {k} + 4 * c, 4);", _fetch(share, max(1, words)))}"""
        if tail:
            # the last word's bytes past k read as 0 (the weights there are 0 too)
            loop += step(str(words), f"xw = 0; memcpy(&xw, x + (size_t)r * {k} + {4 * words}, "
                                     f"{tail});")
    else:
        loop = f"""
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {k}; c++) {{
            {_fetch(share, k)}
            {t} wv[{ov}];
            for (int v = 0; v < {ov}; v++) {{ wv[v] = {t}_load(wt + (size_t)c * {tile} + v * {vl}); VDLA_IN_REGISTER(wv[v]); }}
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {t} xv = {t}_bcast(x[(size_t)r * {k} + c]);
                for (int v = 0; v < {ov}; v++) acc[r][v] = {t}_fma(xv, wv[v], acc[r][v]);
            }}
        }}"""
    return loop
