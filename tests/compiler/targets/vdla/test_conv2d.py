"""vdla back half, qconv2d: lowered programs run on the functional simulator and match the
integer reference (`run_reference`) bit-exactly, for kernels, strides, pads, channel
counts that are not block multiples, per-tensor and per-channel requantization, residual
and clamp, the MUL config, and many schedules; GEMM micro-ops equal the useful count."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.vdla import Conv2dLayer, Conv2dSchedule, lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import choose_conv2d
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.isa import Load, MemoryType

DEFAULT = vdla.HardwareConfig()
WITH_MUL = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"})


def conv_graph(rng, *, n=1, c=20, h=9, w=9, o=24, k=3, stride=1, pad=1, residual=False,
               bias=True, groups=1, **attrs):
    """A one-node qconv2d graph with random int8 weights and int32 bias; returns
    (graph, node name, feed, weights, bias)."""
    g = Graph("qconv")
    x = g.add_input("x", (n, c, h, w), "int8")
    weights = rng.integers(-128, 128, (o, c // groups, k, k)).astype(np.int8)
    b = rng.integers(-5000, 5000, (o,)).astype(np.int32) if bias else None
    inputs = [x, g.add_constant("w", weights, "int8"),
              g.add_constant("b", b, "int32") if bias else ""]
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    feed = {"x": rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)}
    if residual:
        inputs.append(g.add_input("r", (n, o, ho, wo), "int8"))
        feed["r"] = rng.integers(-128, 128, (n, o, ho, wo)).astype(np.int8)
    y = g.add_node("qconv2d", inputs, name="conv", strides=(stride, stride),
                   pads=(pad,) * 4, groups=groups, **attrs)
    g.set_outputs([y])
    return g, "conv", feed, weights, b


def check_conv(g, name, feed, weights, bias, config=DEFAULT, schedule=None,
               backend="functional"):
    """Lower, run, compare with the reference; returns (lowered, stats)."""
    want = run_reference(g, feed)[g.outputs[0]]
    lowered = lower_conv2d(g.node(name), g, config, schedule)
    dev = vdla.runtime.open(config, backend=backend, **(
        {"log": lambda message: None} if backend == "verilator" else {}))
    got, stats = run_conv2d(dev, lowered, feed["x"], weights, bias, feed.get("r"),
                            return_stats=True)
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # No redundant GEMM work: one micro-op per (output position, output block, input
    # block, tap), plus the residual's widening and the bias, and no reset micro-op is
    # counted.
    # (The hardware counts the cycles a GEMM micro-op enters the pipeline: one each.)
    uops = (stats["gemm_macs"] // config.macs_per_cycle if backend == "functional"
            else stats["gemm_active"])
    layer = lowered.layer
    assert uops == layer.gemm_uops + layer.residual_uops + layer.bias_uops
    # The micro-op kernels are loaded once, whatever the number of tiles.
    assert sum(isinstance(i, Load) and i.memory_type == MemoryType.UOP and i.x_size > 0
               for i in lowered.program) == 1
    return lowered, stats


GRID = [  # c, o, h, w, k, stride, pad
    (3, 16, 7, 7, 1, 1, 0),
    (20, 24, 9, 9, 3, 1, 1),
    (33, 40, 8, 8, 3, 2, 1),
    (3, 40, 16, 16, 7, 2, 3),
    (20, 16, 11, 10, 5, 1, 2),
    (33, 24, 12, 12, 5, 2, 0),
    (20, 40, 10, 13, 3, 1, 0),
    (3, 24, 15, 15, 1, 2, 0),
    (33, 16, 7, 9, 5, 2, 3),
    (16, 32, 8, 8, 3, 1, 2),
]


@pytest.mark.parametrize("c, o, h, w, k, stride, pad", GRID)
def test_grid_per_tensor_shift(c, o, h, w, k, stride, pad):
    rng = np.random.default_rng(c * 1000 + o * 10 + k)
    g, name, feed, weights, bias = conv_graph(rng, c=c, o=o, h=h, w=w, k=k, stride=stride,
                                              pad=pad, shift=(10,))
    check_conv(g, name, feed, weights, bias)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_per_channel_shift_residual_and_relu(residual, relu):
    rng = np.random.default_rng(3 + residual + 2 * relu)
    # Shifts 0..20: zero (no rounding), small, and beyond the 16-bit rounding immediate.
    shifts = tuple(int(s) for s in rng.integers(0, 21, 40))
    g, name, feed, weights, bias = conv_graph(
        rng, c=33, o=40, h=10, w=10, k=3, pad=1, residual=residual, shift=shifts,
        residual_shift=1, out_min=0 if relu else -128, out_max=127)
    check_conv(g, name, feed, weights, bias)


def test_per_tensor_shift_beyond_the_immediate_and_no_bias():
    rng = np.random.default_rng(11)
    g, name, feed, weights, bias = conv_graph(rng, c=20, o=24, bias=False, shift=(17,),
                                              out_min=-20, out_max=90)
    # Make the accumulators large enough that shift 17 keeps information.
    feed["x"] = np.full_like(feed["x"], 127)
    check_conv(g, name, feed, weights, bias)


def test_negative_shift_shifts_left():
    rng = np.random.default_rng(12)
    g, name, feed, weights, bias = conv_graph(rng, c=3, o=16, k=1, pad=0, shift=(-2,))
    feed["x"] = rng.integers(-2, 3, feed["x"].shape).astype(np.int8)
    check_conv(g, name, feed, weights, bias)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_multipliers_on_the_mul_config(per_channel, residual):
    rng = np.random.default_rng(20 + per_channel + 2 * residual)
    o = 40
    if per_channel:
        mult = tuple(int(m) for m in rng.integers(1, 32768, o))
        shift = tuple(int(s) for s in rng.integers(14, 31, o))
    else:
        mult, shift = 1234, (21,)
    g, name, feed, weights, bias = conv_graph(
        rng, c=20, o=o, h=8, w=8, k=3, stride=2, pad=1, residual=residual, multiplier=mult,
        shift=shift, residual_multiplier=300 if residual else None, residual_shift=18,
        out_min=0 if residual else -128)
    check_conv(g, name, feed, weights, bias, config=WITH_MUL)


SCHEDULES = [None, Conv2dSchedule(1, 1, 1, 1), Conv2dSchedule(2, 3, 1, 2),
             Conv2dSchedule(3, 7, 2, 1), Conv2dSchedule(100, 100, 100, 100)]


def test_schedules_give_identical_results():
    rng = np.random.default_rng(30)
    g, name, feed, weights, bias = conv_graph(
        rng, c=33, o=40, h=9, w=11, k=3, stride=1, pad=1, residual=True,
        shift=tuple(int(s) for s in rng.integers(8, 18, 40)), residual_shift=0, out_min=0)
    results = []
    for schedule in SCHEDULES:
        lowered, stats = check_conv(g, name, feed, weights, bias, schedule=schedule)
        assert lowered.layer.late_residual       # no residual requantization: added late
        results.append(stats)
    tiny = lower_conv2d(g.node(name), g, DEFAULT, Conv2dSchedule(1, 1, 1, 1))
    assert len(tiny.program) > 10 * len(lower_conv2d(g.node(name), g, DEFAULT).program)
    # Same useful work whatever the tiling.
    assert len({s["gemm_uops"] for s in results}) == 1


def test_default_schedule_is_the_cheapest_by_the_timing_model():
    rng = np.random.default_rng(31)
    g, name, *_ = conv_graph(rng, c=20, o=24, shift=(9,))
    layer = Conv2dLayer.from_node(g.node(name), g, DEFAULT)
    assert (layer.in_blocks, layer.out_blocks, layer.out_h, layer.out_w) == (2, 2, 9, 9)
    whole = Conv2dSchedule(9, 9, 2, 2)
    for nthreads in (1, None):
        chosen = choose_conv2d(layer, DEFAULT, nthreads=nthreads)
        assert (estimate_conv2d(layer, chosen, DEFAULT).cycles
                <= estimate_conv2d(layer, whole, DEFAULT).cycles)
    assert choose_conv2d(layer, DEFAULT, nthreads=1).nthreads == 1
    with pytest.raises(ValueError, match="nthreads must be 1, 2 or None"):
        choose_conv2d(layer, DEFAULT, nthreads=3)


def test_default_schedule_fits_resnet_layers():
    for h, c, o, k, pad, stride in [(224, 3, 64, 7, 3, 2), (56, 64, 64, 3, 1, 1),
                                     (14, 256, 512, 3, 1, 2), (7, 512, 512, 3, 1, 1)]:
        layer = Conv2dLayer(n=1, c=c, h=h, w=h, o=o, kernel_h=k, kernel_w=k, stride_h=stride,
                            stride_w=stride, pads=(pad,) * 4, batch_blocks=1,
                            in_blocks=-(-c // 16), out_blocks=o // 16)
        schedule = choose_conv2d(layer, DEFAULT)
        schedule.check(layer, DEFAULT)
        for need, depth in schedule.needs(layer, DEFAULT).values():
            assert need <= depth


def test_schedule_that_does_not_fit_names_the_buffer():
    small = vdla.HardwareConfig(inp_buff_size=2048)  # 128 inp elements
    rng = np.random.default_rng(32)
    g, name, *_ = conv_graph(rng, c=33, o=40, h=12, w=12, k=3, pad=1, shift=(9,))
    layer = Conv2dLayer.from_node(g.node(name), g, small)
    # 14 x 14 window x 3 blocks, and the bias GEMM's input vector
    with pytest.raises(ValueError, match=r"inp needs 589 elements, has 128 \(over by 461\)"):
        Conv2dSchedule(12, 12, 3, 3).check(layer, small)
    with pytest.raises(ValueError, match="inp needs"):
        lower_conv2d(g.node(name), g, small, Conv2dSchedule(12, 12, 3, 3))
    big = Conv2dLayer(n=1, c=256, h=14, w=14, o=512, kernel_h=3, kernel_w=3, pads=(1,) * 4,
                      batch_blocks=1, in_blocks=16, out_blocks=32)
    with pytest.raises(ValueError, match=r"wgt needs 4608 elements, has 1024 \(over by 3584\)"):
        Conv2dSchedule(1, 1, 16, 32).check(big, DEFAULT)
    with pytest.raises(ValueError, match="acc needs 6272 elements, has 2048"):
        Conv2dSchedule(14, 14, 1, 32).check(big, DEFAULT)
    # The default schedule shrinks the tiles until they fit.
    schedule = choose_conv2d(layer, small)
    schedule.check(layer, small)


@pytest.mark.parametrize("c, dilations, stride", [(16, (2, 2), 1), (20, (1, 3), 2),
                                                   (33, (3, 1), 1)])
def test_dilated(c, dilations, stride):
    """A dilated kernel's taps are micro-op offsets `dilation` rows/columns apart."""
    rng = np.random.default_rng(42)
    g, name, feed, weights, bias = conv_graph(rng, c=c, o=24, h=11, w=12, pad=2,
                                              stride=stride, shift=(9,), dilations=dilations)
    lowered, _ = check_conv(g, name, feed, weights, bias)
    assert (lowered.layer.dilation_h, lowered.layer.dilation_w) == dilations


