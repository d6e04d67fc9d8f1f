"""The integer arithmetic of transformers' operators: ``qmatmul``, ``qsoftmax``,
``qlayer_norm``, ``qgelu`` and ``qattention``, the definition every back half
reproduces bit for bit.

Every step below is an add, a multiply, an arithmetic right shift (``>>``: floor), a
comparison, or a floor division ``//`` of a non-negative integer by a positive one, on
int32 or int64 values as stated; the bounds given keep every intermediate inside its
type. C (``int32_t``/``int64_t``, ``>>`` on signed values being arithmetic on every
compiler vdla supports) and Triton express each step exactly. The integer constants of a
node are chosen by `vdla.compiler.passes.quantize` from the scales it calibrated; they
live in the node's ``params`` attribute (a dict of name -> int, or tuple of ints), the
scales themselves (``in_scale``, ``out_scale``, ...) only describe the result.

**qmatmul(a, b)**, int8 a (..., M, K), int8 b (..., K, N) (or (..., N, K) when
``transpose_b``: the product is ``a @ swapaxes(b, -1, -2)``)::

    acc = a @ b                      # exact; fits int32 while K <= 131071 (int8 products)
    y   = requantize(acc, multiplier, shift)      # `vdla.compiler.reference.integer`,
    out = clip(y, out_min, out_max)               # per tensor, as qdense

Batch axes broadcast as numpy's matmul.

**The base-2 exponential** ``exp2_neg(t)`` (t <= 0, in units of 2**-16; int64) is
``2**(t / 2**16) * 2**16`` rounded down, in [0, 65536], within 1.3e-4 relative (for
results >= 2**14; below that the floor's unit dominates)::

    q = t >> 16                      # <= 0, the integer part
    f = t - (q << 16)                # in [0, 65535], the fraction
    h = C3                           # Horner, in units of 2**-30 (int64: h * f < 2**47)
    h = C2 + ((h * f) >> 16)
    h = C1 + ((h * f) >> 16)
    h = 2**30 + ((h * f) >> 16)      # 2**(f / 2**16) * 2**30, in [2**30, 2**31)
    e = h >> min(14 - q, 31)         # 2**q and 2**16; 0 once the shift reaches 31

with ``C1, C2, C3 = EXP2_POLY = (746375804, 244432717, 82749383)`` (a cubic fitted to
``2**u`` on [0, 1) for the least largest relative error, 8.6e-5; times 2**30).
``exp2_neg(0) == 65536`` exactly.

**qsoftmax(x)**, int8 x over its last axis (N <= 16384 entries), params
``exp_multiplier`` c in [1, 2**23] = round(s_x * log2(e) * 2**16) and ``prob_bits`` k
in [0, 14] (the quantizer picks 7 to 14); output scale ``2**-k``::

    m = max(x over the row)          # over the kept positions (qattention's exclusion)
    t = (x - m) * c                  # x - m in [-255, 0]: t in [-255 * 2**23, 0], int32
    e = exp2_neg(t)                  # in [0, 65536]; 0 at an excluded position
    s = sum(e over the row)          # int32: at most 16384 * 65536 = 2**30
    p = ((e << k) + (s >> 1)) // s   # rounded e / s * 2**k; e << k <= 2**30, int32
    out = min(p, 127)                # a row whose every position is excluded: 0

k comes from the calibrated largest probability p: 7 (p = 1 clips to 127 / 128), or
the largest k in [7, 14] with ``p <= 127.5 / 2**k`` where p is smaller (finer steps for
the flat rows of long sequences; a row sharper at run time than any calibration row
clips at ``127 * 2**-k``, as any activation past its calibrated range does). The
exponential depends only on ``x - m`` in [-255, 0], so a target may look it up in
``exp_table(node)``.

**qlayer_norm(x, gamma, beta)**, int8 x over its last axis (D <= 65536 entries),
int32 gamma G (D,), int32 beta B (D,), params ``eps`` in [1, 2**46] and ``shift`` R in
[1, 21]; the float layer norm is ``(x - mean) / sqrt(var + epsilon) * gamma + beta``.
A row's statistics take int64 steps, once a row; every step per entry is an int32 one,
which a 32-bit vector unit runs::

    S   = sum(x); Q = sum(x * x)     # int32 (|S| <= 128 D, Q <= 16384 D)
    w   = D * Q - S * S + eps        # D**2 (the variance + epsilon), in [1, 2**47), int64
    e   = (30 - bit_length(w)) // 2  # in [-9, 14]: w * 4**e is in [2**28, 2**30)
    wn  = w << 2 e  (e >= 0)  or  w >> -2 e  (e < 0)
    sd  = isqrt(wn)                  # sqrt(w) * 2**e, in [2**14, 2**15): 15 bits always
    M   = min((D << (K + e)) // sd, 2**31 - 1)   # 2**K / sqrt(var + eps), int32
    O   = 2**(Z - 1) - floor(S * M / D)          # -mean * M, and half a unit of z
    P   = x * M + O                  # (x - mean) / sqrt(var + eps) * 2**K; |P| < 2**31
    z   = P >> Z                     # the same in units of 2**-12: |z| < 2**(12 + c) + 2
    y   = (z * G + B + 2**(R - 1)) >> R          # |z * G| + |B| + 2**(R - 1) < 2**31
    out = clip(y, -128, 127)

where c is the least integer >= 0 with 4**c >= D - 1 (so sqrt(D - 1) <= 2**c), K = 30 -
c and Z = K - 12 = 18 - c (`layer_norm_shifts`). ``floor(S * M / D)`` is the floor of a
signed quotient (S * M is int64). P fits int32, but x * M alone may not (up to 2**38):
compute it in int64, or modulo 2**32, which gives P exactly because P fits.
``eps = clamp(round(epsilon * D**2 / s_x**2), 1, 2**46)``,
``G = round(gamma / s_y * 2**(R - 12))`` with ``|G| < 2**(17 - c)`` and R the largest in
[1, 21] that keeps it there, ``B = round(beta / s_y * 2**R)`` (clamped to +-2**(R + 8),
past which the output clips anyway). Bounds: ``|x - mean| D <= sqrt((D - 1) v)`` (v = w -
eps), and sd is a floor square root of at least 2**28 with wn at most 1 below w * 4**e,
so ``M <= (1 + 2**-13) 2**K D / sqrt(w)``, ``|P| <= (1 + 2**-13) 2**30 + 2**(Z - 1) + 1``,
``|z G| < 2**29 (1 + 2**-12)`` and ``|B| + 2**(R - 1) <= 2**29 + 2**20``. M carries 15
significant bits or more (sd's), z 12 fraction bits of the normalized value, G 9 or more
(17 - c; 12 for D = 768): each well below the output's half-LSB rounding. ``isqrt`` is
the exact floor square root; the reference computes it digit by digit (``bit`` from
``4**30`` down to 1, 31 steps: ``if n >= r + bit: n -= r + bit; r = (r >> 1) + bit;
else: r >>= 1``); any method giving ``floor(sqrt(n))`` exactly (a double-precision
square root, exact below 2**52) gives the same result.

**qgelu(x)**, int8 x, params ``a``, ``b``, ``q_shift`` Q, ``multiplier`` M and
``shift`` R. GELU(v) = v * Phi(v) with Phi(v) ~ sigmoid(2 sqrt(2/pi) (v + 0.044715 v**3))
= (1 + tanh(sqrt(2/pi) (v + 0.044715 v**3))) / 2, the tanh form, for both
``approximate`` settings (it differs from the erf form by less than 4.8e-4 in absolute
terms: below 0.1 output LSB for output scales from 0.005 up)::

    ax  = |x|                        # in [0, 128], int64 from here on
    T   = (ax * (a + ax * ax * b)) >> Q          # |2 sqrt(2/pi)(v + 0.044715 v**3)| *
                                                 # log2(e) * 2**16, < 2**62
    e   = exp2_neg(-T)                           # exp(-|t|) * 2**16, in [0, 65536]
    sp  = (2**31 + ((65536 + e) >> 1)) // (65536 + e)   # sigmoid(|t|) * 2**15, rounded
    sig = sp if x >= 0 else 2**15 - sp           # Phi(v) * 2**15, in [0, 2**15]
    y   = (x * sig * M + 2**(R - 1)) >> R        # |x * sig * M| < 2**46
    out = clip(y, -128, 127)

with ``a = round(2 sqrt(2/pi) log2(e) s_x 2**(16 + Q))``,
``b = round(2 sqrt(2/pi) 0.044715 log2(e) s_x**3 2**(16 + Q))``, Q the largest in
[0, 48] with ``128 (a + 16384 b) < 2**62``, and ``M = round(s_x / s_y * 2**(R - 15))`` in
[1, 2**24) with R the largest in [1, 62] that keeps it there. The function of the 256
int8 values is ``gelu_table(node)``.

**qattention(q, k, v, [mask])**, int8 q (..., S, D), k (..., T, D), v (..., T, Dv),
bool mask broadcastable to (..., S, T), True where a key is excluded::

    s = qmatmul(q, k, transpose_b=True, qk_multiplier, qk_shift, qk_out_min, qk_out_max)
    excluded = mask | (causal and key t > query s + (T - S))
    p = qsoftmax(s, softmax_params) with the excluded positions left out of m and s
    y = qmatmul(p, v, pv_multiplier, pv_shift, pv_out_min, pv_out_max)

The float ``scale`` (1 / sqrt(D) usually) is folded into the softmax's
``exp_multiplier``, so the scores' requantization ratio stays a power of two in the
"shift" mode.

**Measured error** (``python3 scripts/integer_ops_error.py``): each definition against
the float function of the same int8 inputs, in output LSBs, over realistic inputs and
a sweep of input scales (0.5 is the error of rounding the exact result)::

    qsoftmax     rows of 16 to 512, logits sd 1 to 8          max 0.50-0.72  mean <= 0.26
    qlayer_norm  D 64 and 768, with outlier channels          max 0.50-0.51  mean 0.25
    qgelu        erf and tanh forms, s_x 0.005 to 0.5         max <= 0.50    mean <= 0.26
    qattention   S 16, D 16 / S 128, D 64                     max 2.9 / 5.6  mean 0.6 / 1.1

qattention's figure is the composition's: its scores and probabilities are int8 (with a
probability scale of 2**-7 to 2**-8 here), which the float attention does not round.
"""

