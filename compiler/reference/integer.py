"""The integer arithmetic of quantized graphs: the reference every back half reproduces.

This module DEFINES the arithmetic of the integer operators (`vdla.compiler.ir.ops`);
their kernels (`vdla.compiler.reference.kernels_int`) compute exactly this, and every
back half is checked against them bit-exactly. Every step is one of the accelerator's
ALU operations on int32 lanes (MIN, MAX, ADD, SHR, and MUL in the "multiply"
requantization mode), wrap-around included, so any target can reproduce it with 32-bit
integer arithmetic.
``wrap32(v)`` keeps the low 32 bits of `v` as a signed number.

``requantize(acc, multiplier, shift)`` (per tensor, or per channel along an axis)::

    a = wrap32(acc)
    if multiplier is not None:   a = wrap32(a * multiplier)                      # MUL
    if shift > 0:                a = wrap32(a + (1 << (shift - 1))) >> shift     # ADD, SHR
    else:                        a = wrap32(a << -shift)                         # SHR < 0

``>>`` is arithmetic, so the rounding is half up (towards +inf) for either sign.
Bounds: ``multiplier`` in [1, 32767] (a positive 16-bit signed immediate), ``shift`` in
[-31, 31] (the SHR amount is the operand's low 6 bits as a signed number).

*Multipliers by mode.* In the "multiply" mode any requantization may have a multiplier
(the ALU's MUL). In the "shift" mode (a target without MUL) GEMM and add requantizations
have none (``multiplier`` is None): every scale is a power of two. The one exception is
the average pools, whose ratio ``s_in / (count * s_out)`` is not a power of two when the
window count is not: ``qavg_pool2d`` and ``qglobal_avg_pool2d`` then carry a multiplier
in [1, `POOL_MULTIPLIER_MAX`] = [1, 127], an int8 value, so a back half without MUL can
apply it as the weight of the window sum on its GEMM core
(``sum(x * multiplier) == wrap32(sum(x) * multiplier)``: the quantizer guarantees no
wrap). The arithmetic is the same ``requantize`` either way.

*The rounding constant* ``1 << (shift - 1)`` is part of the definition whatever its size.
It fits the ALU's 16-bit signed immediate while ``shift <= 15``; beyond that a back half
adds it as a vector operand from the accumulator buffer (loaded like a bias) or, when
the requantization follows a bias add with no multiplier in between (shift-only
``qconv2d``/``qdense`` with a bias), folds it into the bias:
``wrap32(wrap32(s + bias) + r) == wrap32(s + wrap32(bias + r))`` since additions modulo
2**32 associate. The quantizer never pre-adds it: the reference above is the one rule.
Per-channel multipliers and shifts are vector operands for the same reason.

Operators (x, w, residual int8; bias int32; all results int8)::

    quantize(x):    clip(floor(x / scale + 0.5), -128, 127)           (float -> int8, host)
    dequantize(x):  float32(x * scale)                                (int -> float, host)
    qconv2d(x, w, bias, residual), qdense(...):
        acc = wrap32(sum(x * w) + bias)              # GEMM into int32 accumulators
        y   = requantize(acc, multiplier, shift)     # per output channel (axis 1)
        if residual: y = wrap32(y + requantize(residual, residual_multiplier,
                                               residual_shift))
        out = clip(y, out_min, out_max)              # MAX, MIN; then narrowed to int8
    qadd(a, b):     clip(wrap32(requantize(a, a_multiplier, a_shift)
                                + requantize(b, b_multiplier, b_shift)), out_min, out_max)
    qavg_pool2d(x): clip(requantize(window sums, multiplier, shift), -128, 127)
    qglobal_avg_pool2d(x): likewise with the sum over H and W

The pools sum the window over the zero-padded input (padding and a ceil-mode overhang add
zeros) and never divide: the quantizer folds ``1 / count`` into multiplier and shift, so
it emits them only where every window has the same count (no padding, or
``count_include_pad`` without a ceil-mode overhang; ``count_include_pad`` on
``qavg_pool2d`` only records the float op's setting). ``max_pool2d``, ``relu``,
``flatten``, ``reshape``, ``transpose``, ``concat`` and ``pad`` (value 0) run on int8 with
their float kernels (``max_pool2d`` pads with the dtype's minimum).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vdla.compiler.ir.tensor import GraphError

__all__ = ["INT32_MAX", "INT32_MIN", "INT8_MAX", "INT8_MIN", "INT8_PRODUCTS_MAX",
           "MULTIPLIER_MAX", "MULTIPLIER_MIN", "POOL_MULTIPLIER_MAX", "QuantizationError",
           "SHIFT_MAX", "SHIFT_MIN", "is_pow2", "per_channel", "requantize",
           "requantize_params", "round_half_up", "wrap32"]

INT8_MIN, INT8_MAX = -128, 127
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
#: A multiplier is a positive 16-bit signed immediate of the ALU's MUL.
MULTIPLIER_MIN, MULTIPLIER_MAX = 1, (1 << 15) - 1
#: The largest multiplier of an average pool in the "shift" mode: an int8 weight, which a
#: back half without MUL applies on its GEMM core (module docstring).
POOL_MULTIPLIER_MAX = INT8_MAX
#: The SHR amount is the low 6 bits of its operand, signed; 32 would not shift right.
SHIFT_MIN, SHIFT_MAX = -31, 31
#: The most int8 x int8 products (128 * 128 each) an int32 accumulator sums without
#: overflow: the CPU and GPU targets refuse longer int8 reductions.
INT8_PRODUCTS_MAX = INT32_MAX // (128 * 128)


class QuantizationError(GraphError):
    """Bad input to the quantizer or to the integer arithmetic: the message names what
    was wrong, the value and what is allowed."""


# --- the integer arithmetic ----------------------------------------------------------------

def wrap32(value) -> np.ndarray:
    """The low 32 bits of integer `value` (array or int) as int32, two's complement."""
    return np.asarray(value, dtype=np.int64).astype(np.int32)


