"""What the lowered ops share: ISA field limits, tiling arithmetic and the hardware
facts of the timing models, micro-op tables interned
by content, the DRAM arena an op's program addresses, and the start of every lowering.

A lowered op (`LoweredConv2d`, `LoweredPool2d`, `LoweredElementwise`) owns one *arena*: a
block of DRAM with named regions (micro-ops, constant rows, operands, output), each
aligned for every element type. Its program is emitted for an arena at address 0;
`relocate` moves every LOAD/STORE to wherever the runtime allocated the arena.

What the timing models (`timing.estimate_conv2d`, `pool.estimate_pool2d`,
`elementwise.estimate_elementwise`) know about the hardware, measured on the Verilator
model of the default config (`vdla.hw`; one figure per fact below):

* the compute module issues one GEMM, reset or ALU-with-immediate micro-op per cycle; an
  ALU micro-op with a vector operand reads the acc buffer twice and takes two cycles,
  except on a config with ``alu_hold``, where an instruction that holds its operand row
  takes one cycle per micro-op and one per outer iteration after the first
  (`vector_pass_cycles`); every GEMM/ALU instruction adds about `INSN_CYCLES` of
  pipeline fill and drain;
* loads and stores move ``bytes_per_cycle`` bytes per cycle each way (reads and writes
  have their own AXI channels) after `DMA_CYCLES` of latency per instruction, overlapped
  when instructions follow each other;
* a LOAD ACC (the residual) runs on the compute module, so its DRAM time is compute time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from vdla._memo import remembered
from vdla.isa.relocate import relocate
from vdla.config import ISA_FIXED_WIDTHS, HardwareConfig
from vdla.isa import MemoryType, Program, Uop
from vdla.isa.encoding import INSN_BYTES
from vdla.runtime.builder import ProgramBuilder
from vdla.compiler.targets.vdla.sequence import contiguous_rows
from vdla.runtime.device import dram_alignment

#: LOAD pads per side (the ISA's pad fields).
PAD_MAX = (1 << ISA_FIXED_WIDTHS["pad"]) - 1
#: GEMM/ALU loop counts (iter_out, iter_in).
ITER_MAX = (1 << ISA_FIXED_WIDTHS["iter"]) - 1
#: A DMA row stride (the LOAD/STORE x_stride field).
STRIDE_MAX = (1 << ISA_FIXED_WIDTHS["x_stride"]) - 1
#: The ALU immediate (signed).
IMM_MIN = -(1 << (ISA_FIXED_WIDTHS["imm"] - 1))
IMM_MAX = (1 << (ISA_FIXED_WIDTHS["imm"] - 1)) - 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_array(array, shape, dtype, what: str, op: str = "conv2d") -> np.ndarray:
    """`array` as an ndarray, or ValueError unless it has exactly `shape` and `dtype`."""
    array = np.asarray(array)
    if array.shape != tuple(shape) or array.dtype != dtype:
        raise ValueError(f"{op} {what} must be {np.dtype(dtype).name} of shape "
                         f"{tuple(shape)}, not {array.dtype} {array.shape}")
    return array


# --- tiling and timing ----------------------------------------------------------------------

def window_rows(layer, tile_h: int) -> int:
    """Input rows that `tile_h` output rows of `layer` (a conv or pool layer) read."""
    dilation = getattr(layer, "dilation_h", 1)      # pools have none
    return (tile_h - 1) * layer.stride_h + (layer.kernel_h - 1) * dilation + 1


def window_cols(layer, tile_w: int) -> int:
    """Input columns that `tile_w` output columns of `layer` read."""
    dilation = getattr(layer, "dilation_w", 1)
    return (tile_w - 1) * layer.stride_w + (layer.kernel_w - 1) * dilation + 1


#: What a LOAD's zero padding costs per element where its writer is the limit (a bus word
#: a cycle, no faster than the DRAM): the writer puts a zero in the SRAM per cycle while
#: the reads of the data run ahead, so a padded element costs less than a read one
#: (measured on MobileNet-v1's features.11 depthwise layer, whose one 15 x 15 window per
#: tile has 29 padded elements: the load module was busy 26,344 cycles, 1,403 fewer than
#: counting the padding as data, about half a cycle per padded element). Where the DRAM
#: is the limit (a bus wider than its bytes a cycle), the zeros fill the writer's idle
#: cycles (`timing._chunk_costs`).
PAD_ELEM_CYCLES = 0.5

#: Pipeline fill and drain of one GEMM/ALU instruction (measured: 100 back-to-back
#: 10-micro-op instructions take 888 cycles more than 1000 micro-ops in one).
INSN_CYCLES = 9
#: The simulated DRAM's read latency, cycles from a read's address to its first data
#: (the Verilator model's default, `DramTiming.read_latency`), and its bytes a cycle each
#: way: the figures below were measured on them. A board's DRAM model has its own
#: (`Board.dram_timing`: ZCU104's 160 ns are 24 cycles at 150 MHz); the timing models take
#: both (``read_latency``, ``bytes_per_cycle``) and price every DMA on them (`dma_cycles`).
READ_LATENCY = 32
BYTES_PER_CYCLE = 8.0
#: What a LOAD instruction takes beyond its data and the DRAM's latency: the DMA engine's
#: turnaround, busy 3 cycles past them and a cycle idle before the next (measured alike
#: on the default DRAM, 35 cycles beyond a LOAD's data, and on ZCU104's, 27).
DMA_TURNAROUND = 4
#: The instruction bytes the fetch module reads per DMA, on average, through the same
#: read channel as the loads: the LOAD's own 16 and about as many of the GEMM, ALU and
#: STORE instructions around it (a ResNet-18 layer's chunk: a LOAD of inputs, often one
#: of weights, and a GEMM). At 8 bytes a cycle they hold the channel 4 cycles a DMA.
FETCH_BYTES_PER_DMA = 2 * INSN_BYTES


def dma_cycles(bytes_per_cycle: float = BYTES_PER_CYCLE,
               read_latency: int | None = None) -> float:
    """What a DMA instruction costs beyond its data when it cannot overlap the previous
    one, on a DRAM of `bytes_per_cycle` and `read_latency` cycles (default
    `READ_LATENCY`): the latency, the engine's turnaround (`DMA_TURNAROUND`) and the
    instruction fetch's share of the read channel (`FETCH_BYTES_PER_DMA`). 40 cycles on
    the default DRAM (`DMA_CYCLES`, fitted there over the recorded Verilator sets before
    it was split so); 29 on ZCU104's at 32 bytes a cycle, where its LOADs take 28 each
    back to back."""
    latency = READ_LATENCY if read_latency is None else read_latency
    return latency + DMA_TURNAROUND + FETCH_BYTES_PER_DMA / bytes_per_cycle


#: `dma_cycles` on the default DRAM.
DMA_CYCLES = 40
#: The simulated DRAM accepts this many read bursts at once, each holding its place from
#: its address to its last beat: the read latency (32 cycles) and a little more
#: (`DMA_BURST_CYCLES`) beyond its data.
DMA_READ_SLOTS = 8
DMA_BURST_CYCLES = 34


def _latency_shift(read_latency: int | None) -> int:
    """How much longer than `READ_LATENCY` a DRAM of `read_latency` cycles answers."""
    return 0 if read_latency is None else read_latency - READ_LATENCY


def dma_row_cycles(rows: int, row_cycles: float, read_latency: int | None = None) -> float:
    """What a LOAD of `rows` rows, each `row_cycles` of data (one read burst a row),
    takes beyond its data: once the DRAM's `DMA_READ_SLOTS` are full, a row is issued
    only as one ends, every ``(DMA_BURST_CYCLES + row_cycles) / DMA_READ_SLOTS``
    cycles (a burst holds its slot for the DRAM's `read_latency` too, default
    `READ_LATENCY`). Rows shorter than that leave the bus idle between them (measured on
    the default config: 13 rows of one 16-byte element in 79 cycles, 26 in 141, where
    their bytes take 26 and 52; rows of six bus words or more keep the bus busy)."""
    burst = DMA_BURST_CYCLES + _latency_shift(read_latency)
    gap = (burst + row_cycles) / DMA_READ_SLOTS - row_cycles
    return max(0, rows - DMA_READ_SLOTS) * max(0.0, gap)


#: A STORE row of one out element (x_size 1: block_in > block_out, `store_activation`)
#: is one DRAM write burst of its own: about 2.35 cycles (measured on 1x32x8 at 8 bytes a
#: cycle: 196 such rows in 479 cycles, 196 contiguous elements in 215), or half a cycle
#: more than its bytes take (1x32x16 at 8 bytes a cycle: 2.5 cycles a row of 16 bytes,
#: 36 cycles a STORE of 7 rows, 194 of 70).
STORE_ROW_CYCLES = 2.35
#: What a STORE takes beyond its bytes (or rows), back to back with others as well: 20
#: cycles (the above; on 1x16x32, 694 cycles for 5,376 bytes at 8 bytes a cycle, 170 for
#: 1,792 at 12).
STORE_CYCLES = 20


def store_cycles(entries: int, stores: int, config: HardwareConfig, bytes_per_cycle: float,
                 group: int = 1) -> float:
    """Store-module cycles of `stores` STOREs of `entries` out elements in all, each to
    its place in an activation block of `group` out elements a pixel (`out_group`): at
    the DRAM's bandwidth, or a row each where `group` > 1, plus `STORE_CYCLES` per
    STORE."""
    if group == 1:
        return entries * config.out_elem_bytes / bytes_per_cycle + stores * STORE_CYCLES
    # A row: its bytes and half a cycle, at least `STORE_ROW_CYCLES` (measured above).
    per = max(config.out_elem_bytes / bytes_per_cycle + 0.5, STORE_ROW_CYCLES)
    return entries * per + stores * STORE_CYCLES


def tile_split(total: int, tile: int) -> list[tuple[int, int]]:
    """[(size, count)]: `total` cut into tiles of `tile`, the last one maybe smaller."""
    full, edge = divmod(total, tile)
    return [(tile, full)] + ([(edge, 1)] if edge else [])


def tile_candidates(total: int, limit: int | None = None) -> list[int]:
    """Distinct tile sizes ceil(total / k), largest first (each gives a different tile
    count); at most `limit` of them (the largest)."""
    sizes = sorted({ceil_div(total, k) for k in range(1, total + 1)}, reverse=True)
    return sizes[:limit] if limit else sizes


def check_tile_sizes(schedule, names: tuple[str, ...]):
    """ValueError unless each field `names` of `schedule` is a positive integer (what
    every schedule's tile sizes must be)."""
    for name in names:
        value = getattr(schedule, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(schedule).__name__}.{name} must be a positive integer, "
                             f"not {value!r}")


