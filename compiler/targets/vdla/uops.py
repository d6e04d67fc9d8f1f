"""The micro-op tables of the lowered ops: every micro-op a program uses, loaded once at
its start, and where in the SRAMs each tile's kernels point.

* convolutions: `conv_uop_table` (GEMM kernels per thread, tile width and input-channel
  chunk; the epilogue's ALU micro-ops) and `conv_uop_count`, the same count without
  building the table (the schedule's fit check uses it);
* pools: `PoolUops` (kernels interned by content, per tile of `pool_tiles`).

Virtual threads and ping-pong tiles own regions of the buffers (`PingPong`); the
micro-ops address the region of the thread or tile they belong to.
"""

from __future__ import annotations

import dataclasses

from vdla.compiler.targets.vdla.conv_layer import (AVG, Conv2dLayer, Pool2dLayer, window_cols,
                                               window_rows)
from vdla.config import HardwareConfig
from vdla.isa import Uop
from vdla.runtime.tokens import PingPong

__all__ = ["ConvUops", "KernelTable", "PoolTile", "PoolUops", "acc_region", "conv_uop_count",
           "conv_uop_table", "inp_blocks", "inp_chunk", "pool_tiles", "residual_inp"]


# --- convolutions ---------------------------------------------------------------------------

def acc_region(layer: Conv2dLayer, s) -> int:
    """acc (and out) elements of one virtual thread: its tile, and its residual tile."""
    return s.tile_h * s.tile_w * s.tile_co * (2 if layer.has_residual else 1)


def inp_blocks(layer: Conv2dLayer, s) -> int:
    """Input-channel blocks of one thread's input tile: a chunk of `tile_ci`, or for a
    diagonal (depthwise) layer the `tile_co` blocks its output blocks read."""
    return s.tile_co if layer.diagonal else s.tile_ci


def _chunk_sizes(layer: Conv2dLayer, s) -> set[int]:
    """The input-channel chunk sizes of the layer's GEMM kernels (full and edge chunks
    of every span; 1 for a diagonal layer, whose kernels read one block per output
    block)."""
    if layer.diagonal:
        return {1}
    sizes = set()
    for _, _, _, cn in layer.spans:
        tci = min(s.tile_ci, cn)
        sizes |= {tci, cn % tci or tci}
    return sizes


def _co_starts(layer: Conv2dLayer, s) -> list[int]:
    return [ob0 for ob0, _, _ in layer.co_tiles(s.tile_co)]


def residual_inp(layer: Conv2dLayer, s) -> int:
    """inp elements of one thread's int8 residual tile (0 without one, or when the host
    widens it): `residual_ratio` input blocks per output block of a full tile."""
    return layer.residual_ratio * s.tile_co * s.tile_h * s.tile_w


def inp_chunk(layer: Conv2dLayer, s) -> int:
    """inp elements between consecutive channel blocks of an input tile (a full tile's
    padded window, so edge tiles keep the same micro-ops' channel offsets)."""
    return window_rows(layer, s.tile_h) * window_cols(layer, s.tile_w)


# --- micro-ops -------------------------------------------------------------------------------------

@dataclasses.dataclass
class ConvUops:
    """Every micro-op the program uses, loaded once. `gemm[(thread, tile_w, tile_ci)]` is
    the (begin, end) of a GEMM kernel; the ALU micro-ops are single entries, one per
    virtual thread (each thread's kernels address its own buffer regions)."""

    uops: list
    gemm: dict
    res_base: int          # acc index of the residual tile, relative to a thread's region
    const_base: int        # acc index of constant row 0
    inp_base: list = dataclasses.field(default_factory=list)  # per thread
    wgt_base: list = dataclasses.field(default_factory=list)
    acc_base: list = dataclasses.field(default_factory=list)
    reset: list = dataclasses.field(default_factory=list)        # Uop(acc, 0, 0): GEMM reset
    alu_main: list = dataclasses.field(default_factory=list)     # Uop(acc, acc): immediates
    alu_res: list = dataclasses.field(default_factory=list)      # Uop(res, 0): on residual
    alu_add_res: list = dataclasses.field(default_factory=list)  # Uop(acc, res): conv += res
    alu_vec: dict = dataclasses.field(default_factory=dict)  # (thread, target, row, ob0) -> index
    res_reset: list = dataclasses.field(default_factory=list)    # Uop(res, 0, 0)
    res_widen: list = dataclasses.field(default_factory=list)    # (begin, end): identities
    res_inp: list = dataclasses.field(default_factory=list)      # inp index of the residual
    identity_base: int = 0    # wgt index of the identity blocks, after the threads' regions


