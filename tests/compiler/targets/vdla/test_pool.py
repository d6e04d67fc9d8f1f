"""vdla back half, pooling: max_pool2d, qavg_pool2d and qglobal_avg_pool2d lowered to
programs that match the integer reference bit-exactly on the functional simulator and on
Verilator, for kernels, strides, pads (max pooling pads with -128, average pooling with
zeros), ceil mode, channel counts that are not block multiples, batches, block_out a
multiple of block_in and block_in a multiple of block_out, per-channel and large-shift requantization, and many tilings."""

from __future__ import annotations

import numpy as np
import pytest
from differential import B2X8X32

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.vdla.pool import estimate_pool2d
from vdla.compiler.targets.vdla import (LoweredPool2d, Pool2dLayer, Pool2dSchedule,
                                        lower_pool2d, run_pool2d)
from vdla.compiler.targets.vdla.target import VdlaTarget
from vdla.isa import Alu, Gemm

DEFAULT = vdla.HardwareConfig()
WITH_MUL = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"})


def pool_graph(op, *, n=1, c=20, h=9, w=9, dtype="int8", **attrs) -> Graph:
    g = Graph("pool")
    x = g.add_input("x", (n, c, h, w), dtype)
    g.set_outputs([g.add_node(op, [x], name="pool", **attrs)])
    return g.validate()


def check_pool(g, config=DEFAULT, schedule=None, backend="functional", seed=0,
               low=-128) -> tuple[LoweredPool2d, dict]:
    """Lower, run on `backend`, compare with the reference; returns (lowered, stats)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(low, 128, g.tensors["x"].shape).astype(np.int8)
    want = run_reference(g, {"x": x})[g.outputs[0]]
    lowered = lower_pool2d("pool", g, config, schedule)
    dev = vdla.runtime.open(config, backend=backend, **(
        {"log": lambda message: None} if backend == "verilator" else {}))
    got, stats = run_pool2d(dev, lowered, x, return_stats=True)
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return lowered, stats


MAX_POOLS = [  # (c, h, w, kernel, stride, pads, ceil_mode)
    (20, 9, 9, 3, 2, 1, False),     # ResNet's stem pool, small
    (3, 8, 8, 2, 2, 0, False),
    (33, 10, 11, 3, 2, 0, True),    # the ceil-mode window hangs over the far edge
    (40, 7, 9, 3, 1, 1, False),
    (16, 12, 12, 5, 3, 2, True),
    (17, 6, 5, 2, 1, 1, False),     # pads on both sides with a 2x2 window
]


@pytest.mark.parametrize("c, h, w, k, stride, pad, ceil", MAX_POOLS)
def test_max_pool_grid(c, h, w, k, stride, pad, ceil):
    g = pool_graph("max_pool2d", c=c, h=h, w=w, kernel=(k, k), strides=(stride, stride),
                   pads=(pad,) * 4, ceil_mode=ceil)
    check_pool(g, seed=c + k)


def test_max_pool_pads_with_the_minimum_not_zero():
    """All-negative inputs: a window at the border must not see the LOAD's zero padding."""
    g = pool_graph("max_pool2d", c=16, h=6, w=6, kernel=(3, 3), strides=(2, 2),
                   pads=(1, 1, 1, 1))
    x = -(np.arange(16 * 36, dtype=np.int64).reshape(1, 16, 6, 6) % 128) - 1
    x = x.astype(np.int8)
    assert x.max() < 0
    lowered = lower_pool2d("pool", g, DEFAULT)
    got = run_pool2d(vdla.runtime.open(DEFAULT, backend="functional"), lowered, x)
    np.testing.assert_array_equal(got, run_reference(g, {"x": x})[g.outputs[0]])
    assert got.max() < 0


AVG_POOLS = [  # (c, h, w, kernel, stride, pads, ceil_mode, shift)
    (20, 9, 9, 3, 2, 1, False, 3),
    (33, 9, 9, 2, 1, 0, False, 2),
    (40, 10, 11, 3, 2, 0, True, 3),
    (5, 7, 7, 7, 1, 3, False, 6),
]


