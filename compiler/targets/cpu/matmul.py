"""Batched matrix products compiled to C: ``matmul`` (float32) and ``qmatmul`` (int8).

    if matmul_refusal(node, graph) is None:
        kernel = matmul_kernel(node, graph, isa, schedule)   # a MatmulSchedule, or None

Both follow numpy's ``matmul``: operands of rank 2 or more, the last two axes the
matrices, the axes before them broadcast (``(B, H, S, D) @ (B, H, D, T)``, ``(B, S, D) @
(D, N)``, ``(1, H, S, D) @ (B, 1, D, T)``). Either operand may be computed or constant.
Each output batch's operand offsets are a table in ``params`` (the broadcast resolved
when the C is written), so the loops see plain (M, K) @ (K, N) products.

The register tile, the reduction's unroll, the threads and AVX2's int8 path are the
knobs of a `MatmulSchedule` (`vdla.compiler.targets.cpu.matmul_schedule`, which the tuner
searches); its default is the tile described here.

float32: a register tile of ``mr`` rows by ``nv`` vectors of ``vl`` columns (by default
AVX-512: 6 by 2 of 16; AVX2 and portable: 4 by 2 of 8). Each reduction step loads ``nv``
vectors of one row of B (contiguous: B is read in place, no packing), broadcasts ``mr``
values of A and does ``mr * nv`` multiply-adds in float32. OpenMP shares (batch, row
block) pairs. The sums run in another order than the reference's float64, within
float32 rounding.

int8 (``qmatmul``, `vdla.compiler.reference.integer`'s arithmetic): every B matrix is
first packed into the scratch space as ``[K / 4][N][4]`` bytes (four consecutive k of one
column side by side: one 32-bit lane; with ``transpose_b`` a plain 4-byte copy from B's
rows), the K past a multiple of 4 zero, and its column sums taken. A's rows are read
four bytes at a time as ``x + 128`` (the word XOR 0x80808080, an unsigned byte) and
multiplied by the packed lanes with `vdla_cpu.h`'s exact dot products (``viN_dot4vv_any``:
AVX-512 VNNI ``vpdpbusd``; AVX2 ``vpmaddubsw`` on nibbles, which cannot saturate;
portable C); the sums lose ``128 * colsum`` (modulo 2**32, as the int32 reference
wraps), are requantized by the node's one multiplier and shift (``viN_rq``) and clamped
to [out_min, out_max]. Bit-exact against the reference on every instruction set.

On AVX2 (``wide``, by default with 4 rows of A or more), both operands are instead
widened to int16 (B packed
``[K / 2][N][2]``, A's rows once into the scratch space as words of two) and multiplied
with ``vpmaddwd`` (``viN_madd16``): exact for every int8 value (a pair sum is at most
2 * 128 * 128 = 2**15, in int32), no offset, four instructions per four products of a
lane against the nibble split's ten. The dense layers' sign trick (`dense`) needs one
operand without -128, which two activations do not promise. Measured on an AMD Zen 4
host (AVX2 only, one thread): BERT-base's scores (12 heads, 128 x 64 @ 64 x 128) 1.27x,
probabilities times values 1.47x and a (128, 768) @ (768, 768) 1.22x faster; with one
row the packing of B dominates and twice its bytes ran 2.2x slower, so one to three
rows keep the nibbles.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import INT8_MAX, INT8_MIN, INT8_PRODUCTS_MAX
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import (SIGNATURE, Kernel, Params, align,
                                              param_pointers)
from vdla.compiler.targets.cpu.matmul_schedule import (MatmulSchedule, MatmulShape,
                                                       choose_matmul, parallel_team)
from vdla.compiler.targets.cpu.opbase import (Sources, dtype_refusal, requant_attrs_refusal,
                                             size)

__all__ = ["batch_offsets", "matmul_kernel", "matmul_refusal", "qmatmul_refusal"]


def batch_offsets(a_shape, b_shape, out_batch) -> tuple[np.ndarray, np.ndarray]:
    """Element offsets of each output batch's A and B matrices (numpy broadcasting of
    the batch axes: an axis of size 1 repeats)."""
    out_batch = tuple(out_batch)
    count = size(out_batch)
    idx = np.indices(out_batch).reshape(len(out_batch), count) if out_batch else \
        np.zeros((0, 1), np.int64)
    offsets = []
    for shape in (a_shape, b_shape):
        batch = (1,) * (len(out_batch) - (len(shape) - 2)) + tuple(shape[:-2])
        matrix = shape[-1] * shape[-2]
        strides = np.cumprod((1,) + batch[::-1])[:-1][::-1] * matrix
        off = np.zeros(count, np.int64)
        for d, (n, s) in enumerate(zip(batch, strides)):
            if n > 1:
                off += idx[d] * s
        offsets.append(off)
    return offsets[0], offsets[1]


def matmul_refusal(node: Node, graph: Graph) -> str | None:
    """float32 ``matmul``: operands of rank 2 or more (numpy's 1-D promotion is not run)."""
    bad = dtype_refusal(node, graph, ("float32",))
    if bad:
        return bad
    return _rank_refusal(node, graph)


def _rank_refusal(node: Node, graph: Graph) -> str | None:
    for name in node.inputs[:2]:
        shape = graph.tensors[name].shape
        if len(shape) < 2:
            return (f"{node.op} node {node.name!r}: operand {name!r} has shape {shape}; the "
                    "CPU target multiplies operands of rank 2 or more")
    if size(graph.tensors[node.outputs[0]].shape) == 0:
        return f"{node.op} node {node.name!r}: an empty output"
    return None


def qmatmul_refusal(node: Node, graph: Graph) -> str | None:
    """``qmatmul``: int8 operands of rank >= 2, per-tensor requantization in bounds, and
    at most `INT8_PRODUCTS_MAX` products per output (an int32 accumulator is exact)."""
    bad = dtype_refusal(node, graph, ("int8",)) or _rank_refusal(node, graph)
    if bad:
        return bad
    a = node.attrs
    if np.size(a["shift"]) != 1 or (a["multiplier"] is not None
                                    and np.size(a["multiplier"]) != 1):
        return (f"qmatmul node {node.name!r}: per-channel requantization (shift "
                f"{a['shift']!r}); the CPU target requantizes qmatmul per tensor")
    bad = requant_attrs_refusal(node, graph)
    if bad:
        return bad
    lo, hi = int(a["out_min"]), int(a["out_max"])
    if not INT8_MIN <= lo <= hi <= INT8_MAX:
        return (f"qmatmul node {node.name!r}: out_min {lo} and out_max {hi} must satisfy "
                "-128 <= out_min <= out_max <= 127")
    k = graph.tensors[node.inputs[0]].shape[-1]
    if k > INT8_PRODUCTS_MAX:
        return (f"qmatmul node {node.name!r} sums {k} products per output, more than an "
                f"int32 accumulator holds exactly ({INT8_PRODUCTS_MAX})")
    return None


def _scalar(v) -> int:
    return int(np.asarray(v).reshape(-1)[0])


def _matrices(shape) -> int:
    """The matrices of an operand of `shape` (its batch axes' product)."""
    return int(np.prod(shape[:-2], dtype=np.int64))


def _requant(node: Node, params: Params) -> int:
    """`node`'s multiplier (0: none), shift, out_min and out_max as int32 in `params`:
    their offset."""
    a = node.attrs
    mult = 0 if a["multiplier"] is None else _scalar(a["multiplier"])
    return params.add(np.array([mult, _scalar(a["shift"]), int(a["out_min"]),
                                int(a["out_max"])], np.int32))


def matmul_kernel(node: Node, graph: Graph, isa: Isa,
                  schedule: MatmulSchedule | None = None, *, bf16: bool = False) -> Kernel:
    """The kernel of a ``matmul`` or ``qmatmul`` node that `matmul_refusal` /
    `qmatmul_refusal` accepts, with `schedule` (None: `choose_matmul`'s; `ScheduleError`
    for one that does not fit the node on `isa`); `bf16`: a float one in bfloat16 on
    tiles (`amx.qmatmul_kernel`; `lower.node_kernel` checks that `isa` has them)."""
    shape = MatmulShape.from_node(node, graph)
    s = (schedule or choose_matmul(shape, isa)).check(shape, isa)
    quant = node.op == "qmatmul"
    a_shape = graph.tensors[node.inputs[0]].shape
    b_shape = graph.tensors[node.inputs[1]].shape
    out = graph.tensors[node.outputs[0]].shape
    m, k, n = shape.m, shape.k, shape.n
    aoff, boff = batch_offsets(a_shape, b_shape, out[:-2])
    params = Params()
    sources = Sources(graph, params)
    elem = "int8_t" if quant else "float"
    a_ptr = sources.pointer(node.inputs[0], elem)
    b_ptr = sources.pointer(node.inputs[1], elem)
    offsets = params.add(np.stack([aoff, boff]).astype(np.int64))
    batches = aoff.size
    if isa.tiles and (quant or bf16):
        return amx.qmatmul_kernel(node, shape, s, a_ptr, b_ptr, params, tuple(sources.inputs),
                                  offsets, _matrices(a_shape), boff,
                                  _requant(node, params) if quant else None)
    if quant:
        return _qmatmul(node, params, sources, s, shape, a_ptr, b_ptr, offsets, boff)
    vl, mr, nv = s.vl, s.mr, s.nv
    v = f"vf{vl}"
    blocks = -(-m // mr)
    groups = _column_groups(n, nv, vl)
    calls = "\n".join(f"    NAME_tile(a, b + {j0}, y + {j0}, rows, {g}, {last});"
                      for j0, g, last in groups)
    work = batches * blocks
    macs = batches * m * k * n
    parallel = int(parallel_team(shape, s))
    body = f"""
/* matmul {a_shape} @ {b_shape} -> {out}: {batches} products {m}x{k} @ {k}x{n} */
VDLA_INLINE void NAME_tile(const float *restrict a, const float *restrict b,
                           float *restrict y, const int rows, const int nv, const int last) {{
    {v} acc[{mr}][{nv}];
    #pragma GCC unroll {mr}
    for (int r = 0; r < rows; r++)
        #pragma GCC unroll {nv}
        for (int u = 0; u < nv; u++) acc[r][u] = ({v}){{0}};
    {_unroll(s)}for (int c = 0; c < {k}; c++) {{
        {v} bv[{nv}];
        #pragma GCC unroll {nv}
        for (int u = 0; u < nv; u++)
            bv[u] = last < {vl} && u == nv - 1 ? {v}_load_n(b + (size_t)c * {n} + u * {vl}, last)
                                               : {v}_load(b + (size_t)c * {n} + u * {vl});
        #pragma GCC unroll {mr}
        for (int r = 0; r < rows; r++) {{
            const {v} x = {v}_bcast(a[(size_t)r * {k} + c]);
            #pragma GCC unroll {nv}
            for (int u = 0; u < nv; u++) acc[r][u] = {v}_fma(x, bv[u], acc[r][u]);
        }}
    }}
    #pragma GCC unroll {mr}
    for (int r = 0; r < rows; r++)
        #pragma GCC unroll {nv}
        for (int u = 0; u < nv; u++) {{
            if (last < {vl} && u == nv - 1) {v}_store_n(y + (size_t)r * {n} + u * {vl}, acc[r][u], last);
            else {v}_store(y + (size_t)r * {n} + u * {vl}, acc[r][u]);
        }}
}}

VDLA_INLINE void NAME_rows(const float *restrict a, const float *restrict b,
                           float *restrict y, const int rows) {{
{calls}
}}

void NAME{SIGNATURE} {{
    const float *restrict A = {a_ptr};
    const float *restrict B = {b_ptr};
    float *restrict Y = (float *)out_;
    const int64_t *restrict off = (const int64_t *)(params + {offsets});
    (void)ws;
    #pragma omp parallel for schedule(static) if({parallel})
    for (int w = 0; w < {work}; w++) {{
        const int bt = w / {blocks}, rb = w % {blocks};
        const float *restrict a = A + off[bt] + (size_t)rb * {mr * k};
        const float *restrict b = B + off[{batches} + bt];
        float *restrict y = Y + (size_t)bt * {m * n} + (size_t)rb * {mr * n};
        const int rows = {m} - rb * {mr} < {mr} ? {m} - rb * {mr} : {mr};
        switch (rows) {{
{_row_cases(mr)}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), macs=macs,
                  items=work if parallel else 1)


def _column_groups(n: int, nv: int, vl: int) -> list[tuple[int, int, int]]:
    """The columns of an output row as (first column, vectors, lanes of the last one):
    whole tiles of `nv` vectors, then single vectors, the last one partial."""
    groups, j = [], 0
    while j + nv * vl <= n:
        groups.append((j, nv, vl))
        j += nv * vl
    while j < n:
        groups.append((j, 1, min(vl, n - j)))
        j += vl
    return groups


def _unroll(s: MatmulSchedule) -> str:
    """C: the reduction loop's unroll pragma and the next line's indent (nothing at 1:
    the default's C as it was)."""
    return f"#pragma GCC unroll {s.unroll}\n    " if s.unroll > 1 else ""


def _row_cases(mr: int, args: str = "a, b, y, {r}") -> str:
    """C: a switch's cases calling ``NAME_rows`` with a constant row count each (`args`,
    its arguments with ``{r}`` for the count)."""
    return "\n".join(f"        case {r}: NAME_rows({args.format(r=r)}); break;"
                     for r in range(1, mr + 1))


def _qmatmul(node: Node, params: Params, sources: Sources, s: MatmulSchedule,
             shape: MatmulShape, a_ptr: str, b_ptr: str, offsets: int,
             boff: np.ndarray) -> Kernel:
    batches, m, k, n, trans = shape.batches, shape.m, shape.k, shape.n, shape.transpose_b
    vl, mr, nv = s.vl, s.mr, s.nv
    v = f"vi{vl}"
    wide = bool(s.wide)                # AVX2: pairs of int16 (module docstring)
    kq = shape.steps(wide)             # 32-bit words of a row of A
    np_ = -(-n // vl) * vl             # packed columns (zero past n)
    rq = _requant(node, params)
    # the distinct B matrices, packed once each: the packed index of each batch's B
    distinct, which = np.unique(boff, return_inverse=True)
    packs = distinct.size
    pack_off = params.add(distinct.astype(np.int64))
    which_off = params.add(which.astype(np.int32))
    panel = align(kq * np_ * 4)           # bytes of one packed B
    sums = align(np_ * 4)                 # its column sums (int32)
    one = panel + sums
    pack_col = _pack_column(k, n, np_, trans, wide)
    groups = _column_groups(n, nv, vl)
    calls = "\n".join(f"    NAME_tile(a, p + {j0 * 4}, cs + {j0}, y + {j0}, rows, {g}, {last}, rq);"
                      for j0, g, last in groups)
    blocks = -(-m // mr)
    work = batches * blocks
    macs = batches * m * k * n
    parallel = int(parallel_team(shape, s))
    per_word = 2 if wide else 4
    tail = k % per_word
    a_rows = int(np.prod(sources.graph.tensors[node.inputs[0]].shape)) // k
    a16 = align(a_rows * kq * 4) if wide else 0     # A widened (wide), after the panels
    a_type = "int32_t" if wide else "int8_t"
    if wide:    # two int16 of A, widened once into the scratch space (the second 0 past k)
        a_word = f"xw = (uint32_t)a[(size_t)r * {kq} + q];"
    else:
        a_word = ("memcpy(&xw, a + (size_t)r * " + str(k) + " + 4 * q, 4);" if not tail else
                  f"if (q < {k // 4}) memcpy(&xw, a + (size_t)r * {k} + 4 * q, 4); "
                  f"else {{ xw = 0; memcpy(&xw, a + (size_t)r * {k} + 4 * q, {tail}); }}")
    flip, dot = ("0u", f"{v}_madd16") if wide else ("0x80808080u", f"{v}_dot4vv_any")
    # (wide: no x + 128, so no column-sum correction)
    corr = f"({v}){{0}}" if wide else f"{v}_load(cs + u * {vl}) * 128"
    tile = _qmatmul_tile(v, vl, mr, nv, kq, np_, n, a_type, a_word, flip, dot, corr,
                         _unroll(s))
    body = f"""
/* qmatmul {node.attrs.get('transpose_b', False) and 'a @ b^T' or 'a @ b'}: {batches} products {m}x{k} @ {k}x{n} */
{tile}
VDLA_INLINE void NAME_rows(const {a_type} *restrict a, const int8_t *restrict p,
                           const int32_t *restrict cs, int8_t *restrict y, const int rows,
                           const int32_t *restrict rq) {{
{calls}
}}

void NAME{SIGNATURE} {{
    const int8_t *restrict A = {a_ptr};
    const int8_t *restrict B = {b_ptr};
    int8_t *restrict Y = (int8_t *)out_;
{param_pointers(("int64_t", "off", offsets), ("int64_t", "packed", pack_off),
                ("int32_t", "which", which_off), ("int32_t", "rq", rq))}
    #pragma omp parallel if({parallel})
    {{
        #pragma omp for schedule(static)
        for (int t = 0; t < {packs * np_}; t++) {{
            const int pk = t / {np_}, j = t % {np_};
            const int8_t *restrict b = B + packed[pk];
            int8_t *restrict p = (int8_t *)(ws + (size_t)pk * {one});
            int32_t *restrict cs = (int32_t *)(ws + (size_t)pk * {one} + {panel});
            if (j >= {n}) {{
                for (int q = 0; q < {kq}; q++) memset(p + ((size_t)q * {np_} + j) * 4, 0, 4);
                cs[j] = 0;
                continue;
            }}
            if ({tail}) for (int q = {k // per_word}; q < {kq}; q++) memset(p + ((size_t)q * {np_} + j) * 4, 0, 4);
            {pack_col.strip()}
        }}{_widen_rows(a_rows, k, kq, packs * one) if wide else ""}
        #pragma omp for schedule(static)
        for (int w = 0; w < {work}; w++) {{
            const int bt = w / {blocks}, rb = w % {blocks};
            {_a_rows(wide, k, kq, mr, packs * one)}
            const int8_t *restrict p = (const int8_t *)(ws + (size_t)which[bt] * {one});
            const int32_t *restrict cs = (const int32_t *)(ws + (size_t)which[bt] * {one} + {panel});
            int8_t *restrict y = Y + (size_t)bt * {m * n} + (size_t)rb * {mr * n};
            const int rows = {m} - rb * {mr} < {mr} ? {m} - rb * {mr} : {mr};
            switch (rows) {{
{_row_cases(mr, "a, p, cs, y, {r}, rq")}
            }}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), shared_bytes=packs * one + a16,
                  macs=macs, items=work if parallel else 1)


def _qmatmul_tile(v: str, vl: int, mr: int, nv: int, kq: int, np_: int, n: int, a_type: str,
                  a_word: str, flip: str, dot: str, corr: str, unroll: str) -> str:
    """C: `_qmatmul`'s register tile, ``NAME_tile``: up to `mr` rows of A by `nv` vectors
    of packed B (`kq` words deep, `np_` packed columns), each row's exact int32 sums
    corrected (`corr`), requantized and clamped into int8 Y (`n` columns); `unroll`
    precedes the reduction loop (`_unroll`)."""
    return f"""VDLA_INLINE void NAME_tile(const {a_type} *restrict a, const int8_t *restrict p,
                           const int32_t *restrict cs, int8_t *restrict y, const int rows,
                           const int nv, const int last, const int32_t *restrict rq) {{
    {v} acc[{mr}][{nv}];
    #pragma GCC unroll {mr}
    for (int r = 0; r < rows; r++)
        #pragma GCC unroll {nv}
        for (int u = 0; u < nv; u++) acc[r][u] = ({v}){{0}};
    {unroll}for (int q = 0; q < {kq}; q++) {{
        {v} bv[{nv}];
        #pragma GCC unroll {nv}
        for (int u = 0; u < nv; u++) bv[u] = {v}_load(p + ((size_t)q * {np_} + u * {vl}) * 4);
        #pragma GCC unroll {mr}
        for (int r = 0; r < rows; r++) {{
            uint32_t xw; {a_word}
            const {v} x = {v}_bcast((int32_t)(xw ^ {flip}));
            #pragma GCC unroll {nv}
            for (int u = 0; u < nv; u++) acc[r][u] = {dot}(acc[r][u], x, bv[u]);
        }}
    }}
    const {v} lo = {v}_bcast(rq[2]), hi = {v}_bcast(rq[3]);
    #pragma GCC unroll {nv}
    for (int u = 0; u < nv; u++) {{
        const {v} corr = {corr};
        #pragma GCC unroll {mr}
        for (int r = 0; r < rows; r++) {{
            {v} t = ({v})((vu{vl})acc[r][u] - (vu{vl})corr);
            t = {v}_rq(t, rq[0], rq[1]);
            t = {v}_max({v}_min(t, hi), lo);
            if (last < {vl} && u == nv - 1) {v}_store_s8_n(y + (size_t)r * {n} + u * {vl}, t, last);
            else {v}_store_s8(y + (size_t)r * {n} + u * {vl}, t);
        }}
    }}
}}"""


def _widen_rows(rows: int, k: int, kq: int, at: int) -> str:
    """C (inside the parallel region): every row of int8 A as ``kq`` int32 words of two
    int16 (the odd k's partner 0), into the scratch space at byte `at`."""
    return f"""
        #pragma omp for schedule(static)
        for (int i = 0; i < {rows}; i++) {{
            const int8_t *restrict ar = A + (size_t)i * {k};
            int16_t *restrict o = (int16_t *)(ws + {at}) + (size_t)i * {2 * kq};
            for (int c = 0; c < {k}; c++) o[c] = ar[c];
            if ({k % 2}) o[{k}] = 0;
        }}"""


def _a_rows(wide: bool, k: int, kq: int, mr: int, at: int) -> str:
    """C: ``a``, the first row of a work item's block of A (wide: of its widened copy;
    A's matrix offsets are whole rows)."""
    if wide:
        return (f"const int32_t *restrict a = (const int32_t *)(ws + {at}) + "
                f"(size_t)(off[bt] / {k} + rb * {mr}) * {kq};")
    return f"const int8_t *restrict a = A + off[bt] + (size_t)rb * {mr * k};"


def _pack_column(k: int, n: int, np_: int, trans: bool, wide: bool = False) -> str:
    """C: column ``j`` of int8 B (read from ``b``; its rows with `trans`) packed into
    ``p`` as ``[K / 4][np_][4]`` bytes, and its sum into ``cs[j]``; `wide`: as
    ``[K / 2][np_][2]`` int16 (the sum unused)."""
    if wide:
        read = f"b[(size_t)j * {k} + c]" if trans else f"b[(size_t)c * {n} + j]"
        return f"""
            int16_t *restrict p16 = (int16_t *)p;
            for (int c = 0; c < {k}; c++)
                p16[((size_t)(c / 2) * {np_} + j) * 2 + c % 2] = {read};
            cs[j] = 0;"""
    if trans:
        pack_col = f"""
            const int8_t *restrict row = b + (size_t)j * {k};
            int32_t s = 0;
            for (int q = 0; q < {k // 4}; q++) {{
                memcpy(p + ((size_t)q * {np_} + j) * 4, row + 4 * q, 4);
                s += row[4 * q] + row[4 * q + 1] + row[4 * q + 2] + row[4 * q + 3];
            }}
            for (int c = {k // 4 * 4}; c < {k}; c++) {{
                p[((size_t)(c / 4) * {np_} + j) * 4 + c % 4] = row[c];
                s += row[c];
            }}
            cs[j] = s;"""
    else:
        pack_col = f"""
            int32_t s = 0;
            for (int c = 0; c < {k}; c++) {{
                const int8_t x = b[(size_t)c * {n} + j];
                p[((size_t)(c / 4) * {np_} + j) * 4 + c % 4] = x;
                s += x;
            }}
            cs[j] = s;"""
    return pack_col
