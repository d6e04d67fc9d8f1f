"""`requantize` and `requantize_params`: rounding, shifts, 32-bit wrap-around, per-channel
parameters and bounds, against an independent pure-Python scalar model, a composition of
the ISA's ALU lane operations, and an ALU program on the functional simulator."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla import AluOp
from vdla.compiler.reference.integer import (MULTIPLIER_MAX, POOL_MULTIPLIER_MAX,
                                             QuantizationError, requantize,
                                             requantize_params, wrap32)
from vdla.isa import Uop
from vdla_testing import load_acc_insn, put, reference_alu_op, run_acc_program


def wrap(v: int) -> int:
    """Low 32 bits as a signed Python int."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def scalar_requantize(acc: int, multiplier: int | None, shift: int) -> int:
    """The documented semantics, one value at a time, in Python integers."""
    a = wrap(acc)
    if multiplier is not None:
        a = wrap(a * multiplier)
    if shift > 0:
        return wrap(a + (1 << (shift - 1))) >> shift       # Python's >> floors: arithmetic
    return wrap(a << -shift)


def alu_requantize(acc: int, multiplier: int | None, shift: int) -> int:
    """The same as a sequence of ALU lane operations (MUL, ADD, SHR), written from the ISA
    description (tests/vdla_testing.py): shows the arithmetic is what the ALU does."""
    a = wrap(acc)
    if multiplier is not None:
        a = reference_alu_op(AluOp.MUL, a, multiplier)
    if shift > 0:
        a = reference_alu_op(AluOp.ADD, a, 1 << (shift - 1))
    return reference_alu_op(AluOp.SHR, a, shift)


def test_shift_rounds_half_up_for_positive_and_negative_values():
    acc = np.arange(-12, 13)
    for shift in (1, 2, 3):
        got = requantize(acc, None, shift)
        # Exact rationals: floor(x / 2**s + 1/2).
        expected = np.floor(acc / 2 ** shift + 0.5).astype(np.int32)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.int32
    # Ties go up (towards +inf) on both sides of zero.
    np.testing.assert_array_equal(requantize([2, 6, -2, -6, -10], None, 2), [1, 2, 0, -1, -2])


def test_shift_zero_is_identity_and_negative_shift_shifts_left():
    acc = np.array([3, -3, 0, 1000, -(1 << 20)])
    np.testing.assert_array_equal(requantize(acc, None, 0), acc)
    np.testing.assert_array_equal(requantize(acc, None, -4), acc * 16)
    np.testing.assert_array_equal(requantize([1], None, -31), [-(1 << 31)])


def test_multiplier_then_shift():
    acc = np.array([100, -100, 7, -7])
    # 100 * 3 = 300; 300 / 8 = 37.5 -> 38; -300 / 8 = -37.5 -> -37 (half up)
    np.testing.assert_array_equal(requantize(acc, 3, 3), [38, -37, 3, -3])
    np.testing.assert_array_equal(requantize(acc, 5, 0), acc * 5)
    np.testing.assert_array_equal(requantize(acc, 5, -1), acc * 10)


def test_wraps_at_32_bits_at_every_step():
    # The input is wrapped first.
    np.testing.assert_array_equal(requantize(np.array([(1 << 32) + 5, 1 << 31], np.int64), None, 0),
                                  [5, -(1 << 31)])
    # The rounding add wraps before the shift (ADD, then SHR, as on the ALU).
    np.testing.assert_array_equal(requantize([(1 << 31) - 1], None, 1), [-(1 << 30)])
    # The product keeps its low 32 bits.
    assert requantize(1 << 20, MULTIPLIER_MAX, 0) == wrap((1 << 20) * MULTIPLIER_MAX)
    assert requantize(1 << 20, MULTIPLIER_MAX, 4) == scalar_requantize(1 << 20, MULTIPLIER_MAX, 4)
    # The left shift keeps its low 32 bits.
    np.testing.assert_array_equal(requantize([1 << 30, 3 << 29], None, -2), [0, wrap(3 << 31)])
    np.testing.assert_array_equal(wrap32(np.array([(1 << 32) - 1, 1 << 33], np.int64)), [-1, 0])


def test_per_channel_parameters_along_an_axis():
    rng = np.random.default_rng(1)
    acc = rng.integers(-(1 << 20), 1 << 20, size=(2, 3, 4, 5))
    shifts = [1, 7, -2]
    multipliers = [3, 1000, 32767]
    got = requantize(acc, multipliers, shifts, axis=1)
    for c in range(3):
        np.testing.assert_array_equal(got[:, c], requantize(acc[:, c], multipliers[c], shifts[c]))
    # The last axis, and a numpy array of shifts without multipliers.
    shifts5 = np.array([0, 1, 2, 3, 31])
    got = requantize(acc, None, shifts5, axis=-1)
    for c in range(5):
        np.testing.assert_array_equal(got[..., c], requantize(acc[..., c], None, int(shifts5[c])))
    # A one-element sequence is one value for every channel (the ops' default shift (0,)).
    np.testing.assert_array_equal(requantize(acc, None, (3,)), requantize(acc, None, 3))


