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
a buffer's size (the fit is `Conv2dSchedule`'s). `timing_key` is that part of a config:
two configs with the same key give every (layer, schedule) the same estimate, which is
what lets the chooser rank a layer's schedules once for the points of a sweep that
differ only in their buffers (tests/compiler/targets/vdla/test_timing_key.py checks the
model reads nothing else).

Why this module is long: the terms of one estimate (tile costs, the one-thread
overlaps, the two-thread pairs and their simulation, weight switches, tables) are read
together with `estimate_conv2d`, which sums them; each states the Verilator
measurement it was fitted to, and split apart the terms would each need the others'
definitions of a tile class and a chunk pair.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

from vdla.compiler.targets.vdla import dw_window
from vdla.compiler.targets.vdla.common import (DMA_CYCLES, INSN_CYCLES, PAD_ELEM_CYCLES,
                                               ceil_div, dma_row_cycles, store_cycles,
                                               tile_split, vector_pass_cycles, window_cols,
                                               window_rows)
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule, conv_uop_count
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
    (layer, schedule, passes, bandwidth) the same estimate, so the default chooser ranks
    a layer's tilings once for all of them (`conv_layer.choose_conv2d`); a sweep's
    points that differ only in their buffers share it. Remembered per config (a sweep
    asks once per layer of every point)."""
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


@dataclasses.dataclass(frozen=True)
class _TileClass:
    """What `estimate_conv2d` keeps of a class of tiles (same rows, columns and channel
    tiling) for the terms between consecutive tiles, in cycles: its first chunk's loads
    (`first_load`); what of it the next tile's first loads may overlap with one thread
    (`overlap`: its epilogue but the bias GEMM, and its stores); its GEMMs with the
    epilogue (`compute`); its stores (`store`); with two threads, what of its epilogue
    runs after its GEMMs have freed its inp buffer (`released`), and its reset (`reset`:
    0 where a REQ clears the tile)."""

    first_load: float
    overlap: float
    compute: float
    store: float
    released: float
    reset: float


def _channel_tilings(layer: Conv2dLayer, s: Conv2dSchedule) -> tuple[list, int, bool]:
    """How clamped schedule `s` cuts `layer`'s channels, as `estimate_conv2d` counts
    them: (tilings, output-channel tiles, weight reuse). `tilings` lists the
    output-channel tiles (tco, count) and their input-channel chunks (blocks per output
    block, count), per span of a grouped layer (one span otherwise)."""
    tilings = []
    for _, on, _, cn in layer.spans:
        chunks = [(1, 1)] if layer.paired else tile_split(cn, min(s.tile_ci, cn))
        tilings += [(tco, nco, chunks) for tco, nco in tile_split(on, s.tile_co)]
    n_chunks = max(sum(n for _, n in chunks) for _, _, chunks in tilings)
    co_tiles = sum(nco for _, nco, _ in tilings)
    # Weights are loaded again for every tile, except with a single input-channel chunk
    # when a thread's next tile uses the same output-channel blocks (see the emitter's
    # `load_chunk` in `vdla.compiler.targets.vdla.conv`).
    if n_chunks > 1:
        weight_reuse = False
    elif s.oc_nthread > 1:
        weight_reuse = co_tiles <= 2
    else:
        weight_reuse = True
    return tilings, co_tiles, weight_reuse


def estimate_conv2d(layer: Conv2dLayer, schedule: Conv2dSchedule, config: HardwareConfig, *,
                    alu_passes: tuple[int, int] | None = None,
                    residual_passes: tuple[int, int] | None = None,
                    bytes_per_cycle: float | None = None) -> Conv2dEstimate:
    """Predict the cycles of `layer` lowered with `schedule` on `config`.

    `alu_passes` = (passes with an immediate, passes with a vector operand) of the
    epilogue over the conv tile; the default is what a requantized, clamped conv with a
    bias needs (SHR, MAX, MIN, or with the ALU's REQ one REQ; the bias ADD unless the
    bias GEMM adds it). The residual's
    passes are counted from `layer.has_residual` (int8 loads widened on the GEMM core, or
    a LOAD ACC; then `residual_passes`, the residual's requantization as (immediate,
    vector) passes, default a shift; then an ADD). `bytes_per_cycle`: the DRAM's each
    way, default the config's `dram_bytes_per_cycle`."""
    s = schedule.clamped(layer)
    c = config
    bw = float(bytes_per_cycle or config.dram_bytes_per_cycle)
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
    first_load = last_store = first_compute = 0
    head_load = head_gemm = None   # the first chunk's loads and GEMMs
    last_paired = last = None      # the last tile's time, `_pair_run`'s arguments
    sides = {}               # (rows, columns, `tilings` index) -> `_TileClass`
    tiles, lone = 0, 0.0     # tiles in all; what the last one adds running alone
    load_waits = 0.0         # two threads: the load module's waits for their buffers
    for th, nh in tile_split(layer.out_h, s.tile_h):
        rows = window_rows(layer, th)
        for tw, nw in tile_split(layer.out_w, s.tile_w):
            cols = window_cols(layer, tw)
            pads = _window_pads(layer, s, th, tw)
            plane = th * tw
            seqs = []
            for k, (tco, nco, chunks) in enumerate(tilings):
                m = nh * nw * nco * layer.batch_blocks
                tile_load, tile_gemm, chunk_pairs, seq, res_epi, res_head = _tile_costs(
                    layer, chunks, tco, (rows, cols, pads), (th, tw), weight_reuse, c, bw,
                    res_passes)
                entries = plane * tco
                epi = _epilogue_cycles(layer, entries, tco, c, (imm, vec), reset) + res_epi
                st = store_cycles(entries, tco * (1 if tw == layer.out_w or layer.out_group == 1
                                                  else th), c, bw, layer.out_group)
                tile_chunks = sum(n for _, n in chunks)
                # GEMM instructions: one a chunk, or a window layer's one per kernel row.
                insns = tile_chunks * (layer.kernel_h if layer.window else 1)
                gemm += m * (tile_gemm - insns * INSN_CYCLES)
                epilogue += m * (epi + insns * INSN_CYCLES)
                load += m * tile_load
                store += m * st
                # For `_serial_overlaps`, `_store_waits` and `_weight_switches`.
                run = _pair_args(layer, seq, (epi, res_head, st), entries, reset, c)
                sides[th, tw, k] = _TileClass(
                    tile_load / tile_chunks, epi + st - _head_cycles(layer, entries, reset=0),
                    tile_gemm + epi, st, run[1] - run[4], reset * (entries + INSN_CYCLES))
                tile_paired = _tile_paired(layer, chunk_pairs, (seq[0][0], seq[0][1] - res_head),
                                           tile_gemm, epi)
                serial += m * (tile_load + tile_gemm + epi + st)
                paired += m * tile_paired
                if threads == 2:
                    more, waits = _pair_terms(m, run, tile_paired, first_class=not tiles)
                    paired += more
                    load_waits += waits * (s.oc_nthread == 2)   # `_pair_terms`
                tiles += m
                seqs.append(seq)
                if len(seqs) == 2 and s.oc_nthread == 2 and len(layer.spans) == 1:
                    paired += nh * nw * layer.batch_blocks * _mixed_pair(*seqs, co_tiles)
                # The last tile in program order is an edge tile of every axis.
                lone = (tile_load + tile_gemm + epi + st - tile_paired
                        - min(sides[th, tw, k].first_load, sides[th, tw, k].overlap))
                last_paired = tile_paired
                last = run
                first_load = max(first_load, tile_load / tile_chunks)
                head_load = seq[0][0] if head_load is None else head_load
                head_gemm = seq[0][1] - res_head if head_gemm is None else head_gemm
                first_compute = max(first_compute, tile_gemm + epi)
                last_store = max(last_store, st)
    # Each thread loads the weights of its output-channel blocks once per batch block;
    # threads over rows each load every block's (into their own region).
    once = weight_reuse * s.h_nthread * (layer.batch_blocks * layer.weight_blocks
                                         * layer.wgt_taps * c.wgt_elem_bytes / bw
                                         + co_tiles * DMA_CYCLES)
    load += once
    serial += once
    table_load, table_compute = _table_cycles(layer, s, c, bw)
    load += table_load
    # Without a reset per tile, each thread resets its whole region once, first.
    region_resets = 0 if reset else threads * (s.tile_h * s.tile_w * s.tile_co + INSN_CYCLES)
    # The tables load on both modules at once (`_table_cycles`); then the compute module
    # resets its regions, and the load module loads the first inputs.
    if threads == 1:
        cycles = (serial - _serial_overlaps(layer, s, tilings, sides)
                  + max(table_load, table_compute + region_resets - first_load))
    else:
        # The busiest module bounds the time; chunk pairs add the waits of a thread whose
        # loads take longer than the other's GEMM; weight switches stall the compute
        # module only (`_weight_switches`); a load-bound layer ends with its drain.
        switches = (_weight_switches(layer, s, tilings, once, c, bw, first_load,
                                     first_compute, (head_load, last_paired, sides))
                    if weight_reuse else 0.0) + _store_waits(layer, s, tilings, sides)
        cycles = _two_thread_cycles(
            paired + switches, load, store,
            (table_load, first_load, head_load, head_gemm, table_compute + region_resets),
            (last_store, lone if tiles % 2 else 0.0, load_waits, _pair_run(*last)[1]))
    return Conv2dEstimate(int(math.ceil(cycles)), int(gemm), int(epilogue + region_resets),
                          int(load), int(store))