def test_unsupported_nodes_raise_clearly():
    rng = np.random.default_rng(40)
    g, name, *_ = conv_graph(rng, c=16, o=16, multiplier=3, shift=(9,))
    with pytest.raises(ValueError, match="needs the ALU MUL"):
        lower_conv2d(g.node(name), g, DEFAULT)
    g, name, *_ = conv_graph(rng, c=16, o=16, k=1, pad=1, shift=(9,))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        lower_conv2d(g.node(name), g, DEFAULT)


def test_run_checks_operands():
    rng = np.random.default_rng(41)
    g, name, feed, weights, bias = conv_graph(rng, c=3, o=16, shift=(9,))
    lowered = lower_conv2d(g.node(name), g, DEFAULT)
    dev = vdla.runtime.open(DEFAULT, backend="functional")
    with pytest.raises(ValueError, match="weights must be int8"):
        run_conv2d(dev, lowered, feed["x"], weights.astype(np.int16), bias)
    with pytest.raises(ValueError, match="without a residual"):
        run_conv2d(dev, lowered, feed["x"], weights, bias, np.zeros((1, 16, 9, 9), np.int8))


def test_tokens_hold_with_tiny_command_and_token_queues():
    """One virtual thread never needs more than one token in flight per queue, and fetch
    stalls on full command queues cannot deadlock it."""
    tight = vdla.HardwareConfig(cmd_queue_depth=2, token_queue_depth=2)
    rng = np.random.default_rng(50)
    g, name, feed, weights, bias = conv_graph(rng, c=33, o=40, h=7, w=7, residual=True,
                                              shift=(9,), residual_shift=0)
    check_conv(g, name, feed, weights, bias, config=tight,
               schedule=Conv2dSchedule(2, 3, 1, 1))