def test_random_values_match_the_scalar_model_and_the_alu_lane_ops():
    rng = np.random.default_rng(7)
    acc = np.concatenate([rng.integers(-(1 << 40), 1 << 40, 300),
                          rng.integers(-(1 << 31), 1 << 31, 300),
                          rng.integers(-4096, 4096, 300),
                          [0, 1, -1, (1 << 31) - 1, -(1 << 31)]])
    for _ in range(40):
        shift = int(rng.integers(-31, 32))
        multiplier = None if rng.random() < 0.3 else int(rng.integers(1, MULTIPLIER_MAX + 1))
        got = requantize(acc, multiplier, shift)
        expected = [scalar_requantize(int(a), multiplier, shift) for a in acc]
        np.testing.assert_array_equal(got, expected, err_msg=f"m={multiplier} s={shift}")
        alu = [alu_requantize(int(a), multiplier, shift) for a in acc[::25]]
        np.testing.assert_array_equal(got[::25], alu, err_msg=f"m={multiplier} s={shift}")


def test_per_channel_requantize_runs_as_an_alu_program():
    """MUL, ADD and SHR with per-lane vector operands from the accumulator buffer (the
    rounding constants there too: most do not fit the 16-bit immediate) on the functional
    simulator give requantize's int32 results exactly; MAX/MIN then clip them."""
    config = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"})
    dev = vdla.runtime.open(config, backend="functional", dram_size=1 << 20)
    c = config
    rng = np.random.default_rng(3)
    n = 6                                            # rows of block_out lanes
    acc = rng.integers(-(1 << 22), 1 << 22, size=(2 * n, c.batch, c.block_out)).astype(np.int32)
    multiplier = rng.integers(1, MULTIPLIER_MAX + 1, size=c.block_out)
    shift = rng.integers(-8, 32, size=c.block_out)
    rounding = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 0)
    table = np.stack([np.broadcast_to(v, (c.batch, c.block_out))
                      for v in (multiplier, rounding, shift)]).astype(np.int64)
    addr = put(dev, np.concatenate([acc, wrap32(table)]).astype(np.int32))
    rows = 2 * n

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=1, x_size=rows + 3, x_stride=rows + 3))
        for k, op in enumerate((AluOp.MUL, AluOp.ADD, AluOp.SHR)):
            p.alu(op, uop_bgn=k, uop_end=k + 1, iter_out=rows, iter_in=1, dst_factor_out=1)
        # Clip the second half only.
        loop = dict(uop_bgn=3, uop_end=4, iter_out=n, iter_in=1, dst_factor_out=1)
        p.alu(AluOp.MAX, use_imm=True, imm=-128, **loop)
        p.alu(AluOp.MIN, use_imm=True, imm=127, **loop)

    uops = [Uop(0, rows), Uop(0, rows + 1), Uop(0, rows + 2), Uop(n, 0)]
    got = run_acc_program(dev, uops, body, rows).reshape(acc.shape)
    expected = requantize(acc, multiplier, shift, axis=-1)
    np.testing.assert_array_equal(got[:n], expected[:n])
    np.testing.assert_array_equal(got[n:], np.clip(expected[n:], -128, 127))
    assert np.abs(expected[:n]).max() > 1 << 16      # not only small or clipped values


@pytest.mark.parametrize("multiplier, shift, match", [
    (0, 1, r"multiplier 0 is outside the allowed range \[1, 32767\]"),
    (32768, 1, r"multiplier 32768 is outside"),
    (-3, 1, r"multiplier -3 is outside"),
    (None, 32, r"shift 32 is outside the allowed range \[-31, 31\]"),
    (None, -32, r"shift -32 is outside"),
    ([1, 2, 0], 1, r"multiplier 0 is outside"),
    (None, [1, 40, 2], r"shift 40 is outside"),
    (1.5, 1, r"multiplier must be an integer"),
    (None, 2.0, r"shift must be an integer"),
    (None, True, r"shift must be an integer"),
    (None, [[1, 2, 3]], r"1-D sequence"),
    ([1, 2], 0, r"multiplier has 2 values but axis 1 of the input has 3 channels"),
    (None, [1, 2, 3, 4], r"shift has 4 values but axis 1"),
])
def test_bad_parameters_are_rejected(multiplier, shift, match):
    with pytest.raises(QuantizationError, match=match):
        requantize(np.zeros((2, 3, 2), np.int32), multiplier, shift)