from __future__ import annotations

import math

import numpy as np

from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, QuantizationError,
                                             requantize)

__all__ = ["EXP2_POLY", "EXP_BITS", "LN_NORM_BITS", "LN_PRODUCT_BITS", "LN_VARIANCE_BOUND",
           "LN_Z_BITS", "MAX_EXP_MULTIPLIER", "MAX_LAYER_NORM_LENGTH", "MAX_LN_EPS",
           "MAX_LN_SHIFT", "MAX_PROB_BITS", "MAX_SOFTMAX_LENGTH", "SIGMOID_BITS",
           "causal_exclusion", "exp2_neg", "exp_table", "gelu_params", "gelu_table",
           "isqrt", "layer_norm_params", "layer_norm_shifts",
           "qattention", "qgelu", "qlayer_norm", "qmatmul", "qsoftmax", "softmax_params"]

#: 2**u on [0, 1) = 1 + u (C1 + u (C2 + u C3)), the Cs times 2**30 (module docstring).
EXP2_POLY = (746375804, 244432717, 82749383)
#: exp2_neg's result is in units of 2**-EXP_BITS (its largest value 2**EXP_BITS).
EXP_BITS = 16
#: The largest softmax ``exp_multiplier`` (t = (x - m) * c must fit int32).
MAX_EXP_MULTIPLIER = 1 << 23
#: The largest softmax ``prob_bits`` (e << k must fit int32).
MAX_PROB_BITS = 14
#: The longest softmax row (the sum of exponentials must fit int32).
MAX_SOFTMAX_LENGTH = 1 << 14
#: Layer norm: the normalized value z in units of 2**-LN_Z_BITS; the normalized spread
#: wn below 2**LN_NORM_BITS (and at least a quarter of it); P = (x - mean) * M below
#: 2**LN_PRODUCT_BITS (times 1 + 2**-13); the longest row, the largest epsilon term
#: and output shift.
LN_Z_BITS, LN_NORM_BITS, LN_PRODUCT_BITS = 12, 30, 30
MAX_LAYER_NORM_LENGTH = 1 << 16
MAX_LN_EPS = 1 << 46
MAX_LN_SHIFT = 21
#: D * sum(x * x) - sum(x)**2 <= LN_VARIANCE_BOUND * D**2 for int8 rows (255**2 / 4).
LN_VARIANCE_BOUND = 16257
#: qgelu's sigmoid in units of 2**-SIGMOID_BITS.
SIGMOID_BITS = 15

