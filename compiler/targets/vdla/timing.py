"""The convolution's timing model: `estimate_conv2d(layer, schedule, config)` predicts the
cycles of the program that `lower_conv2d` (`vdla.compiler.targets.vdla.conv`) emits,
from the work each module does and how the virtual threads let it overlap. It is not
cycle-accurate (the Verilator backend is); it ranks schedules, which is what the
default chooser (`conv_layer.choose_conv2d`, over `conv_layer.schedule_space`) and the
tuner's pre-screening need, and it explains a layer's time (`Conv2dEstimate` splits it
into GEMM, epilogue, load and store). The hardware facts it rests on are
`vdla.compiler.targets.vdla.common`'s; the layer it prices is `conv_layer`'s
`Conv2dLayer`, the tiling `conv_schedule`'s `Conv2dSchedule`.

How the modules overlap (see `vdla.compiler.targets.vdla.conv` for the program): with one
virtual thread a chunk's loads and its GEMM alternate (the next loads overwrite what the
GEMM reads), and only the next tile's first loads overlap the epilogue and stores; with
two, one thread's loads run during the other's GEMM, so a chunk pair takes the longer of
the two, and epilogues and stores hide behind the other thread's work.

What the model reads of a config: its block shape and element widths, the ALU's ops
(REQ, `alu_hold`), the DRAM bus and bandwidth and the micro-op width (`uop_bytes`), never
a buffer's size (the fit is `Conv2dSchedule`'s); beside the config, the DRAM's bandwidth
and read latency where a board's DRAM model sets them (`bytes_per_cycle`,
`read_latency`). `timing_key` is that part of a config: two configs with the same key
give every (layer, schedule) the same estimate, which is what lets the chooser rank a
layer's schedules once for the points of a sweep that differ only in their buffers
(tests/compiler/targets/vdla/test_timing_key.py checks the model reads nothing else).

The terms of two virtual threads (how their tiles pair, the pairs' simulation, the
layer's first and last pairs, weight switches) are `timing_pairs`'; this module holds a
tile's costs, the one-thread overlaps and the tables, and sums them all.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

from vdla.compiler.targets.vdla import dw_window
from vdla.compiler.targets.vdla.common import (INSN_CYCLES, PAD_ELEM_CYCLES, ceil_div,
                                               dma_cycles, dma_row_cycles, store_cycles,
                                               tile_split, vector_pass_cycles, window_cols,
                                               window_rows)
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule, conv_uop_count
from vdla.compiler.targets.vdla.sequence import contiguous_rows
from vdla.compiler.targets.vdla.timing_pairs import (TileClass, TileCosts, first_pair,
                                                     last_pair, last_stores, lone_tile,
                                                     mixed_groups, paired_cycles,
                                                     pair_terms, previous_class, steps,
                                                     store_waits, two_thread_cycles,
                                                     weight_switches)
from vdla.config import AluOp, HardwareConfig

if TYPE_CHECKING:   # annotations only: conv_layer imports this module
    from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer

__all__ = ["Conv2dEstimate", "estimate_conv2d", "timing_key"]


#: The config's fields the timing model never reads: the buffers' sizes (a tiling's fit
#: is `Conv2dSchedule`'s). They reach it only through the micro-op width, `uop_bytes`
#: (wider micro-ops where the buffers' indices need more bits), which `timing_key` holds.
FIT_ONLY = ("inp_buff_size", "wgt_buff_size", "acc_buff_size", "uop_buff_size")


@functools.lru_cache(maxsize=4096)
def timing_key(config: HardwareConfig) -> tuple:
    """What `estimate_conv2d` reads of `config`: every field but the buffers' sizes
    (`FIT_ONLY`), and the micro-op width they set. Configs with equal keys give every
    (layer, schedule, passes, bandwidth, latency) the same estimate, so the default
    chooser ranks a layer's tilings once for all of them (`conv_layer.choose_conv2d`); a
    sweep's points that differ only in their buffers share it. Remembered per config (a
    sweep asks once per layer of every point)."""
    return (tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                  if f.name not in FIT_ONLY), config.uop_bytes)


@dataclasses.dataclass(frozen=True)
class Conv2dEstimate:
    """Predicted cycles of a lowered conv2d and the work behind them (module-busy cycles
    summed over the layer): `gemm` (useful GEMM micro-ops), `epilogue` (reset, ALU
    passes, residual loads and instruction overheads on the compute module), `load` and
    `store` (DMA cycles of the load and store modules)."""

    cycles: int
    gemm: int
    epilogue: int
    load: int
    store: int

    @property
    def compute(self) -> int:
        return self.gemm + self.epilogue


def _tile_class(layer: Conv2dLayer, channels: tuple, geometry: tuple, weight_reuse: bool,
                c: HardwareConfig, dram: tuple[float, int | None], passes: tuple[int, int, int],
                res_passes: tuple[int, int]) -> TileCosts:
    """The costs of a tile of `channels` = (input-channel chunks, output blocks) and
    `geometry` = (input rows, columns and padded positions, output rows, columns) on a
    DRAM of `dram` = (bytes a cycle, read latency); `passes` = the epilogue's (immediate,
    vector) ALU passes and whether each tile resets its acc tile."""
    chunks, tco = channels
    rows, cols, pads, th, tw = geometry
    bw, lat = dram
    imm, vec, reset = passes
    tile_load, tile_gemm, chunk_pairs, seq, res_epi, res_head = _tile_costs(
        layer, chunks, tco, (rows, cols, pads), (th, tw), weight_reuse, c, bw, res_passes, lat)
    entries = th * tw * tco
    epi = _epilogue_cycles(layer, entries, tco, c, (imm, vec), reset) + res_epi
    st = store_cycles(entries, tco * (1 if tw == layer.out_w or layer.out_group == 1 else th),
                      c, bw, layer.out_group)
    run = _pair_args(layer, seq, (epi, res_head, st), entries, reset, c)
    # For `_serial_overlaps`, `store_waits` and `weight_switches`.
    side = TileClass(tile_load / sum(n for _, n in chunks),
                     epi + st - _head_cycles(layer, entries, reset=0), tile_gemm + epi, st,
                     run[1] - run[4], reset * (entries + INSN_CYCLES))
    first = (seq[0][0], seq[0][1] - res_head)
    paired = paired_cycles(layer, chunk_pairs, first, tile_gemm, epi)
    return TileCosts(tile_load, tile_gemm, epi, st, seq, paired, run, side,
                     max(0.0, min(first[0] - first[1], paired - tile_gemm - epi)))


def _channel_tilings(layer: Conv2dLayer, s: Conv2dSchedule) -> tuple[list, int, bool]:
    """How clamped schedule `s` cuts `layer`'s channels, as `estimate_conv2d` counts
    them: (tilings, output-channel tiles, weight reuse). `tilings` lists the
    output-channel tiles (tco, count) and their input-channel chunks (blocks per output
    block, count), per span of a grouped layer (one span otherwise)."""
    tilings = []
    for _, on, _, cn in layer.spans:
        chunks = [(1, 1)] if layer.paired else tile_split(cn, min(s.tile_ci, cn))
        if layer.diagonal_rows:   # one chunk, a full row tile's blocks (`_row_chunks`)
            chunks = [(s.tile_ci, 1)]
        tilings += [(tco, nco, chunks) for tco, nco in tile_split(on, s.tile_co)]
    n_chunks = max(sum(n for _, n in chunks) for _, _, chunks in tilings)
    co_tiles = sum(nco for _, nco, _ in tilings)
    # Weights are loaded again for every tile, except with a single input-channel chunk
    # when a thread's next tile uses the same output-channel blocks (see the emitter's
    # `load_chunk` in `vdla.compiler.targets.vdla.conv`).
    if n_chunks > 1 or layer.diagonal_rows:   # each row tile its own weight blocks
        weight_reuse = False
    elif s.oc_nthread > 1:
        weight_reuse = co_tiles <= 2
    else:
        weight_reuse = True
    return tilings, co_tiles, weight_reuse


def _row_chunks(layer: Conv2dLayer, th: int, chunks: list) -> list:
    """A tile's input chunks: a diagonal_rows tile of `th` rows reads its rows' blocks,
    one chunk (an edge tile fewer than a full one); any other layer's are `chunks`."""
    return [(th // layer.row_block, 1)] if layer.diagonal_rows else chunks


def estimate_conv2d(layer: Conv2dLayer, schedule: Conv2dSchedule, config: HardwareConfig, *,
                    alu_passes: tuple[int, int] | None = None,
                    residual_passes: tuple[int, int] | None = None,
                    bytes_per_cycle: float | None = None,
                    read_latency: int | None = None) -> Conv2dEstimate:
    """Predict the cycles of `layer` lowered with `schedule` on `config`.

    `alu_passes` = (passes with an immediate, passes with a vector operand) of the
    epilogue over the conv tile; the default is what a requantized, clamped conv with a
    bias needs (SHR, MAX, MIN, or with the ALU's REQ one REQ; the bias ADD unless the
    bias GEMM adds it). The residual's
    passes are counted from `layer.has_residual` (int8 loads widened on the GEMM core, or
    a LOAD ACC; then `residual_passes`, the residual's requantization as (immediate,
    vector) passes, default a shift; then an ADD). `bytes_per_cycle`: the DRAM's each
    way, default the config's `dram_bytes_per_cycle`; `read_latency`: the DRAM's, in
    cycles (default the simulated DRAM's, `common.READ_LATENCY`), which every DMA pays."""
    s = _as_emitted(layer, schedule.clamped(layer))
    c = config
    bw = float(bytes_per_cycle or config.dram_bytes_per_cycle)
    lat = read_latency
    if alu_passes is None:   # a shift, the clamp (MAX, MIN or REQ's), a bias ADD row
        alu_passes = ((1 if AluOp.REQ in config.alu_ops else 3), 0 if layer.bias_gemm else 1)
    imm, vec = alu_passes
    res_passes = residual_passes if residual_passes is not None else (1, 0)
    # With the ALU's REQ the epilogue ends in one (`requant.clamp_steps`), which clears
    # the tile: each thread resets its region once instead of every tile.
    reset = 0 if AluOp.REQ in c.alu_ops else 1
    threads = s.nthreads
    tilings, co_tiles, weight_reuse = _channel_tilings(layer, s)

    gemm = epilogue = load = store = 0
    serial = 0          # one thread: the time of the modules taking turns
    paired = 0          # two threads: per chunk, the longer of loads and GEMMs
    first_load = first_compute = 0
    head_load = head_excess = None  # the first chunk's loads; what the pairs count of them
    last_paired = last = None      # the last tile's time with two threads, its class
    costs = {}               # (rows, columns, `tilings` index) -> `TileCosts`
    tiles, lone = 0, 0.0     # tiles in all; what the last one adds running alone
    load_waits = 0.0         # two threads: the load module's waits for their buffers
    for th, nh in tile_split(layer.out_h, s.tile_h):
        rows = window_rows(layer, th)
        for tw, nw in tile_split(layer.out_w, s.tile_w):
            cols = window_cols(layer, tw)
            pads = _window_pads(layer, s, th, tw)
            for k, (tco, nco, chunks) in enumerate(tilings):
                chunks = _row_chunks(layer, th, chunks)
                m = nh * nw * nco * layer.batch_blocks
                t = _tile_class(layer, (chunks, tco), (rows, cols, pads, th, tw), weight_reuse,
                                c, (bw, lat), (imm, vec, reset), res_passes)
                tile_load, tile_gemm, epi, st, seq, tile_paired, run = t[:7]
                costs[th, tw, k] = t
                tile_chunks = sum(n for _, n in chunks)
                # GEMM instructions: one a chunk, or a window layer's one per kernel row.
                insns = tile_chunks * (layer.kernel_h if layer.window else 1)
                gemm += m * (tile_gemm - insns * INSN_CYCLES)
                epilogue += m * (epi + insns * INSN_CYCLES)
                load += m * tile_load
                store += m * st
                serial += m * (tile_load + tile_gemm + epi + st)
                paired += m * tile_paired
                if threads == 2:
                    more, waits = pair_terms(m, run, tile_paired, first_class=not tiles)
                    paired += more
                    load_waits += waits * (s.oc_nthread == 2 or not weight_reuse)  # `pair_terms`
                tiles += m
                # The last tile in program order is an edge tile of every axis.
                lone = lone_tile(t)
                last_paired = tile_paired
                last = th, tw, k
                first_load = max(first_load, tile_load / tile_chunks)
                if head_load is None:
                    head_load, head_run, head_excess = seq[0][0], run, t.head_excess
                    # What the pairs count of the first pair, where it holds two tiles.
                    counted = 2 * tile_paired - head_excess if m >= 2 else None
                first_compute = max(first_compute, tile_gemm + epi)
    # Each thread loads the weights of the output-channel tiles it meets once per batch
    # block, into its own region (`_weight_loads`).
    once = weight_reuse * _weight_loads(layer, s, co_tiles) / co_tiles * (
        layer.batch_blocks * layer.weight_blocks * layer.wgt_taps * c.wgt_elem_bytes / bw
        + (layer.out_blocks if layer.streamed else co_tiles) * dma_cycles(bw, lat))
    load += once
    serial += once
    table_load, table_compute = _table_cycles(layer, s, c, bw, lat)
    load += table_load
    # Without a reset per tile, each thread resets its whole region once, first: the
    # first thread in the head, the second in the first pair (`first_pair`).
    region = 0 if reset else s.tile_h * s.tile_w * s.tile_co + INSN_CYCLES
    region_resets = threads * region
    # The tables load on both modules at once (`_table_cycles`); then the compute module
    # resets its regions, and the load module loads the first inputs.
    sides = {key: t.side for key, t in costs.items()}
    if threads == 1:
        cycles = (serial - _serial_overlaps(layer, s, tilings, sides)
                  + max(table_load, table_compute + region_resets - first_load))
    else:
        # The busiest module bounds the time; chunk pairs add the waits of a thread whose
        # loads take longer than the other's GEMM; weight switches stall the compute
        # module only (`weight_switches`), and so do the stores' waits and the groups
        # that pair a whole output-channel tile with the short one (`store_waits`,
        # `mixed_groups`); a load-bound layer ends with its drain.
        switches = (weight_switches(layer, s, tilings, once, c, (bw, lat), first_load,
                                     first_compute, (head_load, last_paired, sides, head_excess))
                    if weight_reuse else 0.0) + store_waits(layer, s, tilings, sides)
        switches += mixed_groups(layer, s, tilings, costs)
        late, late_waits = first_pair(head_run, counted, region)
        load_waits += late_waits
        previous = previous_class(layer, s, tilings) if tiles > 1 else None
        cycles = two_thread_cycles(
            paired + switches + late, load, store,
            (table_load, first_load, head_load, head_excess, table_compute + region),
            (last_stores(sides, last, previous), lone if tiles % 2 else 0.0, load_waits,
             last_pair(costs[last].run, costs[last].run if weight_reuse or previous is None
                       else costs[previous].run)[1]), layer.streamed)
    return Conv2dEstimate(int(math.ceil(cycles)), int(gemm), int(epilogue + region_resets),
                          int(load), int(store))


def _tile_counts(layer: Conv2dLayer, s: Conv2dSchedule) -> tuple[int, int, int]:
    """(output-channel, row, column) tiles of clamped schedule `s`."""
    return (len(layer.co_tiles(s.tile_co)), ceil_div(layer.out_h, s.tile_h),
            ceil_div(layer.out_w, s.tile_w))


def _as_emitted(layer: Conv2dLayer, s: Conv2dSchedule) -> Conv2dSchedule:
    """`s`, or the schedule the model counts for the same program: threads over rows
    whose tiles come in the order of threads over output channels (at most one of the
    output-channel, row and column axes cut into more than one tile: both orders are then
    that axis's, `_ConvEmitter.groups` in `vdla.compiler.targets.vdla.conv`) are the same
    instructions, and the model counts them as channel threads, whose load module's
    waits for the other thread's buffers (`pair_terms`) it counts. BERT-tiny's output
    dense with its residual on vta-plus (two tiles of 64 rows, one output-channel tile):
    21,446 cycles on Verilator either way; the model 4.7% low as row threads, 0.8% high
    as channel threads."""
    if s.h_nthread != 2 or sum(n > 1 for n in _tile_counts(layer, s)) > 1:
        return s
    return dataclasses.replace(s, oc_nthread=2, h_nthread=1)


def _weight_loads(layer: Conv2dLayer, s: Conv2dSchedule, co_tiles: int) -> int:
    """How many (thread, output-channel tile) pairs meet, per batch block, where a
    thread keeps its weights from tile to tile (one input-channel chunk): each loads
    the weights of every output-channel tile it meets once. Consecutive tiles alternate
    between two threads (`_ConvEmitter.groups`): over channels (channel tiles innermost)
    a thread meets every other channel tile when their count is even, and every one when
    it is odd and the rows and columns give it more than one turn; over rows, every one
    when a channel tile has more than one row or column tile."""
    if s.nthreads == 1:
        return co_tiles
    _, rows, cols = _tile_counts(layer, s)
    turns = layer.batch_blocks * rows * cols
    if s.oc_nthread > 1:
        return co_tiles if co_tiles % 2 == 0 or turns < 2 else 2 * co_tiles
    if rows * cols >= 2:
        return 2 * co_tiles
    # one tile per channel tile: as channel threads over the batch blocks
    return co_tiles if co_tiles % 2 == 0 or layer.batch_blocks < 2 else 2 * co_tiles


def _serial_overlaps(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """One thread: what the tiles' first loads overlap in all. Each tile's overlap its
    predecessor's epilogue and stores, but for its bias GEMM, which waits for them, in
    program order (batch blocks, output-channel tiles, rows, columns: `_ConvEmitter.groups`
    in `vdla.compiler.targets.vdla.conv`); the first tile's overlap nothing. `sides` maps
    a tile class (rows, columns, index in `tilings`) to its `TileClass`. The stem of
    ResNet-18 on a 1x16x32 core at 8 bytes a cycle: 9,172 cycles a tile on Verilator,
    8,826 when the bias GEMM overlapped too; its layer4.0.downsample on 1x32x16 (tiles of
    two rows and a last one of one): 60,295 cycles on Verilator, 58,217 when each tile
    overlapped its own class's epilogue, 58,817 so."""
    rows, cols = tile_split(layer.out_h, s.tile_h), tile_split(layer.out_w, s.tile_w)
    cos = [(k, nco) for k, (_, nco, _) in enumerate(tilings)]
    nb = layer.batch_blocks

    def overlaps(prev, cur, n):
        return n * min(sides[cur].first_load, sides[prev].overlap)

    total = 0.0
    for k, nco in cos:
        for th, nh in rows:          # along a row
            total += sum(overlaps((th, a, k), (th, b, k), n * nh * nco * nb)
                         for (a, b), n in steps(cols).items())
        total += sum(overlaps((a, cols[-1][0], k), (b, cols[0][0], k), n * nco * nb)
                     for (a, b), n in steps(rows).items())
    first, last = (rows[0][0], cols[0][0]), (rows[-1][0], cols[-1][0])
    total += sum(overlaps((*last, a), (*first, b), n * nb) for (a, b), n in steps(cos).items())
    return total + overlaps((*last, cos[-1][0]), (*first, cos[0][0]), nb - 1)


def _pair_args(layer: Conv2dLayer, seq: list, tile: tuple[float, float, float],
               entries: int, reset: int, c: HardwareConfig) -> tuple:
    """`pair_run`'s arguments for a tile of `entries` acc entries, chunks `seq`, and
    `tile` = (epilogue, its residual's head, stores): with two threads the tile's own
    reset and bias GEMM (`_head_cycles`), like its residual's reset and widening, run
    before its first chunk's GEMMs; a late residual holds the inp buffer for all of the
    epilogue but the clamp. ResNet-50's layer3.0.conv3 on 1x32x16 (rows of five, chunks
    of 3, 3 and 2 input blocks): 16,642 cycles a pair on Verilator; 17,551 when the
    epilogue took them, for the other thread's first chunk then waited for its loads;
    16,704 so."""
    epi, res_head, st = tile
    own = _head_cycles(layer, entries, reset)
    pair_epi = epi - res_head - own
    late = layer.late_residual and bool(layer.residual_ratio)   # widened in the epilogue
    return ([(seq[0][0], seq[0][1] + own), *seq[1:]], pair_epi, st, 2,
            pair_epi - _clamp_cycles(entries, c) if late else 0.0)


def _head_cycles(layer: Conv2dLayer, entries: int, reset: int) -> float:
    """What of a tile's epilogue (`_epilogue_cycles`) runs before its first chunk's GEMMs:
    the reset of its `entries` acc entries (`reset`: 0 where a REQ clears them) and the
    bias GEMM."""
    return (reset + layer.bias_gemm) * (entries + INSN_CYCLES)


def _clamp_cycles(entries: int, c: HardwareConfig) -> float:
    """The clamp's cycles over a tile of `entries` acc entries (MAX and MIN, or with the
    ALU's REQ one REQ): what follows a late residual's widening in the epilogue."""
    return (1 if AluOp.REQ in c.alu_ops else 2) * (entries + INSN_CYCLES)


def _epilogue_cycles(layer: Conv2dLayer, entries: int, tco: int, c: HardwareConfig,
                     passes: tuple[int, int], reset: int) -> float:
    """Compute cycles of a tile's epilogue over `entries` acc entries in `tco` output
    blocks: the reset micro-op (`reset`: 0 where the epilogue's REQ clears the tile), the
    bias GEMM's, then the ALU `passes` (immediate, vector), each pass an instruction."""
    imm, vec = passes
    epi = (entries * (reset + imm) + vec * vector_pass_cycles(entries, tco, c)
           + (1 + reset + imm + vec) * INSN_CYCLES)
    if layer.bias_gemm:    # the bias GEMM: one micro-op per acc entry
        epi += entries + INSN_CYCLES
    return epi


def _window_pads(layer: Conv2dLayer, s: Conv2dSchedule, th: int, tw: int) -> float:
    """The mean count of a `th` x `tw` tile's input window positions that lie in the
    padding (the LOAD writes each zero in a cycle while its reads of the rest run ahead:
    `PAD_ELEM_CYCLES`), over the layer's tiles of that size (`_tile_pads`, remembered:
    the schedules of a search share few tile sizes)."""
    return _tile_pads(layer, s.tile_h, s.tile_w, th, tw)


@functools.lru_cache(maxsize=1 << 16)
def _tile_pads(layer: Conv2dLayer, tile_h: int, tile_w: int, th: int, tw: int) -> float:
    """`_window_pads` of tiles of `tile_h` x `tile_w` (its `th` x `tw` ones)."""

    def inside(out, tile, size, stride, pad, window, extent) -> float:
        starts = [o0 for o0 in range(0, out, tile) if min(tile, out - o0) == size]
        return sum(min(o0 * stride - pad + window, extent) - max(o0 * stride - pad, 0)
                   for o0 in starts) / len(starts)

    rows, cols = window_rows(layer, th), window_cols(layer, tw)
    return rows * cols - (
        inside(layer.out_h, tile_h, th, layer.stride_h, layer.pads[0], rows, layer.h)
        * inside(layer.out_w, tile_w, tw, layer.stride_w, layer.pads[1], cols, layer.w))


def _tile_costs(layer: Conv2dLayer, chunks, tco: int, window: tuple[int, int, float],
                tile: tuple[int, int], weight_reuse: bool, c: HardwareConfig, bw: float,
                res_passes: tuple[int, int], lat: int | None = None):
    """One tile's chunks with its residual (`_chunk_costs`, `_residual_cost`): (load
    cycles, GEMM cycles, the sum over chunks of the longer of the two, each chunk's (load,
    GEMM), the residual's compute cycles, those of them before the first GEMMs).
    `window`: the input rows and columns, and the positions in the padding; `lat`: the
    DRAM's read latency (`estimate_conv2d`'s `read_latency`)."""
    tile_load, tile_gemm, chunk_pairs, seq = _chunk_costs(
        layer, chunks, tco, window[:2], tile, weight_reuse, c, bw, window[2], lat)
    first = seq[0]
    res, res_epi, res_head = _residual_cost(layer, tile[0] * tile[1], tco, c, bw, res_passes,
                                            lat)
    if res:
        # The residual tile comes with the first chunk's loads; with two threads it loads
        # during the other thread's GEMM too.
        tile_load += res
        chunk_pairs += max(first[0] + res, first[1]) - max(*first)
    # Its reset and widening run before the first chunk's GEMMs (or, late, in the
    # epilogue: `res_head` is 0).
    seq = [(first[0] + res, first[1] + res_head), *seq[1:]]
    return tile_load, tile_gemm, chunk_pairs, seq, res_epi, res_head


def _chunk_costs(layer: Conv2dLayer, chunks, tco: int, window: tuple[int, int],
                 tile: tuple[int, int],
                 weight_reuse: bool, c: HardwareConfig, bw: float, pads: float = 0.0,
                 lat: int | None = None):
    """One tile's input-channel chunks: (load cycles, GEMM cycles, the sum over chunks of
    the longer of the two, and each chunk's (load, GEMM) in order). A chunk loads whole
    activation blocks of its `window` (rows, columns) of input positions, `pads` of them
    in the padding (a
    diagonal tile one input block per output block) and, unless they are reused, its
    weights: one 2-D DMA per activation block and one of weights, each paying the DRAM
    latency (`common.dma_cycles` of the DRAM's bandwidth and read latency `lat`; measured
    on the default DRAM: bytes / 8 + 36 cycles a DMA, whatever its rows). `tile`: the
    tile's (rows, columns); a window layer's GEMMs are `dw_window.tile_gemm_cycles`."""
    taps = layer.wgt_taps
    grp = layer.inp_group
    plane = tile[0] * tile[1]
    rows, window = window[0], window[0] * window[1]
    if contiguous_rows(layer.w, window // rows, rows, {"pads": pads}):
        rows = 1                  # a sequence's rows: one DMA row (`activation_dma`)
    # A row of one activation DMA: its columns of `grp` elements (`activation_dma`).
    row_cycles = window // rows * grp * c.inp_elem_bytes / bw
    tile_load = tile_gemm = chunk_pairs = 0.0
    seq = []
    for tci, nci in chunks:
        blocks = (tco * grp if layer.window else tco if layer.diagonal
                  else ceil_div(tci, grp) * grp)
        wgt = 0 if weight_reuse else tco * tci * taps * c.wgt_elem_bytes
        dmas = blocks if layer.diagonal else blocks // grp
        data = blocks * (window - pads)
        # The LOAD's writer takes a bus word (or an element narrower) a cycle, and writes
        # a zero for each padded element meanwhile: the padding costs only where the
        # writer, not the DRAM, is the limit (a 128-bit bus at 12 bytes a cycle keeps
        # ahead of the DRAM: MobileNet-v1's features.11.dw on 1x16x32, 58 padded elements
        # a tile, loads its inputs in 565 cycles on Verilator, 563 without them).
        inp = max(data * c.inp_elem_bytes / bw,
                  data * max(1, c.inp_elem_bytes / (c.dram_bus_width // 8))
                  + blocks * pads * PAD_ELEM_CYCLES)
        # A streamed layer's weights (a qmatmul's b) take a LOAD per output block.
        wgt_dmas = (wgt > 0) * (tco if layer.streamed else 1)
        ld = (inp + wgt / bw + (dmas + wgt_dmas) * dma_cycles(bw, lat)
              + dmas * dma_row_cycles(rows, row_cycles, lat))
        g = (dw_window.tile_gemm_cycles(layer, *tile, tco, c) if layer.window
             else plane * tco * tci * taps + INSN_CYCLES)
        tile_load += nci * ld
        tile_gemm += nci * g
        chunk_pairs += nci * max(ld, g)
        seq += [(ld, g)] * nci
    return tile_load, tile_gemm, chunk_pairs, seq


def _residual_cost(layer: Conv2dLayer, plane: int, tco: int, c: HardwareConfig, bw: float,
                   passes: tuple[int, int], lat: int | None = None
                   ) -> tuple[float, float, float]:
    """(load-module cycles, compute cycles, those of them before the tile's first GEMMs)
    of one tile's residual (`plane` positions x
    `tco` output blocks; `passes` its requantization's (immediate, vector) ALU passes).
    The int8 residual tile comes with the first chunk's loads, one DMA per output block
    (its ratio input blocks side by side); the compute module resets its acc tile, widens
    it (one identity GEMM micro-op per input block), requantizes it and ADDs it (a vector
    operand: two cycles), or, late, widens it onto the requantized tile. Where block_out
    is no multiple of block_in, a LOAD ACC of int32 entries on the compute module."""
    imm, vec = passes
    entries = plane * tco
    dma = dma_cycles(bw, lat)
    if layer.residual_ratio:
        widen, og = layer.residual_ratio, layer.out_group
        load = entries * widen * c.inp_elem_bytes / bw + tco * dma
        if og > 1:   # one input block per og output blocks, one selection each
            widen = 1
            load = ceil_div(tco, og) * (plane * c.inp_elem_bytes / bw + dma)
        if layer.late_residual:
            return load, entries * widen + INSN_CYCLES, 0.0
        # Its reset and widening (first), its immediate passes, its vector passes (held on
        # an alu_hold config), then the ADD onto the conv tile (src moves: never held).
        return load, (entries * (1 + widen + imm + 2) + vec * vector_pass_cycles(entries, tco, c)
                      + (2 + imm + vec) * INSN_CYCLES), entries * (1 + widen) + INSN_CYCLES
    if layer.has_residual:
        return 0.0, (entries * (c.acc_elem_bytes / bw + imm + 2)
                     + vec * vector_pass_cycles(entries, tco, c) + tco * dma), 0.0
    return 0.0, 0.0, 0.0


def _table_cycles(layer: Conv2dLayer, s, c: HardwareConfig, bw: float,
                  lat: int | None = None) -> tuple[float, float]:
    """The tables a program loads first, as (load-module cycles: the identity and bias
    blocks and the ones vector; compute-module cycles: the micro-ops and the constant
    rows, a LOAD UOP and a LOAD ACC).

    Both modules load at once over one read channel, so the load module's tables end no
    sooner than the channel has carried all of them (`_shared_tables`)."""
    load_bytes = ((layer.residual_ratio + layer.bias_gemm * layer.out_blocks)
                  * c.wgt_elem_bytes + layer.bias_gemm * c.inp_elem_bytes)
    dma = dma_cycles(bw, lat)
    load = load_bytes / bw + (2 * layer.bias_gemm + (layer.residual_ratio > 0)) * dma
    uops = conv_uop_count(layer, s)
    const_bytes = layer.const_rows * layer.out_blocks * c.acc_elem_bytes
    compute = (uops * c.uop_bytes + const_bytes) / bw + (1 + (layer.const_rows > 0)) * dma
    if load_bytes:
        load = max(load, _shared_tables(uops, load_bytes + const_bytes, c, bw, lat))
    return load, compute


def _shared_tables(uops: int, other_bytes: int, c: HardwareConfig, bw: float,
                   lat: int | None = None) -> float:
    """Cycles for the one read channel to carry the micro-op table and `other_bytes` of
    other tables, both modules loading at once: a DMA latency on each module, the other
    bytes at the DRAM's rate, and the micro-ops no faster than the DMA writer takes them,
    one a cycle (narrower than a bus word, they are picked out of each beat one by one,
    and the channel's beats wait for them).

    Measured on MobileNet-v1 `features.12.dw` on 1x16x32-req-dw3 at 8 bytes a cycle
    (110 micro-ops, 4,096 bytes of constant rows on the compute module; the 16,400-byte
    bias row and ones vector on the load module): the load module's tables end at cycle
    3,040; this bound gives 2,752, the two modules apart 2,130."""
    return uops * max(1.0, c.uop_bytes / bw) + other_bytes / bw + 2 * dma_cycles(bw, lat)
