"""The fused attention of sequence models compiled to C: ``attention`` (float32) and
``qattention`` (int8, bit for bit `vdla.compiler.reference.integer_transformer
.qattention`).

    if attention_refusal(node, graph) is None:
        kernel = attention_kernel(node, graph, isa)

One kernel runs the whole unit: q (..., S, D), k (..., T, D) (not transposed), v (...,
T, Dv), an optional mask broadcast to the scores (..., S, T), and the causal exclusion
(key t > query s + T - S). OpenMP shares (batch x heads x blocks of `step_rows` query
rows); each block goes through:

1. its scores, a register tile of the block's rows by two vectors of keys: ``q . k_t``
   (float32: multiply-adds along D, then ``* scale``; int8: exact int32 sums of int16
   pairs, then ``requantize(qk_multiplier, qk_shift)`` and the clip of the integer
   definition), for the keys the block's last row sees (causal);
2. the softmax of each row (float32: the mask added, max, vector exp, sum, ``1 / sum``;
   int8: `qnorms.SOFTMAX_C`, excluded keys (mask True, causal) left out of the maximum
   and the sum), keys past the row's causal diagonal zeroed;
3. ``p . v``: a register tile of the rows by `pv_vectors` vectors along Dv (int8: two),
   a key (int8: two keys) a step, then (float) each row times its ``1 / sum`` or (int8)
   ``requantize(pv_multiplier, pv_shift)`` and the clip.

Why blocks of rows: one query row at a time reads the head's K and V once per row from
L2 and keeps few accumulators; five to a block, each K and V vector loaded serves five
rows (BERT-base's int8 attention and ViT-tiny's float one 1.7x, ViT-tiny's int8 one
1.4x faster than row by row on an AMD EPYC with AVX2). With AVX-512's 32 registers, six
rows and P.V four vectors wide.

Each tile is a function of its own (`_dispatch`), and K transposed is stored in blocks of
the scores' two vectors of keys, so that a step reads the next 128 bytes (AVX-512: K
transposed whole, 64 x 224 floats for 197 tokens, put the next step's keys 896 bytes
on). On an Intel Xeon with AMX, 2 threads, the four changes together: ViT-tiny's float
attention 1.14x, BERT-base's 1.08x, both int8 ones 1.07x faster (one node, interleaved);
with `vdla_cpu.h`'s exp as multiply-adds, the float ones 1.29x and 1.24x.

Each thread keeps the block's scores (and int8: a row's exponentials, the rows' q and
probabilities as int16 pairs) in its scratch space, with the head's K transposed (int8:
K and V as int16 pairs), made once per batch it meets. Batch axes broadcast (each
operand's offset per output batch is a table in ``params``), as the mask does (its row
and column strides are 0 along a broadcast axis).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import INT8_PRODUCTS_MAX, QuantizationError
from vdla.compiler.reference.integer_transformer import MAX_SOFTMAX_LENGTH, exp_table
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.matmul import batch_offsets
from vdla.compiler.targets.cpu.opbase import PARALLEL_MIN, Sources, size
from vdla.compiler.targets.cpu.qnorms import SOFTMAX_C

__all__ = ["ROWS", "ROWS_32", "attention_kernel", "attention_refusal", "pv_vectors",
           "step_rows"]

#: Query rows a step with 16 vector registers (AVX2): a register tile of 5 rows by two
#: vectors (10 accumulators, two for the keys (or v), one for the broadcast).
ROWS = 5
#: With 32 (AVX-512): 6 rows (P.V's tile of 6 rows by four vectors, `pv_vectors`, takes
#: 29 registers), 1.10x faster than 5 on ViT-tiny's float attention and 1.03x on
#: BERT-base's (Intel Xeon with AMX, 2 threads).
ROWS_32 = 6


def step_rows(isa: Isa) -> int:
    """Query rows a step on `isa`: `ROWS`, or `ROWS_32` with 32 vector registers."""
    return ROWS_32 if isa.registers >= 32 else ROWS


def attention_refusal(node: Node, graph: Graph) -> str | None:
    """float32 ``attention`` or int8 ``qattention`` (bool mask) whose rows fit the
    definitions."""
    t = graph.tensors
    quant = node.op == "qattention"
    want = "int8" if quant else "float32"
    for name in node.inputs[:3]:
        if t[name].dtype != want:
            return (f"{node.op} node {node.name!r}: {name!r} is {t[name].dtype}; the CPU "
                    f"target runs {node.op} on {want}")
    mask = node.input(3)
    if mask and t[mask].dtype != ("bool" if quant else "float32"):
        return (f"{node.op} node {node.name!r}: mask {mask!r} is {t[mask].dtype}; the CPU "
                f"target takes a {'bool' if quant else 'float32'} mask")
    out = t[node.outputs[0]].shape
    if size(out) == 0:
        return f"{node.op} node {node.name!r}: an empty output"
    if not quant:
        return None
    a = node.attrs
    keys, depth = t[node.inputs[1]].shape[-2], t[node.inputs[0]].shape[-1]
    if keys > MAX_SOFTMAX_LENGTH or max(depth, keys) > INT8_PRODUCTS_MAX:
        return f"qattention node {node.name!r}: {keys} keys of depth {depth} are too many"
    try:
        exp_table(node)
    except (QuantizationError, KeyError, TypeError) as e:
        return f"qattention node {node.name!r}: {e}"
    for step in ("qk", "pv"):
        if np.size(a[f"{step}_shift"]) != 1 or np.size(a[f"{step}_multiplier"] or 0) != 1:
            return (f"qattention node {node.name!r}: per-channel {step} requantization; the "
                    "definition is per tensor")
    return None


def _scalar(v, none: int = 0) -> int:
    return none if v is None else int(np.asarray(v).reshape(-1)[0])


def pv_vectors(isa: Isa) -> int:
    """Vectors of Dv in a step of the float P.V tile: four with 32 vector registers
    (`ROWS_32` x 4 accumulators, four of V and the broadcast: 29), so that a head of depth
    64 at 16 lanes is one pass over the probabilities and V instead of two; two with 16
    (AVX2: 13 registers)."""
    return 4 if isa.registers >= 32 else 2


def _operands(node: Node, graph: Graph, views: tuple) -> tuple[list[str], list[np.ndarray],
                                                              list[int]]:
    """The tensors q, k and v are read from, each (b, h) head's offset in them and the
    output's, and the elements from a row to the next of all four: the operands' own
    (numpy broadcasting of batch axes), or their `head_views.HeadView` where `views` has
    one."""
    t = graph.tensors
    shapes = [t[n].shape for n in node.inputs[:3]] + [t[node.outputs[0]].shape]
    batch, k_shape = shapes[3][:-2], shapes[1]
    offsets = [batch_offsets(shape, k_shape, batch)[0] for shape in shapes[:3]]
    offsets.append(np.arange(offsets[0].size) * shapes[3][-2] * shapes[3][-1])
    names, rows = list(node.inputs[:3]), [shape[-1] for shape in shapes]
    for i, view in enumerate(views):
        if view is not None:
            if i < 3:
                names[i] = view.source
            offsets[i], rows[i] = view.offsets(shapes[i]), view.row
    return names, offsets, rows


def attention_kernel(node: Node, graph: Graph, isa: Isa,
                     views: tuple = (None, None, None, None)) -> Kernel:
    """The kernel of a node `attention_refusal` accepts; `views` (q, k, v, output: a
    `HeadView` or None) reads and writes those in place (`head_views`)."""
    t = graph.tensors
    quant = node.op == "qattention"
    q_shape, k_shape, v_shape = (t[n].shape for n in node.inputs[:3])
    out = t[node.outputs[0]].shape
    batch = out[:-2]
    s_len, d = q_shape[-2], q_shape[-1]
    t_len, dv = k_shape[-2], v_shape[-1]
    names, (qoff, koff, voff, yoff), strides = _operands(node, graph, views)
    params = Params()
    sources = Sources(graph, params)
    elem = "int8_t" if quant else "float"
    ptr = [sources.pointer(n, elem) for n in names]
    mask = node.input(3)
    m_decl, m_at, m_row, m_col = "", "", "", 0
    if mask:
        m_shape = (1,) * (len(batch) + 2 - len(t[mask].shape)) + tuple(t[mask].shape)
        moff, _ = batch_offsets(m_shape, k_shape, batch)
        row = m_shape[-1] if m_shape[-2] > 1 else 0
        col = 1 if m_shape[-1] > 1 else 0
        m_type = "uint8_t" if quant else "float"
        m_decl = (f"const {m_type} *restrict M = {sources.pointer(mask, m_type)};\n"
                  f"    const int64_t *restrict moff = (const int64_t *)(params + "
                  f"{params.add(moff)});")
        m_row, m_col = f"(M + moff[bt] + (size_t)i * {row})", col
        m_at = f"{m_row}[(size_t)j * {col}]"
    tables = params.add(np.stack([qoff, koff, voff, yoff]).astype(np.int64))
    batches = qoff.size
    step = step_rows(isa)
    blocks = -(-s_len // step)
    work = batches * blocks
    causal = bool(node.attrs.get("causal"))
    last = (f"(i + {t_len - s_len} < {t_len - 1} ? i + {t_len - s_len} : {t_len - 1})"
            if causal else str(t_len - 1))
    macs = batches * s_len * t_len * (d + dv)
    parallel = 1 if work > 1 and macs >= PARALLEL_MIN else 0
    what = (f" mask {t[mask].shape}" if mask else "") + (" causal" if causal else "")
    shape = _Shape(d, dv, t_len, isa.lanes[0], *strides, pv_vectors(isa), step)
    if quant:
        blocks_c, row_c, scratch, decls = _int_rows(node, shape, params, m_at)
    else:
        blocks_c, row_c, scratch, decls = _float_rows(node, shape, params, m_at,
                                                      (m_row, m_col))
    body = f"""
