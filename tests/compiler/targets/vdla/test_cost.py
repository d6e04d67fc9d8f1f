"""The analytical timing model and the default schedule chooser of the vdla back half,
and the ResNet-18 workload definitions."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler.targets.vdla import Conv2dLayer, Conv2dSchedule, lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.common import (DMA_BURST_CYCLES, DMA_CYCLES, DMA_READ_SLOTS,
                                               dma_cycles, dma_row_cycles)
from vdla.compiler.targets.vdla.conv import conv_uop_table
from vdla.compiler.targets.vdla.conv_layer import choose_conv2d, schedule_space
from vdla.compiler.targets.vdla.conv_schedule import conv_uop_count
from vdla.compiler.targets.vdla.timing import (_chunk_costs, _shared_tables, _table_cycles,
                                               estimate_conv2d)
from vdla.compiler.targets.vdla.timing_pairs import TileClass, steps, store_waits
from vdla.compiler.frontend.workloads import RESNET18, ConvWorkload, parse_workload, workload_graph
from vdla.isa import MemoryType
from vdla.runtime import COMPUTE, LOAD, ProgramBuilder

DEFAULT = vdla.HardwareConfig()


def timed_inp_load(dev, rows: int, elems: int, stride: int) -> tuple[int, int]:
    """(first, last cycle) of one LOAD of `rows` x `elems` inp elements (`stride` apart in
    DRAM) on the default config's device `dev`, from its Verilator timeline."""
    data, at = dev.alloc(1 << 14), dev.alloc(4096)
    p = ProgramBuilder(DEFAULT)
    p.load(MemoryType.INP, dram_base=data // DEFAULT.inp_elem_bytes, y_size=rows,
           x_size=elems, x_stride=stride)
    p.dep_push(LOAD, COMPUTE)
    p.dep_pop(LOAD, COMPUTE)
    program = p.finish()
    dev.write(at, program.to_bytes())
    dev.run(at, len(program), timeline=True)
    (start, end, _), = dev.timeline.intervals("load")
    return start, end


def layer_of(workload: ConvWorkload, config=DEFAULT):
    graph, feed = workload_graph(workload)
    return graph, feed, Conv2dLayer.from_node(graph.node("conv"), graph, config)


def test_workloads_parse_by_name_and_by_numbers():
    assert parse_workload("c5") == ("C5", ConvWorkload(28, 28, 128, 128, 3, 1, 1))
    assert parse_workload("7,7,16,32,3,1,1")[1] == ConvWorkload(7, 7, 16, 32, 3, 1, 1)
    assert RESNET18["C2"].macs == 56 * 56 * 64 * 64 * 9
    for bad, match in [("C12", "neither a ResNet-18"), ("1,2,3", "7 or 8 integers"),
                       ("7,7,16,32,3,1,0", ">= 1"), ("2,2,16,16,7,1,1", "does not fit")]:
        with pytest.raises(ValueError, match=match):
            parse_workload(bad)


@pytest.mark.parametrize("name", ["C2", "C6", "C9", "C10"])
def test_uop_count_matches_the_table(name):
    _, _, layer = layer_of(RESNET18[name])
    for s in list(schedule_space(layer, DEFAULT))[::97]:
        s = s.clamped(layer)
        assert conv_uop_count(layer, s) == len(conv_uop_table(layer, s).uops), s


def test_schedule_space_holds_only_fitting_schedules_of_both_thread_kinds():
    _, _, layer = layer_of(RESNET18["C8"])
    space = list(schedule_space(layer, DEFAULT))
    assert len(space) > 100
    assert {(s.oc_nthread, s.h_nthread) for s in space} == {(1, 1), (2, 1), (1, 2)}
    for s in space:
        s.check(layer, DEFAULT)
    # The whole layer in one tile: 16x16x9 weight blocks are more than the wgt buffer.
    assert not Conv2dSchedule(14, 14, 16, 16).fits(layer, DEFAULT)
    assert "wgt" in Conv2dSchedule(14, 14, 16, 16).overflows(layer, DEFAULT)


