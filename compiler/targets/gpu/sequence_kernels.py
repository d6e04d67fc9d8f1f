"""The GPU target's Triton kernels for sequence models (transformers). Importing this
module imports Triton: only `vdla.compiler.targets.gpu.runtime` does (see `kernels`).

Every kernel works on C-contiguous outputs and reproduces its reference kernel: the
int8 ops bit for bit (`vdla.compiler.reference.integer`), the float ops within float32
rounding (they compute in float32 where the reference computes in float64).

* `nd_map`: one elementwise op over an output of up to 6 axes whose up to three operands
  are strided views (a stride of 0 broadcasts, an offset and a step slice, permuted
  strides transpose): copies (transpose, slice, expand, cast), the unary float functions
  (sqrt, erf, tanh, exp, neg, GELU), binary arithmetic and comparisons, `where`, and an
  int8 table lookup (an int8 -> int8 function as its 256 values).
* `batched_matmul`: numpy matmul over broadcast batch axes, each operand's batch offsets
  a table (so any broadcast is one launch) and its two matrix axes strided (a transposed
  operand is a stride swap): int8 x int8 summed in int32 then requantized per tensor
  (qmatmul), or float32 (ieee dots; float16 with float32 sums).
* `flash_attention`: float attention in one pass over the keys (an online softmax, as
  FlashAttention), the scores never written out.
* `row_softmax`, `row_layer_norm`, `reduce_rows`: rows of the last axis.
* `fused_qattention`: qattention in one launch (the int8 scores recomputed per pass
  rather than stored).
* `row_qsoftmax`, `row_qlayer_norm`: the integer softmax and layer norm of
  `vdla.compiler.reference.integer_transformer`, bit for bit (the softmax's exponentials
  and qgelu as tables computed from the reference's own functions: `exp_table`,
  `gelu_table`).
* `gather_rows`: ONNX Gather (numpy.take) with its indices checked: an index outside
  [-n, n) is never read; its position is reported in an error buffer instead.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vdla.compiler.targets.gpu import codes
from vdla.compiler.targets.gpu.kernels import gelu, requantize, tanh

__all__ = ["batched_matmul", "flash_attention", "fused_qattention", "gather_rows", "nd_map",
           "reduce_rows", "row_layer_norm", "row_qlayer_norm", "row_qsoftmax", "row_softmax"]

# `codes` as Triton constants (a kernel reads no other globals).
E_COPY = tl.constexpr(codes.E_COPY)
E_TO_BOOL = tl.constexpr(codes.E_TO_BOOL)
E_NEG = tl.constexpr(codes.E_NEG)
E_SQRT = tl.constexpr(codes.E_SQRT)
E_ERF = tl.constexpr(codes.E_ERF)
E_TANH = tl.constexpr(codes.E_TANH)
E_EXP = tl.constexpr(codes.E_EXP)
E_GELU = tl.constexpr(codes.E_GELU)
E_GELU_TANH = tl.constexpr(codes.E_GELU_TANH)
E_ADD = tl.constexpr(codes.E_ADD)
E_SUB = tl.constexpr(codes.E_SUB)
E_MUL = tl.constexpr(codes.E_MUL)
E_DIV = tl.constexpr(codes.E_DIV)
E_POW = tl.constexpr(codes.E_POW)
E_POW_INT = tl.constexpr(codes.E_POW_INT)
E_EQUAL = tl.constexpr(codes.E_EQUAL)
E_LESS = tl.constexpr(codes.E_LESS)
E_GREATER = tl.constexpr(codes.E_GREATER)
E_WHERE = tl.constexpr(codes.E_WHERE)
E_TABLE = tl.constexpr(codes.E_TABLE)
R_SUM = tl.constexpr(codes.R_SUM)
R_MEAN = tl.constexpr(codes.R_MEAN)


@triton.jit
def _pow(a, b):
    """numpy's float power: |a|**b by exp2/log2, the sign of a negative base with an
    integral exponent, NaN for a negative base and a fractional one, 1 for b == 0."""
    y = tl.exp2(b * tl.log2(tl.abs(a)))
    whole = tl.floor(b)
    integral = whole == b
    odd = integral & ((whole - 2.0 * tl.floor(whole * 0.5)) != 0.0)
    y = tl.where(a < 0, tl.where(integral, tl.where(odd, -y, y), float("nan")), y)
    return tl.where(b == 0.0, 1.0, y)


@triton.jit
def _pow_int(a, N: tl.constexpr):
    """a**N for a small positive integer N (1..8) by repeated products (x**2, x**3 of
    exported LayerNorms and GELUs)."""
    y = a
    for _ in tl.static_range(N - 1):
        y = y * a
    return y


@triton.jit
def nd_map(x0, x1, x2, out, TOTAL, D1, D2, D3, D4, D5,
           O0, A0, A1, A2, A3, A4, A5,
           O1, B0, B1, B2, B3, B4, B5,
           O2, C0, C1, C2, C3, C4, C5,
           OP: tl.constexpr, NIN: tl.constexpr, FLOAT: tl.constexpr, POW_N: tl.constexpr,
           BLOCK: tl.constexpr):
    """out (D0 x ... x D5, contiguous) = OP(x0, x1, x2), operand k read at
    O_k + sum(i_j * S_kj) (element offset and strides; 0 strides broadcast). FLOAT: the
    arithmetic runs on float32 (the operands converted); else on the operands' own
    types (comparisons, copies, casts). E_TABLE reads x1[x0 + 128]."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    t = offs
    i5 = t % D5
    t = t // D5
    i4 = t % D4
    t = t // D4
    i3 = t % D3
    t = t // D3
    i2 = t % D2
    t = t // D2
    i1 = t % D1
    i0 = t // D1
    # lanes past the end read ones: no 0 / 0 or log(0) in lanes that are never stored
    v0 = tl.load(x0 + (O0 + i0 * A0 + i1 * A1 + i2 * A2 + i3 * A3 + i4 * A4 + i5 * A5),
                 mask=ok, other=1)
    if NIN >= 2:
        v1 = tl.load(x1 + (O1 + i0 * B0 + i1 * B1 + i2 * B2 + i3 * B3 + i4 * B4 + i5 * B5),
                     mask=ok, other=1)
    if NIN >= 3:
        v2 = tl.load(x2 + (O2 + i0 * C0 + i1 * C1 + i2 * C2 + i3 * C3 + i4 * C4 + i5 * C5),
                     mask=ok, other=1)
    if FLOAT:
        v0 = v0.to(tl.float32)
        if NIN >= 2:
            v1 = v1.to(tl.float32)
    if OP == E_COPY:
        y = v0
    elif OP == E_TO_BOOL:
        y = v0 != 0
    elif OP == E_NEG:
        y = -v0
    elif OP == E_SQRT:
        y = tl.sqrt_rn(v0)
    elif OP == E_ERF:
        y = tl.math.erf(v0)
    elif OP == E_TANH:
        y = tanh(v0)
    elif OP == E_EXP:
        y = tl.exp(v0)
    elif OP == E_GELU:
        y = gelu(v0, False)
    elif OP == E_GELU_TANH:
        y = gelu(v0, True)
    elif OP == E_ADD:
        y = v0 + v1
    elif OP == E_SUB:
        y = v0 - v1
    elif OP == E_MUL:
        y = v0 * v1
    elif OP == E_DIV:
        y = tl.div_rn(v0, v1)
    elif OP == E_POW:
        y = _pow(v0, v1)
    elif OP == E_POW_INT:
        y = _pow_int(v0, POW_N)
    elif OP == E_EQUAL:
        y = v0 == v1
    elif OP == E_LESS:
        y = v0 < v1
    elif OP == E_GREATER:
        y = v0 > v1
    elif OP == E_WHERE:
        y = tl.where(v0 != 0, v1, v2)
    else:                                   # E_TABLE
        y = tl.load(x1 + (v0.to(tl.int32) + 128), mask=ok, other=0)
    tl.store(out + offs, y.to(out.dtype.element_ty), mask=ok)