@pytest.mark.parametrize("c, h, w, k, stride, pad, ceil, shift", AVG_POOLS)
def test_avg_pool_grid(c, h, w, k, stride, pad, ceil, shift):
    g = pool_graph("qavg_pool2d", c=c, h=h, w=w, kernel=(k, k), strides=(stride, stride),
                   pads=(pad,) * 4, ceil_mode=ceil, shift=(shift,))
    check_pool(g, seed=c * k)


@pytest.mark.parametrize("c, h, w, shift", [(40, 7, 7, 6), (512, 7, 7, 6), (3, 1, 1, 0),
                                            (24, 4, 6, -1)])
def test_global_avg_pool(c, h, w, shift):
    check_pool(pool_graph("qglobal_avg_pool2d", c=c, h=h, w=w, shift=(shift,)), seed=c)


@pytest.mark.parametrize("multiplier, shift", [(1000, 20), (7282, 16), (3, 2)])
def test_multiplier_and_rounding_beyond_the_immediate(multiplier, shift):
    """A rounding constant 1 << (shift - 1) above 32767 is a vector operand."""
    g = pool_graph("qglobal_avg_pool2d", c=40, h=7, w=7, multiplier=multiplier,
                   shift=(shift,))
    lowered, _ = check_pool(g, config=WITH_MUL)
    assert lowered.layer.vec_passes == (1 if shift > 15 else 0)


@pytest.mark.parametrize("op, multiplier, shift, config", [
    ("qglobal_avg_pool2d", 85, 12, DEFAULT),      # 7x7 = 49: no power of two, no MUL
    ("qglobal_avg_pool2d", 127, 13, WITH_MUL),    # the weights carry it even with MUL
    ("qavg_pool2d", 57, 9, DEFAULT),
    ("qavg_pool2d", 300, 11, WITH_MUL),           # beyond int8: an ALU MUL
])
def test_multiplier_in_the_identity_weights(op, multiplier, shift, config):
    """A per-tensor multiplier of at most 127 scales the identity weights (no ALU MUL,
    so a config without MUL runs it); a larger one stays a MUL pass."""
    attrs = dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)) if op == "qavg_pool2d" \
        else {}
    g = pool_graph(op, c=40, h=7, w=7, multiplier=multiplier, shift=(shift,), **attrs)
    lowered, _ = check_pool(g, config=config)
    in_weights = multiplier <= 127
    assert lowered.layer.weight_scale == (multiplier if in_weights else 1)
    assert not any(isinstance(i, Alu) and i.alu_opcode.name == "MUL"
                   for i in lowered.program) == in_weights
    node = g.node("pool")
    ok, reason = VdlaTarget(config).supports(node, g)
    assert ok and ("scaled by the multiplier" in reason) == in_weights
    if in_weights:
        check_pool(g, config=config, backend="verilator")


def test_per_channel_shift_uses_constant_rows():
    shifts = tuple(range(1, 21))
    g = pool_graph("qavg_pool2d", c=20, kernel=(2, 2), strides=(2, 2), shift=shifts)
    lowered, _ = check_pool(g)
    assert lowered.layer.const_rows == 2   # the rounding row and the shift row


@pytest.mark.parametrize("op", ["max_pool2d", "qavg_pool2d"])
@pytest.mark.parametrize("schedule", [Pool2dSchedule(1, 1, 1), Pool2dSchedule(2, 3, 1),
                                      Pool2dSchedule(3, 5, 2), Pool2dSchedule(99, 99, 99)])
def test_schedules_and_batches(op, schedule):
    extra = {"shift": (3,)} if op == "qavg_pool2d" else {}
    g = pool_graph(op, n=2, c=40, h=9, w=10, kernel=(3, 3), strides=(2, 2),
                   pads=(1, 1, 1, 1), **extra)
    check_pool(g, schedule=schedule, seed=5)


