"""The GPU target's Triton kernels. Importing this module imports Triton: only
`vdla.compiler.targets.gpu.runtime` does, after it has decided whether the kernels run on
a CUDA GPU or under Triton's interpreter (Triton reads ``TRITON_INTERPRET`` when a kernel
is decorated).

Every kernel works on plain, C-contiguous layouts (NCHW activations, OIHW weights, NC for
dense layers) and reproduces its reference kernel: the int8 ops bit for bit
(`vdla.compiler.reference.integer`: int32 arithmetic that wraps, rounding half up),
quantize and dequantize bit for bit (float64 arithmetic, as the reference), and the
float ops within float32 (or float16) rounding.

* `conv_gemm`: a convolution as an implicit GEMM (TVM's and cuDNN's "implicit GEMM"):
  M = N*Ho*Wo output pixels, N = the group's output channels, K = Cin/groups*kh*kw. The
  input tile is gathered straight from NCHW (no im2col buffer); int8 x int8 dots
  accumulate in int32, float ones in float32 (``input_precision="ieee"``: no TF32). A
  dense layer is the 1x1 convolution of an Nx C x 1 x 1 input. With split-K each
  program sums one slice of K into a partial buffer and `gemm_finish` adds the slices
  and applies the epilogue; int32 addition modulo 2**32 associates, so the int8 result
  does not depend on the split.
* `conv_direct`: depthwise convolutions (one input channel per group), tap by tap on a
  (pixels x channels) tile: an implicit GEMM's K would be kh*kw there, too short for a
  dot.
* `_finish` is the epilogue all three share: bias, requantization, residual, clamp
  (int8), or bias, residual, ReLU/clip/GELU (float; a transformer's dense may end
  in a GELU).
* `pool2d`, `global_pool`: windows and planes (max, int8 sums requantized, float means).
* `binary`, `unary`: elementwise ops over a broadcast 4-D view (strides 0 on broadcast
  axes); `copy_rows`: one part of a concat into its slice of the output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vdla.compiler.targets.gpu import codes

__all__ = ["binary", "conv_direct", "conv_gemm", "copy_rows", "gelu", "gemm_finish",
           "global_pool", "pool2d", "requantize", "tanh", "unary"]

# `codes` as Triton constants (a kernel reads no other globals).
ACT_RELU = tl.constexpr(codes.ACT_RELU)
ACT_CLIP = tl.constexpr(codes.ACT_CLIP)
ACT_GELU = tl.constexpr(codes.ACT_GELU)
ACT_GELU_TANH = tl.constexpr(codes.ACT_GELU_TANH)
POOL_MAX = tl.constexpr(codes.POOL_MAX)
POOL_QSUM = tl.constexpr(codes.POOL_QSUM)
POOL_MEAN = tl.constexpr(codes.POOL_MEAN)
OP_QADD = tl.constexpr(codes.OP_QADD)
OP_ADD = tl.constexpr(codes.OP_ADD)
OP_RELU = tl.constexpr(codes.OP_RELU)
OP_CLIP = tl.constexpr(codes.OP_CLIP)
OP_QUANTIZE = tl.constexpr(codes.OP_QUANTIZE)


@triton.jit
def requantize(a, m, s, HAS_M: tl.constexpr):
    """`vdla.compiler.reference.integer.requantize` on int32 lanes: an optional multiply,
    then a rounding right shift (s > 0) or a left shift (s <= 0), each wrapping."""
    if HAS_M:
        a = a * m
    right = tl.maximum(s, 1)
    left = tl.maximum(-s, 0)
    up = (a + (1 << (right - 1))) >> right
    return tl.where(s > 0, up, a << left)


@triton.jit
def tanh(x):
    """tanh in float32 from one exp: sign(x) (1 - e) / (1 + e), e = exp(-2|x|), which
    neither overflows nor loses the sign (Triton's interpreter has no libdevice)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def gelu(x, TANH: tl.constexpr):
    """GELU of float32 `x`: x * Phi(x) by erf, or (TANH) its tanh approximation."""
    if TANH:
        y = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return y


@triton.jit
def _finish(acc, rm, co, c_ok, n_i, p, M, OC, HWO, out, bias, mult, shift, res, rmult, rshift,
            out_min, out_max, lo, hi, INT8: tl.constexpr, HAS_BIAS: tl.constexpr,
            HAS_MULT: tl.constexpr, HAS_RES: tl.constexpr, HAS_RMULT: tl.constexpr,
            ACT: tl.constexpr):
    """The epilogue of a (BM pixels x BN channels) tile: `acc` holds the sums, `rm` the
    pixels' flat indices (n*HWO + p), `co` the output channels and `c_ok` which of them
    the tile owns (a grouped conv's tile ends at its group's last channel: the channels
    past it are the next group's, whose own tile writes them)."""
    ok = (rm[:, None] < M) & c_ok[None, :]
    offs = (n_i[:, None] * OC + co[None, :]) * HWO + p[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias + co, mask=c_ok, other=0)[None, :]
    if INT8:
        m = tl.load(mult + co, mask=c_ok, other=1)[None, :]
        s = tl.load(shift + co, mask=c_ok, other=0)[None, :]
        y = requantize(acc, m, s, HAS_MULT)
        if HAS_RES:
            r = tl.load(res + offs, mask=ok, other=0).to(tl.int32)
            rm_ = tl.load(rmult + co, mask=c_ok, other=1)[None, :]
            rs = tl.load(rshift + co, mask=c_ok, other=0)[None, :]
            y = y + requantize(r, rm_, rs, HAS_RMULT)
        y = tl.minimum(tl.maximum(y, out_min), out_max)
    else:
        y = acc
        if HAS_RES:
            y = y + tl.load(res + offs, mask=ok, other=0).to(tl.float32)
        if ACT == ACT_RELU:
            y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if ACT == ACT_CLIP:
            y = tl.minimum(tl.maximum(y, lo, propagate_nan=tl.PropagateNan.ALL), hi,
                           propagate_nan=tl.PropagateNan.ALL)
        if ACT == ACT_GELU:
            y = gelu(y, False)
        if ACT == ACT_GELU_TANH:
            y = gelu(y, True)
    tl.store(out + offs, y.to(out.dtype.element_ty), mask=ok)


@triton.jit
def conv_gemm(x, w, out, part, bias, mult, shift, res, rmult, rshift,
              N, C, H, W, OC, HO, WO, CIN_G, OC_G, K, K_SPLIT,
              SH, SW, PT, PL, DH, DW, out_min, out_max, lo, hi,
              KH: tl.constexpr, KW: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
              INT8: tl.constexpr, FP16: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_MULT: tl.constexpr, HAS_RES: tl.constexpr, HAS_RMULT: tl.constexpr,
              ACT: tl.constexpr):
    """One (BM x BN) output tile of group program_id(1), K slice program_id(2)."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    ks = tl.program_id(2)
    HWO = HO * WO
    M = N * HWO
    tiles_n = tl.cdiv(OC_G, BN)
    pm = pid // tiles_n
    pn = pid % tiles_n
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    n_i = rm // HWO
    p = rm % HWO
    ih0 = (p // WO) * SH - PT
    iw0 = (p % WO) * SW - PL
    m_ok = rm < M
    n_ok = rn < OC_G
    co = g * OC_G + rn
    x_base = (n_i * C + g * CIN_G) * H
    if INT8:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_lo = ks * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    for k0 in range(k_lo, k_hi, BK):
        rk = k0 + tl.arange(0, BK)
        ci = rk // (KH * KW)
        t = rk % (KH * KW)
        ih = ih0[:, None] + (t // KW)[None, :] * DH
        iw = iw0[:, None] + (t % KW)[None, :] * DW
        k_ok = rk < k_hi
        x_ok = (m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H)
                & (iw >= 0) & (iw < W))
        a = tl.load(x + ((x_base[:, None] + ci[None, :] * H + ih) * W + iw), mask=x_ok,
                    other=0)
        b = tl.load(w + co[None, :] * K + rk[:, None], mask=k_ok[:, None] & n_ok[None, :],
                    other=0)
        if INT8:
            acc += tl.dot(a, b)
        elif FP16:
            acc += tl.dot(a.to(tl.float16), b.to(tl.float16))
        else:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if SPLIT_K == 1:
        _finish(acc, rm, co, n_ok, n_i, p, M, OC, HWO, out, bias, mult, shift, res, rmult,
                rshift, out_min, out_max, lo, hi, INT8, HAS_BIAS, HAS_MULT, HAS_RES,
                HAS_RMULT, ACT)
    else:
        ok = m_ok[:, None] & n_ok[None, :]
        tl.store(part + (ks * M + rm[:, None]) * OC + co[None, :], acc, mask=ok)


@triton.jit
def gemm_finish(part, out, bias, mult, shift, res, rmult, rshift, M, OC, HWO,
                out_min, out_max, lo, hi, SPLITS,
                BM: tl.constexpr, BN: tl.constexpr, INT8: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_MULT: tl.constexpr, HAS_RES: tl.constexpr,
                HAS_RMULT: tl.constexpr, ACT: tl.constexpr):
    """Split-K: the K slices' partial sums (SPLITS x M x OC) added, then `_finish`."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    co = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = (rm[:, None] < M) & (co[None, :] < OC)
    offs = rm[:, None] * OC + co[None, :]
    acc = tl.load(part + offs, mask=ok, other=0)
    for s in range(1, SPLITS):
        acc += tl.load(part + s * M * OC + offs, mask=ok, other=0)
    _finish(acc, rm, co, co < OC, rm // HWO, rm % HWO, M, OC, HWO, out, bias, mult, shift, res,
            rmult, rshift, out_min, out_max, lo, hi, INT8, HAS_BIAS, HAS_MULT, HAS_RES,
            HAS_RMULT, ACT)


@triton.jit
def conv_direct(x, w, out, bias, mult, shift, res, rmult, rshift,
                N, C, H, W, OC, HO, WO, OC_G, SH, SW, PT, PL, DH, DW,
                out_min, out_max, lo, hi,
                KH: tl.constexpr, KW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                INT8: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MULT: tl.constexpr,
                HAS_RES: tl.constexpr, HAS_RMULT: tl.constexpr, ACT: tl.constexpr):
    """A depthwise convolution (input channel co // OC_G for output channel co), one
    (BM pixels x BN channels) tile, tap by tap."""
    HWO = HO * WO
    M = N * HWO
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    co = tl.program_id(1) * BN + tl.arange(0, BN)
    n_i = rm // HWO
    p = rm % HWO
    ih0 = (p // WO) * SH - PT
    iw0 = (p % WO) * SW - PL
    m_ok = rm < M
    c_ok = co < OC
    x_base = (n_i[:, None] * C + (co // OC_G)[None, :]) * H
    if INT8:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for r in tl.static_range(KH):
        ih = ih0 + r * DH
        for s in tl.static_range(KW):
            iw = iw0 + s * DW
            pix_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(x + (x_base + ih[:, None]) * W + iw[:, None],
                        mask=pix_ok[:, None] & c_ok[None, :], other=0)
            b = tl.load(w + co * (KH * KW) + r * KW + s, mask=c_ok, other=0)
            if INT8:
                acc += a.to(tl.int32) * b.to(tl.int32)[None, :]
            else:
                acc += a.to(tl.float32) * b.to(tl.float32)[None, :]
    _finish(acc, rm, co, c_ok, n_i, p, M, OC, HWO, out, bias, mult, shift, res, rmult,
            rshift, out_min, out_max, lo, hi, INT8, HAS_BIAS, HAS_MULT, HAS_RES, HAS_RMULT,
            ACT)


@triton.jit
def pool2d(x, out, mult, shift, TOTAL, C, H, W, HO, WO, SH, SW, PT, PL, H_END, W_END,
           KH: tl.constexpr, KW: tl.constexpr, MODE: tl.constexpr, INT8: tl.constexpr,
           HAS_MULT: tl.constexpr, INCLUDE_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """A window pool over BLOCK outputs: MODE 0 max, 1 int8 sums requantized per channel,
    2 float means. H_END, W_END: where the padded input ends (H + bottom pad), the
    windows' extent that counts towards a mean with INCLUDE_PAD."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    nc = offs // (HO * WO)
    p = offs % (HO * WO)
    ih0 = (p // WO) * SH - PT
    iw0 = (p % WO) * SW - PL
    if MODE == POOL_MAX:
        if INT8:
            acc = tl.full((BLOCK,), -128, tl.int32)
        else:
            acc = tl.full((BLOCK,), float("-inf"), tl.float32)
    elif INT8:
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
    count = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in tl.static_range(KH):
        ih = ih0 + r
        for s in tl.static_range(KW):
            iw = iw0 + s
            inside = ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            if MODE == POOL_MAX:
                if INT8:
                    v = tl.load(x + (nc * H + ih) * W + iw, mask=inside, other=-128)
                    acc = tl.maximum(acc, v.to(tl.int32))
                else:
                    v = tl.load(x + (nc * H + ih) * W + iw, mask=inside, other=float("-inf"))
                    acc = tl.maximum(acc, v.to(tl.float32))
            else:
                v = tl.load(x + (nc * H + ih) * W + iw, mask=inside, other=0)
                if INT8:
                    acc += v.to(tl.int32)
                else:
                    acc += v.to(tl.float32)
                    if INCLUDE_PAD:
                        counted = (ih < H_END) & (iw < W_END)
                    else:
                        counted = inside
                    count += tl.where(counted, 1.0, 0.0)
    if MODE == POOL_QSUM:
        c = nc % C
        m = tl.load(mult + c, mask=ok, other=1)
        sh = tl.load(shift + c, mask=ok, other=0)
        acc = tl.minimum(tl.maximum(requantize(acc, m, sh, HAS_MULT), -128), 127)
    if MODE == POOL_MEAN:
        acc = acc / count      # 0 / 0 = NaN for a window wholly in the padding, as numpy
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=ok)


@triton.jit
def global_pool(x, out, mult, shift, NC, C, HW, INT8: tl.constexpr, HAS_MULT: tl.constexpr,
                BC: tl.constexpr, BHW: tl.constexpr):
    """Sums over H and W of BC planes: int8 sums requantized per channel, or float
    means."""
    rc = tl.program_id(0) * BC + tl.arange(0, BC)
    c_ok = rc < NC
    if INT8:
        acc = tl.zeros((BC, BHW), dtype=tl.int32)
    else:
        acc = tl.zeros((BC, BHW), dtype=tl.float32)
    for k0 in range(0, HW, BHW):
        rk = k0 + tl.arange(0, BHW)
        v = tl.load(x + rc[:, None] * HW + rk[None, :], mask=c_ok[:, None] & (rk < HW)[None, :],
                    other=0)
        if INT8:
            acc += v.to(tl.int32)
        else:
            acc += v.to(tl.float32)
    total = tl.sum(acc, axis=1)
    if INT8:
        c = rc % C
        m = tl.load(mult + c, mask=c_ok, other=1)
        sh = tl.load(shift + c, mask=c_ok, other=0)
        y = tl.minimum(tl.maximum(requantize(total, m, sh, HAS_MULT), -128), 127)
    else:
        y = total / HW
    tl.store(out + rc, y.to(out.dtype.element_ty), mask=c_ok)


@triton.jit
def binary(a, b, out, am, ash, bm, bsh, TOTAL, D1, D2, D3,
           SA0, SA1, SA2, SA3, SB0, SB1, SB2, SB3, out_min, out_max,
           OP: tl.constexpr, A_MULT: tl.constexpr, B_MULT: tl.constexpr,
           BLOCK: tl.constexpr):
    """out = a (op) b over the output's 4-D view (D0 x D1 x D2 x D3, axis 1 the
    channels); SA*/SB* are the operands' element strides (0 where broadcast); qadd's
    requantization parameters are one per channel (D1 of them)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    i3 = offs % D3
    t = offs // D3
    i2 = t % D2
    t = t // D2
    i1 = t % D1
    i0 = t // D1
    va = tl.load(a + i0 * SA0 + i1 * SA1 + i2 * SA2 + i3 * SA3, mask=ok, other=0)
    vb = tl.load(b + i0 * SB0 + i1 * SB1 + i2 * SB2 + i3 * SB3, mask=ok, other=0)
    if OP == OP_QADD:
        ya = requantize(va.to(tl.int32), tl.load(am + i1, mask=ok, other=1),
                         tl.load(ash + i1, mask=ok, other=0), A_MULT)
        yb = requantize(vb.to(tl.int32), tl.load(bm + i1, mask=ok, other=1),
                         tl.load(bsh + i1, mask=ok, other=0), B_MULT)
        y = tl.minimum(tl.maximum(ya + yb, out_min), out_max)
    elif OP == OP_ADD:
        y = va.to(tl.float32) + vb.to(tl.float32)
    else:                                   # OP_MUL
        y = va.to(tl.float32) * vb.to(tl.float32)
    tl.store(out + offs, y.to(out.dtype.element_ty), mask=ok)


@triton.jit
def unary(x, out, scale, TOTAL, lo, hi, OP: tl.constexpr, INT8: tl.constexpr,
          BLOCK: tl.constexpr):
    """relu (int8 or float), clip (float, bounds lo/hi), quantize (float -> int8:
    floor(x / scale + 0.5) saturated, in float64 as the reference) and dequantize
    (float32(x * scale) in float64); `scale` points at one float64."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    v = tl.load(x + offs, mask=ok, other=0)
    if OP == OP_RELU:
        if INT8:
            y = tl.maximum(v, 0)
        else:
            y = tl.maximum(v.to(tl.float32), 0.0, propagate_nan=tl.PropagateNan.ALL)
    elif OP == OP_CLIP:
        y = tl.minimum(tl.maximum(v.to(tl.float32), lo, propagate_nan=tl.PropagateNan.ALL),
                       hi, propagate_nan=tl.PropagateNan.ALL)
    elif OP == OP_QUANTIZE:
        q = tl.floor(v.to(tl.float64) / tl.load(scale) + 0.5)
        y = tl.minimum(tl.maximum(q, -128.0), 127.0)
    else:                                   # OP_DEQUANTIZE
        y = v.to(tl.float64) * tl.load(scale)
    tl.store(out + offs, y.to(out.dtype.element_ty), mask=ok)


@triton.jit
def copy_rows(src, dst, TOTAL, ROW, DST_ROW, OFFSET, BLOCK: tl.constexpr):
    """dst[o, OFFSET + j] = src[o, j] for rows of ROW elements (DST_ROW in dst): one
    part of a concat."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    v = tl.load(src + offs, mask=ok)
    tl.store(dst + (offs // ROW) * DST_ROW + OFFSET + offs % ROW, v, mask=ok)