@pytest.mark.parametrize("c, o, h, w, k, stride, pad", [GRID[1], GRID[2]])
def test_cycle_accurate_backend_matches(c, o, h, w, k, stride, pad):
    """The same programs on the Verilator model of the hardware: bit-exact too."""
    rng = np.random.default_rng(11)
    g, name, feed, weights, bias = conv_graph(rng, c=c, o=o, h=h, w=w, k=k, stride=stride,
                                              pad=pad, shift=(9,), out_min=0)
    _, stats = check_conv(g, name, feed, weights, bias, backend="verilator")
    assert stats["cycles"] >= stats["gemm_active"] > 0


# --- virtual threads ------------------------------------------------------------------------

#: Schedules that force several tiles in the threaded dimension (tile_ci 1: several input
#: chunks per tile too, so each thread's inp/wgt region is reused within a tile).
H_THREADS = Conv2dSchedule(2, 3, 1, 1, h_nthread=2)
OC_THREADS = Conv2dSchedule(2, 4, 2, 1, oc_nthread=2)


@pytest.mark.parametrize("threads", ["h", "oc"])
@pytest.mark.parametrize("c, o, h, w, k, stride, pad", GRID)
def test_grid_with_two_virtual_threads(c, o, h, w, k, stride, pad, threads):
    rng = np.random.default_rng(c * 1000 + o * 10 + k)
    g, name, feed, weights, bias = conv_graph(rng, c=c, o=o, h=h, w=w, k=k, stride=stride,
                                              pad=pad, shift=(10,))
    layer = Conv2dLayer.from_node(g.node(name), g, DEFAULT)
    schedule = H_THREADS if threads == "h" else OC_THREADS
    if threads == "oc" and layer.out_blocks < 2:
        pytest.skip("one output-channel tile: nothing for a second thread")
    assert layer.out_h > schedule.tile_h  # several tiles in the threaded dimension
    lowered, _ = check_conv(g, name, feed, weights, bias, schedule=schedule)
    # The second thread has its own regions: some loads go to the second half of inp.
    half = lowered.schedule.needs(lowered.layer, DEFAULT)["inp"][0] // 2
    assert any(isinstance(i, Load) and i.memory_type == MemoryType.INP and i.x_size
               and i.sram_base >= half for i in lowered.program)