/* the last key query row i sees */
VDLA_INLINE int NAME_last(const int i) {{ (void)i; return {last}; }}
{blocks_c}
/* {node.op} q {q_shape} k {k_shape} v {v_shape}{what} -> {out}; {step} query rows a step */
void NAME{SIGNATURE} {{
    const {elem} *restrict Q = {ptr[0]};
    const {elem} *restrict K = {ptr[1]};
    const {elem} *restrict V = {ptr[2]};
    {m_decl}
{decls}    const int64_t *restrict off = (const int64_t *)(params + {tables});
    {elem} *restrict Y = ({elem} *)out_;
    #pragma omp parallel if({parallel})
    {{
    int have = -1;     /* the batch whose K (and int8: V) this thread holds rearranged */
    #pragma omp for schedule(static)
    for (int w = 0; w < {work}; w++) {{
        const int bt = w / {blocks}, i0 = (w % {blocks}) * {step};
        const int rows = vdla_min({step}, {s_len} - i0);
        const {elem} *restrict q = Q + off[bt] + (size_t)i0 * {shape.qs};
        const {elem} *restrict k = K + off[{batches} + bt];
        const {elem} *restrict vv = V + off[{2 * batches} + bt];
        {elem} *restrict y = Y + off[{3 * batches} + bt] + (size_t)i0 * {shape.ys};
        unsigned char *restrict mine = ws + (size_t)omp_get_thread_num() * {scratch};
        /* keys any row of the block sees (causal: the last row's) */
        const int keys = 1 + NAME_last(i0 + rows - 1);
{row_c}
    }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), thread_bytes=scratch,
                  macs=macs, items=work if parallel else 1)


@dataclasses.dataclass(frozen=True)
class _Shape:
    """One head's sizes: ``d`` (q and k's depth), ``dv`` (v's), ``t`` keys, ``vl`` lanes;
    the elements from one row of q, k, v and the output to the next (``qs``, ``ks``,
    ``vs``, ``ys``: `_operands`); ``nv`` vectors of P.V's tile (`pv_vectors`), ``rows``
    query rows a step (`step_rows`). ``tp``: keys padded to a step of the scores'
    register tile (two vectors)."""

    d: int
    dv: int
    t: int
    vl: int
    qs: int
    ks: int
    vs: int
    ys: int
    nv: int
    rows: int

    @property
    def tp(self) -> int:
        return -(-self.t // (2 * self.vl)) * 2 * self.vl


def _dispatch(fn: str, params: str, most: int) -> str:
    """C: ``NAME_{fn}_rows(params)``, which calls the register tile ``NAME_{fn}`` with the
    block's row count (1 to `most`) a constant, so that its loops over rows unroll.

    It is a function of its own (never inlined) so that the tile has the registers to
    itself: inlined into the block's loop, gcc kept the softmax's exp constants in
    registers across the tile and spilled one of P.V's accumulators to the stack on
    AVX-512 (a store and a reload in each step's chain of multiply-adds)."""
    names = [part.split()[-1] for part in params.split(",")]
    cases = " ".join(
        f"case {r}: NAME_{fn}({', '.join(str(r) if n == 'rows' else n for n in names)}); "
        "break;" for r in range(1, most + 1))
    return (f"static __attribute__((noinline)) void NAME_{fn}_rows({params}) {{\n"
            f"    switch (rows) {{ {cases} }}\n}}\n")


def _float_products(sh: _Shape) -> str:
    """C: the float block's two register tiles, ``NAME_qk`` (the scores) and ``NAME_pv``
    (the probabilities times v, Dv in steps of ``sh.nv`` vectors, then one vector at a
    time, then single columns)."""
    vl, d, dv, tp, nv = sh.vl, sh.d, sh.dv, sh.tp, sh.nv
    v = f"vf{vl}"
    full = dv // (nv * vl) * nv * vl        # columns of whole steps of nv vectors
    rest = ""
    if dv - full >= vl:                     # more whole vectors of columns, one a step
        rest += f"""
    for (int c0 = {full}; c0 + {vl} <= {dv}; c0 += {vl}) {{
        {v} acc[{sh.rows}];
        for (int r = 0; r < rows; r++) acc[r] = ({v}){{0}};
        for (int j = 0; j < keys; j++) {{
            {v} v0 = {v}_load(vv + (size_t)j * {sh.vs} + c0); VDLA_IN_REGISTER(v0);
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) acc[r] = {v}_fma({v}_bcast(s[(size_t)r * {tp} + j]), v0, acc[r]);
        }}
        for (int r = 0; r < rows; r++) {v}_store(y + (size_t)r * {sh.ys} + c0, acc[r] * {v}_bcast(inv[r]));
    }}"""
    if dv % vl:                             # the last columns, one at a time
        rest += f"""
    for (int r = 0; r < rows; r++)
        for (int c = {dv - dv % vl}; c < {dv}; c++) {{
            float a = 0;
            for (int j = 0; j < keys; j++) a += s[(size_t)r * {tp} + j] * vv[(size_t)j * {sh.vs} + c];
            y[(size_t)r * {sh.ys} + c] = a * inv[r];
        }}"""
    functions = f"""
/* the scores of `rows` query rows (q: rows x {d}, rows {sh.qs} apart) by the keys (kt: K
   transposed in blocks of {2 * vl} keys, {tp // (2 * vl)} x {d} x {2 * vl}) up to `keys`, times
   the scale, into s (rows x {tp}) */
VDLA_INLINE void NAME_qk(const float *restrict q, const float *restrict kt,
                         float *restrict s, const int keys, const int rows, const float scale) {{
    for (int jb = 0; jb < keys; jb += {2 * vl}) {{
        {v} acc[{sh.rows}][2];
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = ({v}){{0}};
        for (int c = 0; c < {d}; c++) {{
            const float *restrict kc = kt + (size_t)jb * {d} + c * {2 * vl};
            {v} k0 = {v}_load(kc), k1 = {v}_load(kc + {vl});
            VDLA_IN_REGISTER(k0); VDLA_IN_REGISTER(k1);
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {v} qb = {v}_bcast(q[(size_t)r * {sh.qs} + c]);
                acc[r][0] = {v}_fma(qb, k0, acc[r][0]);
                acc[r][1] = {v}_fma(qb, k1, acc[r][1]);
            }}
        }}
        const {v} sb = {v}_bcast(scale);    /* (after the loop: its registers are taken) */
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {{
            {v}_store(s + (size_t)r * {tp} + jb, acc[r][0] * sb);
            {v}_store(s + (size_t)r * {tp} + jb + {vl}, acc[r][1] * sb);
        }}
    }}
}}

/* y (rows x {dv}) = the probabilities s (rows x {tp}, keys past `keys` unread) times
   v ({dv} columns a key, keys {sh.vs} apart), each row times its inv (rows {sh.ys} apart) */
VDLA_INLINE void NAME_pv(const float *restrict s, const float *restrict vv,
                         float *restrict y, const float *restrict inv, const int keys,
                         const int rows) {{
    for (int c0 = 0; c0 < {full}; c0 += {nv * vl}) {{
        {v} acc[{sh.rows}][{nv}];
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++)
            for (int u = 0; u < {nv}; u++) acc[r][u] = ({v}){{0}};
        for (int j = 0; j < keys; j++) {{
            const float *restrict vj = vv + (size_t)j * {sh.vs} + c0;
            {v} vw[{nv}];
            for (int u = 0; u < {nv}; u++) {{ vw[u] = {v}_load(vj + u * {vl}); VDLA_IN_REGISTER(vw[u]); }}
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {v} pb = {v}_bcast(s[(size_t)r * {tp} + j]);
                for (int u = 0; u < {nv}; u++) acc[r][u] = {v}_fma(pb, vw[u], acc[r][u]);
            }}
        }}
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {{
            const {v} ib = {v}_bcast(inv[r]);
            for (int u = 0; u < {nv}; u++) {v}_store(y + (size_t)r * {sh.ys} + c0 + u * {vl}, acc[r][u] * ib);
        }}
    }}{rest}
}}
"""
    return functions + _dispatch("qk", _FLOAT_QK, sh.rows) + _dispatch("pv", _FLOAT_PV, sh.rows)


#: The float tiles' parameters (`_dispatch`).
_FLOAT_QK = ("const float *restrict q, const float *restrict kt, float *restrict s, "
             "const int keys, const int rows, const float scale")
_FLOAT_PV = ("const float *restrict s, const float *restrict vv, float *restrict y, "
             "const float *restrict inv, const int keys, const int rows")


def _float_rows(node: Node, sh: _Shape, params: Params, m_at: str,
                mask_row: tuple[str, int]) -> tuple[str, str, int, str]:
    """(C functions of the block's two products, C of one block of query rows (module
    docstring), its scratch bytes per thread, its declarations before the loop); `m_at`
    reads the mask at row ``i``, key ``j``. A thread first copies the batch's K
    transposed, padded to `_Shape.tp` keys, in blocks of the tile's two vectors of keys
    (each ``D`` x ``2 * vl``), into its scratch (once per batch it meets: its blocks are
    consecutive), so that the scores are a register tile of `step_rows` rows by two
    vectors of keys, ``D`` multiply-adds a step and no horizontal sums; P.V is a tile of
    rows by `pv_vectors` vectors along Dv, a key a step."""
    vl, d, tp = sh.vl, sh.d, sh.tp
    v = f"vf{vl}"
    scale = params.add(np.array([float(node.attrs["scale"])], np.float32))
    add_mask = f"sr[j] += {m_at}; " if m_at else ""
    # the mask's keys (`mask_row`: the row's C pointer, the keys' stride): consecutive (a
    # vector load), or one value for the row (a broadcast)
    m_row, m_col = mask_row
    vector_mask = ""
    if m_at:
        vector_mask = (f"x += {v}_load({m_row} + j);" if m_col else
                       f"x += {v}_bcast({m_row}[0]);")
    functions = _float_products(sh)
    decls = f"    const float scale = *(const float *)(params + {scale});\n"
    row = f"""        float *restrict s = (float *)mine;
        float *restrict kt = (float *)(mine + {align(4 * sh.rows * tp)});
        float inv[{sh.rows}];
        if (have != bt) {{
            /* in blocks of {2 * vl} keys, each ({d}, {2 * vl}): a step of the scores' tile
               reads the next {8 * vl} bytes */
            for (int j = 0; j < {tp}; j++)
                for (int c = 0; c < {d}; c++)
                    kt[(size_t)(j / {2 * vl}) * {2 * vl * d} + c * {2 * vl} + j % {2 * vl}] =
                        j < {sh.t} ? k[(size_t)j * {sh.ks} + c] : 0;
            have = bt;
        }}
        NAME_qk_rows(q, kt, s, keys, rows, scale);
        for (int r = 0; r < rows; r++) {{
            const int i = i0 + r, last = NAME_last(i);
            float *restrict sr = s + (size_t)r * {tp};
            float m = -INFINITY;
            {{   /* the mask added and the maximum taken, a vector of keys at a time */
                {v} mv = {v}_bcast(-INFINITY);
                int j = 0;
                for (; j + {vl} <= last + 1; j += {vl}) {{
                    {v} x = {v}_load(sr + j);
                    {vector_mask}
                    {v}_store(sr + j, x);
                    mv = {v}_max(mv, x);
                }}
                for (int l = 0; l < {vl}; l++) m = mv[l] > m ? mv[l] : m;
                for (; j <= last; j++) {{ {add_mask}m = sr[j] > m ? sr[j] : m; }}
            }}
            const {v} mb = {v}_bcast(m);
            {v} sv = {{0}};
            int j = 0;
            for (; j + {vl} <= last + 1; j += {vl}) {{
                const {v} e = {v}_exp({v}_load(sr + j) - mb);
                {v}_store(sr + j, e);
                sv += e;
            }}
            if (j <= last) {{
                const {v} e = {v}_exp({v}_load_n(sr + j, last + 1 - j) - mb);
                {v}_store_n(sr + j, e, last + 1 - j);
                for (int l = 0; l < last + 1 - j; l++) sv[l] += e[l];
            }}
            for (j = last + 1; j < keys; j++) sr[j] = 0;   /* past this row's diagonal */
            float sum = 0;
            for (int l = 0; l < {vl}; l++) sum += sv[l];
            inv[r] = 1.0f / sum;
        }}
        NAME_pv_rows(s, vv, y, inv, keys, rows);"""
    return functions, row, align(4 * sh.rows * tp) + align(4 * d * tp), decls


def _int_products(sh: _Shape, rqv: list[int]) -> str:
    """C: the int8 block's two register tiles, ``NAME_qk`` (the scores, requantized by
    ``rqv[0:4]``) and ``NAME_pv`` (the probabilities times v, by ``rqv[4:8]``)."""
    vl, d, dv, t_len, tp = sh.vl, sh.d, sh.dv, sh.t, sh.tp
    v = f"vi{vl}"
    d2, t2 = -(-d // 2), -(-t_len // 2)
    dvp = -(-dv // (2 * vl)) * 2 * vl
    functions = f"""
/* the int8 scores of `rows` query rows (qw: rows x {d2} pairs) by the keys (kt: in
   blocks of {2 * vl} keys, {tp // (2 * vl)} x {d2} pairs x {2 * vl}) up to `keys`,
   requantized and clipped, into sc (rows x {tp}) */
VDLA_INLINE void NAME_qk(const uint32_t *restrict qw, const uint32_t *restrict kt,
                         int8_t *restrict sc, const int keys, const int rows) {{
    for (int jb = 0; jb < keys; jb += {2 * vl}) {{
        {v} acc[{sh.rows}][2];
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = ({v}){{0}};
        for (int c = 0; c < {d2}; c++) {{
            const uint32_t *restrict kc = kt + (size_t)jb * {d2} + c * {2 * vl};
            {v} k0 = {v}_load(kc), k1 = {v}_load(kc + {vl});
            VDLA_IN_REGISTER(k0); VDLA_IN_REGISTER(k1);
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {v} qb = {v}_bcast((int32_t)qw[(size_t)r * {d2} + c]);
                acc[r][0] = {v}_madd16(acc[r][0], qb, k0);
                acc[r][1] = {v}_madd16(acc[r][1], qb, k1);
            }}
        }}
        /* (the bounds made here, not before the loop: its 15 registers are taken) */
        const {v} lo = {v}_bcast({rqv[2]}), hi = {v}_bcast({rqv[3]});
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {{  /* (no loop over the two: acc stays in registers) */
            {v}_store_s8(sc + (size_t)r * {tp} + jb,
                         {v}_max({v}_min({v}_rq(acc[r][0], {rqv[0]}, {rqv[1]}), hi), lo));
            {v}_store_s8(sc + (size_t)r * {tp} + jb + {vl},
                         {v}_max({v}_min({v}_rq(acc[r][1], {rqv[0]}, {rqv[1]}), hi), lo));
        }}
    }}
}}

/* the int8 lanes of o to columns c.. of an output row (those before {dv}) */
VDLA_INLINE void NAME_put(int8_t *restrict y, const int c, const {v} o) {{
    if (c + {vl} <= {dv}) {v}_store_s8(y + c, o);
    else if (c < {dv}) {v}_store_s8_n(y + c, o, {dv} - c);
}}

/* y (rows x {dv}) = the probabilities (pw: rows x {t2} pairs of keys, the first `pairs`
   read) times v (vt: {t2} pairs of keys x {dvp} columns), requantized and clipped */
VDLA_INLINE void NAME_pv(const uint32_t *restrict pw, const uint32_t *restrict vt,
                         int8_t *restrict y, const int pairs, const int rows) {{
    for (int c0 = 0; c0 < {dvp}; c0 += {2 * vl}) {{
        {v} acc[{sh.rows}][2];
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = ({v}){{0}};
        for (int j = 0; j < pairs; j++) {{
            const uint32_t *restrict vj = vt + (size_t)j * {dvp} + c0;
            {v} v0 = {v}_load(vj), v1 = {v}_load(vj + {vl});
            VDLA_IN_REGISTER(v0); VDLA_IN_REGISTER(v1);
            #pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {{
                const {v} pb = {v}_bcast((int32_t)pw[(size_t)r * {t2} + j]);
                acc[r][0] = {v}_madd16(acc[r][0], pb, v0);
                acc[r][1] = {v}_madd16(acc[r][1], pb, v1);
            }}
        }}
        const {v} lo = {v}_bcast({rqv[6]}), hi = {v}_bcast({rqv[7]});
        #pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {{  /* (no loop over the two: acc stays in registers) */
            NAME_put(y + (size_t)r * {sh.ys}, c0, {v}_max({v}_min({v}_rq(acc[r][0], {rqv[4]}, {rqv[5]}), hi), lo));
            NAME_put(y + (size_t)r * {sh.ys}, c0 + {vl}, {v}_max({v}_min({v}_rq(acc[r][1], {rqv[4]}, {rqv[5]}), hi), lo));
        }}
    }}
}}
"""
    return functions + _dispatch("qk", _INT_QK, sh.rows) + _dispatch("pv", _INT_PV, sh.rows)


#: The int8 tiles' parameters (`_dispatch`).
_INT_QK = ("const uint32_t *restrict qw, const uint32_t *restrict kt, int8_t *restrict sc, "
           "const int keys, const int rows")
_INT_PV = ("const uint32_t *restrict pw, const uint32_t *restrict vt, int8_t *restrict y, "
           "const int pairs, const int rows")


def _int_rows(node: Node, sh: _Shape, params: Params,
              m_at: str) -> tuple[str, str, int, str]:
    """(C functions of the block's two products, C of one block of int8 query rows
    (module docstring), its scratch bytes per thread, its declarations before the loop).
    A thread holds the batch's K and V as pairs of int16 in 32-bit lanes (K: ``[keys /
    2 vl][D / 2][2 vl]``, the float K's blocks; V: ``[keys / 2][Dv]``; zeros past the
    ends), made once per batch it
    meets, so both products are register tiles of `step_rows` rows by two vectors of
    `vdla_cpu.h`'s exact ``madd16`` (AVX2 ``vpmaddwd``): the scores along keys, P.V
    along Dv with two keys a step."""
    a = node.attrs
    vl, d, dv, t_len, tp = sh.vl, sh.d, sh.dv, sh.t, sh.tp
    tab = params.add(exp_table(node).astype(np.int32))
    # The requantizations' constants are written into the C: with them literal, gcc
    # drops vdla_rq's branches, which would otherwise push the register tiles' 12
    # accumulators to the stack.
    rqv = [_scalar(a["qk_multiplier"]), _scalar(a["qk_shift"]), int(a["qk_out_min"]),
           int(a["qk_out_max"]), _scalar(a["pv_multiplier"]), _scalar(a["pv_shift"]),
           int(a["pv_out_min"]), int(a["pv_out_max"])]
    d2, t2 = -(-d // 2), -(-t_len // 2)
    dvp = -(-dv // (2 * vl)) * 2 * vl       # columns, padded to steps of two vectors
    parts = {"sc": align(sh.rows * tp), "e": align(4 * t_len), "qw": align(4 * sh.rows * d2),
             "pw": align(4 * sh.rows * t2), "kt": align(4 * d2 * tp), "vt": align(4 * t2 * dvp)}
    at, offsets = 0, {}
    for name, size_ in parts.items():
        offsets[name] = at
        at += size_
    keep = "(j <= last)" + (f" & !{m_at}" if m_at else "")   # 0 or 1, no branch
    softmax = SOFTMAX_C.format(length=t_len, keep=keep, x="x", e="e", tab="tab", y="x",
                               k=int(a["softmax_params"]["prob_bits"]))
    decls = (f"    const int32_t *restrict tab = (const int32_t *)(params + {tab});\n"
             )
    pair = "(uint32_t)(uint16_t)(int16_t)({lo}) | (uint32_t)(uint16_t)(int16_t)({hi}) << 16"
    functions = _int_products(sh, rqv)
    row = f"""        int8_t *restrict sc = (int8_t *)(mine + {offsets['sc']});
        int32_t *restrict e = (int32_t *)(mine + {offsets['e']});
        uint32_t *restrict qw = (uint32_t *)(mine + {offsets['qw']});
        uint32_t *restrict pw = (uint32_t *)(mine + {offsets['pw']});
        uint32_t *restrict kt = (uint32_t *)(mine + {offsets['kt']});
        uint32_t *restrict vt = (uint32_t *)(mine + {offsets['vt']});
        if (have != bt) {{
            for (int j = 0; j < {tp}; j++)      /* blocks of {2 * vl} keys, as the float kt */
                for (int c = 0; c < {d2}; c++)
                    kt[(size_t)(j / {2 * vl}) * {2 * vl * d2} + c * {2 * vl} + j % {2 * vl}] =
                        j >= {t_len} ? 0 : {pair.format(
                        lo=f"k[(size_t)j * {sh.ks} + 2 * c]",
                        hi=f"2 * c + 1 < {d} ? k[(size_t)j * {sh.ks} + 2 * c + 1] : 0")};
            for (int j = 0; j < {t2}; j++)
                for (int c = 0; c < {dvp}; c++)
                    vt[j * {dvp} + c] = c >= {dv} ? 0 : {pair.format(
                        lo=f"vv[(size_t)(2 * j) * {sh.vs} + c]",
                        hi=f"2 * j + 1 < {t_len} ? vv[(size_t)(2 * j + 1) * {sh.vs} + c] : 0")};
            have = bt;
        }}
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < {d2}; c++)
                qw[r * {d2} + c] = {pair.format(
                    lo=f"q[(size_t)r * {sh.qs} + 2 * c]",
                    hi=f"2 * c + 1 < {d} ? q[(size_t)r * {sh.qs} + 2 * c + 1] : 0")};
        NAME_qk_rows(qw, kt, sc, keys, rows);
        for (int r = 0; r < rows; r++) {{
            const int i = i0 + r, last = NAME_last(i);
            int8_t *restrict x = sc + (size_t)r * {tp};   /* probabilities replace scores */
            {softmax}
            for (int j = 0; j < {t2}; j++)
                pw[r * {t2} + j] = {pair.format(lo="x[2 * j]",
                                                hi=f"2 * j + 1 < {t_len} ? x[2 * j + 1] : 0")};
        }}
        NAME_pv_rows(pw, vt, y, (keys + 1) / 2, rows);"""
    return functions, row, at, decls
