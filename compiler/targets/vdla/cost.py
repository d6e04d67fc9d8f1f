"""An analytical timing model of a lowered conv2d, and the default schedule chooser.

`estimate_conv2d(layer, schedule, config)` predicts the cycles of the program that
`lower_conv2d` emits, from the work each module does and how the virtual threads let it
overlap. It is not cycle-accurate (the Verilator backend is); it ranks schedules, which is
what the default chooser (`choose_conv2d`) and the tuner's pre-screening need, and it
explains a layer's time (`Conv2dEstimate` splits it into GEMM, epilogue, load and store).

What it knows about the hardware (measured on the Verilator model of the default config,
`vdla.hw`; one figure per fact below):

* the compute module issues one GEMM, reset or ALU-with-immediate micro-op per cycle; an
  ALU micro-op with a vector operand reads the acc buffer twice and takes two cycles;
  every GEMM/ALU instruction adds about `INSN_CYCLES` of pipeline fill and drain;
* loads and stores move ``bytes_per_cycle`` bytes per cycle each way (reads and writes
  have their own AXI channels) after `DMA_CYCLES` of latency per instruction, overlapped
  when instructions follow each other;
* a LOAD ACC (the residual) runs on the compute module, so its DRAM time is compute time.

How the modules overlap (see `vdla.compiler.targets.vdla.conv` for the program): with one
virtual thread a chunk's loads and its GEMM alternate (the next loads overwrite what the
GEMM reads), and only the next tile's first loads overlap the epilogue and stores; with
two, one thread's loads run during the other's GEMM, so a chunk pair takes the longer of
the two, and epilogues and stores hide behind the other thread's work.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from vdla.compiler.targets.vdla.common import ITER_MAX, ceil_div
from vdla.compiler.targets.vdla.conv_layer import MAX, Conv2dLayer, Pool2dLayer
from vdla.compiler.targets.vdla.schedules import Conv2dSchedule, Pool2dSchedule
from vdla.config import HardwareConfig

__all__ = ["Conv2dEstimate", "choose_conv2d", "choose_pool2d", "depthwise_alu_cycles",
           "estimate_conv2d", "estimate_pool2d", "schedule_space"]

#: Pipeline fill and drain of one GEMM/ALU instruction (measured: 100 back-to-back
#: 10-micro-op instructions take 888 cycles more than 1000 micro-ops in one).
INSN_CYCLES = 9
#: Latency a DMA instruction adds when it cannot overlap the previous one (the DRAM
#: model's 32-cycle read latency plus the DMA engine's own turnaround).
DMA_CYCLES = 40
#: The DRAM model's bandwidth in each direction, bytes per cycle (DESIGN.md's default,
#: `vdla.sim.verilator.DramTiming.bytes_per_cycle`).
BYTES_PER_CYCLE = 8.0


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


def _split(total: int, tile: int) -> list[tuple[int, int]]:
    """[(size, count)]: `total` cut into tiles of `tile`, the last one maybe smaller."""
    full, edge = divmod(total, tile)
    return [(tile, full)] + ([(edge, 1)] if edge else [])


def estimate_conv2d(layer: Conv2dLayer, schedule: Conv2dSchedule, config: HardwareConfig, *,
                    alu_passes: tuple[int, int] | None = None,
                    bytes_per_cycle: float = BYTES_PER_CYCLE) -> Conv2dEstimate:
    """Predict the cycles of `layer` lowered with `schedule` on `config`.

    `alu_passes` = (passes with an immediate, passes with a vector operand) of the
    epilogue over the conv tile; the default is what a requantized, clamped conv with a
    bias needs (SHR, MAX, MIN; the bias ADD). The residual's passes are counted from
    `layer.has_residual` (int8 loads widened on the GEMM core, or a LOAD ACC; a shift, an
    ADD)."""
    s = schedule.clamped(layer)
    c = config
    bw = float(bytes_per_cycle)
    imm, vec = alu_passes if alu_passes is not None else (3, 1)
    taps = layer.kernel_h * layer.kernel_w
    threads = s.nthreads
    # Output-channel tiles (tco, count) and their input-channel chunks (blocks per output
    # block, count), per span of a grouped layer (one span otherwise).
    tilings = []
    for _, on, _, cn in layer.spans:
        chunks = [(1, 1)] if layer.diagonal else _split(cn, min(s.tile_ci, cn))
        tilings += [(tco, nco, chunks) for tco, nco in _split(on, s.tile_co)]
    n_chunks = max(sum(n for _, n in chunks) for _, _, chunks in tilings)
    co_tiles = sum(nco for _, nco, _ in tilings)
    # Weights are loaded again for every tile, except with a single input-channel chunk
    # when a thread's next tile uses the same output-channel blocks (see `_emit`).
    if n_chunks > 1:
        weight_reuse = False
    elif s.oc_nthread > 1:
        weight_reuse = co_tiles <= 2
    else:
        weight_reuse = True
    # Bytes of one buffer element (a whole batch x block vector or weight block).
    inp_entry, wgt_entry = c.inp_elem_bytes, c.wgt_elem_bytes
    acc_entry, out_entry = c.acc_elem_bytes, c.out_elem_bytes

    gemm = epilogue = load = store = 0
    serial = 0          # one thread: the time of the modules taking turns
    paired = 0          # two threads: per chunk, the longer of loads and GEMMs
    first_load = last_store = 0
    for th, nh in _split(layer.out_h, s.tile_h):
        rows = (th - 1) * layer.stride_h + layer.kernel_h
        for tw, nw in _split(layer.out_w, s.tile_w):
            cols = (tw - 1) * layer.stride_w + layer.kernel_w
            plane = th * tw
            for tco, nco, chunks in tilings:
                m = nh * nw * nco * layer.batch_blocks
                tile_load = tile_gemm = 0
                chunk_pairs = 0
                for tci, nci in chunks:
                    # A diagonal tile loads one input block per output block.
                    inp = (tco if layer.diagonal else tci) * rows * cols * inp_entry
                    wgt = 0 if weight_reuse else tco * tci * taps * wgt_entry
                    ld = (inp + wgt) / bw + DMA_CYCLES
                    g = plane * tco * tci * taps + INSN_CYCLES
                    tile_load += nci * ld
                    tile_gemm += nci * g
                    chunk_pairs += nci * max(ld, g)
                entries = plane * tco
                # The reset micro-op, then the ALU passes, per acc entry.
                epi = entries * (1 + imm + 2 * vec) + 5 * INSN_CYCLES
                ratio = layer.residual_ratio
                if ratio:
                    # The int8 residual tile comes with the first chunk's loads; the
                    # compute module resets its acc tile, widens it (one identity GEMM
                    # micro-op per input block), shifts it and ADDs it (a vector operand:
                    # two cycles).
                    res = entries * ratio * inp_entry / bw + tco * ratio * DMA_CYCLES / 4
                    tile_load += res
                    chunk_pairs += res
                    epi += entries * (1 + ratio + 1 + 2) + 2 * INSN_CYCLES
                elif layer.has_residual:
                    # LOAD ACC of int32 residual entries (on the compute module), its
                    # shift and the ADD (a vector operand: two cycles).
                    epi += entries * (acc_entry / bw + 1 + 2) + tco * DMA_CYCLES
                st = entries * out_entry / bw + tco * DMA_CYCLES / 4
                tile_chunks = sum(n for _, n in chunks)
                gemm += m * (tile_gemm - tile_chunks * INSN_CYCLES)
                epilogue += m * (epi + tile_chunks * INSN_CYCLES)
                load += m * tile_load
                store += m * st
                # The next tile's first loads overlap this tile's epilogue and stores
                # (not after the last tile: added back below).
                overlap = min(tile_load / tile_chunks, epi + st)
                serial += m * (tile_load + tile_gemm + epi + st - overlap)
                paired += m * (chunk_pairs + epi)
                first_load = max(first_load, tile_load / tile_chunks)
                last_store = max(last_store, st)
    once = 0.0
    if weight_reuse:
        # Each thread loads the weights of its output-channel blocks once per batch block.
        once = (layer.batch_blocks * layer.weight_blocks * taps * wgt_entry / bw
                + co_tiles * DMA_CYCLES)
        load += once
        serial += once
    if threads == 1:
        cycles = serial + overlap
    else:
        # The busiest module bounds the time; chunk pairs add the waits of a thread whose
        # loads take longer than the other's GEMM.
        cycles = max(paired, load, store) + first_load + last_store
        if weight_reuse:
            # Both threads switch output-channel blocks at the same time (or start), and
            # the first thread's new weights load while the compute module waits.
            cycles += once / 2
    return Conv2dEstimate(int(math.ceil(cycles)), int(gemm), int(epilogue), int(load),
                          int(store))


def depthwise_alu_cycles(layer: Conv2dLayer) -> int:
    """Compute-module cycles of a depthwise layer done the other way, on the vector ALU
    with MUL (the alternative to diagonal weight blocks on the GEMM core, which
    `estimate_conv2d` models): the input window widened into the acc buffer through the
    GEMM core (one micro-op per input entry), then per output entry and kernel tap a
    temporary set to the tap's input (reset, vector ADD: 1 + 2 cycles), multiplied by the
    tap's per-channel weights (vector MUL: 2) and added to the sum (vector ADD: 2), then
    the same epilogue (reset, bias ADD, SHR, MAX, MIN: 6). A lower bound: no loads,
    stores or instruction overheads. The diagonal GEMM takes one micro-op per entry and
    tap, so it wins whenever this exceeds `estimate_conv2d` (by about 4x on
    MobileNet-v1's 3x3 layers), and it needs no MUL; the back half lowers depthwise
    layers to it."""
    entries = layer.batch_blocks * layer.out_blocks * layer.out_h * layer.out_w
    inputs = layer.batch_blocks * layer.in_blocks * layer.h * layer.w
    return inputs + entries * (7 * layer.kernel_h * layer.kernel_w + 6)


def _candidates(total: int, limit: int | None = None) -> list[int]:
    """Distinct tile sizes ceil(total / k), largest first (each gives a different tile
    count); at most `limit` of them (the largest)."""
    sizes = sorted({ceil_div(total, k) for k in range(1, total + 1)}, reverse=True)
    return sizes[:limit] if limit else sizes


def schedule_space(layer: Conv2dLayer, config: HardwareConfig, *,
                   threads: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2)),
                   width_tiles: int | None = 4):
    """Every schedule of `layer` that fits `config`: tile sizes that give distinct tile
    counts, (oc_nthread, h_nthread) from `threads`; `width_tiles` limits the output-width
    tilings tried to the widest few (full rows make the longest DMA rows)."""
    for oc, hn in threads:
        for tw in _candidates(layer.out_w, width_tiles):
            for th in _candidates(layer.out_h):
                if th * tw > ITER_MAX:
                    continue
                for tci in _candidates(layer.span_in):
                    for tco in _candidates(layer.span_out):
                        s = Conv2dSchedule(th, tw, tci, tco, oc, hn)
                        if (oc == 2 and len(layer.co_tiles(tco)) < 2) or (
                                hn == 2 and th >= layer.out_h):
                            continue  # one tile along the threaded axis: nothing to overlap
                        if s.fits(layer, config):
                            yield s


@functools.lru_cache(maxsize=256)
def choose_conv2d(layer: Conv2dLayer, config: HardwareConfig, *,
                  nthreads: int | None = None) -> Conv2dSchedule:
    """The schedule of `layer` with the fewest estimated cycles (`estimate_conv2d`) among
    `schedule_space`; `nthreads` (1 or 2) restricts the virtual threads. The widest few
    output-width tilings are searched first (full rows make the longest DMA rows) and
    every width only when none of those fits, so a schedule is found whenever the
    smallest tiling fits. Raises ValueError when nothing fits (naming the buffers the
    smallest tiles overflow)."""
    options = {None: ((1, 1), (2, 1), (1, 2)), 1: ((1, 1),), 2: ((2, 1), (1, 2))}
    if nthreads not in options:
        raise ValueError(f"nthreads must be 1, 2 or None (either), not {nthreads!r}")
    threads = options[nthreads]
    best, best_cycles = None, None
    for width_tiles in (4, None):
        for s in schedule_space(layer, config, threads=threads, width_tiles=width_tiles):
            cycles = estimate_conv2d(layer, s, config).cycles
            # Ties go to fewer, larger tiles (fewer instructions).
            key = (cycles, -s.tile_h * s.tile_w * s.tile_ci * s.tile_co)
            if best is None or key < best_cycles:
                best, best_cycles = s, key
        if best is not None:
            break
    if best is None:
        Conv2dSchedule(1, 1, 1, 1).check(layer, config)  # raises, naming the buffers
        raise ValueError(f"conv2d layer {layer} has no schedule with {nthreads} virtual "
                         f"threads that fits config {config.name}")
    return best


# --- pooling -----------------------------------------------------------------------------------

def estimate_pool2d(layer: Pool2dLayer, schedule: Pool2dSchedule, config: HardwareConfig, *,
                    bytes_per_cycle: float = BYTES_PER_CYCLE) -> int:
    """Predicted cycles of `layer` (a `Pool2dLayer`) lowered with `schedule` (a
    `Pool2dSchedule`, see `vdla.compiler.targets.vdla.pool`). Tiles alternate between two
    input and two output regions, so while the compute module works on a tile the next
    tile's window loads and the previous tile's stores run: a tile costs the longest of
    its loads, its compute and its stores. (Within 1% of Verilator on ResNet-18's max
    pool; see `bench/pools.py`.)"""
    s = schedule.clamped(layer)
    c, bw = config, float(bytes_per_cycle)
    imm_steps, vec_steps = layer.imm_passes, layer.vec_passes
    cycles = first = 0.0
    for th, nh in _split(layer.out_h, s.tile_h):
        rows = (th - 1) * layer.stride_h + layer.kernel_h
        for tw, nw in _split(layer.out_w, s.tile_w):
            cols = (tw - 1) * layer.stride_w + layer.kernel_w
            for tc, nc in _split(layer.blocks, s.tile_c):
                m = nh * nw * nc * layer.batch_blocks
                entries = tc * th * tw
                window = tc * layer.ratio * rows * cols
                load = window * c.inp_elem_bytes / bw + DMA_CYCLES
                store = entries * c.out_elem_bytes / bw + tc * DMA_CYCLES / 4
                if layer.kind == MAX:
                    # reset and -128, widening (reset and copy), one MAX per tap
                    compute = (2 * entries + 2 * tc * rows * cols
                               + 2 * entries * layer.taps + (4 + layer.taps) * INSN_CYCLES)
                else:
                    compute = (entries * (1 + layer.taps * layer.ratio + imm_steps
                                          + 2 * vec_steps)
                               + (2 + imm_steps + vec_steps) * INSN_CYCLES)
                cycles += m * max(load, compute, store)
                first = max(first, load)
    return int(math.ceil(cycles + first))


@functools.lru_cache(maxsize=256)
def choose_pool2d(layer: Pool2dLayer, config: HardwareConfig) -> Pool2dSchedule:
    """The `Pool2dSchedule` of `layer` with the fewest estimated cycles among tilings that
    fit: the widest few output-width tilings, every channel tiling, and for each the
    tallest tile that fits. Raises ValueError when not even 1x1x1 tiles fit."""
    ranked = []
    for tw in _candidates(layer.out_w, 4):
        for tc in _candidates(layer.blocks):
            # The tallest tile whose buffers fit (micro-ops counted below, for the best).
            for th in _candidates(layer.out_h):
                s = Pool2dSchedule(th, tw, tc)
                if not any(need > depth for need, depth in
                           s.needs(layer, config, uops=False).values()):
                    ranked.append((estimate_pool2d(layer, s, config), -th * tw * tc, s))
                    break
    for _, _, s in sorted(ranked, key=lambda r: r[:2]):
        if s.fits(layer, config):
            return s
    Pool2dSchedule(1, 1, 1).check(layer, config)  # raises, naming the buffers
    raise ValueError(f"pool layer {layer} has no schedule that fits config {config.name}")