def test_default_schedule_fits_and_is_the_cheapest_by_the_timing_model():
    g = pool_graph("max_pool2d", c=64, h=112, w=112, kernel=(3, 3), strides=(2, 2),
                   pads=(1, 1, 1, 1))
    layer = Pool2dLayer(kind="max", n=1, c=64, h=112, w=112, kernel_h=3, kernel_w=3,
                        stride_h=2, stride_w=2, pad_top=1, pad_left=1, out_h=56, out_w=56,
                        batch_blocks=1, blocks=4)
    lowered = lower_pool2d("pool", g, DEFAULT)
    assert lowered.layer == layer
    s = lowered.schedule
    assert s.fits(layer, DEFAULT)
    best = estimate_pool2d(layer, s, DEFAULT)
    for other in (Pool2dSchedule(1, 56, 4), Pool2dSchedule(4, 56, 1), Pool2dSchedule(2, 7, 2)):
        assert best <= estimate_pool2d(layer, other, DEFAULT)


def test_max_pool_work_per_entry():
    """The compute module's work: every MAX covers only taps inside the image, so the MAX
    micro-ops executed are exactly the (output, tap) pairs that see the input."""
    g = pool_graph("max_pool2d", c=16, h=9, w=9, kernel=(3, 3), strides=(2, 2),
                   pads=(1, 1, 1, 1))
    lowered = lower_pool2d("pool", g, DEFAULT, Pool2dSchedule(2, 3, 1))
    executed = sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in lowered.program
                   if isinstance(i, Alu) and not i.use_imm)
    rows = [sum(0 <= o * 2 + k - 1 < 9 for k in range(3)) for o in range(5)]
    assert executed == sum(rows) ** 2
    # The window is widened once: one copy micro-op per input entry of each tile.
    copies = sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in lowered.program
                 if isinstance(i, Gemm) and not i.reset_reg)
    tiles_rows = [(2, 5), (2, 5), (1, 3)]     # (output rows, input rows) of the 3 row tiles
    tiles_cols = [(3, 7), (2, 5)]
    assert copies == sum(r for _, r in tiles_rows) * sum(c for _, c in tiles_cols)


def test_block_out_a_multiple_of_block_in():
    """On the VTA-like 2x8x32 config an output block takes four input blocks."""
    for g in (pool_graph("max_pool2d", n=3, c=40, kernel=(3, 3), strides=(2, 2),
                         pads=(1, 1, 1, 1)),
              pool_graph("qavg_pool2d", n=3, c=70, kernel=(3, 3), strides=(2, 2),
                         pads=(1, 1, 1, 1), shift=(3,)),
              pool_graph("qglobal_avg_pool2d", n=2, c=40, h=5, w=6, shift=(5,))):
        lowered, _ = check_pool(g, config=B2X8X32)
        assert lowered.layer.ratio == 4


#: block_in = 4 x block_out: selection blocks pick each output block out of an input block.
WIDE_IN = vdla.HardwareConfig(block_in=32, block_out=8, acc_buff_size=32768)


@pytest.mark.parametrize("config", [WIDE_IN, vdla.HardwareConfig(block_in=32, block_out=16),
                                    vdla.HardwareConfig(batch=2, block_in=32, block_out=16,
                                                        acc_buff_size=65536)],
                         ids=["1x32x8", "1x32x16", "2x32x16"])
def test_block_in_a_multiple_of_block_out(config):
    """Output blocks narrower than input blocks: a tile loads whole input blocks and a
    selection GEMM takes each output block from its input block; outputs are stored into
    blocks of block_in channels (x_size 1 STOREs). Channel counts that leave the last
    input block partly empty, tiles of fewer channel blocks than an input block holds."""
    for g, schedule in (
            (pool_graph("max_pool2d", n=3, c=40, kernel=(3, 3), strides=(2, 2),
                        pads=(1, 1, 1, 1)), None),
            (pool_graph("max_pool2d", c=72, kernel=(3, 3), strides=(2, 2),
                        pads=(1, 1, 1, 1)), Pool2dSchedule(2, 3, 1)),
            (pool_graph("qavg_pool2d", n=3, c=70, kernel=(3, 3), strides=(2, 2),
                        pads=(1, 1, 1, 1), shift=(3,)), Pool2dSchedule(2, 4, 3)),
            (pool_graph("qglobal_avg_pool2d", n=2, c=40, h=5, w=6, shift=(5,)), None)):
        lowered, _ = check_pool(g, config=config, schedule=schedule)
        assert lowered.layer.group == config.block_in // config.block_out