def test_chooser_prefers_two_threads_where_loads_are_long_and_raises_when_nothing_fits():
    _, _, layer = layer_of(RESNET18["C11"])
    assert choose_conv2d(layer, DEFAULT).nthreads == 2
    assert choose_conv2d(layer, DEFAULT, nthreads=1).nthreads == 1
    tiny = vdla.HardwareConfig(wgt_buff_size=1 << 11)  # 8 weight blocks, 9 taps
    _, _, layer = layer_of(RESNET18["C11"], tiny)
    with pytest.raises(ValueError, match="does not fit"):
        choose_conv2d(layer, tiny)


def test_the_model_and_the_chooser_plan_with_the_configs_dram_bandwidth():
    # C11 on 512 MACs streams 10.4 weight bytes per cycle of GEMM work: the DRAM limits.
    narrow = vdla.HardwareConfig(block_out=32, wgt_buff_size=128 * 1024)
    wide = narrow.replace(dram_bus_width=128, dram_bytes_per_cycle=12.0)
    _, _, layer = layer_of(RESNET18["C11"], narrow)
    s = choose_conv2d(layer, narrow)
    # `bytes_per_cycle` overrides the config's (the bus width stays: it sets what the
    # LOADs' padding costs).
    assert (estimate_conv2d(layer, s, wide).cycles
            == estimate_conv2d(layer, s, wide.replace(dram_bytes_per_cycle=8.0),
                               bytes_per_cycle=12).cycles
            < estimate_conv2d(layer, s, narrow).cycles)
    best = estimate_conv2d(layer, choose_conv2d(layer, wide), wide).cycles
    assert best <= estimate_conv2d(layer, s, wide).cycles
    slow = estimate_conv2d(layer, s, narrow).cycles
    assert layer.macs / (best * 512) > 0.9 > layer.macs / (slow * 512)


@pytest.mark.parametrize("workload, schedule, tolerance", [
    (ConvWorkload(14, 14, 64, 64, 3, 1, 1), Conv2dSchedule(7, 14, 2, 2, oc_nthread=2), 0.05),
    (ConvWorkload(14, 14, 64, 64, 3, 1, 1), Conv2dSchedule(7, 14, 4, 4), 0.05),
    (ConvWorkload(7, 7, 128, 128, 3, 1, 1), Conv2dSchedule(7, 7, 1, 2, oc_nthread=2), 0.05),
    # Small 1x1 layers are dominated by DMA latencies the model only approximates.
    (ConvWorkload(14, 14, 64, 128, 1, 0, 2), Conv2dSchedule(2, 7, 4, 8, h_nthread=2), 0.2),
    # One thread, rows of three and a last one of one: each tile's first loads overlap
    # its predecessor's epilogue and stores, a short tile's after a whole one's.
    (ConvWorkload(7, 7, 256, 256, 1, 0, 1), Conv2dSchedule(3, 7, 16, 8), 0.03),
])
def test_estimate_is_close_to_the_cycle_accurate_backend(workload, schedule, tolerance):
    """The model ranks schedules for the chooser and the tuner: it must track Verilator's
    cycles closely (it is within 2% on ResNet-18's 3x3 layers; see
    bench/resnet18_layers.py)."""
    graph, feed, layer = layer_of(workload)
    lowered = lower_conv2d(graph.node("conv"), graph, DEFAULT, schedule)
    dev = vdla.runtime.open(DEFAULT, backend="verilator", log=lambda message: None)
    _, stats = run_conv2d(dev, lowered, feed["x"], graph.tensors["w"].data,
                          graph.tensors["b"].data, return_stats=True)
    estimate = estimate_conv2d(layer, schedule, DEFAULT)
    assert estimate.gemm == layer.gemm_uops
    assert abs(estimate.cycles / stats["cycles"] - 1) < tolerance, (estimate, stats["cycles"])


