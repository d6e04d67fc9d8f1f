"""Pooling on the accelerator: max pooling on the vector ALU, average pooling as window
sums on the GEMM core, each followed by its ALU epilogue.

Ops: ``max_pool2d`` on int8 data, ``qavg_pool2d`` and ``qglobal_avg_pool2d`` (a global pool
is a pool whose window is the whole image). The input is int8 ``NCHW{batch}n{block_in}c``,
the output int8 ``NCHW{batch}n{block_out}c``; one output channel block takes ``ratio =
block_out / block_in`` input blocks (the host pads the channels to whole output blocks).

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
  zeros, as in the reference); the requantization (`common.requant_steps`: MUL, rounding
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
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import pack, unpack
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.common import (IdentityTables, check_array, layout_arena,
                                               load_tables, run_arena)
from vdla.compiler.targets.vdla.cost import choose_pool2d
from vdla.compiler.targets.vdla.conv_layer import (AVG, Pool2dLayer, pool2d_layer, window_cols,
                                               window_rows)
from vdla.compiler.targets.vdla.schedules import Pool2dSchedule
from vdla.compiler.targets.vdla.uops import PoolUops
from vdla.config import AluOp, HardwareConfig
from vdla.isa import MemoryType, Program, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import RegionTokens

__all__ = ["LoweredPool2d", "lower_pool2d", "run_pool2d"]


# --- lowering ----------------------------------------------------------------------------------

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
        padded = L.blocks * self.config.block_out
        if padded != L.c:  # whole output blocks of channels: `ratio` input blocks each
            x = np.pad(x, ((0, 0), (0, padded - L.c), (0, 0), (0, 0)))
        return {"input": pack(x, "NCHW", self.data_layout)}

    def unpack_output(self, raw: np.ndarray) -> np.ndarray:
        L, c = self.layer, self.config
        shape = (L.batch_blocks, L.blocks, L.out_h, L.out_w, c.batch, c.block_out)
        return unpack(raw.view(np.int8).reshape(shape), self.out_layout, "NCHW",
                      channels=L.c, batch=L.n)


def lower_pool2d(node: Node | str, graph: Graph, config: HardwareConfig,
                 schedule: Pool2dSchedule | None = None) -> LoweredPool2d:
    """Lower pooling node `node` of `graph` (one of `POOL_OPS`) to a program for `config`
    (see the module docstring). Raises ValueError for what the back half does not support
    (float data, block_out not a multiple of block_in, a window in the padding only,
    MUL missing) and for a schedule that does not fit."""
    if isinstance(node, str):
        node = graph.node(node)
    layer, steps, rows = pool2d_layer(node, graph, config)
    schedule = schedule or choose_pool2d(layer, config)
    if not isinstance(schedule, Pool2dSchedule):
        raise TypeError(f"lower_pool2d: schedule must be a Pool2dSchedule, not "
                        f"{type(schedule).__name__}")
    schedule.check(layer, config)
    s = schedule.clamped(layer)
    table = PoolUops(layer, s, config)
    c, L = config, layer
    regions, arena_bytes = layout_arena({
        "uop": len(table.uops) * c.uop_bytes,
        "const": L.const_rows * L.blocks * c.acc_elem_bytes,
        "weights": L.ratio * c.wgt_elem_bytes,
        "input": L.batch_blocks * L.in_blocks * L.h * L.w * c.inp_elem_bytes,
        "output": L.batch_blocks * L.blocks * L.out_h * L.out_w * c.out_elem_bytes,
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
    load_tables(p, regions, c, len(u.uops), u.const_base, L.const_rows * L.blocks, L.ratio)
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
        for b in range(t.tc * L.ratio):
            p.load(MemoryType.INP, sram_base=u.window(t) + b * u.chunk,
                   dram_base=inp0 + ((t.nb * L.in_blocks + t.ob0 * L.ratio + b) * L.h + y0)
                   * L.w + x0, y_size=y1 - y0, x_size=x1 - x0, x_stride=L.w, **pads)
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
                   src_factor_out=L.stride_h * cols, src_factor_in=L.stride_w)
        else:
            bgn, end = k["imm"]
            p.alu(AluOp.ADD, uop_bgn=bgn, uop_end=end, use_imm=True, imm=-128, **tile_loop)
            widen = dict(iter_out=t.tc, iter_in=rows * cols, dst_factor_out=u.chunk,
                         dst_factor_in=1)
            bgn, end = k["widen_reset"]
            p.gemm(reset_reg=True, uop_bgn=bgn, uop_end=end, **widen)
            tokens.wait_loaded()  # RAW: the window is in
            bgn, end = k["widen"]
            p.gemm(uop_bgn=bgn, uop_end=end, src_factor_out=L.ratio * u.chunk,
                   src_factor_in=1, **widen)
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
            p.store(sram_base=o + obi * plane,
                    dram_base=out0 + ((t.nb * L.blocks + t.ob0 + obi) * L.out_h + t.oh0)
                    * L.out_w + t.ow0, y_size=t.th, x_size=t.tw, x_stride=L.out_w)
        tokens.stored(("out", o))  # tile k+2 waits for it
    return tokens.finish()  # FINISH waits for the last store


# --- running ------------------------------------------------------------------------------------

def run_pool2d(dev, lowered: LoweredPool2d, x_int8: np.ndarray, *, return_stats: bool = False):
    """Write the input packed into `dev`'s DRAM, run the program, read the output back:
    int8 (N, C, Ho, Wo). With `return_stats`, returns (y, stats)."""
    raw, stats = run_arena(dev, lowered, {**lowered.static_data(), **lowered.input_data(x_int8)})
    y = lowered.unpack_output(raw)
    return (y, stats) if return_stats else y