def _wrap64(value: np.ndarray) -> np.ndarray:
    # wrap32, kept in int64 so the next step cannot overflow numpy's integers.
    return value.astype(np.int32).astype(np.int64)


def _channel_param(name: str, value, low: int, high: int, shape: tuple[int, ...],
                   axis: int) -> np.ndarray:
    """`value` (int, or a sequence/array with one entry per channel along `axis` of an
    array of `shape`) as an int64 array that broadcasts against it; bounds checked."""
    arr = np.asarray(value)
    if isinstance(value, bool) or arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise QuantizationError(f"requantize: {name} must be an integer or a 1-D sequence of "
                                f"integers (one per channel), not {value!r}")
    arr = arr.astype(np.int64)
    bad = (arr < low) | (arr > high)
    if bad.any():
        raise QuantizationError(f"requantize: {name} {int(arr[bad][0])} is outside the "
                                f"allowed range [{low}, {high}]")
    if arr.size == 1:
        return arr.reshape(())
    if not -len(shape) <= axis < len(shape):
        raise QuantizationError(f"requantize: per-channel {name} ({arr.size} values) needs a "
                                f"channel axis {axis}, which an input of shape {shape} lacks")
    if arr.size != shape[axis]:
        raise QuantizationError(f"requantize: {name} has {arr.size} values but axis {axis} of "
                                f"the input has {shape[axis]} channels")
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    return arr.reshape(bshape)


def requantize(acc, multiplier, shift, axis: int = 1) -> np.ndarray:
    """Scale int32 accumulators down (or up) by ``multiplier * 2**-shift``, rounding half
    up, with the accelerator's 32-bit wrap-around at every step (module docstring).

    acc : integer array (or int); wrapped to int32 first
    multiplier : None (shift only), an int in [1, 32767], or one per channel along `axis`
    shift : an int in [-31, 31] or one per channel along `axis` (a 1-element sequence
        counts as one value)
    Returns an int32 array of acc's shape. Raises QuantizationError for a float `acc`,
    out-of-range parameters, or per-channel parameters that do not fit `axis`."""
    acc = np.asarray(acc)
    if acc.dtype.kind not in "iu":
        raise QuantizationError(f"requantize: the accumulators must be integers, not "
                                f"{acc.dtype}")
    a = _wrap64(acc.astype(np.int64))
    if multiplier is not None:
        m = _channel_param("multiplier", multiplier, MULTIPLIER_MIN, MULTIPLIER_MAX,
                           acc.shape, axis)
        a = _wrap64(a * m)
    s = _channel_param("shift", shift, SHIFT_MIN, SHIFT_MAX, acc.shape, axis)
    right = np.clip(s, 1, SHIFT_MAX)
    rounded = _wrap64(a + (np.int64(1) << (right - 1))) >> right
    left = _wrap64(a << np.clip(-s, 0, -SHIFT_MIN))
    return np.where(s > 0, rounded, left).astype(np.int32)


def per_channel(value, count: int, none_is: int | None = None) -> np.ndarray:
    """A per-tensor or per-channel attribute (None, one value, or `count` values) as
    `count` int32: what a back half hands its kernels for requantization parameters."""
    if value is None:
        return np.full(count, none_is, np.int32)
    arr = np.atleast_1d(np.asarray(value, dtype=np.int64)).reshape(-1)
    if arr.size == 1:
        return np.full(count, int(arr[0]), np.int32)
    if arr.size != count:
        raise ValueError(f"{arr.size} per-channel values for {count} channels")
    return arr.astype(np.int32)


