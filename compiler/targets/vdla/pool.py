"""Pooling on the accelerator: max pooling on the vector ALU, average pooling as window
sums on the GEMM core, each followed by its ALU epilogue. The pool family in one module:
the layer (`Pool2dLayer`, `pool2d_layer`), the schedule (`Pool2dSchedule`) and its
micro-op table (`PoolUops`), the timing model and default chooser (`estimate_pool2d`,
`choose_pool2d`), the lowering (`lower_pool2d`) and `run_pool2d`.

Ops: ``max_pool2d`` on int8 data, ``qavg_pool2d`` and ``qglobal_avg_pool2d`` (a global pool
is a pool whose window is the whole image). Input and output are int8 in the activation
layout (`common.pack_activation`, blocks of max(block_in, block_out) channels); one
output channel block takes ``ratio = block_out / block_in`` input blocks, side by side in
each pixel, or where block_in = `group` x block_out, `group` output blocks share an input
block and selection blocks ``S_j[o, i] = (i == j * block_out + o)`` pick each out.

*Identity weights.* Only the GEMM core moves int8 activations into the int32 acc buffer
(a LOAD ACC reads int32 DRAM: four times the bytes, on the compute module). The arena
holds `ratio` weight blocks ``E_j[o, i] = (o == j * block_in + i)``; a GEMM micro-op with
``E_j`` adds input block ``j`` of an output block's channels to the accumulators
unchanged, and one with all the window's taps sums the window.

Per tile (``tile_h`` output rows x ``tile_w`` columns x ``tile_c`` channel blocks of one
batch block), the load module brings the tile's input window (one 2-D DMA per input
block, the borders from the LOAD's zero padding), then:

* **average pooling**: GEMM reset of the acc tile; ONE GEMM whose loops run over the
  tile's output rows and columns and whose micro-ops run over (channel block, ``j``, ky,
  kx), so each accumulator sums its window (zero padding and a ceil-mode overhang add
  zeros, as in the reference); the requantization (`requant.requant_steps`: MUL, rounding
  ADD, SHR) and the clamp to int8 (MAX -128, MIN 127) on the ALU.
* **max pooling**: the input window is widened into a second acc region (GEMM reset, GEMM
  with ``E_j``); the acc tile is set to -128 (GEMM reset, ALU ADD -128); then one ALU MAX
  per kernel tap with the widened window as vector operand. A tap's MAX covers only the
  output positions whose tap lies inside the image, a sub-rectangle of the tile: the
  reference pads max pooling with -128, which skipping a padded tap matches and the
  LOAD's zero padding would not. GEMM and ALU also write every result narrowed into the
  out buffer, so each entry's out value is the one its last pass wrote: its maximum.

The compute module issues one GEMM, reset or ALU-immediate micro-op per cycle and one
ALU micro-op with a vector operand per two cycles (the acc buffer has one read port). Per
output entry of a 3x3 stride-2 max pool that is about 2 (reset and -128) + 9 x 2 (MAX)
+ 2 x 4 (widening about four input entries) = 28 cycles; an average pool takes one
cycle per tap and input block, plus its epilogue.

Tiles alternate between two regions of the inp buffer and two of the acc/out buffers
(ping-pong), so tile ``k + 1``'s loads run during tile ``k``'s compute and tile ``k``'s
stores during tile ``k + 1``'s. Dependency tokens (`vdla.runtime.tokens.RegionTokens`),
for tile ``k`` of ``n``: load->compute
after its loads (RAW); compute->load after the GEMM that reads its window, when tile
``k + 2`` loads into the same region (WAR); compute->store after its last ALU pass (RAW);
store->compute after its stores, when tile ``k + 2`` writes the same acc/out region (WAR);
FINISH pops the last tile's store token.

DRAM arena: micro-ops, per-channel constant rows (acc elements), the identity weights,
the int8 input, the int8 output.

Why this module is long: the pool family is one module (the layer, the schedule, the
timing model and the emitter read the same window and region layout), and it runs every
block shape: where block_in and block_out differ, windows are widened or selected per
output block, which the schedule, the model and the emitter all count.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.common import (INSN_CYCLES, PerChannelBlocks, ITER_MAX, PAD_MAX,
                                               dma_cycles, IdentityTables, KernelTable,
                                               activation_dma,
                                               ceil_div, check_array, check_tile_sizes,
                                               layout_arena, pack_activation, store_activation,
                                               store_cycles, unpack_activation, load_tables,
                                               overflow_detail, remembered_schedule,
                                               run_arena, start_lowering, tile_candidates,
                                               tile_split, window_cols, window_rows)
from vdla.compiler.targets.vdla.requant import AluStep, check_alu_ops, requant_steps
from vdla.compiler.targets.vdla.support import pool_weight_scale
from vdla.config import AluOp, HardwareConfig
from vdla.isa import Program, Uop, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import PingPong, RegionTokens

__all__ = ["AVG", "MAX", "POOL_OPS", "LoweredPool2d", "Pool2dLayer", "Pool2dSchedule",
           "PoolUops", "choose_pool2d", "estimate_pool2d", "lower_pool2d", "pool2d_layer",
           "run_pool2d"]

#: The pooling ops the accelerator runs.
POOL_OPS = ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d")

MAX, AVG = "max", "avg"


# --- the layer ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Pool2dLayer(PerChannelBlocks):
    """A pooling workload: `kind` ("max" or "avg"), plain sizes (N, C, H, W), the window
    (kernel, strides, top and left pads), the output size (which includes a ceil-mode
    window), and the block counts: `batch_blocks`, output channel `blocks`, and `ratio`
    input blocks per output block. The epilogue (average pooling): `imm_passes` ALU passes
    with an immediate and `vec_passes` with a vector operand, which reads one of the
    `const_rows` per-channel constant rows kept in the acc buffer. `weight_scale`: the
    int8 value of the identity weights (an average pool's multiplier up to 127, applied
    by the GEMM core; 1 otherwise)."""

    kind: str
    n: int
    c: int
    h: int
    w: int
    kernel_h: int
    kernel_w: int
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    out_h: int
    out_w: int
    batch_blocks: int
    blocks: int
    ratio: int = 1
    group: int = 1
    const_rows: int = 0
    imm_passes: int = 0
    vec_passes: int = 0
    weight_scale: int = 1

    def __post_init__(self):
        if self.kind not in (MAX, AVG):
            raise ValueError(f"pool kind must be {MAX!r} or {AVG!r}, not {self.kind!r}")
        # A window that starts at or beyond the image's far edge, or one that lies in the
        # padding only, has no input to load (the ISA's LOAD cannot load nothing).
        for axis, pad, k, size, out, stride in (
                ("rows", self.pad_top, self.kernel_h, self.h, self.out_h, self.stride_h),
                ("columns", self.pad_left, self.kernel_w, self.w, self.out_w, self.stride_w)):
            if pad >= k:
                raise ValueError(f"pool pad {pad} on the {axis} must be smaller than the "
                                 f"kernel ({k}): a window that sees only padding is not "
                                 "supported")
            if (out - 1) * stride - pad >= size:
                raise ValueError(f"pool: the last window along the {axis} starts past the "
                                 f"input ({size}); it would see only padding")
            far = (out - 1) * stride + k - pad - size   # padding beyond the far edge
            if pad > PAD_MAX or far > PAD_MAX:
                raise ValueError(f"pool padding {max(pad, far)} along the {axis} exceeds "
                                 f"the LOAD's {PAD_MAX} per side")
            # A column of padding is `ratio` inp elements (a pixel of an activation block).
            if axis == "columns" and max(pad, far) * self.ratio > PAD_MAX:
                raise ValueError(f"pool padding {max(pad, far)} along the columns is "
                                 f"{max(pad, far) * self.ratio} inp elements ({self.ratio} "
                                 f"per pixel), more than the LOAD's {PAD_MAX} per side")

    @property
    def taps(self) -> int:
        return self.kernel_h * self.kernel_w

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: none (the GEMM core sums or copies windows)."""
        return 0