@pytest.mark.slow   # a Verilator model of its own to build
def test_block_in_a_multiple_of_block_out_on_verilator():
    check_pool(pool_graph("max_pool2d", c=40, kernel=(3, 3), strides=(2, 2),
                          pads=(1, 1, 1, 1)), config=WIDE_IN, backend="verilator")


def test_unsupported_nodes_raise_clearly():
    with pytest.raises(ValueError, match="pools float32 data"):
        lower_pool2d("pool", pool_graph("max_pool2d", dtype="float32", kernel=(2, 2)), DEFAULT)
    with pytest.raises(ValueError, match="ALU MUL"):
        lower_pool2d("pool", pool_graph("qglobal_avg_pool2d", multiplier=300, shift=(9,)),
                     DEFAULT)
    g = Graph("conv")
    x = g.add_input("x", (1, 16, 4, 4), "int8")
    g.set_outputs([g.add_node("relu", [x], name="r")])
    with pytest.raises(ValueError, match="lower_pool2d lowers"):
        lower_pool2d("r", g, DEFAULT)


def test_schedule_that_does_not_fit_names_the_buffer():
    g = pool_graph("max_pool2d", c=512, h=64, w=64, kernel=(3, 3), strides=(1, 1))
    with pytest.raises(ValueError, match=r"does not fit config .*inp needs \d+ elements, "
                                         r"has 2048"):
        lower_pool2d("pool", g, DEFAULT, Pool2dSchedule(62, 62, 32))
    with pytest.raises(ValueError, match="tile_c must be a positive integer"):
        Pool2dSchedule(1, 1, 0)


def test_run_checks_the_input():
    g = pool_graph("max_pool2d", kernel=(2, 2))
    lowered = lower_pool2d("pool", g, DEFAULT)
    dev = vdla.runtime.open(DEFAULT, backend="functional")
    with pytest.raises(ValueError, match=r"input must be int8 of shape \(1, 20, 9, 9\)"):
        run_pool2d(dev, lowered, np.zeros((1, 20, 9, 8), np.int8))
    with pytest.raises(ValueError, match="lowered for config"):
        run_pool2d(vdla.runtime.open(WITH_MUL, backend="functional"), lowered,
                   np.zeros((1, 20, 9, 9), np.int8))


def test_tokens_hold_with_tiny_command_and_token_queues():
    tight = vdla.HardwareConfig(cmd_queue_depth=2, token_queue_depth=2)
    for op, extra in (("max_pool2d", {}), ("qavg_pool2d", {"shift": (3,)})):
        g = pool_graph(op, c=40, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), **extra)
        check_pool(g, config=tight, schedule=Pool2dSchedule(2, 2, 1))


# --- the cycle-accurate backend ---------------------------------------------------------------

@pytest.mark.parametrize("g", [
    pool_graph("max_pool2d", c=20, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    pool_graph("max_pool2d", c=33, h=10, w=11, kernel=(3, 3), strides=(2, 2), ceil_mode=True),
    pool_graph("qavg_pool2d", c=33, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
               shift=(3,)),
    pool_graph("qglobal_avg_pool2d", c=40, h=7, w=7, shift=(6,)),
], ids=["max", "max_ceil", "avg", "global"])
def test_cycle_accurate_backend_matches(g):
    lowered, stats = check_pool(g, backend="verilator", schedule=Pool2dSchedule(2, 3, 1))
    assert stats["cycles"] > 0


def test_cycle_accurate_backend_with_four_input_blocks_per_output_block():
    check_pool(pool_graph("max_pool2d", n=3, c=40, kernel=(3, 3), strides=(2, 2),
                          pads=(1, 1, 1, 1)), config=B2X8X32, backend="verilator")
    check_pool(pool_graph("qavg_pool2d", n=3, c=70, kernel=(2, 2), strides=(2, 2),
                          shift=(2,)), config=B2X8X32, backend="verilator")