@pytest.mark.parametrize("schedule", [H_THREADS, OC_THREADS,
                                      Conv2dSchedule(3, 100, 1, 2, oc_nthread=2),
                                      Conv2dSchedule(4, 4, 3, 3, h_nthread=2)])
@pytest.mark.parametrize("residual_shift", [1, 0], ids=["requantized", "late"])
def test_two_threads_with_residual_and_per_channel_shift(schedule, residual_shift):
    rng = np.random.default_rng(60)
    g, name, feed, weights, bias = conv_graph(
        rng, c=33, o=40, h=9, w=11, k=3, pad=1, residual=True,
        shift=tuple(int(s) for s in rng.integers(0, 21, 40)), residual_shift=residual_shift,
        out_min=0)
    lowered, _ = check_conv(g, name, feed, weights, bias, schedule=schedule)
    assert lowered.layer.late_residual == (residual_shift == 0)


@pytest.mark.parametrize("schedule", [Conv2dSchedule(2, 3, 1, 1, h_nthread=2),
                                      Conv2dSchedule(2, 3, 1, 1, oc_nthread=2)])
def test_two_threads_do_not_deadlock_on_tiny_queues(schedule):
    tight = vdla.HardwareConfig(cmd_queue_depth=2, token_queue_depth=2)
    rng = np.random.default_rng(51)
    g, name, feed, weights, bias = conv_graph(rng, c=33, o=40, h=7, w=7, residual=True,
                                              shift=(9,), residual_shift=0)
    check_conv(g, name, feed, weights, bias, config=tight, schedule=schedule)