_LOG2E = 1.0 / math.log(2.0)
_GELU_C = 2.0 * math.sqrt(2.0 / math.pi)


def _int64(x) -> np.ndarray:
    return np.asarray(x).astype(np.int64)


def _need_int8(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.int8:
        raise QuantizationError(f"{what} must be int8, not {x.dtype}")
    return x


def _param(params, name: str, low: int, high: int, what: str) -> int:
    if not isinstance(params, dict) or name not in params:
        raise QuantizationError(f"{what}: params must be a dict holding {name!r}, not "
                                f"{params!r}")
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise QuantizationError(f"{what}: params[{name!r}] must be an integer, not {value!r}")
    if not low <= int(value) <= high:
        raise QuantizationError(f"{what}: params[{name!r}] = {int(value)} is outside the "
                                f"allowed range [{low}, {high}]")
    return int(value)


# --- the shared steps ----------------------------------------------------------------------

def exp2_neg(t) -> np.ndarray:
    """``2**(t / 2**16) * 2**16`` rounded down, for integer t <= 0 (module docstring);
    int64 in [0, 65536]."""
    t = _int64(t)
    if np.any(t > 0):
        raise QuantizationError(f"exp2_neg: t must be <= 0, not {int(t.max())}")
    q = t >> EXP_BITS
    f = t - (q << EXP_BITS)
    c1, c2, c3 = EXP2_POLY
    h = np.full(t.shape, c3, np.int64)
    h = c2 + ((h * f) >> 16)
    h = c1 + ((h * f) >> 16)
    h = (1 << 30) + ((h * f) >> 16)
    return h >> np.minimum(30 - EXP_BITS - q, 31)


def isqrt(n) -> np.ndarray:
    """The exact floor square root of int64 values in [0, 2**62), digit by digit."""
    n = _int64(n).copy()
    if np.any(n < 0) or np.any(n >= (1 << 62)):
        raise QuantizationError("isqrt: arguments must be in [0, 2**62)")
    r = np.zeros_like(n)
    bit = np.int64(1) << 60
    while bit:
        take = n >= r + bit
        n = np.where(take, n - (r + bit), n)
        r = np.where(take, (r >> 1) + bit, r >> 1)
        bit >>= 2
    return r


# --- qmatmul ---------------------------------------------------------------------------------

def qmatmul(a, b, multiplier, shift, out_min: int = INT8_MIN, out_max: int = INT8_MAX,
            transpose_b: bool = False) -> np.ndarray:
    """int8 ``a @ b`` (b swapped on its last two axes with `transpose_b`), exact, then
    qdense's per-tensor requantization and the clip (module docstring)."""
    a = _need_int8(a, "qmatmul: a")
    b = _need_int8(b, "qmatmul: b")
    if b.ndim < 2 and transpose_b:
        raise QuantizationError(f"qmatmul: transpose_b needs b of rank >= 2, not {b.shape}")
    if not INT8_MIN <= out_min <= out_max <= INT8_MAX:
        raise QuantizationError(f"qmatmul: out_min {out_min} and out_max {out_max} must "
                                "satisfy -128 <= out_min <= out_max <= 127")
    bb = np.swapaxes(b, -1, -2) if transpose_b else b
    acc = np.matmul(a.astype(np.int64), bb.astype(np.int64))
    y = requantize(acc, multiplier, shift)
    return np.clip(y, out_min, out_max).astype(np.int8)


# --- qsoftmax --------------------------------------------------------------------------------

def softmax_params(in_scale: float, max_prob: float) -> dict:
    """The params of a qsoftmax whose input has scale `in_scale` and whose output's
    calibrated largest value is `max_prob` (in (0, 1]; module docstring)."""
    if not (np.isfinite(in_scale) and in_scale > 0):
        raise QuantizationError(f"qsoftmax: the input scale {in_scale!r} must be positive "
                                "and finite")
    c = int(np.clip(np.floor(in_scale * _LOG2E * (1 << EXP_BITS) + 0.5), 1,
                    MAX_EXP_MULTIPLIER))
    m = min(max(float(max_prob), 1e-9), 1.0)
    k = 7
    while k < MAX_PROB_BITS and m * 2 ** (k + 1) <= INT8_MAX + 0.5:
        k += 1
    return {"exp_multiplier": c, "prob_bits": k}


def qsoftmax(x, params, excluded=None) -> np.ndarray:
    """The integer softmax of int8 `x` over its last axis (module docstring); `excluded`
    (bool, broadcastable to x) leaves positions out. int8, scale 2**-prob_bits."""
    x = _need_int8(x, "qsoftmax: x")
    c = _param(params, "exp_multiplier", 1, MAX_EXP_MULTIPLIER, "qsoftmax")
    k = _param(params, "prob_bits", 0, MAX_PROB_BITS, "qsoftmax")
    if x.ndim == 0 or x.shape[-1] > MAX_SOFTMAX_LENGTH:
        raise QuantizationError(f"qsoftmax: rows of {x.shape[-1] if x.ndim else 0} "
                                f"entries; the definition holds for 1 to "
                                f"{MAX_SOFTMAX_LENGTH}")
    xi = x.astype(np.int64)
    if excluded is None:
        keep = np.ones(x.shape, bool)
    else:
        keep = ~np.broadcast_to(np.asarray(excluded, bool), x.shape)
    m = np.where(keep, xi, INT8_MIN).max(axis=-1, keepdims=True)
    d = np.where(keep, xi - m, 0)
    e = np.where(keep, exp2_neg(d * c), 0)
    s = e.sum(axis=-1, keepdims=True)
    p = ((e << k) + (s >> 1)) // np.maximum(s, 1)
    return np.minimum(p, INT8_MAX).astype(np.int8)


def exp_table(node) -> np.ndarray:
    """The exponentials of a qsoftmax or qattention node for ``x - m`` = -255 .. 0:
    int32[256], index ``x - m + 255`` (so entry 255 is 65536)."""
    params = node.attrs["softmax_params"] if node.op == "qattention" else node.attrs["params"]
    c = _param(params, "exp_multiplier", 1, MAX_EXP_MULTIPLIER, f"node {node.name!r}")
    return exp2_neg(np.arange(-255, 1, dtype=np.int64) * c).astype(np.int32)


# --- qlayer_norm -----------------------------------------------------------------------------

def layer_norm_shifts(length: int) -> dict:
    """The shifts a qlayer_norm over rows of `length` entries takes (module docstring):
    ``c`` (the least with 4**c >= length - 1), ``k`` = K (P's scale, 2**K per standard
    deviation), ``z_shift`` = Z (P >> Z is z) and ``gamma_bits`` (|G| < 2**gamma_bits)."""
    if not 1 <= length <= MAX_LAYER_NORM_LENGTH:
        raise QuantizationError(f"qlayer_norm: rows of {length} entries; the definition "
                                f"holds for 1 to {MAX_LAYER_NORM_LENGTH}")
    c = 0
    while 4 ** c < length - 1:
        c += 1
    k = LN_PRODUCT_BITS - c
    return {"c": c, "k": k, "z_shift": k - LN_Z_BITS,
            "gamma_bits": LN_PRODUCT_BITS - 1 - LN_Z_BITS - c}


def layer_norm_params(gamma, beta, epsilon: float, in_scale: float, out_scale: float,
                      length: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """(G int32, B int32, params) of a qlayer_norm over rows of `length` from float
    gamma, beta (None: 0), the float epsilon and the input and output scales."""
    shifts = layer_norm_shifts(length)
    for what, s in (("input", in_scale), ("output", out_scale)):
        if not (np.isfinite(s) and s > 0):
            raise QuantizationError(f"qlayer_norm: the {what} scale {s!r} must be positive "
                                    "and finite")
    g = np.asarray(gamma, np.float64).reshape(-1)
    b = np.zeros(length) if beta is None else np.asarray(beta, np.float64).reshape(-1)
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(b))):
        raise QuantizationError("qlayer_norm: gamma and beta must be finite")
    eps = float(epsilon) * length * length / (in_scale * in_scale)
    eps = int(min(max(1.0, np.floor(eps + 0.5)), MAX_LN_EPS))
    ratio = g / out_scale
    top = float(np.abs(ratio).max(initial=0.0))
    limit = (1 << shifts["gamma_bits"]) - 0.5
    shift = MAX_LN_SHIFT
    while shift > 1 and top * 2.0 ** (shift - LN_Z_BITS) >= limit:
        shift -= 1
    G = np.floor(ratio * 2.0 ** (shift - LN_Z_BITS) + 0.5)
    if np.abs(G).max(initial=0) >= (1 << shifts["gamma_bits"]):
        raise QuantizationError(f"qlayer_norm: gamma / output scale {top:.6g} is too large "
                                f"for rows of {length}")
    lim = 2.0 ** (shift + 8)
    B = np.clip(np.floor(b / out_scale * 2.0 ** shift + 0.5), -lim, lim)
    return G.astype(np.int32), B.astype(np.int32), {"eps": eps, "shift": shift}


