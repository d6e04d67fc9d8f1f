"""Standalone elementwise ops on the accelerator's vector ALU: an int8 ``relu``, a
``qadd`` (two int8 activations, or one and the quantizer's all-zero constant operand: how
`vdla.compiler.passes.quantize` writes a rescale and a standalone clip) and, on a config
with the ALU's lookup table, a ``qgelu``.

* ``relu(x)``: ``max(x, 0)``;
* ``qgelu(x)``: the integer GELU, one TAB pass by the immediate 127 over the table of its 256
  values (`vdla.compiler.targets.vdla.table`), which the program loads first;
* ``qadd(a, b)``: ``clip(wrap32(requantize(a, a_multiplier, a_shift) + requantize(b,
  b_multiplier, b_shift)), out_min, out_max)`` (`vdla.compiler.reference.integer`), a and
  b of the same shape (no broadcasting); a zero operand drops out (``requantize(0) == 0``).
  Multipliers and shifts are per tensor (immediates) or per channel (vector operands).

Inputs int8 (N, C, H, W) or (N, C) (an image of 1 x 1 pixels) and the output in the
activation layout (`common.pack_activation`: what a producer writes); an output channel
block takes ``ratio = block_out / block_in`` input blocks, or where block_in = `group` x
block_out a selection block of its input block, as for the pools.

*Identity weights.* Only the GEMM core moves int8 activations into the int32 acc buffer
(a LOAD ACC reads int32 DRAM: four times the bytes, on the compute module). The arena
holds `ratio` weight blocks ``E_j[o, i] = (o == j * block_in + i)``; a GEMM micro-op with
``E_j`` adds input block ``j`` of an output block's channels to the accumulators, as
`vdla.compiler.targets.vdla.pool` widens max-pool windows.

Per tile (``tile_p`` pixels x ``tile_c`` channel blocks of one batch block, see
`ElementwiseSchedule`) the load module brings each operand's window (one 2-D DMA per
operand: a row of the tile's pixels per input block, H x W apart), then the compute module
runs one of three plans, chosen from the requantizations (`ElementwiseLayer`):

* **one operand** (``relu``, ``qgelu``, ``qadd`` with a zero operand): GEMM reset of the
  acc tile, GEMM with ``E_j`` (widen), the requantization (`requant.requant_steps`: MUL,
  rounding ADD, SHR; a qgelu's TAB), the clamp (MAX out_min, MIN out_max; a bound an int8
  value cannot pass is skipped, so a ReLU is MAX 0 alone and a qgelu has none);
* **both operands requantized** (`separate`): reset the tile and a second acc region, one
  GEMM widens ``a`` into the tile and ``b`` into that region, each one's requantization,
  ALU ADD of the region into the tile (a vector operand), the clamp;
* **one or neither requantized**: reset, widen the requantized operand (neither: one GEMM
  sums both), its requantization, a second GEMM with ``E_j`` adding the other operand onto
  the tile (the GEMM accumulates with the ALU ADD's int32 wrap-around), the clamp. This
  saves the second region, its reset and the two-cycle vector ADD.

GEMM and ALU also write every result narrowed into the out buffer: one 2-D STORE per tile
copies out what the last pass left.

*Time.* The compute module issues one GEMM, reset or ALU-immediate micro-op per cycle
and one ALU micro-op with a vector operand per two cycles. Per acc entry (batch x
block_out values) a ReLU takes 1 (reset) + ratio (widen) + 1 (MAX) cycles, a shift-only
add of two requantized operands 2 + 2 ratio + 2 x 2 (rounding ADD, SHR) + 2 (vector ADD)
+ 2 (clamp) = 12 at ratio 1, while the DMAs move one entry per operand in 2 cycles (at
8 bytes per cycle): the op is bound by the compute module. Measured on Verilator (default
config, 64 x 56 x 56): that add 155 k cycles (0.77 per element), 92 k with one operand
requantized, 66 k with neither, a ReLU 40 k; `estimate_elementwise` is within 1%.

Tiles alternate between two regions of the inp buffer and two of the acc/out buffers
(`PingPong`), so tile ``k + 1``'s loads and tile ``k - 1``'s stores overlap tile ``k``'s
compute. Tokens (`RegionTokens`), for tile ``k``: load->compute after its loads (RAW);
compute->load after the last GEMM reading its window, when tile ``k + 2`` loads there
(WAR); compute->store after its last pass (RAW); store->compute after its stores, when
tile ``k + 2`` writes that acc/out region (WAR); FINISH pops the last store token. The
second operand's acc region is shared by all tiles: only compute touches it, in order.

DRAM arena: micro-ops, constant rows (acc elements: per-channel or large requantization
constants), identity weights, the int8 inputs read (``input0``, ``input1``), the output.

Why this module is long: the elementwise family is one module, as the pools are (the
layer, its three plans, the schedule, the timing model and the emitter read the same
operand and region layout), and every block shape runs here: where block_in and
block_out differ, the operands' activation blocks are widened or selected per output
block, which the plans, the model and the emitter all count.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.common import (INSN_CYCLES, PerChannelBlocks, ITER_MAX,
                                               IdentityTables, dma_cycles,
                                               KernelTable, ceil_div, check_array,
                                               pack_activation, store_activation, store_cycles,
                                               unpack_activation, check_tile_sizes, dense_dma,
                                               layout_arena, load_tables, overflow_detail,
                                               run_arena, start_lowering, tile_candidates,
                                               tile_split)
from vdla.compiler.targets.vdla.requant import AluStep, check_alu_ops, requant_steps
from vdla.compiler.targets.vdla.sequence import image_shape, pixel_rows
from vdla.compiler.targets.vdla.table import (TABLE_OFFSETS, TABLE_OPS, TAB_ENTRY_BYTES,
                                              load_table, table_entries, table_load_cycles,
                                              table_problem)
from vdla.config import TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import Program, Uop, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import PingPong, RegionTokens

__all__ = ["ELEMENTWISE_OPS", "ElementwiseLayer", "ElementwiseSchedule", "LoweredElementwise",
           "choose_elementwise", "elementwise_layer", "estimate_elementwise",
           "lower_elementwise", "run_elementwise"]

#: The standalone elementwise ops the accelerator runs (those of `TABLE_OPS` on a config
#: with the ALU's table).
ELEMENTWISE_OPS = ("relu", "qadd") + TABLE_OPS
#: The ops of one int8 operand (the rest are qadd's two).
_ONE_OPERAND = ("relu",) + TABLE_OPS


# --- the layer ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class ElementwiseLayer(PerChannelBlocks):
    """A standalone elementwise workload: `op` (``"relu"``, ``"qadd"``, ``"qgelu"``), plain
    sizes `n`, `c`, `h`, `w` (h = w = 1 for an (N, C) tensor, `rank` 2; a sequence, (S, D) of rank 2
    or (1, S, D) of rank 3, is the image (1, D, S, 1) of its rows, `sequence`:
    `vdla.compiler.targets.vdla.sequence`), `batch_blocks`, output channel
    `blocks`, `ratio` input blocks per output block; `inputs`: the node inputs read, first
    operand first (a zero constant is not read); `first`, `second`: their requantization's
    ALU steps; `separate`: the second is widened into an acc region of its own and added
    by an ALU ADD (both requantized), else added onto the tile by a GEMM; `clamp`: the
    final MAX/MIN steps; `const_rows`: vector operand rows kept in the acc buffer."""

    op: str
    n: int
    c: int
    h: int
    w: int
    rank: int = 4
    sequence: bool = False
    batch_blocks: int
    blocks: int
    ratio: int = 1
    group: int = 1
    inputs: tuple[int, ...] = (0,)
    first: tuple[AluStep, ...] = ()
    second: tuple[AluStep, ...] = ()
    separate: bool = False
    clamp: tuple[AluStep, ...] = ()
    const_rows: int = 0

    @property
    def pixels(self) -> int:
        """Pixels per channel (H x W)."""
        return self.h * self.w

    @property
    def operands(self) -> int:
        """Activations the program reads (1 or 2)."""
        return len(self.inputs)

    @property
    def table(self) -> bool:
        """The program loads the ALU's lookup table (a step is a TAB)."""
        return any(st.op == AluOp.TAB for st in self.first)

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: none (the GEMM core only moves data)."""
        return 0

    @property
    def late(self) -> bool:
        """The second operand is added by a GEMM after the first one's requantization."""
        return self.operands == 2 and not self.separate and bool(self.first)

    def alu_steps(self) -> tuple[AluStep, ...]:
        """Every ALU pass over a tile, in order (the vector ADD of `separate` included)."""
        add = (AluStep(AluOp.ADD, row=-1),) if self.separate else ()
        return self.first + self.second + add + self.clamp

    def entry_cycles(self) -> int:
        """Compute-module cycles per acc entry of a tile: resets, widening GEMMs (one
        micro-op per input block and operand), ALU passes (two cycles with a vector
        operand)."""
        resets = 2 if self.separate else 1
        alu = sum(1 if st.row is None else 2 for st in self.alu_steps())
        return resets + self.operands * self.ratio + alu

    def instructions(self) -> int:
        """GEMM/ALU instructions per tile."""
        gemms = 2 + (1 if self.late else 0)   # reset, widen (late: the second operand)
        return gemms + len(self.alu_steps())

    def uop_count(self, schedule) -> int:
        """Micro-ops the program loads for `schedule` (the `ElementwiseSchedule` check)."""
        return len(ElementwiseUops(self, schedule.clamped(self), None).uops)


