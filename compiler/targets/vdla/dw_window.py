"""Depthwise convolutions on the GEMM core's *depthwise window* (`HardwareConfig.dw_taps`,
the `dw` bit of `vdla.isa.Gemm`): what only that lowering needs. The conv family
(`conv_layer`, `conv`) does the rest (tiling, virtual threads, tokens, epilogue, stores).

A `dw` GEMM micro-op computes one output pixel x one kernel row (ky) x T = dw_taps kernel
columns for all block_out channels of an output block: lane n sums its own channel's T
taps along x. The window holds T columns (a column is one pixel of a block_out-channel
activation block: r = block_out / block_in inp elements, `dw_column_rows`); the first
micro-op of a pass loads all of it (T·r cycles), each later one slides it one column
(r cycles). So the lowering is:

* micro-ops: per kernel row ky, one *walk* along an output row of the tile: micro-op x
  (x = 0 .. (tw - 1)·stride_w) reads window columns x .. x + T - 1 of input row ky (its
  src advances by r, one column, so the slide is exact). With stride 1 every micro-op
  is an output pixel; with stride s only every s-th one is (ox = x / s), the others read
  a zero weight row and add nothing (to the previous output's entry), which is still
  cheaper than a full window load per pixel: (s·(tw - 1) + T)·r cycles a pass against
  T·r·tw, and against kw·r·tw for the diagonal/span GEMM;
* one GEMM per ky and tile: iter_out over the tile's output blocks (each reads its own
  activation block of the input tile: src_factor_out), iter_in over output rows
  (src_factor_in = stride_h input rows), one pass each: kh·tco·th passes a tile;
* weights: per output block, `wgt_rows` weight blocks: row ky puts lane n's tap t at
  column 2t + n % 2 and zeros elsewhere (columns past 2T multiply the window's last row,
  so they must be zero too; taps past kernel_w are zero), then with stride > 1 one zero
  row for the skipped micro-ops.

`conv_layer.conv2d_layer` offers the window as one of a depthwise layer's lowerings and
keeps it only where `estimate_conv2d` (which counts `tile_gemm_cycles` here) finds it
faster than the diagonal or span GEMM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vdla.compiler.targets.vdla.common import INSN_CYCLES, ceil_div
from vdla.config import HardwareConfig
from vdla.isa import Uop

if TYPE_CHECKING:   # annotations only: conv_layer imports this module
    from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer

__all__ = ["emit_window_gemms", "inp_reach", "tile_gemm_cycles", "walk", "window_eligible",
           "window_uops", "window_weights", "wgt_rows"]


def window_eligible(c: int, o: int, groups: int, kernel_w: int, dilation_w: int,
                    config: HardwareConfig) -> bool:
    """Whether a convolution can run on the depthwise window: the config has one with at
    least `kernel_w` taps, the layer is depthwise (c == o == groups: each output channel
    reads its own input channel) and its taps are adjacent columns (no column dilation:
    the window slides one column at a time). A config with the window has block_out a
    multiple of block_in (`HardwareConfig` checks it)."""
    return config.dw_taps >= kernel_w and c == o == groups and dilation_w == 1


def wgt_rows(layer: Conv2dLayer) -> int:
    """Weight blocks per output block: one per kernel row, and with a column stride one
    zero row for the micro-ops that only slide the window."""
    return layer.kernel_h + (layer.stride_w > 1)


def walk(layer: Conv2dLayer, tile_w: int) -> int:
    """Micro-ops of one pass (an output row of `tile_w` pixels at one kernel row): one per
    input column the window's first tap passes, (tile_w - 1)·stride_w + 1."""
    return (tile_w - 1) * layer.stride_w + 1


def pass_cycles(layer: Conv2dLayer, tile_w: int, config: HardwareConfig) -> int:
    """GEMM cycles of one pass (`vdla.isa.Gemm`'s `dw` rule, `sim.validate`'s count): the
    first micro-op loads T columns of r rows, each later one r rows."""
    return config.dw_pass_cycles(walk(layer, tile_w))


