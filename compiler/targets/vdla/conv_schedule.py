"""A convolution's tiling, `Conv2dSchedule(tile_h, tile_w, tile_ci, tile_co, oc_nthread,
h_nthread)`, and whether it fits a config's buffers (`needs`, `overflows`, `fits`, `check`,
which names every buffer it overflows and by how much), with the buffer regions and the
micro-op count it implies (`conv_uop_count`). The layer it tiles is
`vdla.compiler.targets.vdla.conv_layer`'s `Conv2dLayer`; the timing model that prices a
tiling is `vdla.compiler.targets.vdla.timing`'s; the lowering
(`vdla.compiler.targets.vdla.conv`) reads the regions to lay out its buffers.

This module sits below both the layer and the timing model: the timing model counts the
micro-op table it loads (`conv_uop_count`), and the layer's default chooser ranks the
tilings that fit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from vdla.compiler.targets.vdla import dw_window
from vdla.compiler.targets.vdla.common import (ITER_MAX, ceil_div, check_tile_sizes,
                                               overflow_detail, window_cols, window_rows)
from vdla.config import HardwareConfig

if TYPE_CHECKING:   # annotations only: conv_layer imports this module
    from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer

__all__ = ["Conv2dSchedule", "acc_region", "chunk_sizes", "co_starts", "conv_uop_count",
           "inp_blocks", "inp_chunk", "res_planes", "residual_inp"]


@dataclasses.dataclass(frozen=True)
class Conv2dSchedule:
    """Tiling of a conv2d: output rows, output columns, input-channel blocks and
    output-channel blocks per tile. Tiles larger than the layer are clamped to it.

    `oc_nthread` / `h_nthread` (1 or 2, at most one of them 2): virtual threads over
    output-channel tiles / output-row tiles. With 2, the inp, wgt and acc (and out)
    buffers are split into one region per thread (ping-pong), the tiles alternate
    between the threads, and their instruction streams are interleaved per input-channel
    chunk so that one thread's loads run while the other computes and stores."""

    tile_h: int
    tile_w: int
    tile_ci: int
    tile_co: int
    oc_nthread: int = 1
    h_nthread: int = 1

    def __post_init__(self):
        check_tile_sizes(self, ("tile_h", "tile_w", "tile_ci", "tile_co"))
        for name in ("oc_nthread", "h_nthread"):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in (1, 2):
                raise ValueError(f"Conv2dSchedule.{name} must be 1 or 2, not {value!r}")
        if self.oc_nthread == self.h_nthread == 2:
            raise ValueError("Conv2dSchedule: oc_nthread and h_nthread cannot both be 2 "
                             "(at most two virtual threads are supported)")

    @property
    def nthreads(self) -> int:
        """Virtual threads: oc_nthread * h_nthread (1 or 2)."""
        return self.oc_nthread * self.h_nthread

    def clamped(self, layer: Conv2dLayer) -> "Conv2dSchedule":
        """This tiling cut to `layer` (`_clamped`, remembered: the fit and the timing
        model ask for it several times a schedule)."""
        return _clamped(self, layer)

    def needs(self, layer: Conv2dLayer, config: HardwareConfig) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling (all virtual threads' regions
        together), and its depth: {name: (need, depth)}."""
        s = self.clamped(layer)
        t = s.nthreads
        tile = s.tile_h * s.tile_w * s.tile_co
        region = acc_region(layer, s)
        return {
            "inp": (t * (inp_blocks(layer, s) * inp_chunk(layer, s)
                         + residual_inp(layer, s)) + layer.bias_gemm
                    + (dw_window.inp_reach(layer, config) if layer.window else 0),
                    config.inp_depth),
            "wgt": (t * s.tile_co * s.tile_ci * layer.wgt_taps
                    + layer.residual_ratio + layer.bias_gemm * layer.out_blocks,
                    config.wgt_depth),
            "acc": (t * region + layer.const_rows * layer.out_blocks, config.acc_depth),
            "out": ((t - 1) * region + tile, config.out_depth),
            "uop": (conv_uop_count(layer, s), config.uop_depth),
        }

    def overflows(self, layer: Conv2dLayer, config: HardwareConfig) -> dict[str, tuple[int, int]]:
        """The limits this tiling exceeds: {buffer or "iter": (need, limit)}; empty when
        it fits. "iter" is the GEMM loop count of a tile (tile_h * tile_w)."""
        s = self.clamped(layer)
        over = {k: v for k, v in self.needs(layer, config).items() if v[0] > v[1]}
        if s.tile_h * s.tile_w > ITER_MAX:
            over["iter"] = (s.tile_h * s.tile_w, ITER_MAX)
        return over

    def uneven_chunks(self, layer: Conv2dLayer) -> set[int] | None:
        """The differing input-channel chunk counts of the layer's output-channel tiles
        when this schedule has two virtual threads, else None. The threads' instruction
        streams interleave chunk by chunk, and a thread with more chunks than the other
        would push its WAR tokens out of queue order; only a grouped layer whose groups
        straddle blocks has spans of different widths."""
        if self.nthreads == 1 or layer.paired:
            return None
        tci = min(self.tile_ci, layer.span_in)
        counts = {-(-cn // min(tci, cn)) for _, _, _, cn in layer.spans}
        return counts if len(counts) > 1 else None

    def fits(self, layer: Conv2dLayer, config: HardwareConfig) -> bool:
        """Whether `check` would pass."""
        return not self.overflows(layer, config) and not self.uneven_chunks(layer)

    def check(self, layer: Conv2dLayer, config: HardwareConfig):
        """Raise ValueError naming every buffer this tiling overflows, and by how much
        (and for two virtual threads over tiles with different chunk counts)."""
        s = self.clamped(layer)
        uneven = self.uneven_chunks(layer)
        if uneven:
            raise ValueError(f"conv2d schedule {self}: two virtual threads need every "
                             f"output-channel tile to take the same number of input-channel "
                             f"chunks; this grouped layer's spans {list(layer.spans)} take "
                             f"{sorted(uneven)} chunks of {s.tile_ci} blocks (use one "
                             "thread, or a tile_ci that divides them evenly)")
        over = self.overflows(layer, config)
        if over:
            detail = overflow_detail(over)
            threads = (f" with {s.nthreads} virtual threads (one buffer region each)"
                       if s.nthreads > 1 else "")
            raise ValueError(f"conv2d schedule {self} does not fit config {config.name}"
                             f"{threads}: {detail}")


@functools.lru_cache(maxsize=1 << 16)
def _clamped(s: Conv2dSchedule, layer: Conv2dLayer) -> Conv2dSchedule:
    # A tile's channels stay inside one span (one group's block range); a chunk
    # takes whole activation blocks (`Conv2dLayer.inp_group` input blocks each).
    g, og = layer.inp_group, layer.out_group if layer.has_residual else 1
    if layer.diagonal_rows:     # whole blocks of rows, each tile the blocks of its rows
        block = layer.row_block
        tile_h = min(ceil_div(s.tile_h, block) * block, layer.out_h)
        return Conv2dSchedule(tile_h, 1, ceil_div(tile_h, block),
                              min(s.tile_co, layer.span_out), s.oc_nthread, s.h_nthread)
    return Conv2dSchedule(min(s.tile_h, layer.out_h), min(s.tile_w, layer.out_w),
                          min(ceil_div(s.tile_ci, g) * g, layer.span_in),
                          min(ceil_div(s.tile_co, og) * og, layer.span_out),
                          s.oc_nthread, s.h_nthread)


def acc_region(layer: Conv2dLayer, s) -> int:
    """acc (and out) elements of one virtual thread: its tile, and its residual tile."""
    residual_tile = layer.has_residual and not layer.late_residual
    return s.tile_h * s.tile_w * s.tile_co * (2 if residual_tile else 1)


def inp_blocks(layer: Conv2dLayer, s) -> int:
    """Input-channel blocks of one thread's input tile: a chunk of `tile_ci`, or for a
    diagonal (depthwise) layer the `tile_co` blocks its output blocks read (a window
    layer's `tile_co` activation blocks)."""
    if layer.window:
        return s.tile_co * layer.inp_group
    return s.tile_co if layer.diagonal else ceil_div(s.tile_ci, layer.inp_group) * layer.inp_group


def chunk_sizes(layer: Conv2dLayer, s) -> set[int]:
    """The input-channel chunk sizes of the layer's GEMM kernels (full and edge chunks
    of every span; 1 for a diagonal layer, whose kernels read one block per output
    block)."""
    if layer.paired:
        return {1}
    if layer.diagonal_rows:     # a tile's rows' blocks: full and edge row tiles
        return {s.tile_h // layer.row_block,
                (layer.out_h % s.tile_h or s.tile_h) // layer.row_block}
    sizes = set()
    for _, _, _, cn in layer.spans:
        tci = min(s.tile_ci, cn)
        sizes |= {tci, cn % tci or tci}
    return sizes


def co_starts(layer: Conv2dLayer, s) -> list[int]:
    """The first output block of every output-channel tile."""
    return [ob0 for ob0, _, _ in layer.co_tiles(s.tile_co)]


def residual_inp(layer: Conv2dLayer, s) -> int:
    """inp elements of one thread's int8 residual tile (0 without one, or when the host
    widens it): `residual_ratio` input blocks per output block of a full tile, or where
    block_in > block_out one input block per activation block of the tile's outputs."""
    if layer.out_group > 1:
        return ceil_div(s.tile_co, layer.out_group) * s.tile_h * s.tile_w
    return layer.residual_ratio * s.tile_co * s.tile_h * s.tile_w


def inp_chunk(layer: Conv2dLayer, s) -> int:
    """inp elements between consecutive channel blocks of an input tile (a full tile's
    padded window, so edge tiles keep the same micro-ops' channel offsets)."""
    return window_rows(layer, s.tile_h) * window_cols(layer, s.tile_w)


def res_planes(layer: Conv2dLayer, s) -> list[int]:
    """The output tiles' planes (rows x columns): full and edge tiles."""
    hs = sorted({s.tile_h, layer.out_h % s.tile_h or s.tile_h})
    ws = sorted({s.tile_w, layer.out_w % s.tile_w or s.tile_w})
    return sorted({h * w for h in hs for w in ws})


def _res_widen_uops(layer: Conv2dLayer, s) -> int:
    """Micro-ops that widen the int8 residual, per thread: one per identity block, or
    where block_in > block_out one per selection block and tile plane."""
    if layer.out_group > 1:
        return min(layer.out_group, s.tile_co) * len(res_planes(layer, s))
    return layer.residual_ratio


@functools.lru_cache(maxsize=1 << 16)
def conv_uop_count(layer: Conv2dLayer, s) -> int:
    """len(conv_uop_table(layer, s).uops), without building it (remembered: the fit and
    the timing model's tables both count it, for every schedule a search ranks)."""
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = chunk_sizes(layer, s)
    gemm = sum(w * ci for w in widths for ci in cis) * layer.kernel_h * layer.kernel_w
    if layer.window:   # a walk per kernel row and tile width
        gemm = sum(dw_window.walk(layer, w) for w in widths) * layer.kernel_h
    residual_tile = layer.has_residual and not layer.late_residual
    alu = 2 + (2 if residual_tile else 0) + layer.const_rows * len(co_starts(layer, s))
    if layer.residual_ratio:    # (the residual tile's reset) and the widening
        alu += _res_widen_uops(layer, s) + (0 if layer.late_residual else 1)
    if layer.bias_gemm:         # one bias micro-op per output-channel tile
        alu += len(co_starts(layer, s))
    return s.nthreads * (gemm + alu)