def _two_thread_cycles(compute: float, load: float, store: float, head: tuple,
                       tail: tuple) -> float:
    """Two threads: the longer of the compute module's chain (its pairs and weight
    switches, `compute`) and the load module's (`load`, the tables' included), from the
    head: (table loads, the first loads before any GEMM, the first chunk's loads and
    GEMMs, the compute module's table loads and resets) and the tail: (the last store,
    what an odd tile count's lone last tile adds, the load module's waits, the drain
    after the last load, `_pair_run`'s).

    The first chunk's loads are in the head, so neither chain counts them again: not
    the pairs (where they outlast its GEMMs, their pair's share is those loads) nor the
    loads after the head. Counted twice, load-bound layers with two threads over output
    channels came out up to 36% high (ResNet-18's C6/r on a 1x32x32 core, tile_ci=1:
    11,694 cycles on Verilator, 13,824 when counted twice, 11,657 now); over the
    recorded Verilator sets of `bench/datasets` the mean error fell from 1.2-3.0% to
    0.7-1.3% (`bench/timing_records.py`)."""
    table_load, first_load, head_load, head_gemm, compute_head = head
    last_store, lone, load_waits, drain = tail
    excess = max(0.0, head_load - head_gemm)
    cycles = (max(compute - excess, load - table_load - head_load, store) + last_store
              + max(table_load + first_load, compute_head))
    # An odd tile count leaves the last group one thread: its loads and GEMMs take turns.
    # A load-bound layer's drain below already holds its tail.
    cycles += max(0.0, lone)
    # The loads, their waits for the compute module and, from the last load's end to the
    # last store's, the drain of the last tiles.
    return max(cycles, load + load_waits + drain)