def test_serial_overlaps_count_the_steps_between_tile_classes():
    """A whole row tile after the short last one of the previous output-channel tile
    overlaps that short tile's epilogue, not its own class's."""
    assert steps([("W", 3), ("S", 1)]) == {("W", "W"): 2, ("W", "S"): 1, ("S", "S"): 0}
    assert steps([("W", 1)]) == {("W", "W"): 0}


def test_store_waits_count_a_short_row_tile_between_whole_ones_but_the_last():
    """Two threads over rows: after each short last row tile but the layer's last, the
    next whole tile waits for the stores of the whole tile before the short one, less
    the short tile's compute (MobileNet-v1's features.1.pw on 1x16x32-req-hold-dw3:
    56 rows of five and a last one of one, four columns of 14)."""
    _, _, layer = layer_of(ConvWorkload(56, 56, 64, 128, 1, 0, 1))
    tilings = [(8, 1, [(4, 1)])]

    def tile(compute, store):
        return TileClass(first_load=900, overlap=1500, compute=compute, store=store,
                          released=580, reset=147)

    sides = {(5, 14, 0): tile(1704, 1208), (1, 14, 0): tile(360, 312)}
    rows = Conv2dSchedule(5, 14, 4, 8, h_nthread=2)
    assert store_waits(layer, rows, tilings, sides) == 3 * (1208 - 360)
    # A short tile that outlasts the whole tile's stores leaves nothing to wait for.
    assert store_waits(layer, rows, tilings, {**sides, (1, 14, 0): tile(1300, 312)}) == 0
    assert store_waits(layer, Conv2dSchedule(5, 14, 4, 8), tilings, sides) == 0


def test_the_tables_of_both_modules_share_the_read_channel():
    """The load module's tables (the bias row and the ones vector of a bias GEMM) end no
    sooner than the channel has carried the compute module's micro-ops too, at one a
    cycle (narrower than a bus word)."""
    config = vdla.HardwareConfig(block_out=32)
    _, _, layer = layer_of(ConvWorkload(7, 7, 1024, 1024, 1, 0, 1), config)
    assert layer.bias_gemm and not layer.const_rows
    s = choose_conv2d(layer, config)
    load, _ = _table_cycles(layer, s, config, 8.0)
    uops = conv_uop_count(layer, s)
    bias_row = layer.out_blocks * config.wgt_elem_bytes + config.inp_elem_bytes
    assert load == _shared_tables(uops, bias_row, config, 8.0) == uops + bias_row / 8 + 80
    assert load > bias_row / 8 + 2 * 40      # the load module's tables alone


def test_padding_costs_only_where_the_loads_writer_is_the_limit():
    """A LOAD writes a bus word a cycle and a zero for each padded element: on a 64-bit
    bus at 8 bytes a cycle the writer is the limit and each zero costs half a cycle; on a
    128-bit bus at 12 bytes a cycle the zeros fill the writer's idle cycles."""
    _, _, layer = layer_of(ConvWorkload(14, 14, 32, 32, 3, 1, 2))
    window, pads = (15, 15), 29           # a 7 x 7 tile's window, 29 positions padded
    blocks = layer.in_blocks              # one DMA each (one block a pixel)
    data = blocks * (15 * 15 - pads) * DEFAULT.inp_elem_bytes
    narrow = _chunk_costs(layer, [(blocks, 1)], 1, window, (7, 7), True, DEFAULT, 8.0, pads)
    assert narrow[0] == data / 8 + blocks * pads * 0.5 + blocks * 40
    wide = DEFAULT.replace(dram_bus_width=128, dram_bytes_per_cycle=12.0)
    assert _chunk_costs(layer, [(blocks, 1)], 1, window, (7, 7), True, wide, 12.0,
                        pads)[0] == data / 12 + blocks * dma_cycles(12.0)