def overflow_detail(over: dict[str, tuple[int, int]]) -> str:
    """A schedule's overflows ({buffer: (need, depth)}) as one clause per buffer, for
    the message of its `check`."""
    return "; ".join(f"{name} needs {need} elements, has {depth} (over by "
                     f"{need - depth})" for name, (need, depth) in over.items())


# --- the activation layout ------------------------------------------------------------------

def activation_block(config: HardwareConfig) -> int:
    """Channels per block of every activation in DRAM, L = max(block_in, block_out): the
    one layout producers STORE and consumers LOAD (`vdla.compiler.targets.vdla.placement`
    re-exports it). Block sizes are powers of two, so the smaller block divides L: a pixel
    of an L-block holds ``L / block_in`` inp elements (a consumer LOADs them contiguously)
    and ``L / block_out`` out elements (a producer STOREs each to its place)."""
    return max(config.block_in, config.block_out)


class PerChannelBlocks:
    """The block counts a per-channel op's layer (a pool, an elementwise op) derives from
    its `blocks` (output channel blocks), `ratio` (input blocks per output block) and
    `group` (output blocks per activation block where block_in > block_out, else 1)."""

    @property
    def in_blocks(self) -> int:
        """Input channel blocks (the channels padded to whole output blocks, or where
        block_in > block_out to whole activation blocks of `group` output blocks)."""
        return self.window_blocks(self.blocks)

    @property
    def out_planes(self) -> int:
        """Output blocks per pixel in DRAM (padded to whole activation blocks)."""
        return ceil_div(self.blocks, self.group) * self.group

    @property
    def identities(self) -> int:
        """Identity (or selection, where block_in > block_out) weight blocks."""
        return self.ratio if self.group == 1 else self.group

    def window_blocks(self, tc: int) -> int:
        """Input blocks of `tc` output blocks (from an activation block's first)."""
        return tc * self.ratio if self.group == 1 else ceil_div(tc, self.group)