def _serial_overlaps(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """One thread: what the tiles' first loads overlap in all. Each tile's overlap its
    predecessor's epilogue and stores, but for its bias GEMM, which waits for them, in
    program order (batch blocks, output-channel tiles, rows, columns: `_ConvEmitter.groups`
    in `vdla.compiler.targets.vdla.conv`); the first tile's overlap nothing. `sides` maps
    a tile class (rows, columns, index in `tilings`) to its `_TileClass`. The stem of
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
                         for (a, b), n in _steps(cols).items())
        total += sum(overlaps((a, cols[-1][0], k), (b, cols[0][0], k), n * nco * nb)
                     for (a, b), n in _steps(rows).items())
    first, last = (rows[0][0], cols[0][0]), (rows[-1][0], cols[-1][0])
    total += sum(overlaps((*last, a), (*first, b), n * nb) for (a, b), n in _steps(cos).items())
    return total + overlaps((*last, cos[-1][0]), (*first, cos[0][0]), nb - 1)


def _store_waits(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """Two threads over rows: the compute module's waits where a tile is followed by one
    of another class. A tile's first GEMM waits for the stores of its thread's previous
    tile, two tiles back, which run during the tile between; each class's own pairs
    count that wait (`_pair_run`), but a short last row tile between two whole ones hides
    less of the whole tile's stores. `sides` maps a tile class to its `_TileClass`; the
    order is `_ConvEmitter.groups`' (batch blocks, output channels, columns, rows).
    MobileNet-v1's features.1.pw on 1x16x32-req-hold-dw3, tiles of five rows and a last
    one of one: the compute module waits 850 cycles after each last row tile but the
    layer's last on Verilator, 848 here (83,540 cycles; 80,562 without it)."""
    if s.h_nthread != 2:
        return 0.0
    levels = [[(k, nco) for k, (_, nco, _) in enumerate(tilings)],
              tile_split(layer.out_w, s.tile_w), tile_split(layer.out_h, s.tile_h)]
    nb = layer.batch_blocks

    def wait(a, b, n=1):      # classes as (rows, columns, output-channel tiling)
        prev, cur = sides[a[::-1]], sides[b[::-1]]
        st_a, comp_b, st_b = prev.store, cur.compute, cur.store
        return n * max(0.0, st_a - comp_b - max(0.0, st_b - comp_b))

    (ks, cols, rows), last = levels, tuple(level[-1][0] for level in levels)
    total = sum(wait((k, tw, a), (k, tw, b), n * nco * nw * nb)
                for k, nco in ks for tw, nw in cols for (a, b), n in _steps(rows).items())
    total += sum(wait((k, a, rows[-1][0]), (k, b, rows[0][0]), n * nco * nb)
                 for k, nco in ks for (a, b), n in _steps(cols).items())
    total += sum(wait((a, cols[-1][0], rows[-1][0]), (b, cols[0][0], rows[0][0]), n * nb)
                 for (a, b), n in _steps(ks).items())
    total += wait(last, (ks[0][0], cols[0][0], rows[0][0]), nb - 1)
    # The layer's last tile has no tile after it to wait: its predecessor's class.
    for i in (2, 1, 0):
        if levels[i][-1][1] > 1:
            break
        if len(levels[i]) > 1:
            return total - wait((*last[:i], levels[i][-2][0], *last[i + 1:]), last)
    return total


def _steps(classes: list[tuple]) -> dict[tuple, int]:
    """The steps between consecutive items of the sequence of `classes` (class, count),
    each class repeated count times: {(previous, next): steps}."""
    steps: dict[tuple, int] = {}
    for i, (k, n) in enumerate(classes):
        pairs = [((k, k), n - 1)] + ([((classes[i - 1][0], k), 1)] if i else [])
        for key, count in pairs:
            steps[key] = steps.get(key, 0) + count
    return steps


def _tile_paired(layer: Conv2dLayer, chunk_pairs: float, first: tuple[float, float],
                 tile_gemm: float, epi: float) -> float:
    """A tile's time with two threads, to first order: its chunks' longer of loads and
    GEMMs, and its epilogue. `first`: its first chunk's (loads, GEMMs)."""
    if layer.inp_group == 1:
        # A tile's first loads also run during the other thread's epilogue, which hides
        # what they take beyond its first GEMM.
        return chunk_pairs + epi - min(epi, max(0.0, first[0] - first[1]))
    # Loading whole activation blocks (block_out > block_in) makes a narrow layer
    # load-bound (a stem: 3 channels in a 32-channel block), and a load-bound pair hides
    # the epilogue behind the other thread's loads (1x8x32's MobileNet stem: 247,498
    # cycles against Verilator's 248,246, not 329,274).
    return max(chunk_pairs, tile_gemm + epi)


def _mixed_pair(whole: list[tuple[float, float]], short: list[tuple[float, float]],
                co_tiles: int) -> float:
    """Two threads over output channels whose channels end in a short output-channel
    tile, an even count of them: each position's last group pairs a whole tile with the
    short one. What that pair takes beyond each tile's own chunks (`_tile_paired`), from
    the chunks' (loads, GEMMs): a thread's next chunk loads only after its GEMMs, so a
    chunk pair takes at least one thread's loads and GEMMs in turn, which the short
    tile's chunks cannot hide (ResNet-18's layer4.1.conv2 on VTA's default sizes, tiles of
    6 and 2 output blocks: the compute module waits 1,031 cycles a chunk on Verilator,
    1,080 here; 501,544 cycles against 468,440 without it). An odd count leaves the short
    tile alone in its group (`estimate_conv2d`'s lone tile)."""
    if co_tiles % 2:
        return 0.0
    return sum(max(g0 + g1, l0 + l1, l0 + g0, l1 + g1) - max(l0, g0) - max(l1, g1)
               for (l0, g0), (l1, g1) in zip(whole, short))


def _pair_terms(m: int, run: tuple, tile_paired: float, first_class: bool):
    """What `m` tiles of one class add, with two threads, to the compute module's time
    beyond `tile_paired` each (the steady pairs after the first two tiles, where there
    are two pairs or more; less than nothing where `_tile_paired` overstates a pair, as
    it does a load-bound one: MobileNet-v1's features.11.pw on 1x32x16, two pairs, 101,938
    cycles on Verilator, 105,763 without the term, 103,797 with it), and the load
    module's waits (`_pair_run`'s, the first pair of the layer's from free buffers).
    `run`: `_pair_run`'s arguments. The waits are measured over output channels
    (`oc_nthread`); over rows (weights kept, a residual in the first chunk) they
    overstate, and `estimate_conv2d` leaves them out: ResNet-50's layer3.1.conv3 on
    1x32x16 takes 244,530 cycles on Verilator, 252,469 with them."""
    waits = _pair_run(*run)[2]
    load_waits = m / 2 * waits[1] - (waits[1] - waits[0]) * first_class
    more = 0.0
    if m >= 4:
        more = (m - 2) * (_pair_period(*run[:3], run[4]) / 2 - tile_paired)
    return more, load_waits


def _pair_period(chunks: list[tuple[float, float]], epilogue: float, store: float,
                 held: float = 0.0) -> float:
    """The steady-state cycles of a pair of tiles of two threads (`_pair_run`)."""
    ends = _pair_run(chunks, epilogue, store, 4, held)[0]
    return ends[-1] - ends[-2]


def _pair_run(chunks: list[tuple[float, float]], epilogue: float, store: float,
              pairs: int = 4, held: float = 0.0) -> tuple[tuple[float, ...], float,
                                                         tuple[float, ...]]:
    """`_simulate_pairs`, remembered: a space's schedules share few distinct chunk
    patterns, and ranking a whole space (the pretrained tuner, the learned chooser) asks
    for the same ones hundreds of thousands of times."""
    return _simulate_pairs(tuple(chunks), epilogue, store, pairs, held)


@functools.lru_cache(maxsize=1 << 16)
def _simulate_pairs(chunks: tuple[tuple[float, float], ...], epilogue: float, store: float,
                    pairs: int, held: float) -> tuple[tuple[float, ...], float,
                                                      tuple[float, ...]]:
    """The steady-state cycles of a pair of tiles (one per thread) of two threads that
    take turns chunk by chunk, from their dependencies, module by module in program
    order: a chunk's loads wait for the thread's previous chunk's GEMMs (its buffer) and
    for the loads before them; a chunk's GEMMs for its loads and the compute module; a
    tile's first GEMM for the thread's previous stores (the GEMMs write the out buffer
    the stores read); a tile's stores for its epilogue and the stores before them.
    `chunks` are each chunk's (loads, GEMMs) in program order, so chunks that differ
    keep their own waits; `epilogue` and `store` are per tile. The residual's reset and
    widening run before a tile's first GEMMs (in its first chunk's GEMMs here, not in
    its `epilogue`); a late residual is widened in the epilogue from the thread's inp
    buffer, which the epilogue then holds for its first `held` cycles, all but the
    clamp (ResNet-50's layer3.1.conv3 on pynq-z1-plus: the next tile's first loads wait
    946 cycles, the shift and the widening GEMM; on a 1x16x32 core without REQ, two
    threads over rows of seven: 21,314 cycles a pair on Verilator, 23,488 when the
    clamp held the buffer too, 21,693 now).

    When the stores take longer than the compute between a thread's epilogue and its
    next tile (the other thread's last chunk and epilogue), the compute module waits:
    pointwise layers of a 1x16x32 core whose tiles load as long as they compute
    (MobileNet-v1's features.2.pw: 9,611 cycles a pair on Verilator, 9,591 here).
    Simulated over a few pairs: every pair after the first repeats the same waits.
    `estimate_conv2d` adds what this differs from `_tile_paired` by to the pairs after
    the first of a tile class with two pairs or more (`_pair_terms`).

    Returns each pair's end on the compute module, the *drain* and each pair's *load
    waits*. The load waits are the time the load module waits for a thread's buffer (a
    chunk's loads for its own thread's previous GEMMs): a layer bound by its loads still
    waits there where its chunks differ, a short last chunk loading before the other
    thread's long one has computed (MobileNet-v1's features.11.pw on pynq-z1-plus,
    chunks of 6 input blocks and a last one of 2: 1,837 cycles a pair on Verilator,
    1,468 here; 64,074 cycles against 60,474 without them, 63,410 with them). The drain
    is from the last load's end to the last store's: a load-bound layer ends that long
    after its loads, for the compute module still has the last pair's GEMMs and
    epilogues in program order, then the stores come (on a 1x16x32 core at 12 bytes a
    cycle, ResNet-18's layer4.0.downsample with its residual fused ends 3,849 cycles
    after its last chunk's GEMM starts, both threads' epilogues, 1,213 cycles each,
    after it; the model's tail had been the first load and the last store, 1,468:
    33,044 cycles against Verilator's 35,501, now 35,840)."""
    compute = loads = stores = 0.0
    stored = [0.0, 0.0]       # each thread's last store's end
    computed = [0.0, 0.0]     # each thread's last chunk's end (its buffers free)
    ends, waits = [], []
    for _ in range(pairs):
        waits.append(0.0)
        for j, (load, gemm) in enumerate(chunks):
            for t in (0, 1):
                waits[-1] += max(0.0, computed[t] - loads)
                loads = max(loads, computed[t]) + load
                start = max(compute, loads, stored[t] if j == 0 else 0.0)
                compute = computed[t] = start + gemm
                if j == len(chunks) - 1:
                    computed[t] += held
                    compute += epilogue
                    stores = stored[t] = max(stores, compute) + store
        ends.append(compute)
    return tuple(ends), stores - loads, tuple(waits)


def _weight_switches(layer: Conv2dLayer, s: Conv2dSchedule, tilings, once: float,
                     c: HardwareConfig, bw: float, first_load: float,
                     tile_compute: float, edges: tuple[float, float, float]) -> float:
    """Two threads that load each weight block once: what their weight loads add to the
    busiest module's time. `once` is every weight load; `first_load` and `tile_compute`
    a tile's first loads and its compute (the most of each over the layer's tiles);
    `edges` the first tile's first loads, the last tile's time with two threads
    (`_tile_paired`) and `estimate_conv2d`'s tile classes (`sides`).
    Weight switches stall the compute module (a thread waits for its new weights): they
    add to its time, not to the load module's, which already counts every weight load
    (`once`). So a load-bound layer pays none (MobileNet-v1's features.3.dw on the 1x16x32
    window: 60,545 cycles on Verilator, 62,785 with the switches added on top of the
    loads)."""
    first_gap = first_load - tile_compute
    if s.h_nthread > 1:
        # Threads over rows switch output-channel tiles together, each loading its own
        # copy of the tile's weights. The first copy and the first thread's first inputs
        # load while the other thread computes the last tile of the previous
        # output-channel tile, a bottom edge tile that may be short (at the start, while
        # the compute module waits); the second copy and its first inputs while the first
        # thread's first tile computes. MobileNet-v1's features.3.dw on pynq-z1-plus
        # (three rows a tile, the last tile one row): the compute module waits 694
        # cycles at each switch on Verilator, 1,221 of loads against 529 of compute.
        # Elsewhere the first thread's loads start when its inp buffer frees, after its
        # previous tile's GEMMs: a whole row tile's, two tiles back. So the rest of that
        # tile's epilogue (`released`: all of it but for a late residual's widening)
        # hides them too, and so does the new tile's reset, which needs no loads.
        # ResNet-50's layer3.1.conv3 on a 1x16x32 core at 8 bytes a cycle (rows of
        # three, the residual late): 3,300 cycles of waits at a switch on Verilator;
        # 207,877 cycles in all, 183,498 with the weights alone against a whole tile.
        # MobileNet-v1's features.5.dw on 1x32x16 (rows of five, the last tile of four):
        # 215 cycles at a switch on Verilator, 451 with the short tile's epilogue
        # released and no reset. Window layers keep their measured rule.
        head_load, last_paired, sides = edges
        taps = layer.wgt_taps
        total, started = 0.0, False
        whole, cols = s.tile_h, tile_split(layer.out_w, s.tile_w)[-1][0]
        for k, (tco, nco, chunks) in enumerate(tilings):
            w = tco * chunks[0][0] * taps * c.wgt_elem_bytes / bw + DMA_CYCLES
            released, own_reset = (sides[whole, cols, k].released,
                                   sides[whole, cols, k].reset)
            for _ in range(nco * layer.batch_blocks):
                first = (max(0.0, w + head_load - last_paired) if layer.window
                         else max(0.0, w + head_load - last_paired - released - own_reset))
                total += (first if started else w) + max(0.0, w + first_gap)
                started = True
        return total
    # Threads over output channels start at the same time: the first thread's weights
    # load while the compute module waits, and the second thread's weights and first
    # loads after them, while only the first thread's first tile computes.
    return once / 2 + max(0.0, once / 2 + first_gap)


def _pair_args(layer: Conv2dLayer, seq: list, tile: tuple[float, float, float],
               entries: int, reset: int, c: HardwareConfig) -> tuple:
    """`_pair_run`'s arguments for a tile of `entries` acc entries, chunks `seq`, and
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
                res_passes: tuple[int, int]):
    """One tile's chunks with its residual (`_chunk_costs`, `_residual_cost`): (load
    cycles, GEMM cycles, the sum over chunks of the longer of the two, each chunk's (load,
    GEMM), the residual's compute cycles, those of them before the first GEMMs).
    `window`: the input rows and columns, and the positions in the padding."""
    tile_load, tile_gemm, chunk_pairs, seq = _chunk_costs(
        layer, chunks, tco, window[:2], tile, weight_reuse, c, bw, window[2])
    first = seq[0]
    res, res_epi, res_head = _residual_cost(layer, tile[0] * tile[1], tco, c, bw, res_passes)
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
                 weight_reuse: bool, c: HardwareConfig, bw: float, pads: float = 0.0):
    """One tile's input-channel chunks: (load cycles, GEMM cycles, the sum over chunks of
    the longer of the two, and each chunk's (load, GEMM) in order). A chunk loads whole
    activation blocks of its `window` (rows, columns) of input positions, `pads` of them
    in the padding (a
    diagonal tile one input block per output block) and, unless they are reused, its
    weights: one 2-D DMA per activation block and one of weights, each paying the DRAM
    latency (measured: bytes / 8 + 36 cycles a DMA, whatever its rows). `tile`: the
    tile's (rows, columns); a window layer's GEMMs are `dw_window.tile_gemm_cycles`."""
    taps = layer.wgt_taps
    grp = layer.inp_group
    plane = tile[0] * tile[1]
    rows, window = window[0], window[0] * window[1]
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
        ld = (inp + wgt / bw + (dmas + (wgt > 0)) * DMA_CYCLES
              + dmas * dma_row_cycles(rows, row_cycles))
        g = (dw_window.tile_gemm_cycles(layer, *tile, tco, c) if layer.window
             else plane * tco * tci * taps + INSN_CYCLES)
        tile_load += nci * ld
        tile_gemm += nci * g
        chunk_pairs += nci * max(ld, g)
        seq += [(ld, g)] * nci
    return tile_load, tile_gemm, chunk_pairs, seq


def _residual_cost(layer: Conv2dLayer, plane: int, tco: int, c: HardwareConfig, bw: float,
                   passes: tuple[int, int]) -> tuple[float, float, float]:
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
    if layer.residual_ratio:
        widen, og = layer.residual_ratio, layer.out_group
        load = entries * widen * c.inp_elem_bytes / bw + tco * DMA_CYCLES
        if og > 1:   # one input block per og output blocks, one selection each
            widen = 1
            load = ceil_div(tco, og) * (plane * c.inp_elem_bytes / bw + DMA_CYCLES)
        if layer.late_residual:
            return load, entries * widen + INSN_CYCLES, 0.0
        # Its reset and widening (first), its immediate passes, its vector passes (held on
        # an alu_hold config), then the ADD onto the conv tile (src moves: never held).
        return load, (entries * (1 + widen + imm + 2) + vec * vector_pass_cycles(entries, tco, c)
                      + (2 + imm + vec) * INSN_CYCLES), entries * (1 + widen) + INSN_CYCLES
    if layer.has_residual:
        return 0.0, (entries * (c.acc_elem_bytes / bw + imm + 2)
                     + vec * vector_pass_cycles(entries, tco, c) + tco * DMA_CYCLES), 0.0
    return 0.0, 0.0, 0.0


def _table_cycles(layer: Conv2dLayer, s, c: HardwareConfig, bw: float) -> tuple[float, float]:
    """The tables a program loads first, as (load-module cycles: the identity and bias
    blocks and the ones vector; compute-module cycles: the micro-ops and the constant
    rows, a LOAD UOP and a LOAD ACC).

    Both modules load at once over one read channel, so the load module's tables end no
    sooner than the channel has carried all of them (`_shared_tables`)."""
    load_bytes = ((layer.residual_ratio + layer.bias_gemm * layer.out_blocks)
                  * c.wgt_elem_bytes + layer.bias_gemm * c.inp_elem_bytes)
    load = load_bytes / bw + (2 * layer.bias_gemm + (layer.residual_ratio > 0)) * DMA_CYCLES
    uops = conv_uop_count(layer, s)
    const_bytes = layer.const_rows * layer.out_blocks * c.acc_elem_bytes
    compute = (uops * c.uop_bytes + const_bytes) / bw + (1 + (layer.const_rows > 0)) * DMA_CYCLES
    if load_bytes:
        load = max(load, _shared_tables(uops, load_bytes + const_bytes, c, bw))
    return load, compute


def _shared_tables(uops: int, other_bytes: int, c: HardwareConfig, bw: float) -> float:
    """Cycles for the one read channel to carry the micro-op table and `other_bytes` of
    other tables, both modules loading at once: a DMA latency on each module, the other
    bytes at the DRAM's rate, and the micro-ops no faster than the DMA writer takes them,
    one a cycle (narrower than a bus word, they are picked out of each beat one by one,
    and the channel's beats wait for them).

    Measured on MobileNet-v1 `features.12.dw` on 1x16x32-req-dw3 at 8 bytes a cycle
    (110 micro-ops, 4,096 bytes of constant rows on the compute module; the 16,400-byte
    bias row and ones vector on the load module): the load module's tables end at cycle
    3,040; this bound gives 2,752, the two modules apart 2,130."""
    return uops * max(1.0, c.uop_bytes / bw) + other_bytes / bw + 2 * DMA_CYCLES
