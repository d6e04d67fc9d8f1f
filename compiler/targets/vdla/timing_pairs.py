"""The convolution timing model's terms of two virtual threads
(`vdla.compiler.targets.vdla.timing`, whose `estimate_conv2d` sums them): how their tiles
pair (`paired_cycles`, `mixed_pair`, `pair_terms`), the pairs simulated module by module
from their dependencies (`simulate_pairs`), the layer's first and last pairs
(`first_pair`, `last_pair`, `last_stores`), a lone last tile (`lone_tile`), weight
switches and store waits, and the two chains they add up to (`two_thread_cycles`). A tile
class is `TileClass` (what the terms between consecutive tiles read) and `TileCosts`
(one tile's costs); each term states the Verilator measurement it was fitted to.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, NamedTuple

from vdla.compiler.targets.vdla.common import dma_cycles, tile_split
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.config import HardwareConfig

if TYPE_CHECKING:   # annotations only: conv_layer imports the timing model
    from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer

__all__ = ["TileClass", "TileCosts", "first_pair", "last_pair", "last_stores", "lone_tile",
           "mixed_groups", "mixed_pair", "pair_run", "pair_terms", "paired_cycles",
           "previous_class", "steps", "store_waits", "two_thread_cycles", "weight_switches"]


@dataclasses.dataclass(frozen=True)
class TileClass:
    """What `estimate_conv2d` keeps of a class of tiles (same rows, columns and channel
    tiling) for the terms between consecutive tiles, in cycles: its first chunk's loads
    (`first_load`); what of it the next tile's first loads may overlap with one thread
    (`overlap`: its epilogue but the bias GEMM, and its stores); its GEMMs with the
    epilogue (`compute`); its stores (`store`); with two threads, what of its epilogue
    runs after its GEMMs have freed its inp buffer (`released`), and its reset (`reset`:
    0 where the epilogue's last pass clears the tile)."""

    first_load: float
    overlap: float
    compute: float
    store: float
    released: float
    reset: float


class TileCosts(NamedTuple):
    """What `estimate_conv2d` sums of one tile of a class (`timing._tile_class`), in cycles:
    its loads, GEMMs (the residual's widening out), epilogue and stores; each chunk's
    (loads, GEMMs) (`seq`); its time with two threads (`paired_cycles`); `pair_run`'s
    arguments (`run`); the class's `TileClass` (`side`); and what of its first chunk's
    loads beyond the chunk's GEMMs its `paired` counts (`head_excess`: the first tile's
    are in the head instead)."""

    load: float
    gemm: float
    epilogue: float
    store: float
    seq: list
    paired: float
    run: tuple
    side: TileClass
    head_excess: float


def lone_tile(t: TileCosts) -> float:
    """What tile `t`, the last of an odd count and alone in its group with two threads,
    adds beyond its `paired`. Its first chunk's loads wait for no GEMM of its own (its
    thread's buffers are free since its previous tile): they run during the other
    thread's last chunk and epilogue, and only what they take beyond those delays its
    GEMMs. Its later chunks' loads wait for its own previous GEMMs: one thread's turns.
    MobileNet-v2's features.14.conv.1.0 on a 1x32x64 core (9 depthwise tiles of one chunk,
    threads over output channels): 8,681 cycles on Verilator, 9,350 when every chunk's
    loads took turns with its GEMMs, 8,774 so."""
    seq = t.seq
    return (max(0.0, seq[0][0] - seq[-1][1] - t.epilogue) + t.gemm + t.epilogue
            + sum(ld for ld, _ in seq[1:]) - t.paired)


def last_stores(sides: dict, last: tuple, previous: tuple | None) -> float:
    """What the stores take after the last tile's epilogue, with two threads: its own,
    after the previous tile's (the other thread's) where those outlast the last tile's
    compute. `sides`: the tile classes (`TileClass`); `last`, `previous`: the classes of
    the last tile and of the one before it (None: the layer has one tile). MobileNet-v2's
    features.5.conv.0.0 on a 1x32x64 core, threads over rows of three and a last one of
    one: the last tile computes in 270 cycles, the previous tile's stores take 570, and
    the last tile's own 210 come after them."""
    tail = sides[last].store
    if previous is not None:
        tail += max(0.0, sides[previous].store - sides[last].compute)
    return tail


def last_pair(last: tuple, previous: tuple) -> tuple:
    """`pair_run` of the layer's last pair of tiles: the last tile's class (`last`, its
    `pair_run` arguments) after pairs of its own, its partner in the pair the tile
    before it in program order (`previous`'s class). MobileNet-v2's features.15.conv.0.0
    on a 1x32x64 core (output-channel tiles of 4, 4, 4 and 3 blocks, two threads): the
    last pair's stores, 4 then 3 blocks', end 914 cycles after the last load on
    Verilator; 683 when both were the short tile's."""
    if previous is last:
        return pair_run(*last)
    chunks, epilogue, store, _, held = previous
    return pair_run(*last, leader=(tuple(chunks), epilogue, store, held))


def previous_class(layer: Conv2dLayer, s: Conv2dSchedule, tilings) -> tuple:
    """The class (rows, columns, `tilings` index) of the tile before the last in program
    order (`_ConvEmitter.groups` in `vdla.compiler.targets.vdla.conv`: the threads' axis
    innermost), or the last tile's own where the layer has one tile."""
    rows = [th for th, n in tile_split(layer.out_h, s.tile_h) for _ in range(n)]
    cols = [tw for tw, n in tile_split(layer.out_w, s.tile_w) for _ in range(n)]
    cos = [k for k, (_, n, _) in enumerate(tilings) for _ in range(n)]
    axes = ((2, cos), (1, cols), (0, rows)) if s.oc_nthread > 1 else \
        ((0, rows), (1, cols), (2, cos)) if s.h_nthread > 1 else ((1, cols), (0, rows), (2, cos))
    key = [rows[-1], cols[-1], cos[-1]]
    for i, axis in axes:
        if len(axis) > 1:
            key[i] = axis[-2]
            break
    return tuple(key)


def first_pair(run: tuple, counted: float | None, region: float) -> tuple[float, float]:
    """Two threads: the layer's first pair of tiles simulated from free buffers
    (`pair_run` of the first tile class, `run` its arguments), against what the pairs
    count of it (`counted`: twice its `paired_cycles`, less what the head holds of its
    first loads; None where the pair's tiles differ in class): (what to add to the
    compute module's chain, what to the load module's waits).

    `paired_cycles` overstates a pair whose loads bound it, its epilogues hidden in its
    GEMMs' waits for them (a 14 x 14 x 96 -> 32 pointwise layer on a 1x16x16 core whose
    epilogue clears its tile, two threads over rows of seven, three chunks: 5,242 cycles
    on Verilator; the model 5,378 with the pair counted so, 5,232 with it simulated).
    Where the epilogue's last pass clears the tile, each thread resets its `region`
    (cycles) once, and the second thread's reset falls in this pair: program order puts
    it after the first thread's first chunk, not in the head with the first thread's
    (`estimate_conv2d`'s region resets). It runs while the second thread's first loads
    do; what they do not hide delays its first GEMMs, and with them the WAR tokens its
    next loads wait for. MobileNet-v2's features.5.conv.0.0 on a
    1x32x64 core (28 x 7 tiles of one chunk, the compute module the busier): 8,809
    cycles on Verilator, 8,432 with both resets in the head, 8,924 now."""
    ends, _, waits = pair_run(*run)
    later, _, more = pair_run(*run, lead=region)
    if counted is None:     # the reset's delay alone
        return later[-1] - ends[-1], sum(more) - sum(waits)
    return later[0] - run[0][0][0] - counted, sum(more) - sum(waits)


def two_thread_cycles(compute: float, load: float, store: float, head: tuple,
                       tail: tuple, streamed: bool = False) -> float:
    """Two threads: the longer of the compute module's chain (its pairs and weight
    switches, `compute`) and the load module's (`load`, the tables' included), from the
    head: (table loads, the first loads before any GEMM, the first chunk's loads, what
    the pairs count of them (`TileCosts.head_excess`), the compute module's table loads
    and first reset) and the tail: (the last tile's store, what an odd tile count's lone
    last tile adds (`lone_tile`), the load module's waits, the drain after the last
    load, `last_pair`'s); `streamed`: the layer's weights are an activation.

    The first chunk's loads are in the head, so neither chain counts them again: not
    the pairs (where they outlast its GEMMs, their pair's share is those loads) nor the
    loads after the head. Counted twice, load-bound layers with two threads over output
    channels came out up to 36% high (ResNet-18's C6/r on a 1x32x32 core, tile_ci=1:
    11,694 cycles on Verilator, 13,824 when counted twice, 11,657 now); over the
    recorded Verilator sets of `bench/datasets` the mean error fell from 1.2-3.0% to
    0.7-1.3% (`bench/timing_records.py`). Only what the pairs count comes off: a tile
    whose GEMMs and epilogue outlast its loads counts none of them (ResNet-18's
    layer2.0.downsample.0 on a 1x32x64 core, its residual fused: 21,798 cycles on
    Verilator, 21,082 when the first loads' lead over their GEMMs came off the compute
    module's chain all the same, 21,989 now)."""
    table_load, first_load, head_load, excess, compute_head = head
    last_store, lone, load_waits, drain = tail
    if streamed and compute - excess <= load - table_load and drain > 0:
        # A product of two activations (`streamed`) whose pairs are no longer than its
        # loads: the loads bound it, back to back from the first, and it ends with the
        # drain after the last. The chain below would put the first tile's GEMMs between
        # its loads and the next tile's (ViT-tiny's v^T identity product on
        # pynq-z1-transformers, 208 keys in output-channel tiles of 3, 3, 3, 3 and 1
        # blocks: 6,304 cycles on Verilator, 6,788 so, 6,283 now). Not for convolutions:
        # on the recorded sets it moved the mean error by 0.02% either way, but on
        # zcu104-plus it flattered schedules of ResNet-18 that then ran 2.9% slower.
        return max(load + load_waits + drain, store + last_store)
    cycles = (max(compute - excess, load - table_load - head_load, store) + last_store
              + max(table_load + first_load, compute_head))
    # An odd tile count leaves the last group one thread (`lone_tile`). A load-bound
    # layer's drain below already holds its tail.
    cycles += max(0.0, lone)
    # The loads, their waits for the compute module and, from the last load's end to the
    # last store's, the drain of the last tiles.
    return max(cycles, load + load_waits + drain)


def store_waits(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """Two threads over rows: the compute module's waits where a tile is followed by one
    of another class. A tile's first GEMM waits for the stores of its thread's previous
    tile, two tiles back, which run during the tile between; each class's own pairs
    count that wait (`pair_run`), but a short last row tile between two whole ones hides
    less of the whole tile's stores. `sides` maps a tile class to its `TileClass`; the
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
                for k, nco in ks for tw, nw in cols for (a, b), n in steps(rows).items())
    total += sum(wait((k, a, rows[-1][0]), (k, b, rows[0][0]), n * nco * nb)
                 for k, nco in ks for (a, b), n in steps(cols).items())
    total += sum(wait((a, cols[-1][0], rows[-1][0]), (b, cols[0][0], rows[0][0]), n * nb)
                 for (a, b), n in steps(ks).items())
    total += wait(last, (ks[0][0], cols[0][0], rows[0][0]), nb - 1)
    # The layer's last tile has no tile after it to wait: its predecessor's class.
    for i in (2, 1, 0):
        if levels[i][-1][1] > 1:
            break
        if len(levels[i]) > 1:
            return total - wait((*last[:i], levels[i][-2][0], *last[i + 1:]), last)
    return total


def steps(classes: list[tuple]) -> dict[tuple, int]:
    """The steps between consecutive items of the sequence of `classes` (class, count),
    each class repeated count times: {(previous, next): steps}."""
    steps: dict[tuple, int] = {}
    for i, (k, n) in enumerate(classes):
        pairs = [((k, k), n - 1)] + ([((classes[i - 1][0], k), 1)] if i else [])
        for key, count in pairs:
            steps[key] = steps.get(key, 0) + count
    return steps


def paired_cycles(layer: Conv2dLayer, chunk_pairs: float, first: tuple[float, float],
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


def mixed_groups(layer: Conv2dLayer, s: Conv2dSchedule, tilings, costs: dict) -> float:
    """Two threads over output channels whose channels end in a short output-channel
    tile: what the groups that pair a whole tile with the short one add beyond each
    tile's own time (`mixed_pair`). One such group a position (an even count of tiles a
    position pairs them within it; an odd count, the short tile with the next position's
    first), but for the layer's last tile where the tiles in all are odd, alone in its
    group (`lone_tile`). `costs` maps a tile class (rows, columns, `tilings` index) to
    its `TileCosts`. MobileNet-v1's features.6.pw on VTA's default sizes, tiles of 7, 7,
    7, 7 and 4 output blocks at two positions: 248,320 cycles on Verilator, 243,554
    without its two mixed groups, 248,898 with them. (Threads over rows whose last row
    tile is short pair theirs the same way, but counting those groups so took the
    recorded sets' mean error on one-chunk layers from 1.7% to 1.9%: left out.)"""
    if s.oc_nthread == 1 or len(tilings) != 2 or len(layer.spans) != 1:
        return 0.0
    rows, cols = tile_split(layer.out_h, s.tile_h), tile_split(layer.out_w, s.tile_w)
    nb = layer.batch_blocks
    odd = (sum(n for _, n in rows) * sum(n for _, n in cols)
           * sum(n for _, n, _ in tilings) * nb) % 2
    total = 0.0
    for th, nh in rows:
        for tw, nw in cols:
            last = (th, tw) == (rows[-1][0], cols[-1][0])
            total += (nh * nw * nb - (last and odd)) * mixed_pair(costs[th, tw, 0],
                                                                   costs[th, tw, 1])
    return total


def mixed_pair(whole: TileCosts, short: TileCosts) -> float:
    """Two threads over output channels whose channels end in a short output-channel
    tile: what a group that pairs a whole tile with the short one (`mixed_groups`) takes
    beyond each tile's own chunks (`paired_cycles`), from the chunks' (loads, GEMMs): a
    thread's next chunk loads only after its GEMMs, so a chunk pair takes at least one
    thread's loads and GEMMs in turn, which the short tile's chunks cannot hide
    (ResNet-18's layer4.1.conv2 on VTA's default sizes, tiles of 6 and 2 output blocks:
    the compute module waits 1,031 cycles a chunk on Verilator, 1,080 here; 501,544
    cycles against 468,440 without it). And a thread's next tile starts only once its
    stores have freed its acc region, which the other thread's tile between may not hide:
    MobileNet-v2's features.5.conv.0.0 on a 1x32x64 core in tiles of 2 and 1 output
    blocks, the whole tile's stores 380 cycles, the short tile's compute 273: 911 cycles a
    pair on Verilator, 799 without the wait."""
    chunks = sum(max(g0 + g1, l0 + l1, l0 + g0, l1 + g1) - max(l0, g0) - max(l1, g1)
                 for (l0, g0), (l1, g1) in zip(whole.seq, short.seq))
    return (chunks + max(0.0, whole.store - short.gemm - short.epilogue)
            + max(0.0, short.store - whole.gemm - whole.epilogue))


def pair_terms(m: int, run: tuple, tile_paired: float, first_class: bool):
    """What `m` tiles of one class add, with two threads, to the compute module's time
    beyond `paired_cycles` each (the steady pairs after the first two tiles, where there
    are two pairs or more; less than nothing where `paired_cycles` overstates a pair, as
    it does a load-bound one: MobileNet-v1's features.11.pw on 1x32x16, two pairs, 101,938
    cycles on Verilator, 105,763 without the term, 103,797 with it), and the load
    module's waits (`pair_run`'s, the first pair of the layer's from free buffers).
    `run`: `pair_run`'s arguments. The waits are measured over output channels
    (`oc_nthread`); over rows where the threads keep their weights (a residual in the
    first chunk) they overstate, and `estimate_conv2d` leaves them out: ResNet-50's
    layer3.1.conv3 on 1x32x16 takes 244,530 cycles on Verilator, 252,469 with them.
    Over rows where every chunk loads its weights they hold: ViT-tiny's attention
    projection with its residual on vta-plus (two row tiles of 99, three channel tiles,
    chunks of two blocks) takes 42,746 cycles on Verilator, the model 41,365 without
    them and 42,354 with them as channel threads."""
    waits = pair_run(*run)[2]
    load_waits = m / 2 * waits[1] - (waits[1] - waits[0]) * first_class
    more = 0.0
    if m >= 4:
        more = (m - 2) * (pair_period(*run[:3], run[4]) / 2 - tile_paired)
    return more, load_waits


def pair_period(chunks: list[tuple[float, float]], epilogue: float, store: float,
                 held: float = 0.0) -> float:
    """The steady-state cycles of a pair of tiles of two threads (`pair_run`)."""
    ends = pair_run(chunks, epilogue, store, 4, held)[0]
    return ends[-1] - ends[-2]


def pair_run(chunks: list[tuple[float, float]], epilogue: float, store: float,
              pairs: int = 4, held: float = 0.0, lead: float = 0.0,
              leader: tuple | None = None) -> tuple[tuple[float, ...], float,
                                                    tuple[float, ...]]:
    """`simulate_pairs`, remembered: a space's schedules share few distinct chunk
    patterns, and ranking a whole space (the pretrained tuner, the learned chooser) asks
    for the same ones hundreds of thousands of times."""
    return simulate_pairs(tuple(chunks), epilogue, store, pairs, held, lead, leader)


@functools.lru_cache(maxsize=1 << 16)
def simulate_pairs(chunks: tuple[tuple[float, float], ...], epilogue: float, store: float,
                    pairs: int, held: float, lead: float = 0.0, leader: tuple | None = None
                    ) -> tuple[tuple[float, ...], float, tuple[float, ...]]:
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
    946 cycles, the shift and the widening GEMM; on a 1x16x32 core clamping with MAX
    and MIN, two threads over rows of seven: 21,314 cycles a pair on Verilator, 23,488
    when the clamp held the buffer too, 21,693 now).

    When the stores take longer than the compute between a thread's epilogue and its
    next tile (the other thread's last chunk and epilogue), the compute module waits:
    pointwise layers of a 1x16x32 core whose tiles load as long as they compute
    (MobileNet-v1's features.2.pw: 9,611 cycles a pair on Verilator, 9,591 here).
    Simulated over a few pairs: every pair after the first repeats the same waits.
    `estimate_conv2d` adds what this differs from `paired_cycles` by to the pairs after
    the first of a tile class with two pairs or more (`pair_terms`).

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
    tiles = [(chunks, epilogue, store, held)] * 2
    for i in range(pairs):
        if leader is not None and i == pairs - 1:
            tiles[0] = leader
        waits.append(0.0)
        for j in range(max(len(tiles[0][0]), len(tiles[1][0]))):
            for t, (own, epi, st, hold) in enumerate(tiles):
                if j >= len(own):
                    continue
                load, gemm = own[j]
                waits[-1] += max(0.0, computed[t] - loads)
                loads = max(loads, computed[t]) + load
                if i == j == 0 and t == 1:
                    compute += lead      # before its first GEMM, waiting for no loads
                start = max(compute, loads, stored[t] if j == 0 else 0.0)
                compute = computed[t] = start + gemm
                if j == len(own) - 1:
                    computed[t] += hold
                    compute += epi
                    stores = stored[t] = max(stores, compute) + st
        ends.append(compute)
    return tuple(ends), stores - loads, tuple(waits)


def weight_switches(layer: Conv2dLayer, s: Conv2dSchedule, tilings, once: float,
                     c: HardwareConfig, dram: tuple[float, int | None], first_load: float,
                     tile_compute: float, edges: tuple[float, float, dict, float]) -> float:
    """Two threads that load each weight block once: what their weight loads add to the
    busiest module's time. `once` is every weight load; `first_load` and `tile_compute`
    a tile's first loads and its compute (the most of each over the layer's tiles);
    `edges` the first tile's first loads, the last tile's time with two threads
    (`paired_cycles`), `estimate_conv2d`'s tile classes (`sides`) and what a tile's pairs
    count of its first loads beyond its GEMMs (`TileCosts.head_excess`).
    Weight switches stall the compute module (a thread waits for its new weights): they
    add to its time, not to the load module's, which already counts every weight load
    (`once`). So a load-bound layer pays none (MobileNet-v1's features.3.dw on the 1x16x32
    window: 60,545 cycles on Verilator, 62,785 with the switches added on top of the
    loads). Nor does a switch count again the first loads of the second thread's tile
    that the pairs count already (a 14 x 14 x 128 -> 48 pointwise layer on a 1x16x16
    core, two threads over rows, one chunk of weights a thread: 8,599 cycles on
    Verilator, 11,104 when counted twice, 9,378 now). `dram`: the DRAM's (bytes a cycle,
    read latency)."""
    bw, lat = dram
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
        head_load, last_paired, sides, excess = edges
        taps = layer.wgt_taps
        total, started = 0.0, False
        whole, cols = s.tile_h, tile_split(layer.out_w, s.tile_w)[-1][0]
        for k, (tco, nco, chunks) in enumerate(tilings):
            w = tco * chunks[0][0] * taps * c.wgt_elem_bytes / bw + dma_cycles(bw, lat)
            released, own_reset = (sides[whole, cols, k].released,
                                   sides[whole, cols, k].reset)
            for _ in range(nco * layer.batch_blocks):
                first = (max(0.0, w + head_load - last_paired) if layer.window
                         else max(0.0, w + head_load - last_paired - released - own_reset))
                total += (first if started else w) + max(0.0, w + first_gap - excess)
                started = True
        return total
    # Threads over output channels start at the same time: the first thread's weights
    # load while the compute module waits, and the second thread's weights and first
    # loads after them, while only the first thread's first tile computes.
    return once / 2 + max(0.0, once / 2 + first_gap - edges[3])