def round_half_up(x):
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5)


def is_pow2(ratio: float) -> bool:
    return ratio > 0 and math.frexp(ratio)[0] == 0.5


def requantize_params(ratio, worst=0, *, multiply: bool,
                      max_multiplier: int = MULTIPLIER_MAX) -> tuple[Any, Any]:
    """The (multiplier, shift) that requantize by `ratio` (= scale in / scale out), per
    tensor (a float) or per channel (a 1-D array, with `worst` per channel or one value).

    ratio : a positive float, or a 1-D array of them (one per channel)
    worst : a bound on |acc| (per channel or one value): no product may wrap 32 bits
    multiply : False (shift mode): every ratio must be a power of two; multiplier is
        None, shift = -log2(ratio), clamped to 31 from above (a larger shift gives 0
        anyway for |acc| < 2**30). True: a ratio that is no power of two becomes
        ``multiplier * 2**-shift`` with the LARGEST shift in [-31, 31] such that
        ``multiplier = floor(ratio * 2**shift + 0.5)`` is at most `max_multiplier` and
        ``worst * multiplier + 2**(shift - 1) < 2**31`` (module docstring)
    max_multiplier : the largest multiplier allowed, in [1, 32767]: 32767 for the
        ALU's MUL (the default), `POOL_MULTIPLIER_MAX` (127) for a multiplier a back half
        applies as an int8 GEMM weight (a shift-mode average pool)
    Returns ints for a scalar ratio, tuples of ints per channel; the multiplier is None
    when every ratio is a power of two. Raises QuantizationError for a ratio that is not
    positive and finite or that needs a left shift beyond 31, a non-power-of-two ratio
    without `multiply`, or a `max_multiplier` out of range."""
    if (isinstance(max_multiplier, bool) or not isinstance(max_multiplier, (int, np.integer))
            or not MULTIPLIER_MIN <= max_multiplier <= MULTIPLIER_MAX):
        raise QuantizationError(f"requantize_params: max_multiplier must be an integer in "
                                f"[{MULTIPLIER_MIN}, {MULTIPLIER_MAX}], not {max_multiplier!r}")
    ratios = np.atleast_1d(np.asarray(ratio, dtype=np.float64))
    worsts = np.broadcast_to(np.asarray(worst, dtype=np.int64), ratios.shape)
    scalar = np.ndim(ratio) == 0
    if not np.all(np.isfinite(ratios)) or np.any(ratios <= 0):
        raise QuantizationError(f"requantization ratio {ratio!r} must be positive and finite")
    if ratios.max() > 2.0 ** -SHIFT_MIN:
        raise QuantizationError(f"requantization ratio {float(ratios.max()):.6g} needs a left "
                                f"shift beyond {-SHIFT_MIN} bits: the output scale is far "
                                "smaller than the input's")
    pow2 = all(is_pow2(float(r)) for r in ratios)
    if pow2:
        shifts = [min(SHIFT_MAX, -(math.frexp(float(r))[1] - 1)) for r in ratios]
        multipliers = None
    elif not multiply:
        bad = next(float(r) for r in ratios if not is_pow2(float(r)))
        raise QuantizationError(f"requantization ratio {bad:.6g} is not a power of two, which "
                                "a shift-only requantization (no ALU MUL) needs")
    else:
        multipliers, shifts = [], []
        for r, w in zip(ratios.tolist(), worsts.tolist()):
            m, s = _multiplier_shift(r, int(w), int(max_multiplier))
            multipliers.append(m)
            shifts.append(s)
    if scalar:
        return (None if multipliers is None else multipliers[0]), shifts[0]
    return (None if multipliers is None else tuple(multipliers)), tuple(shifts)


def _multiplier_shift(ratio: float, worst: int, max_multiplier: int) -> tuple[int, int]:
    for shift in range(SHIFT_MAX, SHIFT_MIN - 1, -1):
        m = max(MULTIPLIER_MIN, int(round_half_up(ratio * 2.0 ** shift)))
        if m > max_multiplier:
            continue
        rounding = 1 << (shift - 1) if shift > 0 else 0
        if worst * m + rounding <= INT32_MAX:
            return m, shift
        if m == MULTIPLIER_MIN:
            break           # smaller shifts only make it worse
    raise QuantizationError(f"requantization ratio {ratio:.6g}: the accumulators can reach "
                            f"{worst}, too large for any multiplier >= 1 without wrapping "
                            "32 bits")
