"""Schedules of the lowered ops: how a layer is cut into tiles and virtual threads, and
whether a tiling fits the config's buffers.

* `Conv2dSchedule(tile_h, tile_w, tile_ci, tile_co, oc_nthread, h_nthread)`;
* `Pool2dSchedule(tile_h, tile_w, tile_c)`.

Each checks what its tiling needs of every buffer (`needs`, `overflows`, `fits`,
`check`, which names every buffer it overflows and by how much). The default schedule of
a layer is the timing model's pick (`vdla.compiler.targets.vdla.cost.choose_conv2d`,
`choose_pool2d`), next to the model that ranks them.
"""

from __future__ import annotations

import dataclasses

from vdla.compiler.targets.vdla.common import ITER_MAX
from vdla.compiler.targets.vdla.conv_layer import (MAX, Conv2dLayer, Pool2dLayer, window_cols,
                                               window_rows)
from vdla.compiler.targets.vdla.uops import (PoolUops, acc_region, conv_uop_count, inp_blocks,
                                             inp_chunk, residual_inp)
from vdla.config import HardwareConfig

__all__ = ["Conv2dSchedule", "Pool2dSchedule"]


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
        for name in ("tile_h", "tile_w", "tile_ci", "tile_co"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Conv2dSchedule.{name} must be a positive integer, not {value!r}")
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
        # A tile's channels stay inside one span (one group's block range).
        return Conv2dSchedule(min(self.tile_h, layer.out_h), min(self.tile_w, layer.out_w),
                              min(self.tile_ci, layer.span_in),
                              min(self.tile_co, layer.span_out), self.oc_nthread,
                              self.h_nthread)

    def needs(self, layer: Conv2dLayer, config: HardwareConfig) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling (all virtual threads' regions
        together), and its depth: {name: (need, depth)}."""
        s = self.clamped(layer)
        t = s.nthreads
        tile = s.tile_h * s.tile_w * s.tile_co
        region = acc_region(layer, s)
        return {
            "inp": (t * (inp_blocks(layer, s) * inp_chunk(layer, s)
                         + residual_inp(layer, s)), config.inp_depth),
            "wgt": (t * s.tile_co * s.tile_ci * layer.kernel_h * layer.kernel_w
                    + layer.residual_ratio, config.wgt_depth),
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
        if self.nthreads == 1 or layer.diagonal:
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
            detail = "; ".join(f"{name} needs {need} elements, has {depth} (over by "
                               f"{need - depth})" for name, (need, depth) in over.items())
            threads = (f" with {s.nthreads} virtual threads (one buffer region each)"
                       if s.nthreads > 1 else "")
            raise ValueError(f"conv2d schedule {self} does not fit config {config.name}"
                             f"{threads}: {detail}")


@dataclasses.dataclass(frozen=True)
class Pool2dSchedule:
    """Tiling of a pool: output rows, output columns and channel blocks per tile; tiles
    larger than the layer are clamped to it."""

    tile_h: int
    tile_w: int
    tile_c: int

    def __post_init__(self):
        for name in ("tile_h", "tile_w", "tile_c"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Pool2dSchedule.{name} must be a positive integer, not "
                                 f"{value!r}")

    def clamped(self, layer: Pool2dLayer) -> "Pool2dSchedule":
        return Pool2dSchedule(min(self.tile_h, layer.out_h), min(self.tile_w, layer.out_w),
                              min(self.tile_c, layer.blocks))

    def needs(self, layer: Pool2dLayer, config: HardwareConfig,
              uops: bool = True) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling, and its depth: {name: (need,
        depth)}. The inp window and the acc tile have two regions each (ping-pong with the
        loads and the stores); a max pool also keeps the widened window in the acc buffer. `uops=False` skips counting the
        micro-ops (which walks every tile)."""
        s = self.clamped(layer)
        chunk = window_rows(layer, s.tile_h) * window_cols(layer, s.tile_w)
        tile = s.tile_c * s.tile_h * s.tile_w
        widened = s.tile_c * chunk if layer.kind == MAX else 0
        need = {
            "inp": (2 * s.tile_c * layer.ratio * chunk, config.inp_depth),
            "wgt": (layer.ratio, config.wgt_depth),
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
            detail = "; ".join(f"{name} needs {need} elements, has {depth} (over by "
                               f"{need - depth})" for name, (need, depth) in over.items())
            raise ValueError(f"pool schedule {self} does not fit config {config.name}: "
                             f"{detail}")


# --- standalone elementwise ops (vdla.compiler.targets.vdla.elementwise) -------------------------

__all__ += ["ElementwiseSchedule"]


@dataclasses.dataclass(frozen=True)
class ElementwiseSchedule:
    """Tiling of a standalone elementwise op (`ElementwiseLayer`: an int8 ``relu`` or a
    ``qadd``): `tile_p` pixels (of the image's H x W, taken in row-major order) by `tile_c`
    channel blocks (output blocks of block_out channels) of one batch block per tile;
    tiles larger than the layer are clamped to it."""

    tile_p: int
    tile_c: int

    def __post_init__(self):
        for name in ("tile_p", "tile_c"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ElementwiseSchedule.{name} must be a positive integer, "
                                 f"not {value!r}")

    def clamped(self, layer) -> "ElementwiseSchedule":
        return ElementwiseSchedule(min(self.tile_p, layer.pixels),
                                   min(self.tile_c, layer.blocks))

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
            "inp": (2 * layer.operands * layer.ratio * tile, config.inp_depth),
            "wgt": (layer.ratio, config.wgt_depth),
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
            detail = "; ".join(f"{name} needs {need} elements, has {depth} (over by "
                               f"{need - depth})" for name, (need, depth) in over.items())
            raise ValueError(f"elementwise schedule {self} does not fit config "
                             f"{config.name}: {detail}")