def test_narrow_rows_wait_for_the_drams_read_slots():
    """A LOAD issues one read burst a row; once the DRAM's eight read slots are full, a
    row of a bus word or two waits for one to free (`dma_row_cycles`), which the
    Verilator model shows on LOADs of 13 and 26 one-element rows, where rows of ten bus
    words keep the bus busy."""

    assert dma_row_cycles(8, 2.0) == 0 and dma_row_cycles(13, 10.0) == 0
    assert dma_row_cycles(13, 2.0) == 5 * ((DMA_BURST_CYCLES + 2.0) / DMA_READ_SLOTS - 2.0)
    row_bytes = DEFAULT.inp_elem_bytes
    with vdla.runtime.open(DEFAULT, backend="verilator", log=lambda message: None) as dev:
        for rows, elems in ((13, 1), (26, 1), (13, 5)):
            start, end = timed_inp_load(dev, rows, elems, stride=64)
            per_row = elems * row_bytes / DEFAULT.dram_bytes_per_cycle
            model = DMA_CYCLES + rows * per_row + dma_row_cycles(rows, per_row)
            assert abs((end - start) - model) <= 5, (rows, elems, end - start, model)


def test_workload_graph_runs_bit_exact_with_the_default_schedule():
    from vdla.compiler import run_reference

    graph, feed, _ = layer_of(ConvWorkload(9, 9, 20, 24, 3, 1, 2))
    want = run_reference(graph, feed)[graph.outputs[0]]
    assert 0 < np.count_nonzero(want) < want.size  # ReLU clamps some, not all
    lowered = lower_conv2d(graph.node("conv"), graph, DEFAULT)
    dev = vdla.runtime.open(DEFAULT)
    got = run_conv2d(dev, lowered, feed["x"], graph.tensors["w"].data, graph.tensors["b"].data)
    np.testing.assert_array_equal(got, want)


def test_the_chooser_finds_narrow_tiles_when_only_those_fit():
    """The default chooser searches the widest output-width tilings first and every width
    only when none of those fits: a schedule exists whenever the smallest tiling fits,
    which is what `VdlaTarget.supports` checks."""
    tiny = vdla.HardwareConfig(acc_buff_size=512)          # 8 acc entries
    layer = Conv2dLayer(n=1, c=16, h=56, w=56, o=16, kernel_h=3, kernel_w=3,
                        pads=(1, 1, 1, 1), batch_blocks=1, in_blocks=1, out_blocks=1)
    widest = min(list(schedule_space(layer, tiny)) + [None], key=lambda s: s is None)
    assert widest is None                                  # no wide tiling fits 8 entries
    chosen = choose_conv2d(layer, tiny)
    assert chosen.fits(layer, tiny) and chosen.tile_w < 14
    assert choose_conv2d(layer, vdla.HardwareConfig()).tile_w >= 14   # unchanged default


def test_depthwise_picks_the_diagonal_gemm_by_the_timing_model():
    """MobileNet-v1's depthwise shapes: diagonal weight blocks on the GEMM core (the
    default chooser's schedule, loads and stores included) beat even the compute-only
    lower bound of the ALU scheme, by over 3x; their utilization stays under the
    1 / block_in ceiling of a diagonal block."""
    from vdla.compiler import Graph
    from vdla.compiler.targets.vdla.grouped import depthwise_alu_cycles
    config = vdla.HardwareConfig()
    for c, size, stride in ((32, 112, 1), (64, 112, 2), (256, 28, 1), (1024, 7, 1)):
        g = Graph("dw")
        x = g.add_input("x", (1, c, size, size), "int8")
        w = g.add_constant("w", np.ones((c, 1, 3, 3), np.int8), "int8")
        g.add_node("qconv2d", [x, w], name="dw", groups=c, strides=(stride, stride),
                   pads=(1, 1, 1, 1), shift=(8,))
        layer = Conv2dLayer.from_node(g.node("dw"), g, config)
        assert layer.diagonal
        gemm = estimate_conv2d(layer, choose_conv2d(layer, config), config).cycles
        assert depthwise_alu_cycles(layer) > 3 * gemm
        assert 0.02 < layer.macs / (gemm * config.macs_per_cycle) < 1 / config.block_in