def tile_gemm_cycles(layer: Conv2dLayer, tile_h: int, tile_w: int, tile_co: int,
                     config: HardwareConfig) -> int:
    """Compute cycles of one tile's window GEMMs: kh instructions of tile_co x tile_h
    passes, each instruction with its pipeline fill (`INSN_CYCLES`)."""
    return layer.kernel_h * (tile_co * tile_h * pass_cycles(layer, tile_w, config)
                             + INSN_CYCLES)


def layer_uops(layer: Conv2dLayer) -> int:
    """Micro-ops the layer's window GEMMs issue with full-width tiles (the functional
    simulator's count; a tiling in columns with stride > 1 issues fewer)."""
    return (layer.batch_blocks * layer.out_blocks * layer.kernel_h * layer.out_h
            * walk(layer, layer.out_w))


def inp_reach(layer: Conv2dLayer, config: HardwareConfig) -> int:
    """inp elements the window reads past a tile's input window: with fewer kernel
    columns than taps, the last micro-op's window reaches T - kernel_w columns further
    (read, times zero weights; they must lie inside the inp buffer)."""
    return max(0, config.dw_taps - layer.kernel_w) * config.dw_column_rows


def window_uops(layer: Conv2dLayer, tile_w: int, cols: int, ib: int, wb: int,
                ab: int) -> list[list[Uop]]:
    """The micro-op kernels of a `tile_w`-wide tile, one per kernel row: the walk along
    the tile's first output row (`walk`); `cols` is the input tile's width, `ib`, `wb`,
    `ab` the thread's inp, wgt and acc bases. Row and output block come from the
    GEMM's loops (`emit_window_gemms`)."""
    g, s = layer.inp_group, layer.stride_w
    zero = layer.kernel_h      # the zero weight row (stride > 1 only)
    kernels = []
    for ky in range(layer.kernel_h):
        row = ky * layer.dilation_h * cols
        kernels.append([Uop(ab + x // s, ib + (row + x) * g, wb + (ky if x % s == 0 else zero))
                        for x in range(walk(layer, tile_w))])
    return kernels


def emit_window_gemms(p, kernels: list[tuple[int, int]], tile, layer: Conv2dLayer,
                      chunk_elems: int):
    """A tile's window GEMMs into builder `p`: one per kernel row (`kernels`: its micro-op
    range), iter_out over the tile's output blocks (each its own activation block of the
    input tile, `chunk_elems` positions of `inp_group` elements apart), iter_in over its
    output rows."""
    g = layer.inp_group
    for bgn, end in kernels:
        p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tile.tco, iter_in=tile.th,
               dst_factor_out=tile.plane, dst_factor_in=tile.tw,
               src_factor_out=chunk_elems * g, src_factor_in=layer.stride_h * tile.cols * g,
               wgt_factor_out=wgt_rows(layer), wgt_factor_in=0, dw=True)


def window_weights(w: np.ndarray, layer: Conv2dLayer, config: HardwareConfig) -> np.ndarray:
    """Depthwise weights (O, 1, kh, kw) int8 -> the window's weight blocks (output
    blocks, `wgt_rows`, block_out, block_in): in row ky, lane n's tap t at column
    2t + n % 2, zeros elsewhere (the other column of the pair, the columns past 2T, the
    padded channels and the stride's zero row)."""
    bo, bi = config.block_out, config.block_in
    blocks = np.zeros((ceil_div(layer.o, bo) * bo, wgt_rows(layer), bi), np.int8)
    lanes = np.arange(layer.o)
    for t in range(layer.kernel_w):
        blocks[lanes, :layer.kernel_h, 2 * t + lanes % 2] = w[:, 0, :, t]
    return blocks.reshape(-1, bo, wgt_rows(layer), bi).transpose(0, 2, 1, 3).copy()
