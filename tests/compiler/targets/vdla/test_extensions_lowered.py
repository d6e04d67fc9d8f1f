"""vdla back half on configs with extensions past VTA (REQ, `alu_hold`): convolutions
lowered for them match the integer reference bit-exactly on the functional simulator,
use the extensions (REQ ends the epilogue, no MAX/MIN), and the timing model counts what
they save."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from .test_conv2d import check_conv, conv_graph
from vdla.compiler.targets.vdla import lower_conv2d
from vdla.compiler.targets.vdla.conv_layer import conv2d_layer
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.config import AluOp
from vdla.isa import Alu

BASE = {"MIN", "MAX", "ADD", "SHR"}
REQ = vdla.HardwareConfig(alu_ops=BASE | {"REQ"})
HOLD = vdla.HardwareConfig(alu_hold=True)
BOTH = vdla.HardwareConfig(alu_ops=BASE | {"REQ"}, alu_hold=True)
ALL = vdla.HardwareConfig(alu_ops=BASE | {"REQ", "MUL"}, alu_hold=True)
CONFIGS = {"req": REQ, "hold": HOLD, "req_hold": BOTH}

CASES = {  # name -> conv_graph keyword arguments (besides rng)
    "per_tensor_relu": dict(shift=(9,), out_min=0, out_max=127),
    "per_channel": dict(shift=tuple(i % 24 for i in range(40)), out_min=-128, out_max=127),
    "relu6_like": dict(shift=(9,), out_min=0, out_max=90),
    "per_channel_clamp": dict(shift=tuple(5 + i % 20 for i in range(40)), out_min=-20, out_max=90),
    "no_shift": dict(shift=(0,), out_min=-128, out_max=127),
    "left_shift": dict(shift=(-2,), k=1, pad=0, c=3, out_min=-128, out_max=127),
    "late_residual": dict(shift=(9,), residual=True, residual_shift=0, out_min=0),
    "requantized_residual": dict(shift=tuple(i % 24 for i in range(40)), residual=True, residual_shift=1,
                                 out_min=0, out_max=100),
    "no_bias": dict(shift=(17,), bias=False, out_min=-20, out_max=90),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_conv_matches_the_reference(case, config):
    rng = np.random.default_rng(hash(case) % 1000)
    kwargs = dict(c=33, o=40, h=9, w=9, k=3, pad=1) | CASES[case]
    if case == "left_shift":
        kwargs["o"] = 40
    g, name, feed, weights, bias = conv_graph(rng, **kwargs)
    if case == "left_shift":
        feed["x"] = rng.integers(-2, 3, feed["x"].shape).astype(np.int8)
    lowered, _ = check_conv(g, name, feed, weights, bias, config=CONFIGS[config])
    ops = [insn.alu_opcode for insn in lowered.program if isinstance(insn, Alu)]
    if AluOp.REQ in CONFIGS[config].alu_ops:
        # REQ clamps: no MAX/MIN pass is left, and one REQ pass per tile.
        assert AluOp.REQ in ops and AluOp.MAX not in ops and AluOp.MIN not in ops
    else:
        assert AluOp.MAX in ops and AluOp.MIN in ops


def test_multiplier_with_req():
    """MUL, the rounding ADD, then REQ (shift and clamp) on a config with both."""
    rng = np.random.default_rng(5)
    g, name, feed, weights, bias = conv_graph(
        rng, c=20, o=40, h=8, w=8, k=3, stride=2, pad=1,
        multiplier=tuple(int(m) for m in rng.integers(1, 32768, 40)),
        shift=tuple(int(s) for s in rng.integers(14, 31, 40)), out_min=0)
    check_conv(g, name, feed, weights, bias, config=ALL)


def test_req_fuses_the_shift_and_the_clamp():
    """Per output entry, the epilogue of a per-channel shift with ReLU is the bias GEMM
    and one REQ (which leaves the accumulators at zero for the next tile, so no reset)
    with REQ and alu_hold; a reset, the bias, a two-cycle SHR, MAX and MIN without (6
    cycles against 2), and the timing model says so."""
    rng = np.random.default_rng(9)
    g, name, *_ = conv_graph(rng, c=64, o=64, h=14, w=14, shift=tuple(4 + i % 8 for i in range(64)), out_min=0)
    node = g.node(name)
    plain_layer, plain = conv2d_layer(node, g, vdla.HardwareConfig())
    layer, epi = conv2d_layer(node, g, BOTH)
    assert [s.op for s in plain.main] == [AluOp.SHR] and plain.clamp is None
    assert [s.op for s in epi.main] == [AluOp.REQ] and epi.clamp == ()
    lowered = lower_conv2d(node, g, BOTH)
    alus = [insn for insn in lowered.program if isinstance(insn, Alu)]
    assert {insn.alu_opcode for insn in alus} == {AluOp.REQ}
    # Every REQ holds its operand row: one micro-op, src fixed in the inner loop.
    assert all(insn.uop_end - insn.uop_bgn == 1 and insn.src_factor_in == 0 for insn in alus)
    fast = estimate_conv2d(layer, lowered.schedule, BOTH, alu_passes=(0, 1))
    slow = estimate_conv2d(plain_layer, lowered.schedule, vdla.HardwareConfig(),
                           alu_passes=(2, 1))
    entries = 14 * 14 * 64 // 16
    # 4 cycles an entry (the SHR's second, MAX, MIN, and the reset REQ makes needless),
    # and the instructions' pipeline fill and drain.
    assert 4 * entries < slow.epilogue - fast.epilogue < 4.3 * entries