def _pool_epilogue(node: Node, kind: str, channels: int, padded: int,
              config: HardwareConfig) -> tuple[tuple[AluStep, ...], np.ndarray]:
    """An average pool's requantization steps and their constant rows (R, padded) int32;
    nothing for a max pool (its int8 maximum needs no clamp)."""
    rows: list[np.ndarray] = []
    steps: list[AluStep] = []
    if kind == AVG:
        # A multiplier the identity weights carry (`pool_weight_scale`) is no ALU step.
        multiplier = None if pool_weight_scale(node) > 1 else node.attrs["multiplier"]
        steps, _ = requant_steps(node, multiplier, node.attrs["shift"],
                                 channels, padded, rows, fold=False)
        check_alu_ops(node, steps, config)
        steps += [AluStep(AluOp.MAX, imm=-128), AluStep(AluOp.MIN, imm=127)]
    table = (np.stack(rows) if rows else np.zeros((0, padded), np.int64)).astype(np.int32)
    return tuple(steps), table


def pool2d_layer(node: Node, graph: Graph, config: HardwareConfig):
    """(layer, epilogue steps, constant rows) of a pooling node (`POOL_OPS`); ValueError
    naming the node for what the back half cannot run."""
    if node.op not in POOL_OPS:
        raise ValueError(f"lower_pool2d lowers {', '.join(POOL_OPS)} nodes, not "
                         f"{node.name!r} ({node.op})")
    x = graph.tensors[node.inputs[0]]
    if x.dtype != "int8":
        raise ValueError(f"{node.op} node {node.name!r} pools {x.dtype} data; the "
                         "accelerator pools int8 only")
    if x.layout:
        raise ValueError(f"{node.op} node {node.name!r}: its input has layout {x.layout!r}; "
                         "lower_pool2d takes the plain NCHW node and packs itself")
    n, c, h, w = x.shape
    _, _, out_h, out_w = graph.tensors[node.outputs[0]].shape
    a = node.attrs
    if node.op == "qglobal_avg_pool2d":
        kernel, strides, pads = (h, w), (1, 1), (0, 0, 0, 0)
    else:
        kernel, strides, pads = a["kernel"], a["strides"], a["pads"]
    kind = MAX if node.op == "max_pool2d" else AVG
    blocks = ceil_div(c, config.block_out)
    steps, rows = _pool_epilogue(node, kind, c, blocks * config.block_out, config)
    layer = Pool2dLayer(kind=kind, n=n, c=c, h=h, w=w, kernel_h=int(kernel[0]),
                        kernel_w=int(kernel[1]), stride_h=int(strides[0]),
                        stride_w=int(strides[1]), pad_top=int(pads[0]), pad_left=int(pads[1]),
                        out_h=out_h, out_w=out_w, batch_blocks=ceil_div(n, config.batch),
                        blocks=blocks, ratio=max(config.block_out // config.block_in, 1),
                        group=max(config.block_in // config.block_out, 1),
                        const_rows=len(rows),
                        weight_scale=pool_weight_scale(node) if kind == AVG else 1,
                        imm_passes=sum(st.row is None for st in steps),
                        vec_passes=sum(st.row is not None for st in steps))
    return layer, steps, rows


# --- the schedule and its micro-ops ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Pool2dSchedule:
    """Tiling of a pool: output rows, output columns and channel blocks per tile; tiles
    larger than the layer are clamped to it."""

    tile_h: int
    tile_w: int
    tile_c: int

    def __post_init__(self):
        check_tile_sizes(self, ("tile_h", "tile_w", "tile_c"))

    def clamped(self, layer: Pool2dLayer) -> "Pool2dSchedule":
        # Where block_in > block_out, a tile takes whole activation blocks.
        g = layer.group
        return Pool2dSchedule(min(self.tile_h, layer.out_h), min(self.tile_w, layer.out_w),
                              min(ceil_div(self.tile_c, g) * g, layer.blocks))

    def needs(self, layer: Pool2dLayer, config: HardwareConfig,
              uops: bool = True) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling, and its depth: {name: (need,
        depth)}. The inp window and the acc tile have two regions each (ping-pong with the
        loads and the stores); a max pool also keeps the widened window in the acc
        buffer. `uops=False` skips counting the micro-ops (which walks every tile)."""
        s = self.clamped(layer)
        chunk = window_rows(layer, s.tile_h) * window_cols(layer, s.tile_w)
        tile = s.tile_c * s.tile_h * s.tile_w
        widened = s.tile_c * chunk if layer.kind == MAX else 0
        need = {
            "inp": (2 * layer.window_blocks(s.tile_c) * chunk, config.inp_depth),
            "wgt": (layer.identities, config.wgt_depth),
            "acc": (2 * tile + widened + layer.const_rows * layer.blocks, config.acc_depth),
            "out": (2 * tile, config.out_depth),
        }
        if uops:
            need["uop"] = (len(PoolUops(layer, s, config).uops), config.uop_depth)
        return need

    def overflows(self, layer: Pool2dLayer, config: HardwareConfig) -> dict:
        """The limits this tiling exceeds: {buffer or "iter": (need, limit)}; empty when it
        fits. "iter" is the largest loop count of an instruction."""
        s = self.clamped(layer)
        over = {k: v for k, v in self.needs(layer, config, uops=False).items() if v[0] > v[1]}
        if not over:  # the micro-op count walks every tile: only for otherwise fitting tiles
            uops = len(PoolUops(layer, s, config).uops)
            if uops > config.uop_depth:
                over["uop"] = (uops, config.uop_depth)
        loops = max(s.tile_h * s.tile_w, window_rows(layer, s.tile_h) * window_cols(layer, s.tile_w))
        if loops > ITER_MAX:
            over["iter"] = (loops, ITER_MAX)
        return over

    def fits(self, layer: Pool2dLayer, config: HardwareConfig) -> bool:
        return not self.overflows(layer, config)

    def check(self, layer: Pool2dLayer, config: HardwareConfig):
        """Raise ValueError naming every buffer this tiling overflows, and by how much."""
        over = self.overflows(layer, config)
        if over:
            detail = overflow_detail(over)
            raise ValueError(f"pool schedule {self} does not fit config {config.name}: "
                             f"{detail}")


@dataclasses.dataclass(frozen=True)
class PoolTile:
    k: int           # position in program order
    nb: int          # batch block
    ob0: int         # first channel block
    oh0: int
    ow0: int
    tc: int
    th: int
    tw: int


def pool_tiles(L: Pool2dLayer, s) -> list[PoolTile]:
    tiles = []
    for nb in range(L.batch_blocks):
        for ob0 in range(0, L.blocks, s.tile_c):
            for oh0 in range(0, L.out_h, s.tile_h):
                for ow0 in range(0, L.out_w, s.tile_w):
                    tiles.append(PoolTile(len(tiles), nb, ob0, oh0, ow0,
                                       min(s.tile_c, L.blocks - ob0),
                                       min(s.tile_h, L.out_h - oh0),
                                       min(s.tile_w, L.out_w - ow0)))
    return tiles


def _valid(first_out: int, count: int, tap: int, stride: int, pad: int, size: int):
    """[lo, hi) of the tile-local outputs (of `count` from global output `first_out`)
    whose tap `tap` reads inside the image (input index in [0, size))."""
    valid = [i for i in range(count) if 0 <= (first_out + i) * stride + tap - pad < size]
    return (valid[0], valid[-1] + 1) if valid else (0, 0)


class PoolUops(KernelTable):
    """Every micro-op of the program, loaded once at its start. Kernels are interned by
    content (`kernel`), so tiles of one shape share them. The acc buffer holds the two
    output regions at 0 and `tile`, the widened window (max pooling) at `widened`, and the
    constant rows at the top."""

    def __init__(self, L: Pool2dLayer, s, config: HardwareConfig | None):
        super().__init__()
        self.L, self.s = L, s
        self.tile = s.tile_c * s.tile_h * s.tile_w
        self.chunk = window_rows(L, s.tile_h) * window_cols(L, s.tile_w)
        # Consecutive tiles alternate between two input windows and two output regions,
        # so one tile's loads and the previous one's stores overlap compute.
        self.windows = PingPong(L.window_blocks(s.tile_c) * self.chunk)
        self.outputs = PingPong(self.tile)
        self.widened = self.outputs.total
        depth = config.acc_depth if config is not None else 1 << 30
        self.const_base = depth - L.const_rows * L.blocks
        self.tiles = pool_tiles(L, s)
        # Every kernel is interned now (the table is loaded first); the emitter reuses these.
        self.tile_passes = [self.passes(tile) for tile in self.tiles]

    def region(self, t: PoolTile) -> int:
        """acc (and out) index of tile `t`'s output region."""
        return self.outputs.base(t.k)

    def window(self, t: PoolTile) -> int:
        """inp index of tile `t`'s input window region."""
        return self.windows.base(t.k)

    def plane(self, t: PoolTile) -> int:
        """acc entries between the tile's channel blocks (a full tile's rows)."""
        return self.s.tile_h * t.tw

    def passes(self, t: PoolTile) -> dict:
        """The micro-op kernels of tile `t`: {pass: (uop_bgn, uop_end)}."""
        L = self.L
        o, plane, chunk, cols = self.region(t), self.plane(t), self.chunk, window_cols(L, t.tw)
        i = self.window(t)
        out = {"reset": self.kernel([Uop(o, 0, 0)]), "imm": self.kernel([Uop(o, o)]),
               "vec": {row: self.kernel([Uop(o, self.const_base + row * L.blocks + t.ob0)])
                       for row in range(L.const_rows)}}
        if L.kind == AVG:
            # Input block j of output block obi: each window pixel holds the `ratio`
            # input blocks of an output block side by side; or (block_in > block_out)
            # output block obi is selection obi % group of input block obi // group.
            g = L.group
            out["sum"] = self.kernel(
                Uop(o + obi * plane, i + obi // g * L.ratio * chunk
                    + (ky * cols + kx) * L.ratio + j, j + obi % g)
                for obi in range(t.tc) for j in range(L.ratio)
                for ky in range(L.kernel_h) for kx in range(L.kernel_w))
            return out
        wide = self.widened
        out["widen_reset"] = self.kernel([Uop(wide, 0, 0)])
        if L.group > 1:   # output block obi: selection obi % group of its input block
            out["widen"] = self.kernel(Uop(wide + obi * chunk, i + obi // L.group * chunk,
                                           obi % L.group) for obi in range(t.tc))
        else:
            out["widen"] = self.kernel(Uop(wide, i + j, j) for j in range(L.ratio))
        taps = []
        for ky in range(L.kernel_h):
            y0, y1 = _valid(t.oh0, t.th, ky, L.stride_h, L.pad_top, L.h)
            for kx in range(L.kernel_w):
                x0, x1 = _valid(t.ow0, t.tw, kx, L.stride_w, L.pad_left, L.w)
                if y1 <= y0 or x1 <= x0:
                    continue
                k = self.kernel(
                    Uop(o + obi * plane + y0 * t.tw + x0,
                        wide + obi * chunk + (y0 * L.stride_h + ky) * cols + x0 * L.stride_w + kx)
                    for obi in range(t.tc))
                taps.append((k, y1 - y0, x1 - x0))
        out["taps"] = taps
        return out


# --- the timing model and the default schedule ----------------------------------------------

#: Cycles a pool tile whose loads are the slowest module's work takes beyond them: the
#: dependency tokens' hand-offs (measured on Verilator: global average pools of 512, 1024
#: and 2048 channels one block per tile take 6 cycles a tile more than their loads). A
#: tile its compute bounds waits for no token: ResNet-50's global pool on a 1x32x64 core
#: at 32 bytes a cycle takes 254 cycles a tile, its compute's, its loads 252.
TILE_SYNC = 6


def estimate_pool2d(layer: Pool2dLayer, schedule: Pool2dSchedule, config: HardwareConfig, *,
                    bytes_per_cycle: float | None = None,
                    read_latency: int | None = None) -> int:
    """Predicted cycles of `layer` (a `Pool2dLayer`) lowered with `schedule` (a
    `Pool2dSchedule`, see `vdla.compiler.targets.vdla.pool`). Tiles alternate between two
    input and two output regions, so while the compute module works on a tile the next
    tile's window loads and the previous tile's stores run: a tile costs the longest of
    its loads (plus `TILE_SYNC` for the tokens that hand it from module to module), its
    compute and its stores; before them the tables load (the micro-ops and the constant
    rows on the compute module, the identity blocks on the load module, sharing the DRAM
    with the first window's loads). (Within 2% of Verilator on ResNet-18's max pool and on
    global average pools of 512 to 2048 channels; see `bench/pools.py` and
    `bench/model_layers.py`.) `bytes_per_cycle`: the DRAM's, default the config's
    `dram_bytes_per_cycle`; `read_latency`: the DRAM's, which every DMA pays
    (`common.dma_cycles`)."""
    s = schedule.clamped(layer)
    c, bw = config, float(bytes_per_cycle or config.dram_bytes_per_cycle)
    dma = dma_cycles(bw, read_latency)
    imm_steps, vec_steps = layer.imm_passes, layer.vec_passes
    # The micro-op table counts, and the first window's loads wait behind it on the
    # DRAM: a global pool on a 1x16x8 core (64-bit bus) has 395 micro-ops (the 49 taps
    # of 4 output blocks, in two regions), its LOAD UOP took 614 cycles on Verilator and
    # the first LOAD INP beside it 620 instead of 133. Both modules load over one read
    # channel, the micro-ops no faster than the DMA writer takes them, one a cycle
    # (`timing._shared_tables`, the convolutions' rule): on a 1x32x64 core (256-bit bus,
    # 32 bytes a cycle) the same table's LOAD UOP takes 455 cycles and the identity
    # blocks beside it end at cycle 581, where this rule gives 581 and the earlier fit,
    # twice the table's bytes over the bus's width, 347. ResNet-18's global pool on the
    # 1x16x8 core: 5,453 cycles, the model 5,279 (5,714 with the fit); on the 1x16x32
    # core with a 128-bit bus, 199 micro-ops: 3,281 cycles, 3,337 (3,303).
    table_bytes = (layer.const_rows * layer.blocks * c.acc_elem_bytes
                   + layer.ratio * c.wgt_elem_bytes)
    uops = _uop_count(layer, s, c)
    tables = max(table_bytes / bw + 3 * dma,
                 uops * max(1.0, c.uop_bytes / bw) + table_bytes / bw + 2 * dma)
    cycles = first = 0.0
    for th, nh in tile_split(layer.out_h, s.tile_h):
        rows = (th - 1) * layer.stride_h + layer.kernel_h
        for tw, nw in tile_split(layer.out_w, s.tile_w):
            cols = (tw - 1) * layer.stride_w + layer.kernel_w
            for tc, nc in tile_split(layer.blocks, s.tile_c):
                m = nh * nw * nc * layer.batch_blocks
                entries = tc * th * tw
                window = layer.window_blocks(tc) * rows * cols
                # One 2-D DMA per activation block, each paying the DRAM latency.
                load = (window * c.inp_elem_bytes / bw
                        + layer.window_blocks(tc) // layer.ratio * dma)
                store = store_cycles(entries, tc * (1 if tw == layer.out_w or layer.group == 1
                                                    else th), c, bw, layer.group)
                if layer.kind == MAX:
                    # reset and -128, widening (reset, and a copy per input block),
                    # one MAX per tap
                    compute = (2 * entries + (1 + layer.ratio) * tc * rows * cols
                               + 2 * entries * layer.taps + (4 + layer.taps) * INSN_CYCLES)
                else:
                    compute = (entries * (1 + layer.taps * layer.ratio + imm_steps
                                          + 2 * vec_steps)
                               + (2 + imm_steps + vec_steps) * INSN_CYCLES)
                cycles += m * max(load + TILE_SYNC, compute, store)
                first = max(first, load)
    return int(math.ceil(tables + first + cycles))


@functools.lru_cache(maxsize=1024)
def _uop_count(layer: Pool2dLayer, schedule: Pool2dSchedule, config: HardwareConfig) -> int:
    """The micro-ops of `layer`'s table with `schedule` (`PoolUops`; it walks every tile,
    so the chooser's candidates are counted once each)."""
    return len(PoolUops(layer, schedule, config).uops)


@functools.lru_cache(maxsize=256)
def choose_pool2d(layer: Pool2dLayer, config: HardwareConfig) -> Pool2dSchedule:
    """The `Pool2dSchedule` of `layer` with the fewest estimated cycles among tilings that
    fit: the widest few output-width tilings, every channel tiling, and for each the
    tallest tile that fits. Raises ValueError when not even 1x1x1 tiles fit. Remembered
    on disk across processes (`common.remembered_schedule`)."""
    return remembered_schedule("pool2d", layer, config, lambda: _search_pool2d(layer, config),
                               Pool2dSchedule)


def _search_pool2d(layer: Pool2dLayer, config: HardwareConfig) -> Pool2dSchedule:
    ranked = []
    for tw in tile_candidates(layer.out_w, 4):
        for tc in tile_candidates(layer.blocks):
            # The tallest tile whose buffers fit (micro-ops counted below, for the best).
            for th in tile_candidates(layer.out_h):
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


# --- lowering -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class LoweredPool2d(IdentityTables):
    """A lowered pool: `program` (for an arena at DRAM address 0; `relocate` moves it),
    the arena's `regions`, the static data it expects there (`static_data`), and the
    host-side packing (`input_data`, `unpack_output`)."""

    node: str
    config: HardwareConfig
    layer: Pool2dLayer
    schedule: Pool2dSchedule
    program: Program
    regions: dict
    arena_bytes: int
    uop_bytes: bytes
    const_rows: np.ndarray        # (R, padded C) int32

    def input_data(self, x: np.ndarray) -> dict:
        """The arena regions one run writes: {"input": packed int8}."""
        L = self.layer
        x = check_array(x, (L.n, L.c, L.h, L.w), np.int8, "input", self.node)
        # whole output blocks of channels: `ratio` input blocks each
        return {"input": pack_activation(x, self.config, self.config.block_in,
                                         channels=L.blocks * self.config.block_out)}

    def unpack_output(self, raw: np.ndarray) -> np.ndarray:
        L, c = self.layer, self.config
        return unpack_activation(raw, c, c.block_out, (L.n, L.c, L.out_h, L.out_w),
                                 L.out_planes * c.block_out)


def lower_pool2d(node: Node | str, graph: Graph, config: HardwareConfig,
                 schedule: Pool2dSchedule | None = None) -> LoweredPool2d:
    """Lower pooling node `node` of `graph` (one of `POOL_OPS`) to a program for `config`
    (see the module docstring). Raises ValueError for what the back half does not support
    (float data, a window in the padding only, padding beyond the LOAD's, MUL missing) and for a schedule that does not fit."""
    node, (layer, steps, rows), s = start_lowering("lower_pool2d", node, graph, config,
                                                   schedule, pool2d_layer, choose_pool2d,
                                                   Pool2dSchedule)
    table = PoolUops(layer, s, config)
    c, L = config, layer
    regions, arena_bytes = layout_arena({
        "uop": len(table.uops) * c.uop_bytes,
        "const": L.const_rows * L.blocks * c.acc_elem_bytes,
        "weights": L.identities * c.wgt_elem_bytes,
        "input": L.batch_blocks * L.in_blocks * L.h * L.w * c.inp_elem_bytes,
        "output": L.batch_blocks * L.out_planes * L.out_h * L.out_w * c.out_elem_bytes,
    }, config)
    program = _emit(layer, s, config, steps, table, regions)
    return LoweredPool2d(node.name, config, layer, s, program, regions, arena_bytes,
                         encode_uops(table.uops, config), rows)


def _emit(L: Pool2dLayer, s: Pool2dSchedule, c: HardwareConfig, steps, u: PoolUops,
          regions: dict) -> Program:
    def base(name: str, elem_bytes: int) -> int:
        return regions[name].offset // elem_bytes

    inp0, out0 = base("input", c.inp_elem_bytes), base("output", c.out_elem_bytes)
    p = ProgramBuilder(c)
    tokens = RegionTokens(p)
    load_tables(p, regions, c, len(u.uops), u.const_base, L.const_rows * L.blocks,
                L.identities)
    tiles = u.tiles
    for t in tiles:
        k = u.tile_passes[t.k]
        o, plane = u.region(t), u.plane(t)
        rows, cols = window_rows(L, t.th), window_cols(L, t.tw)
        # The input window, clipped to the image; the LOAD pads the rest with zeros.
        r0, c0 = t.oh0 * L.stride_h - L.pad_top, t.ow0 * L.stride_w - L.pad_left
        y0, y1 = max(r0, 0), min(r0 + rows, L.h)
        x0, x1 = max(c0, 0), min(c0 + cols, L.w)
        pads = dict(y_pad_0=y0 - r0, y_pad_1=r0 + rows - y1, x_pad_0=x0 - c0,
                    x_pad_1=c0 + cols - x1)
        tokens.load_into(("window", u.window(t)))  # WAR: tile k-2's GEMM read it
        # One LOAD per activation block: per output block `ratio` inp elements a pixel,
        # or (block_in > block_out) one per `group` output blocks.
        for lb in range(L.window_blocks(t.tc) // L.ratio):
            activation_dma(p, u.window(t) + lb * L.ratio * u.chunk,
                           inp0 + (t.nb * L.in_blocks + L.window_blocks(t.ob0) + lb * L.ratio)
                           * L.h * L.w, L.w, y0, y1, x0, x1, L.ratio, pads)
        tokens.loaded()

        tile_loop = dict(iter_out=t.tc, iter_in=t.th * t.tw, dst_factor_out=plane,
                         dst_factor_in=1)
        tokens.compute_into(("out", o))  # WAR: tile k-2's stores have read this region
        bgn, end = k["reset"]
        p.gemm(reset_reg=True, uop_bgn=bgn, uop_end=end, **tile_loop)
        if L.kind == AVG:
            tokens.wait_loaded()  # RAW: the window is in
            bgn, end = k["sum"]
            p.gemm(uop_bgn=bgn, uop_end=end, iter_out=t.th, iter_in=t.tw,
                   dst_factor_out=t.tw, dst_factor_in=1,
                   src_factor_out=L.stride_h * cols * L.ratio,
                   src_factor_in=L.stride_w * L.ratio)
        else:
            bgn, end = k["imm"]
            p.alu(AluOp.ADD, uop_bgn=bgn, uop_end=end, use_imm=True, imm=-128, **tile_loop)
            widen = dict(iter_out=t.tc, iter_in=rows * cols, dst_factor_out=u.chunk,
                         dst_factor_in=1)
            bgn, end = k["widen_reset"]
            p.gemm(reset_reg=True, uop_bgn=bgn, uop_end=end, **widen)
            tokens.wait_loaded()  # RAW: the window is in
            bgn, end = k["widen"]
            if L.group > 1:   # the kernel has a micro-op per output block
                p.gemm(uop_bgn=bgn, uop_end=end, iter_out=1, iter_in=rows * cols,
                       dst_factor_out=0, dst_factor_in=1, src_factor_out=0, src_factor_in=1)
            else:
                p.gemm(uop_bgn=bgn, uop_end=end, src_factor_out=L.ratio * u.chunk,
                       src_factor_in=L.ratio, **widen)
        tokens.read(("window", u.window(t)))  # tile k+2's loads wait for it
        if L.kind == AVG:
            for st in steps:
                if st.row is None:
                    bgn, end = k["imm"]
                    p.alu(st.op, uop_bgn=bgn, uop_end=end, use_imm=True, imm=st.imm,
                          **tile_loop)
                else:
                    bgn, end = k["vec"][st.row]
                    p.alu(st.op, uop_bgn=bgn, uop_end=end, src_factor_out=1, **tile_loop)
        else:
            for (bgn, end), ny, nx in k["taps"]:
                p.alu(AluOp.MAX, uop_bgn=bgn, uop_end=end, iter_out=ny, iter_in=nx,
                      dst_factor_out=t.tw, dst_factor_in=1,
                      src_factor_out=L.stride_h * cols, src_factor_in=L.stride_w)
        tokens.computed()

        tokens.wait_computed()  # RAW: the out tile is written
        for obi in range(t.tc):
            block, j = divmod(t.ob0 + obi, L.group)
            store_activation(p, o + obi * plane,
                             out0 + (t.nb * L.out_planes + block * L.group) * L.out_h * L.out_w,
                             L.out_w, t.oh0, t.th, t.ow0, t.tw, L.group, j)
        tokens.stored(("out", o))  # tile k+2 waits for it
    return tokens.finish()  # FINISH waits for the last store


# --- running --------------------------------------------------------------------------------

def run_pool2d(dev, lowered: LoweredPool2d, x_int8: np.ndarray, *, return_stats: bool = False):
    """Write the input packed into `dev`'s DRAM, run the program, read the output back:
    int8 (N, C, Ho, Wo). With `return_stats`, returns (y, stats)."""
    raw, stats = run_arena(dev, lowered, {**lowered.static_data(), **lowered.input_data(x_int8)})
    y = lowered.unpack_output(raw)
    return (y, stats) if return_stats else y
