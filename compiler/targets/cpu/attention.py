"""The fused attention of sequence models compiled to C: ``attention`` (float32) and
``qattention`` (int8, bit for bit `vdla.compiler.reference.integer_transformer
.qattention`).

    if attention_refusal(node, graph) is None:
        kernel = attention_kernel(node, graph, isa)

One kernel runs the whole unit: q (..., S, D), k (..., T, D) (not transposed), v (...,
T, Dv), an optional mask broadcast to the scores (..., S, T), and the causal exclusion
(key t > query s + T - S). OpenMP shares (batch x heads x query rows); each query row
goes through:

1. its T scores: ``q . k_t`` (float32: vector multiply-adds along D, then
   ``* scale + mask``; int8: exact int32 sums, then ``requantize(qk_multiplier,
   qk_shift)`` and the clip of the integer definition), keys past the causal diagonal
   skipped (float: -inf);
2. the softmax of the row (float32: max, vector exp, sum, ``1 / sum``; int8:
   `qnorms.SOFTMAX_C`, excluded keys (mask True, causal) left out of the maximum and
   the sum);
3. ``p . v``: the probabilities times v's rows, summed in vectors along Dv (int8: int32
   sums, keys whose probability is 0 skipped, exact), then (int8) ``requantize(
   pv_multiplier, pv_shift)`` and the clip.

Each thread keeps one row of scores (and int8: the row's exponentials and Dv sums) in
its scratch space. Batch axes broadcast (each operand's offset per output batch is a
table in ``params``), as the mask does (its row and column strides are 0 along a
broadcast axis).
"""

from __future__ import annotations

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

__all__ = ["attention_kernel", "attention_refusal"]


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