def _plain_shape(graph: Graph, node: Node, name: str, what: str,
                 config: HardwareConfig) -> tuple:
    """(n, c, h, w, rank, sequence) of an int8 activation, a sequence as the image of its
    rows; ValueError naming the node otherwise."""
    t = graph.tensors[name]
    if t.dtype != "int8":
        raise ValueError(f"{node.op} node {node.name!r}: {what} {name!r} is {t.dtype}; the "
                         "accelerator runs elementwise ops on int8 data only")
    if t.layout:
        raise ValueError(f"{node.op} node {node.name!r}: {what} {name!r} has layout "
                         f"{t.layout!r}; lower_elementwise takes the plain NCHW/NC node and "
                         "packs itself")
    shape = tuple(int(d) for d in t.shape)
    if len(shape) in (2, 3) and pixel_rows(graph, name, config):
        return image_shape(shape) + (len(shape), True)
    if len(shape) == 4:
        return shape + (4, False)
    if len(shape) == 2:
        return shape + (1, 1, 2, False)
    raise ValueError(f"{node.op} node {node.name!r}: {what} {name!r} has shape {shape}; "
                     "elementwise ops on vdla take (N, C, H, W), (N, C) or a sequence "
                     "(1, S, D)")


def elementwise_layer(node: Node, graph: Graph,
                      config: HardwareConfig) -> tuple[ElementwiseLayer, np.ndarray]:
    """(layer, constant rows (R, padded C) int32) of a ``relu``, ``qadd`` or ``qgelu``
    node; ValueError naming the node, the value and what is allowed for what the back
    half cannot run (float data, other ranks, broadcasting, a non-zero constant operand,
    a multiplier without MUL, clamp bounds outside int8, a qgelu without the ALU's
    table)."""
    if node.op not in ELEMENTWISE_OPS:
        raise ValueError(f"lower_elementwise lowers {', '.join(ELEMENTWISE_OPS)} nodes, not "
                         f"{node.name!r} ({node.op})")
    out_shape = tuple(int(d) for d in graph.tensors[node.outputs[0]].shape)
    if node.op in TABLE_OPS and (problem := table_problem(node, config)):
        raise ValueError(f"{node.op} node {node.name!r}: {problem}")
    if node.op in _ONE_OPERAND:
        activations = [0]
    else:
        activations = []
        for i, name in enumerate(node.inputs[:2]):
            data = graph.constant(name)
            if data is None:
                activations.append(i)
                continue
            data = np.asarray(data)
            if data.size and np.any(data != 0):
                values = np.unique(data).tolist()
                shown = str(values[:4])[:-1] + (", ...]" if len(values) > 4 else "]")
                raise ValueError(f"qadd node {node.name!r}: input {'ab'[i]} is the constant "
                                 f"{name!r} with values {shown}; the accelerator adds two "
                                 "activations or an activation and an all-zero constant (a "
                                 "rescale or clip) only")
        if not activations:
            raise ValueError(f"qadd node {node.name!r}: both inputs are constants; constant "
                             "folding computes it, there is nothing to run")
    def label(i: int) -> str:
        return "input" if node.op in _ONE_OPERAND else f"input {'ab'[i]}"

    shapes = [_plain_shape(graph, node, node.inputs[i], label(i), config)
              for i in activations]
    n, c, h, w, rank, sequence = shapes[0]
    for (i, shape) in zip(activations, shapes):
        plain = tuple(graph.tensors[node.inputs[i]].shape)
        if plain != out_shape:
            raise ValueError(f"{node.op} node {node.name!r}: {label(i)} "
                             f"{node.inputs[i]!r} has shape {plain} but the output has "
                             f"{out_shape}; the accelerator does not broadcast (both "
                             "inputs must have the output's shape, (N, C, H, W) or (N, C))")
        if shape[5] != sequence:
            kind = "as the image of its rows" if shape[5] else "as a batch of rows"
            raise ValueError(f"{node.op} node {node.name!r}: {label(i)} "
                             f"{node.inputs[i]!r} is laid out {kind} but "
                             f"{node.inputs[activations[0]]!r} is not: both must be alike")

    blocks = ceil_div(c, config.block_out)
    padded = blocks * config.block_out
    rows: list[np.ndarray] = []
    a = node.attrs
    if sequence and len(out_shape) == 3:
        # The reference requantizes along axis 1, the rows of a (1, S, D) sequence: the
        # ALU's vector operands are per channel, so only one value for all runs here.
        for key in ("a_multiplier", "a_shift", "b_multiplier", "b_shift"):
            value = a.get(key)
            if value is not None and np.size(value) > 1:
                raise ValueError(f"{node.op} node {node.name!r}: {key} has {np.size(value)} "
                                 f"values, one per row of the sequence {out_shape}; the "
                                 "accelerator requantizes a sequence per tensor (one value)")
    if node.op == "relu":
        steps = {0: []}
        lo, hi = 0, 127
    elif node.op in TABLE_OPS:   # the entries are the int8 results: no clamp
        steps = {0: [AluStep(AluOp.TAB, imm=TABLE_OFFSETS[node.op])]}
        lo, hi = -128, 127
    else:
        steps = {}
        for i in activations:
            key = "ab"[i]
            steps[i], _ = requant_steps(node, a[f"{key}_multiplier"], a[f"{key}_shift"], c,
                                        padded, rows, fold=False)
        lo, hi = int(a["out_min"]), int(a["out_max"])
        if not -128 <= lo <= hi <= 127:
            raise ValueError(f"qadd node {node.name!r}: out_min {lo} and out_max {hi} must "
                             "satisfy -128 <= out_min <= out_max <= 127")
    check_alu_ops(node, [st for seq in steps.values() for st in seq], config)

    order = list(activations)
    separate = False
    if len(order) == 2:
        if steps[0] and steps[1]:
            separate = True
        elif steps[1] and not steps[0]:
            order.reverse()   # the requantized operand first, the other one added onto it
    first = tuple(steps[order[0]])
    second = tuple(steps[order[1]]) if len(order) == 2 else ()
    # One operand that is not requantized is an int8 value already: a bound at the int8
    # limit needs no pass (and the GEMM's narrowed write is exact).
    exact_int8 = len(order) == 1 and (not first or node.op in TABLE_OPS)
    clamp = tuple(st for st in (AluStep(AluOp.MAX, imm=lo), AluStep(AluOp.MIN, imm=hi))
                  if not (exact_int8 and st.imm == (-128 if st.op == AluOp.MAX else 127)))
    table = (np.stack(rows) if rows else np.zeros((0, padded), np.int64)).astype(np.int32)
    layer = ElementwiseLayer(op=node.op, n=n, c=c, h=h, w=w, rank=rank, sequence=sequence,
                             batch_blocks=ceil_div(n, config.batch), blocks=blocks,
                             ratio=max(config.block_out // config.block_in, 1),
                             group=max(config.block_in // config.block_out, 1),
                             inputs=tuple(order),
                             first=first, second=second, separate=separate, clamp=clamp,
                             const_rows=len(table))
    return layer, table


# --- the schedule and its micro-ops ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ElementwiseSchedule:
    """Tiling of a standalone elementwise op (`ElementwiseLayer`: an int8 ``relu`` or a
    ``qadd``): `tile_p` pixels (of the image's H x W, taken in row-major order) by `tile_c`
    channel blocks (output blocks of block_out channels) of one batch block per tile;
    tiles larger than the layer are clamped to it."""

    tile_p: int
    tile_c: int

    def __post_init__(self):
        check_tile_sizes(self, ("tile_p", "tile_c"))

    def clamped(self, layer) -> "ElementwiseSchedule":
        # Where block_in > block_out, a tile takes whole activation blocks.
        g = layer.group
        return ElementwiseSchedule(min(self.tile_p, layer.pixels),
                                   min(ceil_div(self.tile_c, g) * g, layer.blocks))

    def needs(self, layer, config: HardwareConfig,
              uops: bool = True) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling, and its depth: {name: (need,
        depth)}. The inp buffer holds two tiles' operand windows and the acc/out buffer
        two output tiles (ping-pong with the loads and the stores); when both operands of
        an add are requantized, the second one has a widened region of its own in the acc
        buffer. `uops=False` skips the micro-op count."""
        s = self.clamped(layer)
        tile = s.tile_p * s.tile_c
        need = {
            "inp": (2 * layer.operands * layer.window_blocks(s.tile_c) * s.tile_p,
                    config.inp_depth),
            "wgt": (layer.identities, config.wgt_depth),
            "acc": (2 * tile + (tile if layer.separate else 0)
                    + layer.const_rows * layer.blocks, config.acc_depth),
            "out": (2 * tile, config.out_depth),
        }
        if uops:
            need["uop"] = (layer.uop_count(s), config.uop_depth)
        return need

    def overflows(self, layer, config: HardwareConfig) -> dict:
        """The limits this tiling exceeds: {buffer or "iter": (need, limit)}; empty when it
        fits. "iter" is the largest loop count of an instruction."""
        s = self.clamped(layer)
        over = {k: v for k, v in self.needs(layer, config).items() if v[0] > v[1]}
        if max(s.tile_p, s.tile_c) > ITER_MAX:
            over["iter"] = (max(s.tile_p, s.tile_c), ITER_MAX)
        return over

    def fits(self, layer, config: HardwareConfig) -> bool:
        return not self.overflows(layer, config)

    def check(self, layer, config: HardwareConfig):
        """Raise ValueError naming every buffer this tiling overflows, and by how much."""
        over = self.overflows(layer, config)
        if over:
            detail = overflow_detail(over)
            raise ValueError(f"elementwise schedule {self} does not fit config "
                             f"{config.name}: {detail}")


def elementwise_tiles(L: ElementwiseLayer, s: ElementwiseSchedule):
    """The tiles in program order (batch blocks, channel tiles, pixel tiles): (position,
    batch block, first channel block, first pixel, channel blocks, pixels)."""
    starts = [(nb, ob0, p0) for nb in range(L.batch_blocks)
              for ob0 in range(0, L.blocks, s.tile_c) for p0 in range(0, L.pixels, s.tile_p)]
    for k, (nb, ob0, p0) in enumerate(starts):
        yield k, nb, ob0, p0, min(s.tile_c, L.blocks - ob0), min(s.tile_p, L.pixels - p0)


class ElementwiseUops(KernelTable):
    """Every micro-op of the program, loaded once at its start; kernels are interned by
    content (`kernel`). The inp buffer holds two operand windows (ping-pong), each with
    the operands at multiples of a full tile's size; the acc buffer the two output tiles
    at 0 and `tile`, the second operand's region at `second` (`separate` only) and the
    constant rows at the top. A tile's entries are ordered [channel block][pixel] with
    the tile's own pixel count as the block stride, which is what its dense DMAs write
    and read."""

    def __init__(self, L: ElementwiseLayer, s: ElementwiseSchedule,
                 config: HardwareConfig | None):
        super().__init__()
        self.L, self.s = L, s
        self.tile = s.tile_c * s.tile_p
        self.operand = L.window_blocks(s.tile_c) * s.tile_p   # inp entries of one operand
        self.windows = PingPong(L.operands * self.operand)
        self.outputs = PingPong(self.tile)
        self.second = self.outputs.total
        depth = config.acc_depth if config is not None else 1 << 30
        self.const_base = depth - L.const_rows * L.blocks
        # Every kernel is interned now (the table is loaded first): every region, every
        # tile width (a full tile and the last, narrower one) and channel tile.
        for k in range(2):
            for tp in sorted({s.tile_p, L.pixels % s.tile_p or s.tile_p}):
                for ob0 in range(0, L.blocks, s.tile_c):
                    self.passes(k, tp, ob0)
        self.frozen = len(self.uops)

    def passes(self, k: int, tp: int, ob0: int) -> dict:
        """The micro-op kernels of tile `k` (`tp` pixels, channel tile from block `ob0`):
        {pass: (uop_bgn, uop_end)}; "first"/"second": one per ALU step."""
        L = self.L
        o, win, wide = self.outputs.base(k), self.windows.base(k), self.second

        def widen(q: int, dst: int):
            if L.group > 1:   # output block obi: selection obi % group of its input block
                tc = min(self.s.tile_c, L.blocks - ob0)
                return [Uop(dst + obi * tp, win + q * self.operand + obi // L.group * tp,
                            obi % L.group) for obi in range(tc)]
            # Operand q, input block j of every output block -> the acc entries at dst.
            # (each pixel holds an output block's `ratio` input blocks side by side)
            return [Uop(dst, win + q * self.operand + j, j) for j in range(L.ratio)]

        def steps(seq, dst: int):
            return [self.kernel([Uop(dst, dst)]) if st.row is None else
                    self.kernel([Uop(dst, self.const_base + st.row * L.blocks + ob0)])
                    for st in seq]

        out = {"reset": self.kernel([Uop(o, 0, 0)] + ([Uop(wide, 0, 0)] if L.separate else [])),
               "first": steps(L.first, o), "second": steps(L.second, wide),
               "clamp": steps(L.clamp, o)}
        if L.operands == 1:
            out["widen"] = self.kernel(widen(0, o))
        elif L.separate:
            out["widen"] = self.kernel(widen(0, o) + widen(1, wide))
            out["add"] = self.kernel([Uop(o, wide)])
        elif L.late:
            out["widen"] = self.kernel(widen(0, o))
            out["late"] = self.kernel(widen(1, o))
        else:  # neither operand is requantized: one GEMM sums both
            out["widen"] = self.kernel(widen(0, o) + widen(1, o))
        return out


# --- lowering -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class LoweredElementwise(IdentityTables):
    """A lowered elementwise op: `program` (for an arena at DRAM address 0; `relocate`
    moves it), the arena's `regions`, the static data it expects there (`static_data`), and
    the host-side packing (`input_data`, `unpack_output`)."""

    node: str
    config: HardwareConfig
    layer: ElementwiseLayer
    schedule: ElementwiseSchedule
    program: Program
    regions: dict
    arena_bytes: int
    uop_bytes: bytes
    const_rows: np.ndarray        # (R, padded C) int32
    table_entries: np.ndarray | None = None   # int32[256]: the ALU's table (qgelu)

    def static_data(self) -> dict:
        """`IdentityTables.static_data`, and the table's entries where the op has one."""
        data = super().static_data()
        if self.table_entries is not None:
            data["table"] = self.table_entries.astype("<i4").view(np.uint8)
        return data

    def input_data(self, *args) -> dict:
        """The arena regions one run writes, from the node's inputs in order (``relu(x)``,
        ``qgelu(x)``: one; ``qadd(a, b)``: two, the zero constant included, which is not
        written): {"input0"/"input1": packed int8}."""
        L = self.layer
        want = 1 if L.op in _ONE_OPERAND else 2
        if len(args) != want:
            raise ValueError(f"{L.op} node {self.node!r} takes {want} input(s), got {len(args)}")
        shape = _plain(L)
        padded = L.blocks * self.config.block_out
        data = {}
        for i in L.inputs:
            what = "input" if L.op in _ONE_OPERAND else f"input {'ab'[i]}"
            x = check_array(args[i], shape, np.int8, what, self.node)
            x = (x.reshape(L.h, L.c).T[None, :, :, None] if L.sequence
                 else x.reshape(L.n, L.c, L.h, L.w))
            # whole output blocks of channels: `ratio` input blocks each
            data[f"input{i}"] = pack_activation(x, self.config, self.config.block_in,
                                                channels=padded)
        return data

    def unpack_output(self, raw: np.ndarray) -> np.ndarray:
        """The output region's bytes -> int8 of the node's output shape."""
        L, c = self.layer, self.config
        y = unpack_activation(raw, c, c.block_out, (L.n, L.c, L.h, L.w),
                              L.out_planes * c.block_out)
        if L.sequence:
            return np.ascontiguousarray(y[0, :, :, 0].T.reshape(_plain(L)))
        return y if L.rank == 4 else y.reshape(L.n, L.c)


def _plain(L: ElementwiseLayer) -> tuple[int, ...]:
    """The plain shape of `L`'s operands and output."""
    if L.sequence:
        return (L.h, L.c) if L.rank == 2 else (1, L.h, L.c)
    return (L.n, L.c, L.h, L.w) if L.rank == 4 else (L.n, L.c)


def lower_elementwise(node: Node | str, graph: Graph, config: HardwareConfig,
                      schedule: ElementwiseSchedule | None = None) -> LoweredElementwise:
    """Lower ``relu``, ``qadd`` or ``qgelu`` node `node` of `graph` to a program for
    `config` (see the
    module docstring); the schedule defaults to `choose_elementwise`'s. Raises ValueError
    for what the back half does not support (`elementwise_layer`) and for a schedule that
    does not fit, TypeError for a schedule of another kind."""
    node, (layer, rows), s = start_lowering("lower_elementwise", node, graph, config, schedule,
                                            elementwise_layer, choose_elementwise,
                                            ElementwiseSchedule)
    table = ElementwiseUops(layer, s, config)
    c, L = config, layer
    activation = L.batch_blocks * L.in_blocks * L.pixels * c.inp_elem_bytes
    regions, arena_bytes = layout_arena({
        "uop": len(table.uops) * c.uop_bytes,
        **({"table": TABLE_ENTRIES * TAB_ENTRY_BYTES} if L.table else {}),
        "const": L.const_rows * L.blocks * c.acc_elem_bytes,
        "weights": L.identities * c.wgt_elem_bytes,
        **{f"input{i}": activation for i in sorted(L.inputs)},
        "output": L.batch_blocks * L.out_planes * L.pixels * c.out_elem_bytes,
    }, config)
    program = _emit(layer, s, config, table, regions)
    return LoweredElementwise(node.name, config, layer, s, program, regions, arena_bytes,
                              encode_uops(table.uops, config), rows,
                              table_entries(node) if L.table else None)


def _emit(L: ElementwiseLayer, s: ElementwiseSchedule, c: HardwareConfig, u: ElementwiseUops,
          regions: dict) -> Program:
    def base(name: str, elem_bytes: int) -> int:
        return regions[name].offset // elem_bytes

    out0 = base("output", c.out_elem_bytes)
    p = ProgramBuilder(c)
    tokens = RegionTokens(p)
    load_tables(p, regions, c, len(u.uops), u.const_base, L.const_rows * L.blocks,
                L.identities)
    if L.table:
        load_table(p, regions, c)
    for k, nb, ob0, p0, tc, tp in elementwise_tiles(L, s):
        kernels = u.passes(k, tp, ob0)
        o, win = u.outputs.base(k), u.windows.base(k)
        # The operands' windows: per output block a row of the tile's pixels, each pixel
        # `ratio` input blocks side by side (H x W pixels apart in DRAM), written densely.
        tokens.load_into(("window", win))  # WAR: tile k-2's GEMMs read it
        for q, i in enumerate(L.inputs):
            dense_dma(p, False, win + q * u.operand,
                 base(f"input{i}", c.inp_elem_bytes)
                 + (nb * L.in_blocks + L.window_blocks(ob0)) * L.pixels + p0 * L.ratio,
                 L.window_blocks(tc) // L.ratio, tp * L.ratio, L.pixels * L.ratio,
                 tp * L.ratio)
        tokens.loaded()

        loop = dict(iter_out=tc, iter_in=tp, dst_factor_out=tp, dst_factor_in=1)
        widen = dict(src_factor_out=L.ratio * tp, src_factor_in=L.ratio, **loop)
        if L.group > 1:   # the kernels have a micro-op per output block
            widen = dict(iter_out=1, iter_in=tp, dst_factor_out=0, dst_factor_in=1,
                         src_factor_out=0, src_factor_in=1)

        def alu(seq, spans):
            for st, (bgn, end) in zip(seq, spans):
                if st.row is None:
                    p.alu(st.op, uop_bgn=bgn, uop_end=end, use_imm=True, imm=st.imm, **loop)
                else:  # a per-channel row: the next block's entry per block, one per pixel
                    p.alu(st.op, uop_bgn=bgn, uop_end=end, src_factor_out=1, **loop)

        def span(name: str) -> dict:
            return dict(zip(("uop_bgn", "uop_end"), kernels[name]))

        tokens.compute_into(("out", o))  # WAR: tile k-2's stores have read this region
        p.gemm(reset_reg=True, **span("reset"), **loop)
        tokens.wait_loaded()  # RAW: the windows are in
        p.gemm(**span("widen"), **widen)
        if not L.late:
            tokens.read(("window", win))  # tile k+2's loads wait for it
        alu(L.first, kernels["first"])
        if L.separate:
            alu(L.second, kernels["second"])
            p.alu(AluOp.ADD, **span("add"), src_factor_out=tp, src_factor_in=1, **loop)
        if L.late:
            p.gemm(**span("late"), **widen)
            tokens.read(("window", win))
        alu(L.clamp, kernels["clamp"])
        tokens.computed()

        tokens.wait_computed()  # RAW: the out tile is written
        if L.group == 1:
            dense_dma(p, True, o, out0 + (nb * L.blocks + ob0) * L.pixels + p0, tc, tp,
                      L.pixels, tp)
        for obi in range(tc if L.group > 1 else 0):   # each to its place in its pixel
            block, j = divmod(ob0 + obi, L.group)
            store_activation(p, o + obi * tp,
                             out0 + (nb * L.out_planes + block * L.group) * L.pixels,
                             L.pixels, 0, 1, p0, tp, L.group, j)
        tokens.stored(("out", o))  # tile k+2 waits for it
    if len(u.uops) != u.frozen:
        raise AssertionError("a kernel was interned after the micro-op table was loaded")
    return tokens.finish()  # FINISH waits for the last store


# --- timing model and default schedule ------------------------------------------------------

def estimate_elementwise(layer: ElementwiseLayer, schedule: ElementwiseSchedule,
                         config: HardwareConfig, *,
                         bytes_per_cycle: float | None = None,
                         read_latency: int | None = None) -> int:
    """Predicted cycles of `layer` lowered with `schedule` on `config`. Tiles alternate
    between two input and two output regions, so while the compute module works on a
    tile the next tile's loads and the previous tile's stores run: a tile costs the
    longest of its loads (the operands' bytes at `bytes_per_cycle`, default the config's
    `dram_bytes_per_cycle`), its compute
    (`ElementwiseLayer.entry_cycles` per acc entry, plus `INSN_CYCLES` per instruction)
    and its stores; the first tile's loads and the last one's stores do not overlap, nor
    does the table's LOAD (`table_load_cycles`), which the first tile's compute waits for.
    Each operand's LOAD pays the DRAM's `read_latency` (`common.dma_cycles`)."""
    s = schedule.clamped(layer)
    c, bw = config, float(bytes_per_cycle or config.dram_bytes_per_cycle)
    per_entry, insns = layer.entry_cycles(), layer.instructions()
    cycles = first = last = 0.0
    for tp, npix in tile_split(layer.pixels, s.tile_p):
        for tc, nc in tile_split(layer.blocks, s.tile_c):
            m = npix * nc * layer.batch_blocks
            entries = tc * tp
            load = (layer.operands * layer.window_blocks(tc) * tp * c.inp_elem_bytes / bw
                    + layer.operands * dma_cycles(bw, read_latency))
            compute = entries * per_entry + insns * INSN_CYCLES
            store = store_cycles(entries, tc if layer.group > 1 else 1, c, bw, layer.group)
            cycles += m * max(load, compute, store)
            first, last = max(first, load), max(last, store)
    if layer.table:
        first += table_load_cycles(c)
    return int(math.ceil(cycles + first + last))


@functools.lru_cache(maxsize=256)
def choose_elementwise(layer: ElementwiseLayer, config: HardwareConfig) -> ElementwiseSchedule:
    """The `ElementwiseSchedule` of `layer` with the fewest estimated cycles
    (`estimate_elementwise`; ties go to larger tiles): for every channel tiling, the widest
    pixel tiles whose buffers fit and a few narrower ones (smaller tiles shorten the
    first load and the last store that nothing overlaps). Raises ValueError when not even
    one pixel of one channel block fits."""
    pixels = tile_candidates(layer.pixels)
    ranked = []
    for tc in tile_candidates(layer.blocks):
        fitting = [tp for tp in pixels if not any(
            need > depth for need, depth in
            ElementwiseSchedule(tp, tc).needs(layer, config, uops=False).values())]
        for tp in fitting[:4]:
            s = ElementwiseSchedule(tp, tc)
            ranked.append((estimate_elementwise(layer, s, config), -tp * tc, s))
    for _, _, s in sorted(ranked, key=lambda r: r[:2]):
        if s.fits(layer, config):
            return s
    ElementwiseSchedule(1, 1).check(layer, config)  # raises, naming the buffers
    raise ValueError(f"elementwise layer {layer} has no schedule that fits config "
                     f"{config.name}")


# --- running --------------------------------------------------------------------------------

def run_elementwise(dev, lowered: LoweredElementwise, *inputs, return_stats: bool = False):
    """Write the inputs (the node's, in order: ``relu(x)``, ``qadd(a, b)``, a zero
    constant operand included) packed into `dev`'s DRAM, run the program, read the output
    back: int8 of the node's output shape. With `return_stats`, returns (y, stats)."""
    raw, stats = run_arena(dev, lowered, {**lowered.static_data(),
                                          **lowered.input_data(*inputs)})
    y = lowered.unpack_output(raw)
    return (y, stats) if return_stats else y
