"""vdla back half, standalone elementwise ops: an int8 ``relu`` and a ``qadd`` (two
activations, or one and the quantizer's zero constant: a rescale or clip) lowered to
programs that match the integer reference bit-exactly on the functional simulator and on
Verilator, for shift-only and multiply-mode requantization (negative and positive shifts,
per-channel shifts, rounding constants beyond the immediate, int32 wrap-around), clamp
bounds, channel counts that are not block multiples, (N, C) tensors, batches, block_out a
multiple of block_in and many tilings; and the clear errors for what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from differential import B2X8X32

import vdla
from vdla.compiler import Graph, passes, quantize, run_reference
from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.targets import compile_model
from vdla.compiler.targets.vdla import (ElementwiseSchedule, LoweredElementwise, VdlaTarget,
                                        lower_elementwise, run_elementwise)
from vdla.compiler.targets.vdla.elementwise import choose_elementwise, estimate_elementwise
from vdla.compiler.targets.vdla.estimate import estimate_graph
from vdla.isa import Alu, Gemm, Load, MemoryType

DEFAULT = vdla.HardwareConfig()
WITH_MUL = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"})
#: An output block takes two input blocks.
WIDE_OUT = vdla.HardwareConfig(block_out=32)


def relu_graph(shape=(1, 24, 5, 7), dtype="int8") -> Graph:
    g = Graph("relu")
    x = g.add_input("x", shape, dtype)
    g.set_outputs([g.add_node("relu", [x], name="op")])
    return g.validate()


def qadd_graph(shape=(1, 24, 5, 7), *, b_shape=None, zero=None, **attrs) -> Graph:
    """qadd(a, b); with `zero` (an array), b is that constant (the quantizer's is
    ``np.zeros(1, np.int8)``)."""
    g = Graph("qadd")
    a = g.add_input("a", shape, "int8")
    b = (g.add_constant("zero", zero, "int8") if zero is not None
         else g.add_input("b", b_shape or shape, "int8"))
    g.set_outputs([g.add_node("qadd", [a, b], name="op", **attrs)])
    return g.validate()


ZERO = np.zeros(1, np.int8)


def check(g, config=DEFAULT, schedule=None, backend="functional", seed=0
          ) -> tuple[LoweredElementwise, dict]:
    """Lower node "op", run it on `backend`, compare with the reference; returns (lowered,
    stats)."""
    rng = np.random.default_rng(seed)
    feed = {n: rng.integers(-128, 128, g.tensors[n].shape).astype(np.int8) for n in g.inputs}
    want = run_reference(g, feed)[g.outputs[0]]
    lowered = lower_elementwise("op", g, config, schedule)
    dev = vdla.runtime.open(config, backend=backend, **(
        {"log": lambda message: None} if backend == "verilator" else {}))
    args = [feed[n] if n in feed else g.constant(n) for n in g.node("op").inputs]
    got, stats = run_elementwise(dev, lowered, *args, return_stats=True)
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return lowered, stats


# --- relu ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 24, 5, 7), (2, 40, 3, 3), (1, 16, 8, 8), (2, 40),
                                   (1, 3, 2, 2), (3, 16)])
def test_relu_grid(shape):
    lowered, _ = check(relu_graph(shape), seed=sum(shape))
    # Widen, then one MAX 0: an int8 value needs no MIN 127.
    alu = [i for i in lowered.program if isinstance(i, Alu)]
    assert {(i.alu_opcode.name, i.imm) for i in alu} == {("MAX", 0)}


def test_relu_reads_int8_through_the_gemm_core():
    """Operands come in as int8 (LOAD INP) and are widened by identity-weight GEMMs: the
    only LOAD ACC would be constant rows, and a ReLU has none."""
    lowered, _ = check(relu_graph((1, 40, 6, 6)))
    loads = [i for i in lowered.program if isinstance(i, Load) and i.x_size]
    assert not any(i.memory_type == MemoryType.ACC for i in loads)
    assert any(i.memory_type == MemoryType.INP for i in loads)
    assert lowered.data_layout == "NCHW1n16c"
    np.testing.assert_array_equal(lowered.static_data()["weights"][0], np.eye(16, dtype=np.int8))


# --- qadd of two activations ---------------------------------------------------------------------

QADDS = [  # (a_shift, b_shift, out_min, out_max): the plan follows from which are requantized
    (1, 1, -128, 127),      # both requantized: a second acc region, vector ADD
    (1, 2, -20, 100),
    (0, -1, -128, 127),     # only b: b first, a added onto it by a second GEMM
    (2, 0, 0, 127),         # only a (a ReLU-like lower bound)
    (0, 0, -128, 127),      # neither: one GEMM sums both
    (0, 0, -5, 5),
    (-3, 5, -128, 127),     # left and right shifts
    (-24, -24, -128, 127),  # the sum wraps around int32 (the ALU's ADD)
    (-24, 0, -128, 127),    # ... and on the GEMM's accumulate
    (31, 31, -128, 127),    # rounding 1 << 30: beyond the immediate, a constant row
]


@pytest.mark.parametrize("a_shift, b_shift, lo, hi", QADDS)
def test_qadd_shift_only(a_shift, b_shift, lo, hi):
    g = qadd_graph((1, 40, 6, 5), a_shift=a_shift, b_shift=b_shift, out_min=lo, out_max=hi)
    lowered, _ = check(g, seed=a_shift - b_shift + 50)
    L = lowered.layer
    assert L.separate == bool(a_shift and b_shift)
    assert L.operands == 2 and L.const_rows == (2 if a_shift == 31 else 0)


@pytest.mark.parametrize("am, ash, bm, bsh", [(300, 9, 17000, 18), (1, 0, 3, 2),
                                              (None, 3, 7282, 16), (32767, 31, None, 0)])
def test_qadd_multiply_mode(am, ash, bm, bsh):
    g = qadd_graph((1, 24, 7, 7), a_multiplier=am, a_shift=ash, b_multiplier=bm, b_shift=bsh,
                   out_min=-100, out_max=90)
    check(g, config=WITH_MUL, seed=ash + bsh)


def test_qadd_per_channel_shifts_use_constant_rows():
    g = qadd_graph((2, 24, 4, 4), a_shift=tuple(range(24)), b_shift=-2)
    lowered, _ = check(g, schedule=ElementwiseSchedule(5, 1))
    assert lowered.layer.const_rows == 2   # a's rounding row and shift row


@pytest.mark.parametrize("shape", [(1, 24, 5, 7), (1, 40, 3, 3), (2, 24, 4, 4), (2, 40),
                                   (1, 17), (4, 16, 1, 1)])
def test_qadd_shapes_and_batches(shape):
    check(qadd_graph(shape, a_shift=1, b_shift=2), seed=len(shape))


@pytest.mark.parametrize("schedule", [ElementwiseSchedule(1, 1), ElementwiseSchedule(4, 1),
                                      ElementwiseSchedule(7, 2), ElementwiseSchedule(29, 3),
                                      ElementwiseSchedule(999, 99)])
@pytest.mark.parametrize("shifts", [(1, 2), (0, 3), (0, 0)], ids=["separate", "late", "sum"])
def test_qadd_schedules(schedule, shifts):
    g = qadd_graph((2, 40, 5, 6), a_shift=shifts[0], b_shift=shifts[1], out_min=-90,
                   out_max=80)
    check(g, schedule=schedule, seed=7)


# --- qadd with the zero operand: rescale and clip ------------------------------------------------

@pytest.mark.parametrize("am, ash, lo, hi", [(None, 1, -128, 127), (None, -2, -128, 127),
                                             (None, 0, 0, 6), (None, 0, -128, 127),
                                             (1000, 20, -128, 127), (7, 3, 0, 100)])
def test_rescale_and_clip(am, ash, lo, hi):
    config = WITH_MUL if am is not None else DEFAULT
    g = qadd_graph((1, 40, 5, 5), zero=ZERO, a_multiplier=am, a_shift=ash, b_shift=0,
                   out_min=lo, out_max=hi)
    lowered, _ = check(g, config=config, seed=abs(ash))
    # The zero operand is not read: one input region, one LOAD INP per tile.
    assert lowered.layer.inputs == (0,) and "input1" not in lowered.regions


def test_zero_operand_first_and_a_zero_constant_of_the_full_shape():
    g = Graph("qadd")
    a = g.add_input("a", (1, 24, 3, 3), "int8")
    z = g.add_constant("zero", np.zeros((1, 24, 3, 3), np.int8), "int8")
    g.set_outputs([g.add_node("qadd", [z, a], name="op", b_shift=1)])
    lowered, _ = check(g.validate())
    assert lowered.layer.inputs == (1,)


# --- other configs -------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [WIDE_OUT, B2X8X32], ids=["16x32", "2x8x32"])
def test_block_out_a_multiple_of_block_in(config):
    ratio = config.block_out // config.block_in
    for g in (relu_graph((3, 40, 5, 6)), qadd_graph((3, 70, 4, 3), a_shift=1, b_shift=2),
              qadd_graph((2, 40, 3, 3), a_shift=0, b_shift=3), qadd_graph((3, 24)),
              qadd_graph((1, 24, 5, 5), zero=ZERO, a_shift=2, out_min=0, out_max=60)):
        lowered, _ = check(g, config=config)
        assert lowered.layer.ratio == ratio
    check(qadd_graph((2, 40, 4, 4), a_multiplier=300, a_shift=9, b_multiplier=5, b_shift=1),
          config=B2X8X32)


@pytest.mark.parametrize("config", [
    vdla.HardwareConfig(block_in=32, block_out=8, acc_buff_size=32768),
    vdla.HardwareConfig(batch=2, block_in=32, block_out=16, acc_buff_size=65536)],
    ids=["1x32x8", "2x32x16"])
def test_block_in_a_multiple_of_block_out(config):
    """Output blocks narrower than input blocks: selection blocks widen each output block
    out of its input block; the outputs are stored into blocks of block_in channels."""
    group = config.block_in // config.block_out
    for g, schedule in ((relu_graph((3, 40, 5, 6)), None),
                        (qadd_graph((3, 70, 4, 3), a_shift=1, b_shift=2), None),
                        (qadd_graph((2, 40, 3, 3), a_shift=0, b_shift=3),
                         ElementwiseSchedule(4, 1)),
                        (qadd_graph((3, 24)), None),
                        (qadd_graph((1, 24, 5, 5), zero=ZERO, a_shift=2, out_min=0,
                                    out_max=60), ElementwiseSchedule(7, 3))):
        lowered, _ = check(g, config=config, schedule=schedule)
        assert lowered.layer.group == group


def test_tokens_hold_with_tiny_command_and_token_queues():
    tight = vdla.HardwareConfig(cmd_queue_depth=2, token_queue_depth=2)
    for g in (relu_graph((1, 40, 5, 6)), qadd_graph((1, 40, 5, 6), a_shift=1, b_shift=2),
              qadd_graph((1, 40, 5, 6), a_shift=1)):
        check(g, config=tight, schedule=ElementwiseSchedule(4, 1))


# --- schedules and the timing model --------------------------------------------------------------

def test_default_schedule_fits_and_is_the_cheapest_by_the_timing_model():
    g = qadd_graph((1, 64, 56, 56), a_shift=1, b_shift=1)
    lowered = lower_elementwise("op", g, DEFAULT)
    L, s = lowered.layer, lowered.schedule
    assert s.fits(L, DEFAULT) and choose_elementwise(L, DEFAULT) == s
    best = estimate_elementwise(L, s, DEFAULT)
    for other in (ElementwiseSchedule(56, 4), ElementwiseSchedule(512, 1),
                  ElementwiseSchedule(16, 1), ElementwiseSchedule(128, 2)):
        assert best <= estimate_elementwise(L, other, DEFAULT)
    # The compute module bounds it: about 12 cycles per acc entry (see the module docstring).
    entries = 4 * 56 * 56
    assert L.entry_cycles() == 12 and 12 * entries <= best <= 14 * entries


def test_work_per_entry():
    """Micro-ops executed per acc entry of the tile, as `entry_cycles` counts them."""
    for g, per_entry in ((relu_graph((1, 32, 4, 4)), (2, 1)),            # reset + widen; MAX
                         (qadd_graph((1, 32, 4, 4), a_shift=1, b_shift=1), (4, 7)),
                         (qadd_graph((1, 32, 4, 4), a_shift=1), (3, 4)),  # late GEMM
                         (qadd_graph((1, 32, 4, 4)), (3, 2))):            # one GEMM sums
        program = lower_elementwise("op", g, DEFAULT).program
        entries = 2 * 16
        gemm = sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in program
                   if isinstance(i, Gemm))
        alu = sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in program
                  if isinstance(i, Alu))
        assert (gemm, alu) == (per_entry[0] * entries, per_entry[1] * entries)


def test_estimate_graph_counts_the_elementwise_ops():
    g = qadd_graph((1, 24, 5, 7), a_shift=1, b_shift=2)
    ops = estimate_graph(g, VdlaTarget(DEFAULT, backend="functional"))
    assert [(op.name, op.target, op.macs) for op in ops] == [("op", "vdla", 0)]
    assert ops[0].cycles > 0 and set(ops[0].schedule) == {"tile_p", "tile_c"}


# --- what it refuses ------------------------------------------------------------------------------

def test_non_zero_constant_operand_is_refused():
    g = qadd_graph((1, 16, 3, 3), zero=np.full(1, 2, np.int8))
    with pytest.raises(ValueError, match=r"qadd node 'op': input b is the constant 'zero' "
                                         r"with values \[2\].*all-zero constant"):
        lower_elementwise("op", g, DEFAULT)
    ok, reason = VdlaTarget(DEFAULT).supports(g.node("op"), g)
    assert not ok and "all-zero constant" in reason


def test_mismatched_shapes_are_refused():
    g = qadd_graph((1, 16, 4, 4), b_shape=(1, 16, 1, 1), a_shift=1)
    with pytest.raises(ValueError, match=r"input b 'b' has shape \(1, 16, 1, 1\) but the "
                                         r"output has \(1, 16, 4, 4\).*does not broadcast"):
        lower_elementwise("op", g, DEFAULT)
    g = qadd_graph((2, 16, 4), a_shift=1)       # (1, S, D) is a sequence; this is not
    with pytest.raises(ValueError, match=r"has shape \(2, 16, 4\); elementwise ops on vdla "
                                         r"take \(N, C, H, W\), \(N, C\) or a sequence "
                                         r"\(1, S, D\)"):
        lower_elementwise("op", g, DEFAULT)


def test_other_unsupported_nodes_raise_clearly():
    with pytest.raises(ValueError, match="relu node 'op': input 'x' is float32; the "
                                         "accelerator runs elementwise ops on int8"):
        lower_elementwise("op", relu_graph(dtype="float32"), DEFAULT)
    ok, reason = VdlaTarget(DEFAULT).supports(relu_graph(dtype="float32").node("op"),
                                              relu_graph(dtype="float32"))
    assert not ok and "int8 data only" in reason
    g = qadd_graph(a_multiplier=3, a_shift=2)
    with pytest.raises(ValueError, match="ALU MUL"):
        lower_elementwise("op", g, DEFAULT)
    ok, reason = VdlaTarget(DEFAULT).supports(g.node("op"), g)
    assert not ok and "a_multiplier is set" in reason and "no MUL" in reason
    with pytest.raises(ValueError, match="out_min 10 and out_max 5 must satisfy"):
        lower_elementwise("op", qadd_graph(out_min=10, out_max=5), DEFAULT)
    g = Graph("p")
    x = g.add_input("x", (1, 16, 4, 4), "int8")
    g.set_outputs([g.add_node("max_pool2d", [x], name="op", kernel=(2, 2))])
    with pytest.raises(ValueError, match="lower_elementwise lowers relu, qadd, qgelu nodes"):
        lower_elementwise("op", g.validate(), DEFAULT)


def test_schedule_that_does_not_fit_names_the_buffer():
    g = qadd_graph((1, 64, 56, 56), a_shift=1, b_shift=1)
    with pytest.raises(ValueError, match=r"elementwise schedule .* does not fit config "
                                         r"1x16x16.*: inp needs 6272 elements, has 2048 "
                                         r"\(over by 4224\); acc needs 4704"):
        lower_elementwise("op", g, DEFAULT, ElementwiseSchedule(784, 2))
    with pytest.raises(ValueError, match="tile_c must be a positive integer"):
        ElementwiseSchedule(1, 0)
    with pytest.raises(TypeError, match="must be an ElementwiseSchedule"):
        lower_elementwise("op", g, DEFAULT, {"tile_p": 1, "tile_c": 1})
    tiny = vdla.HardwareConfig(acc_buff_size=128)   # acc: 2 entries, no room for 2 tiles
    ok, reason = VdlaTarget(tiny).supports(g.node("op"), g)
    assert not ok and "does not fit config" in reason and "acc needs 3 elements" in reason


def test_run_checks_the_inputs():
    g = qadd_graph((1, 20, 3, 3), a_shift=1)
    lowered = lower_elementwise("op", g, DEFAULT)
    dev = vdla.runtime.open(DEFAULT, backend="functional")
    ok = np.zeros((1, 20, 3, 3), np.int8)
    with pytest.raises(ValueError, match=r"input b must be int8 of shape \(1, 20, 3, 3\)"):
        run_elementwise(dev, lowered, ok, np.zeros((1, 20, 3, 3), np.int32))
    with pytest.raises(ValueError, match="takes 2 input"):
        run_elementwise(dev, lowered, ok)
    with pytest.raises(ValueError, match="lowered for config"):
        run_elementwise(vdla.runtime.open(WITH_MUL, backend="functional"), lowered, ok, ok)


# --- a whole graph --------------------------------------------------------------------------------

def elementwise_model():
    """A float CNN whose add, ReLU and ReLU6 fusion cannot fold into a convolution: a ReLU
    and a ReLU6 (a clip: qadd with the zero operand) after max pools, an add of two pool
    outputs, an add of two (N, C) vectors. Returns (prepared float graph, calibration)."""
    b = GraphBuilder("elementwise", seed=11)
    x = b.input("input", (1, 8, 12, 12))
    p1 = b.max_pool(b.conv(x, 24, 3, padding=1, bias=True, name="conv_a"), 2, name="pool_a")
    p2 = b.max_pool(b.conv(x, 24, 3, padding=1, bias=True, name="conv_b"), 2, name="pool_b")
    r = b.relu(p1, name="relu")
    s = b.add(r, p2, name="add")
    c = b.relu6(b.max_pool(s, 2, name="pool_c"), name="clip")
    v = b.add(b.flatten(b.global_avg_pool(c)), b.flatten(b.global_avg_pool(p2)),
              name="add_nc")
    y = b.dense(v, 10, name="fc")
    graph = passes.prepare(b.build([y]))
    rng = np.random.default_rng(2)
    return graph, rng.standard_normal((4, 1, 8, 12, 12)).astype(np.float32)


@pytest.mark.parametrize("mode, config", [("shift", DEFAULT), ("multiply", WITH_MUL)])
def test_whole_graph_runs_its_elementwise_ops_on_vdla(mode, config):
    graph, samples = elementwise_model()
    q = quantize(graph, {"input": samples}, mode)
    compiled = compile_model(q, VdlaTarget(config, backend="functional"))
    ops = {op.name: op for op in compiled.ops}
    for name in ("relu", "add", "clip", "add_nc"):
        assert ops[name].target == "vdla", (name, ops[name].reason)
    assert ops["clip"].op == "qadd" and ops["add"].op == "qadd" and ops["relu"].op == "relu"
    feed = {"input": np.random.default_rng(3).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    with compiled.session() as session:
        result = session.run(feed)
    want = run_reference(q, feed)
    for name, value in want.items():
        np.testing.assert_array_equal(result.outputs[name], value)
    stats = {s.name: s for s in result.ops}
    assert stats["add"].target == "vdla" and stats["add"].macs == 0 and stats["add"].bytes > 0


# --- the cycle-accurate backend -------------------------------------------------------------------

@pytest.mark.parametrize("g, schedule", [
    (relu_graph((2, 40, 5, 6)), ElementwiseSchedule(7, 2)),
    (qadd_graph((1, 40, 6, 5), a_shift=1, b_shift=2, out_min=-20, out_max=100),
     ElementwiseSchedule(8, 1)),
    (qadd_graph((1, 24, 5, 5), a_shift=-24, b_shift=0), None),
    (qadd_graph((2, 24), zero=ZERO, a_shift=2, out_min=0, out_max=60), None),
], ids=["relu", "separate", "late_wrap", "clip_nc"])
def test_cycle_accurate_backend_matches(g, schedule):
    _, stats = check(g, schedule=schedule, backend="verilator")
    assert stats["cycles"] > 0


def test_cycle_accurate_backend_with_two_input_blocks_per_output_block():
    check(qadd_graph((2, 40, 4, 5), a_shift=1, b_shift=-1), config=WIDE_OUT,
          backend="verilator")


def test_an_image_beyond_the_dma_stride_field():
    """More than 65535 pixels: a tile's rows are H x W apart in DRAM, beyond the x_stride
    field, so each row is its own DMA."""
    g = relu_graph((1, 32, 257, 256))
    lowered, _ = check(g, schedule=ElementwiseSchedule(400, 2))
    loads = [i for i in lowered.program if isinstance(i, Load) and i.memory_type == MemoryType.INP
             and i.x_size]
    assert max(i.x_size for i in loads) == 400 and {i.y_size for i in loads} == {1}