def attention_kernel(node: Node, graph: Graph, isa: Isa) -> Kernel:
    """The kernel of a node `attention_refusal` accepts."""
    t = graph.tensors
    quant = node.op == "qattention"
    q_shape, k_shape, v_shape = (t[n].shape for n in node.inputs[:3])
    out = t[node.outputs[0]].shape
    batch = out[:-2]
    s_len, d = q_shape[-2], q_shape[-1]
    t_len, dv = k_shape[-2], v_shape[-1]
    qoff, koff = batch_offsets(q_shape, k_shape, batch)
    voff, _ = batch_offsets(v_shape, k_shape, batch)
    params = Params()
    sources = Sources(graph, params)
    elem = "int8_t" if quant else "float"
    ptr = [sources.pointer(n, elem) for n in node.inputs[:3]]
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
    tables = params.add(np.stack([qoff, koff, voff]).astype(np.int64))
    batches = qoff.size
    work = batches * s_len
    causal = bool(node.attrs.get("causal"))
    last = f"(i + {t_len - s_len} < {t_len - 1} ? i + {t_len - s_len} : {t_len - 1})" \
        if causal else str(t_len - 1)
    macs = batches * s_len * t_len * (d + dv)
    parallel = 1 if work > 1 and macs >= PARALLEL_MIN else 0
    what = (f" mask {t[mask].shape}" if mask else "") + (" causal" if causal else "")
    if quant:
        row_c, scratch, decls = _int_row(node, isa, params, d, dv, t_len, m_at)
    else:
        row_c, scratch, decls = _float_row(node, isa, params, d, dv, t_len, m_at,
                                           (m_row, m_col))
    body = f"""
/* {node.op} q {q_shape} k {k_shape} v {v_shape}{what} -> {out} */
void NAME{SIGNATURE} {{
    const {elem} *restrict Q = {ptr[0]};
    const {elem} *restrict K = {ptr[1]};
    const {elem} *restrict V = {ptr[2]};
    {m_decl}
{decls}    const int64_t *restrict off = (const int64_t *)(params + {tables});
    {elem} *restrict Y = ({elem} *)out_;
    #pragma omp parallel if({parallel})
    {{
    int have = -1;     /* the batch whose K this thread holds transposed (float) */
    (void)have;
    #pragma omp for schedule(static)
    for (int w = 0; w < {work}; w++) {{
        const int bt = w / {s_len}, i = w % {s_len};
        const {elem} *restrict q = Q + off[bt] + (size_t)i * {d};
        const {elem} *restrict k = K + off[{batches} + bt];
        const {elem} *restrict vv = V + off[{2 * batches} + bt];
        {elem} *restrict y = Y + ((size_t)bt * {s_len} + i) * {dv};
        const int last = {last};
        unsigned char *restrict mine = ws + (size_t)omp_get_thread_num() * {scratch};
{row_c}
    }}
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), thread_bytes=scratch,
                  macs=macs, items=work if parallel else 1)


def _float_row(node: Node, isa: Isa, params: Params, d: int, dv: int, t_len: int,
               m_at: str, mask_row: tuple[str, int]) -> tuple[str, int, str]:
    """(C of one float32 query row (module docstring), its scratch bytes per thread, its
    declarations before the loop); `m_at` reads the mask at key ``j``. A thread first
    copies the batch's K transposed, (D, T) padded to whole vectors of keys, into its
    scratch (once per batch it meets: its rows are consecutive), so the scores are
    vectors of keys: ``D`` multiply-adds per ``vl`` keys and no horizontal sums."""
    vl = isa.lanes[0]
    v = f"vf{vl}"
    scale = params.add(np.array([float(node.attrs["scale"])], np.float32))
    tp = -(-t_len // vl) * vl
    fv, tv = divmod(dv, vl)
    add_mask = f"s[j] += {m_at}; " if m_at else ""
    # the mask's keys (`mask_row`: the row's C pointer, the keys' stride): consecutive (a
    # vector load), or one value for the row (a broadcast)
    m_row, m_col = mask_row
    vector_mask = ""
    if m_at:
        vector_mask = (f"x += {v}_load({m_row} + j);" if m_col else
                       f"x += {v}_bcast({m_row}[0]);")
    decls = f"    const float scale = *(const float *)(params + {scale});\n"
    row = f"""        float *restrict s = (float *)mine;
        float *restrict kt = (float *)(mine + {align(4 * tp)});
        if (have != bt) {{
            for (int c = 0; c < {d}; c++) {{
                for (int j = 0; j < {t_len}; j++) kt[c * {tp} + j] = k[(size_t)j * {d} + c];
                for (int j = {t_len}; j < {tp}; j++) kt[c * {tp} + j] = 0;
            }}
            have = bt;
        }}
        const {v} sb = {v}_bcast(scale);
        int jb = 0;
        for (; jb + {4 * vl} <= last + 1; jb += {4 * vl}) {{     /* four vectors of keys */
            {v} a0 = {{0}}, a1 = {{0}}, a2 = {{0}}, a3 = {{0}};
            for (int c = 0; c < {d}; c++) {{
                const {v} qc = {v}_bcast(q[c]);
                const float *restrict kc = kt + c * {tp} + jb;
                a0 = {v}_fma(qc, {v}_load(kc), a0);
                a1 = {v}_fma(qc, {v}_load(kc + {vl}), a1);
                a2 = {v}_fma(qc, {v}_load(kc + {2 * vl}), a2);
                a3 = {v}_fma(qc, {v}_load(kc + {3 * vl}), a3);
            }}
            {v}_store(s + jb, a0 * sb); {v}_store(s + jb + {vl}, a1 * sb);
            {v}_store(s + jb + {2 * vl}, a2 * sb); {v}_store(s + jb + {3 * vl}, a3 * sb);
        }}
        for (; jb <= last; jb += {vl}) {{
            {v} acc = {{0}};
            for (int c = 0; c < {d}; c++) acc = {v}_fma({v}_bcast(q[c]), {v}_load(kt + c * {tp} + jb), acc);
            {v}_store(s + jb, acc * sb);
        }}
        float m = -INFINITY;
        {{   /* the mask added and the maximum taken, a vector of keys at a time */
            {v} mv = {v}_bcast(-INFINITY);
            int j = 0;
            for (; j + {vl} <= last + 1; j += {vl}) {{
                {v} x = {v}_load(s + j);
                {vector_mask}
                {v}_store(s + j, x);
                mv = {v}_max(mv, x);
            }}
            for (int l = 0; l < {vl}; l++) m = mv[l] > m ? mv[l] : m;
            for (; j <= last; j++) {{ {add_mask}m = s[j] > m ? s[j] : m; }}
        }}
        const {v} mb = {v}_bcast(m);
        {v} sv = {{0}};
        int j = 0;
        for (; j + {vl} <= last + 1; j += {vl}) {{
            const {v} e = {v}_exp({v}_load(s + j) - mb);
            {v}_store(s + j, e);
            sv += e;
        }}
        if (j <= last) {{
            const {v} e = {v}_exp({v}_load_n(s + j, last + 1 - j) - mb);
            {v}_store_n(s + j, e, last + 1 - j);
            for (int l = 0; l < last + 1 - j; l++) sv[l] += e[l];
        }}
        float sum = 0;
        for (int l = 0; l < {vl}; l++) sum += sv[l];
        const float inv = 1.0f / sum;
        {v} acc[{max(fv, 1)}];
        for (int c = 0; c < {fv}; c++) acc[c] = ({v}){{0}};
        float rest[{max(tv, 1)}] = {{0}};
        for (int j = 0; j <= last; j++) {{
            const {v} p = {v}_bcast(s[j]);
            const float *restrict vj = vv + (size_t)j * {dv};
            for (int c = 0; c < {fv}; c++) acc[c] = {v}_fma(p, {v}_load(vj + c * {vl}), acc[c]);
            for (int c = 0; c < {tv}; c++) rest[c] += s[j] * vj[{fv * vl} + c];
        }}
        const {v} ib = {v}_bcast(inv);
        for (int c = 0; c < {fv}; c++) {v}_store(y + c * {vl}, acc[c] * ib);
        for (int c = 0; c < {tv}; c++) y[{fv * vl} + c] = rest[c] * inv;"""
    return row, align(4 * tp) + align(4 * d * tp), decls


def _int_row(node: Node, isa: Isa, params: Params, d: int, dv: int, t_len: int,
             m_at: str) -> tuple[str, int, str]:
    """(C of one int8 query row (module docstring), its scratch bytes per thread, its
    declarations before the loop). A thread holds the batch's K and V as pairs of int16
    in 32-bit lanes (K: ``[D / 2][keys]``, V: ``[keys / 2][Dv]``, zeros past the ends),
    made once per batch it meets, so both products are `vdla_cpu.h`'s exact ``madd16``
    on vectors (AVX2 ``vpmaddwd``): the scores as vectors of keys, P.V as vectors along
    Dv with two keys a step."""
    a = node.attrs
    vl = isa.lanes[0]
    v = f"vi{vl}"
    tab = params.add(exp_table(node).astype(np.int32))
    rq = params.add(np.array([_scalar(a["qk_multiplier"]), _scalar(a["qk_shift"]),
                              int(a["qk_out_min"]), int(a["qk_out_max"]),
                              _scalar(a["pv_multiplier"]), _scalar(a["pv_shift"]),
                              int(a["pv_out_min"]), int(a["pv_out_max"])], np.int32))
    tp = -(-t_len // vl) * vl               # keys, padded to whole vectors
    d2, t2 = -(-d // 2), -(-t_len // 2)
    dvp = -(-dv // vl) * vl
    fv = dvp // vl
    parts = {"sc": align(tp + 1), "e": align(4 * t_len), "qw": align(4 * d2),
             "kt": align(4 * d2 * tp), "vt": align(4 * t2 * dvp)}
    at, offsets = 0, {}
    for name, size_ in parts.items():
        offsets[name] = at
        at += size_
    keep = "j <= last" + (f" && !{m_at}" if m_at else "")
    softmax = SOFTMAX_C.format(length=t_len, keep=keep, x="sc", e="e", tab="tab", y="p",
                               k=int(a["softmax_params"]["prob_bits"]))
    decls = (f"    const int32_t *restrict tab = (const int32_t *)(params + {tab});\n"
             f"    const int32_t *restrict rq = (const int32_t *)(params + {rq});\n")
    pair = "(uint32_t)(uint16_t)(int16_t)({lo}) | (uint32_t)(uint16_t)(int16_t)({hi}) << 16"
    row = f"""        int8_t *sc = (int8_t *)(mine + {offsets['sc']});
        int32_t *restrict e = (int32_t *)(mine + {offsets['e']});
        uint32_t *restrict qw = (uint32_t *)(mine + {offsets['qw']});
        uint32_t *restrict kt = (uint32_t *)(mine + {offsets['kt']});
        uint32_t *restrict vt = (uint32_t *)(mine + {offsets['vt']});
        int8_t *p = sc;     /* the probabilities replace the scores */
        if (have != bt) {{
            for (int c = 0; c < {d2}; c++)
                for (int j = 0; j < {tp}; j++)
                    kt[c * {tp} + j] = j >= {t_len} ? 0 : {pair.format(
                        lo=f"k[(size_t)j * {d} + 2 * c]",
                        hi=f"2 * c + 1 < {d} ? k[(size_t)j * {d} + 2 * c + 1] : 0")};
            for (int j = 0; j < {t2}; j++)
                for (int c = 0; c < {dvp}; c++)
                    vt[j * {dvp} + c] = c >= {dv} ? 0 : {pair.format(
                        lo=f"vv[(size_t)(2 * j) * {dv} + c]",
                        hi=f"2 * j + 1 < {t_len} ? vv[(size_t)(2 * j + 1) * {dv} + c] : 0")};
            have = bt;
        }}
        for (int c = 0; c < {d2}; c++)
            qw[c] = {pair.format(lo="q[2 * c]", hi=f"2 * c + 1 < {d} ? q[2 * c + 1] : 0")};
        const {v} lo1 = {v}_bcast(rq[2]), hi1 = {v}_bcast(rq[3]);
        for (int jb = 0; jb <= last; jb += {vl}) {{
            {v} acc = {{0}};
            for (int c = 0; c < {d2}; c++)
                acc = {v}_madd16(acc, {v}_bcast((int32_t)qw[c]), {v}_load(kt + c * {tp} + jb));
            acc = {v}_max({v}_min({v}_rq(acc, rq[0], rq[1]), hi1), lo1);
            {v}_store_s8(sc + jb, acc);
        }}
        {softmax}
        for (int j = {t_len}; j < {2 * t2}; j++) p[j] = 0;
        {v} acc[{fv}];
        for (int c = 0; c < {fv}; c++) acc[c] = ({v}){{0}};
        for (int j = 0; j < {t2}; j++) {{
            const uint32_t pw = {pair.format(lo="p[2 * j]", hi="p[2 * j + 1]")};
            if (!pw) continue;
            const {v} pb = {v}_bcast((int32_t)pw);
            for (int c = 0; c < {fv}; c++)
                acc[c] = {v}_madd16(acc[c], pb, {v}_load(vt + j * {dvp} + c * {vl}));
        }}
        const {v} lo2 = {v}_bcast(rq[6]), hi2 = {v}_bcast(rq[7]);
        for (int c = 0; c < {fv}; c++) {{
            const {v} r = {v}_max({v}_min({v}_rq(acc[c], rq[4], rq[5]), hi2), lo2);
            if ((c + 1) * {vl} <= {dv}) {v}_store_s8(y + c * {vl}, r);
            else {v}_store_s8_n(y + c * {vl}, r, {dv} - c * {vl});
        }}"""
    return row, at, decls