@triton.jit
def batched_matmul(a, b, out, a_off, b_off, M, N, K, SAM, SAK, SBK, SBN, mult, shift,
                   out_min, out_max, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   INT8: tl.constexpr, FP16: tl.constexpr, HAS_MULT: tl.constexpr):
    """One (BM x BN) tile of batch program_id(1): out[z] = a[z] @ b[z], a[z] at element
    a_off[z] with strides (SAM, SAK), b[z] at b_off[z] with (SBK, SBN); out contiguous
    (batch, M, N). int8: int32 sums requantized (one multiplier, shift), clamped; float:
    float32 sums."""
    pid = tl.program_id(0)
    z = tl.program_id(1)
    tiles_n = tl.cdiv(N, BN)
    rm = (pid // tiles_n) * BM + tl.arange(0, BM)
    rn = (pid % tiles_n) * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    ao = tl.load(a_off + z)
    bo = tl.load(b_off + z)
    if INT8:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < K
        x = tl.load(a + ao + rm[:, None] * SAM + rk[None, :] * SAK,
                    mask=m_ok[:, None] & k_ok[None, :], other=0)
        y = tl.load(b + bo + rk[:, None] * SBK + rn[None, :] * SBN,
                    mask=k_ok[:, None] & n_ok[None, :], other=0)
        if INT8:
            acc += tl.dot(x, y)
        elif FP16:
            acc += tl.dot(x.to(tl.float16), y.to(tl.float16))
        else:
            acc += tl.dot(x.to(tl.float32), y.to(tl.float32), input_precision="ieee")
    ok = m_ok[:, None] & n_ok[None, :]
    if INT8:
        r = requantize(acc, mult, shift, HAS_MULT)
        r = tl.minimum(tl.maximum(r, out_min), out_max)
    else:
        r = acc
    offs = z.to(tl.int64) * M * N + rm[:, None] * N + rn[None, :]
    tl.store(out + offs, r.to(out.dtype.element_ty), mask=ok)


@triton.jit
def flash_attention(q, k, v, out, q_off, k_off, v_off, mask, m_off, S, T, D, DV, SMM, SMN,
                    scale, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                    BDV: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                    FP16: tl.constexpr):
    """Float attention for BM queries of batch program_id(1) in one pass over the keys
    (FlashAttention's online softmax: the scores never leave the chip): per BN keys,
    s = q k^T * scale (+ mask, -inf above the causal diagonal), the running max m and
    sum l rescaled by exp(m_old - m_new), acc += exp(s - m) v; out = acc / l. q, k, v at
    their batch offsets, rows of D (DV for v); a row whose every key is -inf gives NaN,
    as the reference's softmax."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    z = tl.program_id(1)
    rd = tl.arange(0, BD)
    rdv = tl.arange(0, BDV)
    m_ok = rm < S
    qt = tl.load(q + tl.load(q_off + z) + rm[:, None] * D + rd[None, :],
                 mask=m_ok[:, None] & (rd < D)[None, :], other=0)
    ko = tl.load(k_off + z)
    vo = tl.load(v_off + z)
    if HAS_MASK:
        mo = tl.load(m_off + z)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BDV), tl.float32)
    for n0 in range(0, T, BN):
        rn = n0 + tl.arange(0, BN)
        n_ok = rn < T
        kt = tl.load(k + ko + rn[None, :] * D + rd[:, None],
                     mask=(rd < D)[:, None] & n_ok[None, :], other=0)
        if FP16:
            sc = tl.dot(qt.to(tl.float16), kt.to(tl.float16))
        else:
            sc = tl.dot(qt.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        sc = sc * scale
        if HAS_MASK:
            sc += tl.load(mask + mo + rm[:, None] * SMM + rn[None, :] * SMN,
                          mask=m_ok[:, None] & n_ok[None, :], other=0).to(tl.float32)
        if CAUSAL:
            sc = tl.where(rn[None, :] > rm[:, None] + (T - S), float("-inf"), sc)
        sc = tl.where(n_ok[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        # a row with no finite score yet keeps everything at 0 (no -inf - -inf)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(sc - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(v + vo + rn[:, None] * DV + rdv[None, :],
                     mask=n_ok[:, None] & (rdv < DV)[None, :], other=0)
        if FP16:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vt.to(tl.float16))
        else:
            acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision="ieee")
        m_i = m_new
    l_i = tl.where(m_ok, l_i, 1.0)            # rows past the end: never stored
    y = acc / l_i[:, None]
    offs = z.to(tl.int64) * S * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(out + offs, y.to(out.dtype.element_ty), mask=m_ok[:, None] & (rdv < DV)[None, :])


@triton.jit
def row_softmax(x, out, ROWS_N, N, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Softmax of ROWS rows of N elements from row program_id(0) * ROWS (of ROWS_N): the
    max, the sum of exp(x - max), then each exp over the sum. In place (out == x) is
    safe: a row is read before it is written."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < ROWS_N
    base = rows.to(tl.int64)[:, None] * N
    top = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.float32)
        # rows past the end read zeros (their max 0: no inf - inf), columns past it -inf
        top = tl.maximum(top, tl.where((c < N)[None, :], v, float("-inf")))
    m = tl.max(top, axis=1)[:, None]
    total = tl.zeros((ROWS, BLOCK), tl.float32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=float("-inf")).to(tl.float32)
        total += tl.where(ok, tl.exp(v - m), 0.0)
    s = tl.where(row_ok, tl.sum(total, axis=1), 1.0)[:, None]
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.float32)
        tl.store(out + base + c[None, :], (tl.exp(v - m) / s).to(out.dtype.element_ty),
                 mask=ok)


@triton.jit
def row_layer_norm(x, scale, bias, out, ROWS_N, N, eps, HAS_BIAS: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """LayerNorm of ROWS rows from row program_id(0) * ROWS: (x - mean) /
    sqrt(var + eps) * scale + bias, the variance from the centred values (two passes,
    as the reference)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < ROWS_N
    base = rows.to(tl.int64)[:, None] * N
    acc = tl.zeros((ROWS, BLOCK), tl.float32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        acc += tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.float32)
    mean = (tl.sum(acc, axis=1) / N)[:, None]
    acc = tl.zeros((ROWS, BLOCK), tl.float32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.float32)
        d = tl.where(ok, v - mean, 0.0)
        acc += d * d
    inv = (1.0 / tl.sqrt_rn(tl.sum(acc, axis=1) / N + eps))[:, None]
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.float32)
        y = (v - mean) * inv * tl.load(scale + c, mask=c < N, other=0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(bias + c, mask=c < N, other=0).to(tl.float32)[None, :]
        tl.store(out + base + c[None, :], y.to(out.dtype.element_ty), mask=ok)


@triton.jit
def reduce_rows(x, out, R, OP: tl.constexpr, BLOCK: tl.constexpr):
    """out[row] = the sum, mean or max of row program_id(0) (R elements)."""
    base = tl.program_id(0).to(tl.int64) * R
    if OP == R_SUM or OP == R_MEAN:
        acc = tl.zeros((BLOCK,), tl.float32)
    else:
        acc = tl.full((BLOCK,), float("-inf"), tl.float32)
    for k0 in range(0, R, BLOCK):
        r = k0 + tl.arange(0, BLOCK)
        if OP == R_SUM or OP == R_MEAN:
            acc += tl.load(x + base + r, mask=r < R, other=0).to(tl.float32)
        else:
            v = tl.load(x + base + r, mask=r < R, other=float("-inf")).to(tl.float32)
            acc = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
    if OP == R_SUM:
        y = tl.sum(acc, axis=0)
    elif OP == R_MEAN:
        y = tl.sum(acc, axis=0) / R
    else:
        y = tl.max(acc, axis=0)
    tl.store(out + tl.program_id(0), y.to(out.dtype.element_ty))


@triton.jit
def gather_rows(data, idx, out, err, TOTAL, INNER, J, N, BLOCK: tl.constexpr):
    """out[o, j, i] = data[o, idx[j], i] (OUTER x J x INNER elements; data OUTER x N x
    INNER). A negative index counts from the end; one outside [-N, N) reads nothing, and
    the largest such position + 1 goes to err[0] (atomic max) for the session to
    report."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    i = offs % INNER
    t = offs // INNER
    j = t % J
    o = t // J
    v = tl.load(idx + j, mask=ok, other=0).to(tl.int64)
    v = tl.where(v < 0, v + N, v)
    bad = ok & ((v < 0) | (v >= N))
    tl.atomic_max(err + j * 0, (j + 1).to(tl.int32), mask=bad)
    safe = ok & (v >= 0) & (v < N)
    val = tl.load(data + (o * N + v) * INNER + i, mask=safe, other=0)
    tl.store(out + offs, val.to(out.dtype.element_ty), mask=ok)


@triton.jit
def _kept(mask, mbase, c, ok, i, N, S, SMN, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """Which of a (rows x columns) tile of qsoftmax's entries count: in range, not
    excluded by the bool mask (True: excluded), not above the causal diagonal."""
    keep = ok
    if HAS_MASK:
        excluded = tl.load(mask + mbase[:, None] + c[None, :] * SMN, mask=ok, other=1)
        keep = keep & (excluded.to(tl.int32) == 0)
    if CAUSAL:
        keep = keep & (c[None, :] <= i[:, None] + (N - S))
    return keep


@triton.jit
def row_qsoftmax(x, out, table, ROWS_N, N, K_BITS, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """The integer softmax (`vdla.compiler.reference.integer_transformer.qsoftmax`) of
    ROWS int8 rows of N entries from row program_id(0) * ROWS: the max, the sum of
    exp2_neg(x - max) = `table`[x - max + 255] (int32, the reference's values), then the
    rounded int32 division clipped to 127, as the definition bounds them."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < ROWS_N
    base = rows.to(tl.int64)[:, None] * N
    top = tl.full((ROWS, BLOCK), -128, tl.int32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        top = tl.maximum(top, tl.load(x + base + c[None, :], mask=ok, other=-128).to(tl.int32))
    m = tl.max(top, axis=1)[:, None]
    total = tl.zeros((ROWS, BLOCK), tl.int32)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.int32)
        total += tl.load(table + tl.where(ok, v - m, 0) + 255, mask=ok, other=0)
    s = tl.sum(total, axis=1)[:, None]
    div = tl.maximum(s, 1)
    for k0 in range(0, N, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < N)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.int32)
        e = tl.load(table + tl.where(ok, v - m, 0) + 255, mask=ok, other=0)
        p = tl.minimum(((e << K_BITS) + (s >> 1)) // div, 127)
        tl.store(out + base + c[None, :], p.to(tl.int8), mask=ok)


@triton.jit
def row_qlayer_norm(x, gamma, beta, out, ROWS_N, D, eps, K, Z, R, ROWS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """The integer layer norm (`vdla.compiler.reference.integer_transformer.qlayer_norm`)
    of ROWS int8 rows of D entries from row program_id(0) * ROWS: per row in int64, the
    sums, w = D**2 x (the variance + eps) normalized into [2**28, 2**30) by shifts of
    two bits (at most 14 up, 9 down), its exact floor square root (digit by digit, 15
    steps), the multiplier M = (D << (K + e)) // sd (at most 2**31 - 1) and the offset
    O = 2**(Z - 1) - floor(S * M / D); then per entry z = (x * M + O) >> Z and the int32
    (z * G + B) rounded by R bits, clipped."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < ROWS_N
    base = rows.to(tl.int64)[:, None] * D
    acc_s = tl.zeros((ROWS, BLOCK), tl.int64)
    acc_q = tl.zeros((ROWS, BLOCK), tl.int64)
    for k0 in range(0, D, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < D)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.int64)
        acc_s += v
        acc_q += v * v
    s = tl.sum(acc_s, axis=1)
    w = tl.sum(acc_q, axis=1) * D - s * s + eps
    e = w * 0
    for step in tl.static_range(14):
        up = w < (1 << 28)
        w = tl.where(up, w << 2, w)
        e = tl.where(up, e + 1, e)
    for step in tl.static_range(9):
        down = w >= (1 << 30)
        w = tl.where(down, w >> 2, w)
        e = tl.where(down, e - 1, e)
    root = w * 0
    for step in tl.static_range(15):
        bit = (w * 0 + 1) << (28 - 2 * step)
        take = w >= root + bit
        w = tl.where(take, w - (root + bit), w)
        root = tl.where(take, (root >> 1) + bit, root >> 1)
    root = tl.maximum(root, 1)           # rows past the end: 0, never divided by
    m = tl.minimum(((root * 0 + D) << (K + e)) // root, (1 << 31) - 1)
    sm = s * m
    floor_q = tl.where(sm >= 0, sm // D, -((D - 1 - sm) // D))
    o = (((m * 0 + 1) << (Z - 1)) - floor_q)[:, None]
    m = m[:, None]
    half = (1 << (R - 1))
    for k0 in range(0, D, BLOCK):
        c = k0 + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (c < D)[None, :]
        v = tl.load(x + base + c[None, :], mask=ok, other=0).to(tl.int64)
        z = ((v * m + o) >> Z).to(tl.int32)
        g = tl.load(gamma + c, mask=c < D, other=0)[None, :]
        b = tl.load(beta + c, mask=c < D, other=0)[None, :]
        y = (z * g + b + half) >> R
        y = tl.minimum(tl.maximum(y, -128), 127)
        tl.store(out + base + c[None, :], y.to(tl.int8), mask=ok)


@triton.jit
def _qscores(qt, k, ko, rn, n_ok, rd, D, mult, shift, lo, hi, HAS_MULT: tl.constexpr):
    """qattention's int8 scores of a (queries x BN keys) tile: q k^T summed in int32,
    requantized and clamped as qmatmul."""
    kt = tl.load(k + ko + rn[None, :] * D + rd[:, None], mask=(rd < D)[:, None] & n_ok[None, :],
                 other=0)
    r = requantize(tl.dot(qt, kt), mult, shift, HAS_MULT)
    return tl.minimum(tl.maximum(r, lo), hi)


@triton.jit
def fused_qattention(q, k, v, out, table, q_off, k_off, v_off, mask, m_off, S, T, D, DV,
                     SMM, SMN, K_BITS, qk_mult, qk_shift, qk_lo, qk_hi, pv_mult, pv_shift,
                     pv_lo, pv_hi, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                     BDV: tl.constexpr, QK_MULT: tl.constexpr, PV_MULT: tl.constexpr,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """qattention (`vdla.compiler.reference.integer_transformer.qattention`) for BM
    queries of batch program_id(1) in one launch, bit for bit: three passes over the
    keys, each recomputing the int8 scores (qmatmul(q, k^T)) of a key tile rather than
    storing them: the max over the kept keys, the sum of their exponentials
    (`table`[s - max + 255]), then the probabilities (the rounded int32 division,
    clipped to 127, as `row_qsoftmax`) times v summed in int32, requantized (pv)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    z = tl.program_id(1)
    rd = tl.arange(0, BD)
    rdv = tl.arange(0, BDV)
    m_ok = rm < S
    qt = tl.load(q + tl.load(q_off + z) + rm[:, None] * D + rd[None, :],
                 mask=m_ok[:, None] & (rd < D)[None, :], other=0)
    ko = tl.load(k_off + z)
    vo = tl.load(v_off + z)
    mbase = rm * 0
    if HAS_MASK:
        mbase = tl.load(m_off + z) + rm * SMM
    top = tl.full((BM,), -128, tl.int32)
    for n0 in range(0, T, BN):
        rn = n0 + tl.arange(0, BN)
        n_ok = rn < T
        sc = _qscores(qt, k, ko, rn, n_ok, rd, D, qk_mult, qk_shift, qk_lo, qk_hi, QK_MULT)
        keep = _kept(mask, mbase, rn, m_ok[:, None] & n_ok[None, :], rm, T, S, SMN, HAS_MASK,
                     CAUSAL)
        top = tl.maximum(top, tl.max(tl.where(keep, sc, -128), axis=1))
    m = top[:, None]
    total = tl.zeros((BM,), tl.int32)
    for n0 in range(0, T, BN):
        rn = n0 + tl.arange(0, BN)
        n_ok = rn < T
        sc = _qscores(qt, k, ko, rn, n_ok, rd, D, qk_mult, qk_shift, qk_lo, qk_hi, QK_MULT)
        keep = _kept(mask, mbase, rn, m_ok[:, None] & n_ok[None, :], rm, T, S, SMN, HAS_MASK,
                     CAUSAL)
        e = tl.load(table + tl.where(keep, sc - m, 0) + 255, mask=keep, other=0)
        total += tl.sum(tl.where(keep, e, 0), axis=1)
    s = total[:, None]
    div = tl.maximum(s, 1)
    acc = tl.zeros((BM, BDV), tl.int32)
    for n0 in range(0, T, BN):
        rn = n0 + tl.arange(0, BN)
        n_ok = rn < T
        sc = _qscores(qt, k, ko, rn, n_ok, rd, D, qk_mult, qk_shift, qk_lo, qk_hi, QK_MULT)
        keep = _kept(mask, mbase, rn, m_ok[:, None] & n_ok[None, :], rm, T, S, SMN, HAS_MASK,
                     CAUSAL)
        e = tl.where(keep, tl.load(table + tl.where(keep, sc - m, 0) + 255, mask=keep,
                                   other=0), 0)
        p = tl.minimum(((e << K_BITS) + (s >> 1)) // div, 127)
        p = tl.where(keep, p, 0).to(tl.int8)
        vt = tl.load(v + vo + rn[:, None] * DV + rdv[None, :],
                     mask=n_ok[:, None] & (rdv < DV)[None, :], other=0)
        acc += tl.dot(p, vt)
    y = requantize(acc, pv_mult, pv_shift, PV_MULT)
    y = tl.minimum(tl.maximum(y, pv_lo), pv_hi)
    offs = z.to(tl.int64) * S * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(out + offs, y.to(tl.int8), mask=m_ok[:, None] & (rdv < DV)[None, :])