def conv_uop_count(layer: Conv2dLayer, s) -> int:
    """len(conv_uop_table(layer, s).uops), without building it."""
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = _chunk_sizes(layer, s)
    gemm = sum(w * ci for w in widths for ci in cis) * layer.kernel_h * layer.kernel_w
    alu = 2 + (2 if layer.has_residual else 0) + layer.const_rows * len(_co_starts(layer, s))
    alu += 1 + layer.residual_ratio if layer.residual_ratio else 0   # reset, widening
    return s.nthreads * (gemm + alu)


def conv_uop_table(layer: Conv2dLayer, s, config: HardwareConfig | None = None,
                   rows_used: dict | None = None) -> ConvUops:
    kh, kw = layer.kernel_h, layer.kernel_w
    chunk = inp_chunk(layer, s)
    threads = s.nthreads
    # Each virtual thread owns one region of the inp, wgt and acc (so also out) buffers.
    # A thread's inp region: its input chunk, then its int8 residual tile (if any).
    inp = PingPong(inp_blocks(layer, s) * chunk + residual_inp(layer, s), threads)
    wgt = PingPong(s.tile_co * s.tile_ci * kh * kw, threads)
    acc = PingPong(acc_region(layer, s), threads)
    tile = s.tile_h * s.tile_w * s.tile_co
    depth = config.acc_depth if config is not None else 1 << 30
    const_base = depth - layer.const_rows * layer.out_blocks
    table = ConvUops([], {}, tile, const_base, identity_base=wgt.total)
    uops = table.uops
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = _chunk_sizes(layer, s)
    for t in range(threads):
        ib, wb, ab = inp.base(t), wgt.base(t), acc.base(t)
        table.inp_base.append(ib)
        table.wgt_base.append(wb)
        table.acc_base.append(ab)
        for tw in sorted(widths):
            cols = window_cols(layer, tw)
            for tci in sorted(cis):
                begin = len(uops)
                uops += [Uop(ab + ox, ib + cb * chunk + ky * cols + ox * layer.stride_w + kx,
                             wb + cb * kh * kw + ky * kw + kx)
                         for ox in range(tw) for cb in range(tci)
                         for ky in range(kh) for kx in range(kw)]
                table.gemm[t, tw, tci] = (begin, len(uops))
        table.reset.append(len(uops))
        uops.append(Uop(ab, 0, 0))
        table.alu_main.append(len(uops))
        uops.append(Uop(ab, ab))
        if layer.residual_ratio:
            # Reset of the residual tile, then one GEMM micro-op per identity block j:
            # the residual's input block j of each output block (stored j-major in the
            # thread's inp region, after the input chunk) into the residual acc tile.
            res_inp = ib + inp_blocks(layer, s) * chunk
            full = s.tile_co * s.tile_h * s.tile_w
            table.res_reset.append(len(uops))
            uops.append(Uop(ab + tile, 0, 0))
            table.res_widen.append((len(uops), len(uops) + layer.residual_ratio))
            uops += [Uop(ab + tile, res_inp + j * full, wgt.total + j)
                     for j in range(layer.residual_ratio)]
            table.res_inp.append(res_inp)
        if layer.has_residual:
            table.alu_res.append(len(uops))
            uops.append(Uop(ab + tile, 0))
            table.alu_add_res.append(len(uops))
            uops.append(Uop(ab, ab + tile))
        # One vector micro-op per (constant row, output-channel tile): its src is the row's
        # entry for the tile's first block. Rows are counted for the size check even
        # before the epilogue says which tile region each reads.
        targets = rows_used or {row: 0 for row in range(layer.const_rows)}
        for row, target in targets.items():
            for ob0 in _co_starts(layer, s):
                table.alu_vec[t, target, row, ob0] = len(uops)
                uops.append(Uop(ab + target, const_base + row * layer.out_blocks + ob0))
    return table


# --- pools ----------------------------------------------------------------------------------

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
        self.windows = PingPong(s.tile_c * L.ratio * self.chunk)
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
            out["sum"] = self.kernel(
                Uop(o + obi * plane, i + (obi * L.ratio + j) * chunk + ky * cols + kx, j)
                for obi in range(t.tc) for j in range(L.ratio)
                for ky in range(L.kernel_h) for kx in range(L.kernel_w))
            return out
        wide = self.widened
        out["widen_reset"] = self.kernel([Uop(wide, 0, 0)])
        out["widen"] = self.kernel(Uop(wide, i + j * chunk, j) for j in range(L.ratio))
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