def inp_group(config: HardwareConfig) -> int:
    """inp elements (block_in channels) per pixel of an activation block: 1 when block_in
    >= block_out, else block_out / block_in (a LOAD brings them contiguously and the
    micro-ops index inp SRAM as ``pixel * group + j`` for sub-block j)."""
    return activation_block(config) // config.block_in


def out_group(config: HardwareConfig) -> int:
    """out elements (block_out channels) per pixel of an activation block: 1 when
    block_out >= block_in, else block_in / block_out (a STORE writes each out element
    to its place, `out_group` elements apart)."""
    return activation_block(config) // config.block_out


def pack_activation(x: np.ndarray, config: HardwareConfig, elem: int,
                    channels: int | None = None) -> np.ndarray:
    """int8 (N, C, H, W) in the DRAM layout of activations (`activation_block` L), seen as
    elements of `elem` channels (block_in for a LOAD INP, block_out for a STORE): (N /
    batch, C' / L, H, W, L / elem, batch, elem) with C' = `channels` (default C) rounded
    up to L, zero padded. With batch 1 this is ``NCHW1n{L}c`` whatever `elem` is."""
    x = np.asarray(x)
    block = activation_block(config)
    c = ceil_div(channels if channels is not None else x.shape[1], block) * block
    if c != x.shape[1]:
        x = np.pad(x, ((0, 0), (0, c - x.shape[1]), (0, 0), (0, 0)))
    b = config.batch
    n = ceil_div(x.shape[0], b) * b
    if n != x.shape[0]:
        x = np.pad(x, ((0, n - x.shape[0]), (0, 0), (0, 0), (0, 0)))
    h, w = x.shape[2:]
    blocked = x.reshape(n // b, b, c // block, block // elem, elem, h, w)
    return np.ascontiguousarray(blocked.transpose(0, 2, 5, 6, 3, 1, 4))


def unpack_activation(raw: np.ndarray, config: HardwareConfig, elem: int, shape,
                      physical: int | None = None) -> np.ndarray:
    """The inverse of `pack_activation`: int8 bytes of `physical` channels (default
    shape[1], rounded up to L) -> int8 `shape` (N, C, H, W), the first C channels."""
    n, ch, h, w = shape
    block, b = activation_block(config), config.batch
    c = ceil_div(physical if physical is not None else ch, block) * block
    nb = ceil_div(n, b)
    x = np.asarray(raw).view(np.int8).reshape(nb, c // block, h, w, block // elem, b, elem)
    x = x.transpose(0, 5, 1, 4, 6, 2, 3).reshape(nb * b, c, h, w)
    return np.ascontiguousarray(x[:n, :ch])


def vector_pass_cycles(entries: int, outer: int, config: HardwareConfig,
                       held: bool = True) -> int:
    """Issue cycles of one ALU pass with a vector operand over `entries` acc entries in
    `outer` outer iterations: two per micro-op, or on a config with ``alu_hold`` (for an
    instruction of the shape that holds its row, `held`) one per micro-op plus a free
    cycle before each outer iteration after the first."""
    if config.alu_hold and held:
        return entries + max(0, outer - 1)
    return 2 * entries


def acc_rows(values: np.ndarray, config: HardwareConfig) -> np.ndarray:
    """Per-channel int32 rows (..., padded channels) -> acc elements (..., channel blocks,
    batch, block_out): each value replicated over the batch rows."""
    v = values.reshape(values.shape[:-1] + (-1, 1, config.block_out))
    return np.ascontiguousarray(np.broadcast_to(
        v, values.shape[:-1] + (v.shape[-3], config.batch, config.block_out)).astype(np.int32))


def identity_blocks(config: HardwareConfig, ratio: int, scale: int = 1) -> np.ndarray:
    """The weight blocks that move int8 activations into the accumulators on the GEMM
    core: ``E_j[o, i] = scale * (o == j * block_in + i)`` for j < `ratio` (input blocks per
    output block), int8 (ratio, block_out, block_in). A micro-op with ``E_j`` adds input
    block j of an output block's channels (times `scale`) to the accumulators. Where
    block_in > block_out the blocks select instead: ``S_j[o, i] = scale * (i == j *
    block_out + o)`` for j < `ratio` (output blocks per input block) adds output block j
    of an input block's channels."""
    o = np.arange(config.block_out)[None, :, None]
    i = np.arange(config.block_in)[None, None, :]
    j = np.arange(ratio)[:, None, None]
    if config.block_in > config.block_out:
        return ((i == j * config.block_out + o) * scale).astype(np.int8)
    return ((o == j * config.block_in + i) * scale).astype(np.int8)


#: The input vector the bias GEMM multiplies (`bias_blocks`): lane 0 holds 1, the others
#: this, so that a weight block's row holds a bias as ``w0 + ONES_HIGH * (w1 + w2 + ...)``.
ONES_HIGH = 127


def gemm_bias_limit(config: HardwareConfig) -> int:
    """The largest |bias| the bias GEMM can add (`bias_blocks`): ``w0`` in [-63, 63] and
    ``block_in - 1`` lanes of at most 127 each times `ONES_HIGH`."""
    return ONES_HIGH * 127 * (config.block_in - 1) + ONES_HIGH // 2


def ones_vector(config: HardwareConfig) -> np.ndarray:
    """The bias GEMM's input element: (batch, block_in) int8, [1, ONES_HIGH, ...] per row."""
    v = np.full((config.batch, config.block_in), ONES_HIGH, np.int8)
    v[:, 0] = 1
    return v


def bias_blocks(values: np.ndarray, config: HardwareConfig) -> np.ndarray:
    """Per-channel int32 constants (padded O,) as weight blocks (O / block_out, block_out,
    block_in) int8 whose GEMM with `ones_vector` adds exactly them to the accumulators:
    ``W[o, 0] + ONES_HIGH * sum(W[o, 1:]) = value[o]``. One GEMM micro-op per acc entry
    adds a bias that way, where an ALU ADD with a vector operand takes two cycles (the acc
    buffer's one read port). ValueError beyond `gemm_bias_limit`."""
    v = np.asarray(values, np.int64)
    limit = gemm_bias_limit(config)
    if config.block_in < 2 or np.abs(v).max(initial=0) > limit:
        raise ValueError(f"bias values up to {np.abs(v).max(initial=0)} exceed what the bias "
                         f"GEMM adds on block_in {config.block_in} (|bias| <= {limit})")
    high = np.round(v / ONES_HIGH).astype(np.int64)
    w = np.zeros((len(v), config.block_in), np.int64)
    w[:, 0] = v - ONES_HIGH * high
    rest = high.copy()
    for lane in range(1, config.block_in):    # spread the high part, 127 a lane at most
        part = np.clip(rest, -127, 127)
        w[:, lane] = part
        rest -= part
    assert not rest.any()
    return w.astype(np.int8).reshape(-1, config.block_out, config.block_in)


# --- micro-op tables ------------------------------------------------------------------------

class KernelTable:
    """Micro-op kernels interned by content: `kernel(uops)` appends a kernel once and
    returns its (uop_bgn, uop_end), so tiles of one shape share their micro-ops. The
    pool and elementwise tables build on it."""

    def __init__(self):
        self.uops: list[Uop] = []
        self._kernels: dict[tuple, tuple[int, int]] = {}

    def kernel(self, uops) -> tuple[int, int]:
        """(uop_bgn, uop_end) of micro-ops `uops`, appended once."""
        key = tuple(uops)
        if key not in self._kernels:
            self._kernels[key] = (len(self.uops), len(self.uops) + len(key))
            self.uops.extend(key)
        return self._kernels[key]


# --- the arena ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Region:
    offset: int   # bytes from the arena's start
    nbytes: int


def layout_arena(sizes: dict[str, int], config: HardwareConfig) -> tuple[dict, int]:
    """Regions of `sizes` bytes, in order, each aligned for every element type:
    ({name: Region}, arena bytes)."""
    align = dram_alignment(config)
    regions, offset = {}, 0
    for name, nbytes in sizes.items():
        regions[name] = Region(offset, nbytes)
        offset += ceil_div(nbytes, align) * align
    return regions, max(offset, align)


class ArenaProgram:
    """What lowered ops share (a mixin for their dataclasses, which hold `program` and
    `config`): the blocked activation layouts and relocation."""

    @property
    def data_layout(self) -> str:
        """The input activations' layout in the arena."""
        return f"NCHW{self.config.batch}n{self.config.block_in}c"

    @property
    def out_layout(self) -> str:
        """The output activations' layout in the arena."""
        return f"NCHW{self.config.batch}n{self.config.block_out}c"

    def relocate(self, base: int) -> Program:
        """The program for an arena at DRAM byte address `base` (see `relocate`)."""
        return relocate(self.program, base, self.config)


class IdentityTables(ArenaProgram):
    """What pools and elementwise ops share (a mixin for their dataclasses, which hold
    `uop_bytes`, `const_rows` and a `layer` with `ratio`): the static data of programs
    whose weights are identity blocks (`load_tables`)."""

    def static_data(self) -> dict:
        """The arena regions that stay the same from run to run: {region: array}
        (micro-ops, the identity blocks scaled by the layer's `weight_scale` if it has
        one, the constant rows)."""
        layer = self.layer
        data = {"uop": np.frombuffer(self.uop_bytes, np.uint8),
                "weights": identity_blocks(self.config, layer.identities,
                                           getattr(layer, "weight_scale", 1))}
        if len(self.const_rows):
            data["const"] = acc_rows(self.const_rows, self.config)
        return data


def load_tables(p, regions: dict, config: HardwareConfig, n_uops: int, const_base: int,
                n_const: int, n_weights: int):
    """The start of a program that keeps its tables for the whole run (pools, elementwise
    ops): LOAD UOP of its `n_uops` micro-ops, LOAD ACC of `n_const` constant-row entries
    to acc index `const_base` (if any), LOAD WGT of its `n_weights` identity blocks to
    wgt index 0, each from its arena region ("uop", "const", "weights")."""
    def base(name: str, elem_bytes: int) -> int:
        return regions[name].offset // elem_bytes

    p.load(MemoryType.UOP, sram_base=0, dram_base=base("uop", config.uop_bytes), y_size=1,
           x_size=n_uops, x_stride=n_uops)
    if n_const:
        p.load(MemoryType.ACC, sram_base=const_base,
               dram_base=base("const", config.acc_elem_bytes), y_size=1, x_size=n_const,
               x_stride=n_const)
    p.load(MemoryType.WGT, sram_base=0, dram_base=base("weights", config.wgt_elem_bytes),
           y_size=1, x_size=n_weights, x_stride=n_weights)


def dense_dma(p: ProgramBuilder, store: bool, sram: int, dram: int, rows: int, cols: int,
         stride: int, elem_rows: int):
    """`rows` DRAM rows of `cols` elements, `stride` apart, to/from dense SRAM from `sram`:
    one 2-D DMA (1-D when the rows are consecutive), or one per row when the stride does
    not fit the x_stride field (an image of more than 65535 pixels)."""
    if stride == cols:  # the rows are consecutive (a whole image per row, or 1 x 1 pixels)
        rows, cols = 1, rows * cols
    if rows == 1 or stride <= STRIDE_MAX:
        chunks = [(0, rows, stride if rows > 1 else cols)]
    else:
        chunks = [(r, 1, cols) for r in range(rows)]
    for r, y, x_stride in chunks:
        fields = dict(sram_base=sram + r * elem_rows, dram_base=dram + r * stride, y_size=y,
                      x_size=cols, x_stride=x_stride)
        if store:
            p.store(**fields)
        else:
            p.load(MemoryType.INP, **fields)


def activation_dma(p: ProgramBuilder, sram: int, plane: int, w: int, y0: int, y1: int,
                   x0: int, x1: int, group: int, pads: dict | None = None):
    """LOAD INP of rows `y0`:`y1`, columns `x0`:`x1` of one activation block (an image
    `w` pixels wide whose first inp element is `plane`) into dense SRAM from `sram`:
    each pixel is `group` inp elements side by side (`inp_group`), so a row is
    ``(x1 - x0) * group`` elements and a column of padding ``group`` elements. `pads`: the
    LOAD's y_pad_0, y_pad_1, x_pad_0, x_pad_1 in pixels."""
    pads = dict(pads or {})
    for key in ("x_pad_0", "x_pad_1"):
        if key in pads:
            pads[key] *= group
    if contiguous_rows(w, x1 - x0, y1 - y0, pads):   # one DMA row
        p.load(MemoryType.INP, sram_base=sram, dram_base=plane + y0 * group, y_size=1,
               x_size=(y1 - y0) * group, x_stride=(y1 - y0) * group)
        return
    p.load(MemoryType.INP, sram_base=sram, dram_base=plane + (y0 * w + x0) * group,
           y_size=y1 - y0, x_size=(x1 - x0) * group, x_stride=w * group, **pads)


def store_activation(p: ProgramBuilder, sram: int, plane: int, w: int, y0: int, th: int,
                     x0: int, tw: int, group: int, j: int):
    """STORE a dense OUT tile (`th` rows of `tw` pixels from `sram`) into rows from `y0`,
    columns from `x0` of an image `w` pixels wide whose activation block starts at out
    element `plane`, as sub-block `j` of `group` out elements per pixel (`out_group`):
    one 2-D STORE when each pixel is one out element; else each pixel's element lands
    `group` elements after the previous one (x_size 1, x_stride `group`), one STORE for
    the tile when its rows are whole image rows, else one per row."""
    if group == 1:
        if w == 1 and tw == 1:   # a sequence's rows, one DMA row (a write burst a row
            th, tw = 1, th       # costs half a cycle more than its bytes)
        p.store(sram_base=sram, dram_base=plane + y0 * w + x0, y_size=th, x_size=tw,
                x_stride=w)
        return
    rows = [(0, th * tw)] if tw == w else [(r, tw) for r in range(th)]
    for r, n in rows:
        p.store(sram_base=sram + r * tw, dram_base=plane + ((y0 + r) * w + x0) * group + j,
                y_size=n, x_size=1, x_stride=group)


def run_arena(dev, lowered, data: dict) -> tuple[np.ndarray, dict]:
    """Run one lowered op on `dev` in an arena of its own: allocate it, write `data`
    ({region: array}), run the relocated program, read the "output" region back, free
    everything. Returns (output bytes as uint8, the run's statistics)."""
    if dev.config != lowered.config:
        raise ValueError(f"{lowered.node!r} was lowered for config {lowered.config.name}, "
                         f"the device has {dev.config.name}")
    base = dev.alloc(lowered.arena_bytes)
    insn_addr = None
    try:
        for name, array in data.items():
            if array.nbytes:
                dev.write(base + lowered.regions[name].offset, array)
        insn_addr, count = dev.load_program(lowered.relocate(base))
        stats = dev.run(insn_addr, count)
        out = lowered.regions["output"]
        raw = dev.read(base + out.offset, out.nbytes)
    finally:
        dev.free(base)
        if insn_addr is not None:
            dev.free(insn_addr)
    return raw, stats


# --- the start of a lowering ----------------------------------------------------------------

def start_lowering(what: str, node, graph, config: HardwareConfig, schedule, describe,
                   choose, kind: type):
    """What every lowering starts with. Returns (node, description, clamped schedule).

    what : the lowering's name, for the messages (``"lower_conv2d"``)
    node : a graph node, or its name in `graph`
    graph, config : the graph and the `HardwareConfig` it is lowered for
    schedule : the schedule to lower with, or None for `choose`'s
    describe : ``describe(node, graph, config)`` -> a tuple whose first item is the layer
        (ValueError naming the node for what the back half cannot run)
    choose : ``choose(layer, config)`` -> the default schedule
    kind : the schedule class; a schedule of another kind is a TypeError
    The schedule is checked against the config's buffers (ValueError naming every buffer
    it overflows) and clamped to the layer."""
    if isinstance(node, str):
        node = graph.node(node)
    described = describe(node, graph, config)
    layer = described[0]
    schedule = schedule or choose(layer, config)
    if not isinstance(schedule, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{what}: schedule must be {article} {kind.__name__}, not "
                        f"{type(schedule).__name__}")
    schedule.check(layer, config)
    return node, described, schedule.clamped(layer)


# --- the default schedules, remembered across processes ------------------------------------

#: The folder of `cache_root()` that holds the default choosers' answers.
SCHEDULE_CACHE = "schedules"


def remembered_schedule(kind: str, layer, config: HardwareConfig, choose: Callable[[], Any],
                        schedule_type: type, accept: Callable[[Any], bool] | None = None,
                        **options) -> Any:
    """`choose()`, the default `schedule_type` of `layer` on `config`, answered from the
    on-disk cache (``cache_root()/schedules``, `vdla._memo`) when it holds the answer for
    `kind`, the layer's fields, the whole config, `options` and this version of the code
    of `choose`'s module (the chooser's: `conv_layer`, `pool`; with every project module
    it imports, so its timing model and fits, the config and the ISA: `vdla._keys`).

    A remembered schedule is used only if it still fits the layer's buffers and
    `accept(schedule)` (when given) holds; any other is chosen again and rewritten."""
    def decode(data):
        if not isinstance(data, dict):
            raise TypeError(f"a remembered schedule is a JSON object, not {data!r}")
        schedule = schedule_type(**data)
        if not schedule.fits(layer, config) or (accept is not None and not accept(schedule)):
            raise ValueError(f"remembered schedule {schedule} does not serve {layer}")
        return schedule

    return remembered(SCHEDULE_CACHE, kind,
                      {"layer": layer, "config": config.to_dict(), "options": options},
                      choose, to_json=dataclasses.asdict, from_json=decode, code=choose)