def test_bad_accumulators_and_axis_are_rejected():
    with pytest.raises(QuantizationError, match="must be integers, not float32"):
        requantize(np.zeros(4, np.float32), None, 1)
    with pytest.raises(QuantizationError, match="channel axis 3, which an input of shape"):
        requantize(np.zeros((2, 3), np.int32), None, [1, 2], axis=3)
    with pytest.raises(QuantizationError, match="channel axis 1, which an input of shape"):
        requantize(5, None, [1, 2])


# --- requantize_params ---------------------------------------------------------------------

def test_shift_mode_params_are_exact_shifts():
    assert requantize_params(2.0 ** -9, multiply=False) == (None, 9)
    assert requantize_params(4.0, multiply=False) == (None, -2)
    assert requantize_params(1.0, multiply=False) == (None, 0)
    assert requantize_params(np.array([0.5, 0.125]), multiply=False) == (None, (1, 3))
    # Beyond 31 the result is 0 for any realistic input: clamped.
    assert requantize_params(2.0 ** -40, multiply=False) == (None, 31)
    with pytest.raises(QuantizationError, match="not a power of two"):
        requantize_params(0.3, multiply=False)
    with pytest.raises(QuantizationError, match="left shift beyond 31"):
        requantize_params(2.0 ** 32, multiply=False)
    with pytest.raises(QuantizationError, match="positive and finite"):
        requantize_params(0.0, multiply=False)


@pytest.mark.parametrize("ratio, worst", [(0.0037, 1 << 20), (0.3, 128), (1e-6, 5000),
                                          (3.7, 128), (0.012, 40_000_000), (700.0, 128)])
def test_multiply_mode_picks_the_largest_shift_that_cannot_wrap(ratio, worst):
    m, s = requantize_params(ratio, worst, multiply=True)
    assert 1 <= m <= MULTIPLIER_MAX and -31 <= s <= 31
    rounding = 1 << (s - 1) if s > 0 else 0
    assert worst * m + rounding < 1 << 31
    assert abs(m * 2.0 ** -s - ratio) <= 0.5 * 2.0 ** -s       # m is the rounded ratio
    if s < 31:                                                  # one more bit would break
        m1 = int(np.floor(ratio * 2.0 ** (s + 1) + 0.5))
        assert m1 > MULTIPLIER_MAX or worst * m1 + (1 << s) >= 1 << 31
    # Requantizing by (m, s) approximates the ratio to about 1 / m.
    acc = np.array([worst // 3, -worst // 7], np.int64)
    np.testing.assert_allclose(requantize(acc, m, s), acc * ratio, rtol=2 / m, atol=1)


def test_multiply_mode_edge_cases():
    assert requantize_params(0.25, 1000, multiply=True) == (None, 2)     # power of two
    assert requantize_params(1e-12, 1000, multiply=True) == (1, 31)      # rounds to 0
    m, s = requantize_params(np.array([0.01, 0.02]), np.array([100, 1 << 24]), multiply=True)
    assert isinstance(m, tuple) and isinstance(s, tuple) and s[0] > s[1]
    with pytest.raises(QuantizationError, match="too large for any multiplier"):
        requantize_params(0.3, 1 << 31, multiply=True)


@pytest.mark.parametrize("ratio, worst", [(1 / 49, 128 * 49), (1 / 9, 128 * 9), (0.3, 128),
                                          (3 / 49, 128 * 49), (1e-6, 128)])
def test_a_smaller_multiplier_bound_for_int8_multipliers(ratio, worst):
    """A shift-mode average pool's multiplier is an int8 GEMM weight: at most 127, with
    the same rule (largest shift, no wrap) as the ALU's 16-bit ones."""
    m, s = requantize_params(ratio, worst, multiply=True, max_multiplier=POOL_MULTIPLIER_MAX)
    assert POOL_MULTIPLIER_MAX == 127 and 1 <= m <= 127
    assert m == int(np.floor(ratio * 2.0 ** s + 0.5)) or (m, s) == (1, 31)
    if s < 31:
        assert int(np.floor(ratio * 2.0 ** (s + 1) + 0.5)) > 127
    wide = requantize_params(ratio, worst, multiply=True)
    assert wide[1] >= s                                  # the 16-bit bound shifts further
    if (m, s) != (1, 31):
        assert abs(m * 2.0 ** -s / ratio - 1) < 1 / 128  # 7 significant bits
    assert requantize_params(0.25, worst, multiply=True, max_multiplier=127) == (None, 2)


@pytest.mark.parametrize("bound", [0, 32768, 1.5, True])
def test_bad_multiplier_bounds_are_rejected(bound):
    with pytest.raises(QuantizationError, match=r"max_multiplier must be an integer in "
                                                 r"\[1, 32767\]"):
        requantize_params(0.3, 128, multiply=True, max_multiplier=bound)