def _layer_norm_row_terms(s, q, length: int, eps: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, O) of qlayer_norm rows from their int sums `s` = S and `q` = Q (any shape):
    the per-row int64 steps of the module docstring, each entry's P then x * M + O."""
    sh = layer_norm_shifts(length)
    s, q = _int64(s), _int64(q)
    w = length * q - s * s + eps
    # bit_length of w < 2**47: a double holds it exactly, and frexp's exponent is it.
    e = (LN_NORM_BITS - np.frexp(w.astype(np.float64))[1].astype(np.int64)) // 2
    wn = np.where(e >= 0, w << np.maximum(2 * e, 0), w >> np.maximum(-2 * e, 0))
    sd = isqrt(wn)
    m = np.minimum((np.int64(length) << (sh["k"] + e)) // sd, (1 << 31) - 1)
    o = (1 << (sh["z_shift"] - 1)) - (s * m) // length
    return m, o


def qlayer_norm(x, gamma, beta, params) -> np.ndarray:
    """The integer layer norm of int8 `x` over its last axis (module docstring), int32
    `gamma` G and `beta` B per channel (None: 0)."""
    x = _need_int8(x, "qlayer_norm: x")
    n = x.shape[-1] if x.ndim else 0
    sh = layer_norm_shifts(n)
    eps = _param(params, "eps", 1, MAX_LN_EPS, "qlayer_norm")
    r = _param(params, "shift", 1, MAX_LN_SHIFT, "qlayer_norm")
    G = np.zeros(n, np.int64) if gamma is None else _int64(gamma).reshape(-1)
    B = np.zeros(n, np.int64) if beta is None else _int64(beta).reshape(-1)
    if G.shape != (n,) or B.shape != (n,):
        raise QuantizationError(f"qlayer_norm: gamma and beta need {n} values, not "
                                f"{G.size} and {B.size}")
    if np.abs(G).max(initial=0) >= (1 << sh["gamma_bits"]) \
            or np.abs(B).max(initial=0) > (1 << (r + 8)):
        raise QuantizationError(f"qlayer_norm: gamma must be in (-2**{sh['gamma_bits']}, "
                                f"2**{sh['gamma_bits']}) for rows of {n} and beta within "
                                "+-2**(shift + 8)")
    xi = x.astype(np.int64)
    m, o = _layer_norm_row_terms(xi.sum(axis=-1, keepdims=True),
                                (xi * xi).sum(axis=-1, keepdims=True), n, eps)
    z = (xi * m + o) >> sh["z_shift"]
    y = (z * G + B + (np.int64(1) << (r - 1))) >> r
    return np.clip(y, INT8_MIN, INT8_MAX).astype(np.int8)


# --- qgelu -----------------------------------------------------------------------------------

def gelu_params(in_scale: float, out_scale: float) -> dict:
    """The params of a qgelu from its input and output scales (module docstring)."""
    for what, s in (("input", in_scale), ("output", out_scale)):
        if not (np.isfinite(s) and s > 0):
            raise QuantizationError(f"qgelu: the {what} scale {s!r} must be positive and "
                                    "finite")
    a1 = _GELU_C * _LOG2E * in_scale * (1 << EXP_BITS)
    b1 = _GELU_C * 0.044715 * _LOG2E * in_scale ** 3 * (1 << EXP_BITS)
    q_shift = 48
    while q_shift > 0 and 128 * (a1 + 16384 * b1) * 2.0 ** q_shift >= 2.0 ** 62:
        q_shift -= 1
    if 128 * (a1 + 16384 * b1) >= 2.0 ** 62:
        raise QuantizationError(f"qgelu: the input scale {in_scale:.6g} is too large")
    a = int(np.floor(a1 * 2.0 ** q_shift + 0.5))
    b = int(np.floor(b1 * 2.0 ** q_shift + 0.5))
    ratio = in_scale / out_scale
    shift = 62
    while shift > 1 and ratio * 2.0 ** (shift - SIGMOID_BITS) >= (1 << 24) - 0.5:
        shift -= 1
    m = int(np.floor(ratio * 2.0 ** (shift - SIGMOID_BITS) + 0.5))
    if not 1 <= m < (1 << 24):
        raise QuantizationError(f"qgelu: the scale ratio {ratio:.6g} (input / output) is "
                                "out of range")
    return {"a": a, "b": b, "q_shift": q_shift, "multiplier": m, "shift": shift}


def qgelu(x, params) -> np.ndarray:
    """The integer GELU of int8 `x` (module docstring)."""
    x = _need_int8(x, "qgelu: x")
    a = _param(params, "a", 0, 1 << 62, "qgelu")
    b = _param(params, "b", 0, 1 << 62, "qgelu")
    q_shift = _param(params, "q_shift", 0, 48, "qgelu")
    m = _param(params, "multiplier", 1, (1 << 24) - 1, "qgelu")
    r = _param(params, "shift", 1, 62, "qgelu")
    if 128 * (a + 16384 * b) >= (1 << 62):
        raise QuantizationError("qgelu: params a and b too large: 128 (a + 16384 b) must "
                                "stay below 2**62")
    xi = x.astype(np.int64)
    ax = np.abs(xi)
    t = (ax * (a + ax * ax * b)) >> q_shift
    e = exp2_neg(-t)
    one = np.int64(1) << EXP_BITS
    sp = ((np.int64(1) << (EXP_BITS + SIGMOID_BITS)) + ((one + e) >> 1)) // (one + e)
    sig = np.where(xi >= 0, sp, (1 << SIGMOID_BITS) - sp)
    y = (xi * sig * m + (np.int64(1) << (r - 1))) >> r
    return np.clip(y, INT8_MIN, INT8_MAX).astype(np.int8)


def gelu_table(node) -> np.ndarray:
    """qgelu of a node for the 256 int8 values: int8[256], index ``x + 128``."""
    return qgelu(np.arange(-128, 128).astype(np.int8), node.attrs["params"])


# --- qattention ------------------------------------------------------------------------------

def causal_exclusion(s: int, t: int) -> np.ndarray:
    """(s, t) bool: True where key j > query i + (t - s)."""
    return np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)


def qattention(q, k, v, mask, attrs: dict) -> np.ndarray:
    """The integer attention (module docstring): `attrs` holds qk_* and pv_*
    requantizations, ``softmax_params`` and ``causal``; `mask` is None or bool, True
    where a key is excluded."""
    s = qmatmul(q, k, attrs["qk_multiplier"], attrs["qk_shift"], attrs["qk_out_min"],
                attrs["qk_out_max"], transpose_b=True)
    excluded = None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise QuantizationError(f"qattention: the mask must be bool (True: excluded), "
                                    f"not {mask.dtype}")
        excluded = np.broadcast_to(mask, s.shape)
    if attrs.get("causal"):
        c = np.broadcast_to(causal_exclusion(s.shape[-2], s.shape[-1]), s.shape)
        excluded = c if excluded is None else (excluded | c)
    p = qsoftmax(s, attrs["softmax_params"], excluded)
    return qmatmul(p, v, attrs["pv_multiplier"], attrs["pv_shift"], attrs["pv_out_min"],
                   attrs["pv_out_max"])