def test_virtual_threads_halve_the_capacity():
    small = vdla.HardwareConfig(inp_buff_size=2048)  # 128 inp elements
    rng = np.random.default_rng(33)
    g, name, *_ = conv_graph(rng, c=33, o=40, h=12, w=12, k=3, pad=1, shift=(9,))
    layer = Conv2dLayer.from_node(g.node(name), g, small)
    Conv2dSchedule(8, 3, 2, 1).check(layer, small)  # 10 x 5 window x 2 blocks = 100 (+ 1)
    with pytest.raises(ValueError, match=r"2 virtual threads.*inp needs 201 elements, has "
                                         r"128 \(over by 73\)"):
        Conv2dSchedule(8, 3, 2, 1, h_nthread=2).check(layer, small)
    with pytest.raises(ValueError, match="inp needs 201"):
        lower_conv2d(g.node(name), g, small, Conv2dSchedule(8, 3, 2, 1, oc_nthread=2))
    # default() with two threads picks tiles that fit both threads' regions.
    assert choose_conv2d(layer, small, nthreads=1).nthreads == 1
    for nthreads in (2, None):      # (either: whichever the timing model prefers)
        schedule = choose_conv2d(layer, small, nthreads=nthreads)
        assert schedule.nthreads == (nthreads or schedule.nthreads)
        schedule.check(layer, small)
        for need, depth in schedule.needs(layer, small).values():
            assert need <= depth
    with pytest.raises(ValueError, match="cannot both be 2"):
        Conv2dSchedule(1, 1, 1, 1, oc_nthread=2, h_nthread=2)
    with pytest.raises(ValueError, match="h_nthread must be 1 or 2"):
        Conv2dSchedule(1, 1, 1, 1, h_nthread=3)


def test_two_threads_are_faster_on_the_cycle_accurate_backend(capsys):
    """Same tiles, Verilator model: bit-exact with 2 threads, and fewer cycles (one
    thread's loads overlap the other's GEMMs and stores)."""
    rng = np.random.default_rng(5)
    g, name, feed, weights, bias = conv_graph(rng, c=32, o=32, h=14, w=14, k=3, pad=1,
                                              shift=(9,), out_min=0)
    cycles = {}
    for schedule in (Conv2dSchedule(2, 14, 1, 2), Conv2dSchedule(2, 14, 1, 2, h_nthread=2),
                     Conv2dSchedule(4, 14, 1, 1), Conv2dSchedule(4, 14, 1, 1, oc_nthread=2)):
        _, stats = check_conv(g, name, feed, weights, bias, schedule=schedule,
                              backend="verilator")
        cycles[schedule] = stats["cycles"]
    with capsys.disabled():
        print("\nconv2d 32->32 14x14 3x3 cycles:",
              {f"{s.tile_h}x{s.tile_w}x{s.tile_ci}x{s.tile_co} oc{s.oc_nthread} "
               f"h{s.h_nthread}": n for s, n in cycles.items()})
    one_h, two_h, one_oc, two_oc = cycles.values()
    assert two_h < one_h
    assert two_oc < one_oc


# --- grouped and depthwise convolutions ---------------------------------------------------

GROUPED = [  # c, o, groups, h, k, stride, pad
    (64, 64, 2, 8, 3, 1, 1),      # groups of 32 channels: one span (per-group GEMM) each
    (64, 128, 4, 6, 1, 1, 0),     # groups of 16 -> 32: aligned to the blocks
    (48, 48, 2, 8, 3, 1, 1),      # groups of 24: blocks straddle two groups
    (40, 40, 4, 7, 3, 2, 1),      # groups of 10, channels not a block multiple
    (20, 40, 4, 6, 3, 1, 1),
    (32, 32, 32, 9, 3, 1, 1),     # depthwise: diagonal weight blocks
    (24, 24, 24, 9, 3, 2, 1),     # depthwise, channels not a block multiple, stride 2
    (96, 96, 96, 5, 5, 1, 2),
    (32, 64, 32, 6, 3, 1, 1),     # depthwise with a channel multiplier of 2
]


@pytest.mark.parametrize("c, o, groups, h, k, stride, pad", GROUPED)
@pytest.mark.parametrize("schedule", [None, Conv2dSchedule(2, 3, 1, 1),
                                      Conv2dSchedule(3, 5, 2, 2, oc_nthread=2),
                                      Conv2dSchedule(2, 9, 3, 3, h_nthread=2)],
                         ids=["default", "small", "oc-threads", "h-threads"])
def test_grouped_and_depthwise(c, o, groups, h, k, stride, pad, schedule):
    """Grouped convolutions as per-span GEMMs and depthwise ones with diagonal weight
    blocks: bit-exact, with exactly one GEMM micro-op per weight block, position and tap
    (`check_conv`); a schedule whose threads would see uneven chunk counts is refused."""
    rng = np.random.default_rng(c * 100 + groups)
    g, name, feed, weights, bias = conv_graph(
        rng, c=c, o=o, h=h, w=h, k=k, stride=stride, pad=pad, groups=groups,
        shift=tuple(rng.integers(6, 12, o)), out_min=-100, out_max=120)
    layer = Conv2dLayer.from_node(g.node(name), g, DEFAULT)
    assert layer.macs == layer.n * layer.out_h * layer.out_w * o * (
        c // groups) * k * k
    if schedule is not None and schedule.uneven_chunks(layer):
        with pytest.raises(ValueError, match="same number of input-channel chunks"):
            lower_conv2d(g.node(name), g, DEFAULT, schedule)
        return
    check_conv(g, name, feed, weights, bias, schedule=schedule)


def test_group_spans():
    from vdla.compiler.targets.vdla.grouped import group_spans
    assert group_spans(64, 64, 2, DEFAULT) == (((0, 2, 0, 2), (2, 2, 2, 2)), False)
    assert group_spans(48, 48, 2, DEFAULT) == (((0, 1, 0, 2), (1, 1, 0, 3), (2, 1, 1, 2)),
                                                False)
    assert group_spans(32, 32, 32, DEFAULT) == (((0, 2, 0, 2),), True)
    wide = vdla.HardwareConfig(block_out=32)
    assert group_spans(32, 32, 32, wide)[1] is False     # blocks differ: not diagonal
    with pytest.raises(ValueError, match="groups=3 must divide"):
        group_spans(32, 32, 3, DEFAULT)


def test_grouped_with_residual_per_channel_and_batch():
    rng = np.random.default_rng(77)
    g, name, feed, weights, bias = conv_graph(rng, n=2, c=48, o=48, h=6, w=7, groups=48,
                                              residual=True, shift=tuple(int(v) for v in np.arange(48) % 20 + 4),
                                              residual_shift=1, out_min=0)
    check_conv(g, name, feed, weights, bias)
    g, name, feed, weights, bias = conv_graph(rng, n=2, c=48, o=48, h=6, w=7, groups=2,
                                              residual=True, shift=(8,), residual_shift=-1)
    check_conv(g, name, feed, weights, bias, config=vdla.HardwareConfig(batch=2))


def test_depthwise_on_a_block_out_wider_than_block_in():
    """block_out = 2 block_in: depthwise is not diagonal there, it runs as spans."""
    config = vdla.HardwareConfig(block_out=32)
    rng = np.random.default_rng(78)
    g, name, feed, weights, bias = conv_graph(rng, c=40, o=40, h=6, w=6, groups=40,
                                              shift=(8,))
    lowered, _ = check_conv(g, name, feed, weights, bias, config=config)
    assert not lowered.layer.diagonal and len(lowered.layer.spans) == 2


@pytest.mark.parametrize("groups", [2, 32])
def test_grouped_on_the_cycle_accurate_backend(groups):
    rng = np.random.default_rng(79)
    g, name, feed, weights, bias = conv_graph(rng, c=32, o=32, h=8, w=8, groups=groups,
                                              shift=(9,), out_min=0)
    _, stats = check_conv(g, name, feed, weights, bias, backend="verilator")
    assert stats["cycles"] >= stats["gemm_active"] > 0


@pytest.mark.parametrize("config, ratio", [
    (vdla.HardwareConfig(block_out=32), 2),                 # two identity blocks
    (vdla.HardwareConfig(block_in=32, block_out=16), 2),    # two selection blocks
    (vdla.HardwareConfig(block_in=32, block_out=8, acc_buff_size=32768), 4),
], ids=["block_out=2*block_in", "block_in=2*block_out", "block_in=4*block_out"])
def test_residual_paths_on_other_block_shapes(config, ratio):
    """The int8 residual in the activation layout (blocks of max(block_in, block_out)),
    widened on the GEMM core by identity or selection blocks; edge tiles of every
    size; one and two threads."""
    rng = np.random.default_rng(80)
    g, name, feed, weights, bias = conv_graph(rng, c=40, o=64, h=6, w=7, residual=True,
                                              shift=(9,), residual_shift=1, out_min=0)
    for schedule in (None, Conv2dSchedule(2, 3, 1, 1, h_nthread=2),
                     Conv2dSchedule(4, 5, 1, 1, oc_nthread=2)):
        lowered, _ = check_conv(g, name, feed, weights, bias, config=config,
                                schedule=schedule)
        assert lowered.layer.residual_ratio == ratio


def test_the_bias_gemm_adds_exactly_and_a_large_bias_takes_the_alu():
    """A bias within `gemm_bias_limit` is one GEMM micro-op per entry (the ones vector
    times the bias blocks); a larger one is the ALU's vector ADD; both bit-exact."""
    from vdla.compiler.targets.vdla.common import bias_blocks, gemm_bias_limit, ones_vector
    limit = gemm_bias_limit(DEFAULT)
    values = np.array([limit, -limit, 0, 1, -1, 63, -64, 127 * 127] + [5] * 24)
    blocks = bias_blocks(values, DEFAULT).reshape(len(values), -1).astype(np.int64)
    np.testing.assert_array_equal(blocks @ ones_vector(DEFAULT)[0].astype(np.int64), values)
    with pytest.raises(ValueError, match="exceed"):
        bias_blocks(np.array([limit + 1] + [0] * 15), DEFAULT)
    rng = np.random.default_rng(70)
    for big, gemm in ((False, True), (True, False)):
        g, name, feed, weights, bias = conv_graph(rng, c=20, o=24, shift=(9,))
        if big:
            bias = bias.copy()
            bias[3] = limit + 1000
            g.tensors["b"].data = bias
        lowered, _ = check_conv(g, name, feed, weights, bias)
        assert lowered.layer.bias_gemm == gemm
        assert (lowered.bias_row is None) == gemm
