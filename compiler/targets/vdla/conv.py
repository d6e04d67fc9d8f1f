"""One ``qconv2d`` or ``qdense`` node tensorized into a vdla program: the conv family's
lowering (`lower_conv2d`, its micro-op table, its emitter) and `run_conv2d` to run one on
a device. What it lowers (the layer, the schedule, the timing model that picks the
default schedule) is `vdla.compiler.targets.vdla.conv_layer`'s; grouped and depthwise
layers take their block structure and weight packing from
`vdla.compiler.targets.vdla.grouped`.

A ``qdense`` is lowered as a 1x1 convolution over a 1x1 image.

What the program does, per output tile (``tile_h`` rows x ``tile_w`` columns x
``tile_co`` output-channel blocks of one batch block), with one virtual thread (two
threads: see *Virtual threads* below):

1. *Reset* the acc tile: one ``GEMM reset_reg`` instruction, one micro-op per acc entry
   (one cycle each). Loading the bias instead (LOAD ACC, ``x_stride 0``) would read 64
   bytes of DRAM per entry on the compute module: 8 cycles at 8 bytes per cycle.
2. For each chunk of ``tile_ci`` input-channel blocks: LOAD INP (one 2-D DMA per channel
   block, the image borders supplied by the LOAD's zero padding, 0..15 per side), LOAD WGT
   (one 2-D DMA for all ``tile_co`` blocks; skipped when the chunk's weights are already
   in the buffer), then ONE GEMM whose loop nest is folded as
   ``iter_out = tile_co`` (weights), ``iter_in = tile_h`` (input rows), micro-ops over
   (output column, input-channel block, ky, kx). The micro-op kernels (at most four: full
   and edge ``tile_w`` x full and edge ``tile_ci``) are loaded once, at the start.
3. Epilogue on the ALU over the tile: the bias ADD (a vector operand; when the
   requantization has no multiplier its rounding constant is folded into that row on the
   host, ``wrap32(bias + r)``: additions modulo 2**32 associate, as
   `vdla.compiler.reference.integer` documents), requantization exactly as
   `vdla.compiler.reference.integer.requantize` (MUL, rounding ADD, SHR), the residual (int8,
   loaded with the tile's first chunk into the thread's inp region and widened into a
   second acc region by identity-weight GEMMs, requantized there, ADDed; or, when it
   needs no requantization, widened by those GEMMs straight onto the requantized tile,
   one cycle per entry instead of five: `Conv2dLayer.late_residual`), then MAX/MIN
   clamp;
   the last ALU op also writes the int8 out buffer, which STOREs copy to DRAM. Per-tensor
   values are immediates; per-channel values (and a rounding constant too large for the
   16-bit immediate) are vector operands: rows of per-channel constants loaded once into a
   reserved region at the top of the acc buffer.

Dependency tokens (`vdla.runtime.tokens.RegionTokens`): load->compute after each chunk's
loads (RAW), compute->load after each GEMM that a later load overwrites (WAR on inp/wgt),
compute->store after the epilogue (RAW), store->compute after each tile's stores (WAR on
the acc/out tile, popped by the next tile's first compute instruction; the last one by
FINISH, so the host sees done only after the last store).

Virtual threads (``Conv2dSchedule.oc_nthread`` or ``h_nthread`` = 2), as VTA lowers them:
each thread owns one region of the inp, wgt and acc (so also out) buffers, the micro-op
kernels exist once per thread (they address its regions), and the tiles alternate
between the threads (output-channel or output-row tiles innermost, consecutive tiles in
groups of two: thread 0 takes the first, thread 1 the second). Within a group the
instruction streams are interleaved per input-channel chunk: thread 0's loads, thread
0's GEMM, thread 1's loads, thread 1's GEMM, ...; a thread's epilogue and stores follow
its last GEMM. So one thread's loads run while the other computes, and its stores while
the other computes. Tokens are per thread: load->compute per chunk (RAW),
compute->load after a GEMM when that thread loads into its region again (WAR),
compute->store per tile (RAW), store->compute when that thread's next tile reuses its
acc/out region (WAR). Because every group but the last holds both threads, each queue's
k-th pop waits for exactly the k-th push: tokens of the two threads never get mixed up.
With one thread this is exactly the single-thread program.

DRAM (one arena, offsets in bytes, every region aligned for any element type): micro-ops,
per-channel constant rows (the bias row among them) as acc elements (int32, replicated
over the batch rows), the int8 input, residual and output in the activation layout
(`common.pack_activation`: blocks of L = max(block_in, block_out) channels; where
block_out = r x block_in a LOAD brings r inp elements a pixel and the micro-ops index
``pixel * r + j``, where block_in = r x block_out each output block is STOREd to its place
in the pixel), weights int8 ``OIHW{block_out}o{block_in}i``, and the identity (or, where
block_in > block_out, selection) weight blocks that widen the residual. The residual
stays int8 so that it can be another op's output in place. The program is emitted for an
arena at address 0 and relocated to wherever the arena is allocated.

Why this module is long: the micro-op table, the lowered op's arena and packing and the
emitter's steps address the same buffer regions and DRAM regions, and the conv family is
two modules (see `conv_layer`), so that lowering one convolution enters three modules of
the target.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import pack
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import wrap32
from vdla.compiler.targets.vdla.common import (ArenaProgram, acc_rows, activation_dma,
                                               bias_blocks, check_array, identity_blocks,
                                               layout_arena, ones_vector, pack_activation,
                                               run_arena, start_lowering, store_activation,
                                               unpack_activation,
                                               window_cols, window_rows)
from vdla.compiler.targets.vdla.conv_layer import (Conv2dLayer, ConvEpilogue, choose_conv2d,
                                                   conv2d_layer)
from vdla.compiler.targets.vdla.conv_schedule import (Conv2dSchedule, acc_region, chunk_sizes,
                                                      co_starts, inp_blocks, inp_chunk,
                                                      res_planes, residual_inp)
from vdla.compiler.targets.vdla.dw_window import (emit_window_gemms, window_uops,
                                                  window_weights)
from vdla.compiler.targets.vdla.grouped import grouped_weights
from vdla.compiler.targets.vdla.tap_pack import pack_tap_weights, pack_taps
from vdla.config import AluOp, HardwareConfig
from vdla.isa import MemoryType, Program, Uop, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import PingPong, RegionTokens

__all__ = ["ConvUops", "LoweredConv2d", "conv_uop_table", "lower_conv2d", "run_conv2d"]


# --- micro-ops ------------------------------------------------------------------------------

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
    bias_wgt_base: int = 0    # wgt index of the bias blocks (one per output block), after them
    ones_inp: int = 0         # inp index of the bias GEMM's input vector, after the regions
    bias: dict = dataclasses.field(default_factory=dict)    # (thread, ob0) -> index


def conv_uop_table(layer: Conv2dLayer, s, config: HardwareConfig | None = None,
                   rows_used: dict | None = None) -> ConvUops:
    """Every micro-op of `layer` tiled by `s` (clamped), per virtual thread: the GEMM
    kernels of every (tile width, chunk size), the resets, the ALU entries and one vector
    micro-op per (constant row, output-channel tile). `config` places the constant rows
    at the top of its acc buffer; `rows_used` maps each constant row to the tile region
    it applies to (0: the conv tile; the residual tile's offset)."""
    kh, kw = layer.kernel_h, layer.kernel_w
    chunk, g = inp_chunk(layer, s), layer.inp_group
    threads = s.nthreads
    # Each virtual thread owns one region of the inp, wgt and acc (so also out) buffers.
    # A thread's inp region: its input chunk, then its int8 residual tile (if any).
    inp = PingPong(inp_blocks(layer, s) * chunk + residual_inp(layer, s), threads)
    wgt = PingPong(s.tile_co * s.tile_ci * layer.wgt_taps, threads)
    acc = PingPong(acc_region(layer, s), threads)
    tile = s.tile_h * s.tile_w * s.tile_co
    depth = config.acc_depth if config is not None else 1 << 30
    const_base = depth - layer.const_rows * layer.out_blocks
    table = ConvUops([], {}, tile, const_base, identity_base=wgt.total,
                     bias_wgt_base=wgt.total + layer.residual_ratio, ones_inp=inp.total)
    uops = table.uops
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = chunk_sizes(layer, s)
    for t in range(threads):
        ib, wb, ab = inp.base(t), wgt.base(t), acc.base(t)
        table.inp_base.append(ib)
        table.wgt_base.append(wb)
        table.acc_base.append(ab)
        for tw in sorted(widths):
            cols = window_cols(layer, tw)
            if layer.window:
                # The depthwise window: a walk along an output row per kernel row
                # (`dw_window`), keyed (thread, width, "dw", ky).
                for ky, kernel in enumerate(window_uops(layer, tw, cols, ib, wb, ab)):
                    table.gemm[t, tw, "dw", ky] = (len(uops), len(uops) + len(kernel))
                    uops += kernel
                continue
            for tci in sorted(cis):
                begin = len(uops)
                # Input block cb of the chunk: sub-block cb % g of activation block cb // g,
                # whose window holds g inp elements per pixel; taps dilation apart.
                dh, dw = layer.dilation_h, layer.dilation_w
                uops += [Uop(ab + ox, ib + cb // g * chunk * g
                             + (ky * dh * cols + ox * layer.stride_w + kx * dw) * g + cb % g,
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
            # the residual's input block j of each output block (its pixels' ratio inp
            # elements side by side in the thread's inp region, after the input chunk)
            # into the residual acc tile; a late residual is widened onto the conv tile
            # itself, with no reset.
            res_inp = ib + inp_blocks(layer, s) * chunk
            if not layer.late_residual:
                table.res_reset.append(len(uops))
                uops.append(Uop(ab + tile, 0, 0))
            og = layer.out_group
            if og > 1:
                # block_in > block_out: selection block j picks output block j of the
                # residual's input block; a kernel per tile plane (output blocks are
                # plane apart in the acc tile).
                kernels = {}
                for plane in res_planes(layer, s):
                    kernels[plane] = (len(uops), len(uops) + min(og, s.tile_co))
                    uops += [Uop(ab + tile + j * plane, res_inp, wgt.total + j)
                             for j in range(min(og, s.tile_co))]
                table.res_widen.append(kernels)
            else:
                dst = ab if layer.late_residual else ab + tile
                table.res_widen.append((len(uops), len(uops) + layer.residual_ratio))
                uops += [Uop(dst, res_inp + j, wgt.total + j)
                         for j in range(layer.residual_ratio)]
            table.res_inp.append(res_inp)
        if layer.has_residual and not layer.late_residual:
            table.alu_res.append(len(uops))
            uops.append(Uop(ab + tile, 0))
            table.alu_add_res.append(len(uops))
            uops.append(Uop(ab, ab + tile))
        if layer.bias_gemm:
            # One bias micro-op per output-channel tile: the ones vector times the bias
            # blocks from the tile's first output block on (`common.bias_blocks`).
            for ob0 in co_starts(layer, s):
                table.bias[t, ob0] = len(uops)
                uops.append(Uop(ab, table.ones_inp, table.bias_wgt_base + ob0))
        # One vector micro-op per (constant row, output-channel tile): its src is the row's
        # entry for the tile's first block. Rows are counted for the size check even
        # before the epilogue says which tile region each reads.
        targets = rows_used or {row: 0 for row in range(layer.const_rows)}
        for row, target in targets.items():
            for ob0 in co_starts(layer, s):
                table.alu_vec[t, target, row, ob0] = len(uops)
                uops.append(Uop(ab + target, const_base + row * layer.out_blocks + ob0))
    return table


# --- lowering -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class LoweredConv2d(ArenaProgram):
    """A lowered qconv2d: `program` (for an arena at DRAM address 0; `relocate` moves it),
    the arena's `regions` (name -> offset and size in bytes), the static data the
    program expects there (micro-ops, constant rows), and the host-side packing."""

    node: str
    config: HardwareConfig
    layer: Conv2dLayer
    schedule: Conv2dSchedule
    program: Program
    regions: dict
    arena_bytes: int
    uop_bytes: bytes
    const_rows: np.ndarray        # (R, padded O) int32; the host adds the bias to bias_row
    bias_row: int | None
    bias_gemm: np.ndarray | None  # (padded O,) int64 the host adds the bias to, or None

    @property
    def kernel_layout(self) -> str:
        return f"OIHW{self.config.block_out}o{self.config.block_in}i"

    # Host-side packing of the operands into the arena's formats.

    def pack_input(self, x: np.ndarray) -> np.ndarray:
        L = self.layer
        if L.dense:
            if L.sequence and np.ndim(x) == 3 and np.shape(x)[0] == 1:   # (1, S, D)
                x = np.asarray(x)[0]
            x = _dense_image(check_array(x, _dense_shape(L, L.c), np.int8, "input"), L)
        if L.packed is not None:        # kernel taps packed into channels
            tp = L.packed
            h = tp.height if tp.im2col else L.h
            x = pack_taps(check_array(x, (L.n, tp.channels, h, tp.width), np.int8, "input"),
                          tp)
        return pack_activation(check_array(x, (L.n, L.c, L.h, L.w), np.int8, "input"),
                               self.config, self.config.block_in)

    def pack_weights(self, w: np.ndarray) -> np.ndarray:
        """Weights (O, C / groups, kh, kw) int8 -> the arena's weight blocks: per span,
        (output blocks, input blocks, kh, kw, block_out, block_in), the spans one after
        the other; a diagonal layer's block k holds channel k's taps on its diagonal."""
        L, c = self.layer, self.config
        if L.streamed:     # b's sequence image: its blocks lie as the GEMM core reads them
            b = check_array(np.asarray(w).reshape(-1, L.c), (L.o, L.c), np.int8, "b")
            return pack_activation(b.T[None, :, :, None], c, c.block_in)
        if L.dense:
            w = check_array(w, (L.o, L.c), np.int8, "weights").reshape(L.o, L.c, 1, 1)
        if L.packed is not None:
            tp = L.packed
            kh = tp.kernel_h if tp.im2col else L.kernel_h
            w = pack_tap_weights(check_array(w, (L.o, tp.channels, kh, tp.kernel_w),
                                             np.int8, "weights"), tp)
        w = check_array(w, (L.o, L.c // L.groups, L.kernel_h, L.kernel_w), np.int8, "weights")
        if L.window:
            return window_weights(w, L, c)
        if L.groups == 1:
            return pack(w, "OIHW", self.kernel_layout)
        return grouped_weights(w, L, c, self.kernel_layout)

    def pack_constants(self, bias: np.ndarray | None) -> np.ndarray:
        """The per-channel constant rows as acc elements, the bias added to its row
        (modulo 2**32, like the accumulator)."""
        rows = self.const_rows.astype(np.int64)
        if bias is not None:
            if self.bias_row is None:
                raise ValueError(f"conv2d node {self.node!r} was lowered without a bias")
            rows[self.bias_row, :self.layer.o] += check_array(bias, (self.layer.o,), np.int32,
                                                         "bias")
        return acc_rows(wrap32(rows).astype(np.int32), self.config)

    def static_data(self, weights: np.ndarray | None, bias: np.ndarray | None) -> dict:
        """The arena regions that stay the same from run to run: {region: array}
        (micro-ops, constant rows with the bias, packed weights). A streamed layer's
        weights (a qmatmul's b) are an activation: None, unless one run packs them here
        (`run_conv2d`)."""
        data = {"uop": np.frombuffer(self.uop_bytes, np.uint8)}
        if weights is not None:
            data["weights"] = self.pack_weights(weights)
        elif not self.layer.streamed:
            raise ValueError(f"conv2d node {self.node!r} needs its weights")
        if self.layer.residual_ratio:
            data["identity"] = identity_blocks(self.config, self.layer.residual_ratio)
        if self.bias_gemm is not None:
            data.update(self.pack_bias_gemm(bias))
        if len(self.const_rows):
            data["const"] = self.pack_constants(bias if self.bias_gemm is None else None)
        elif bias is not None and self.bias_gemm is None:
            raise ValueError(f"conv2d node {self.node!r} was lowered without a bias")
        return data

    def pack_bias_gemm(self, bias: np.ndarray | None) -> dict:
        """The bias GEMM's regions: its input vector and the bias blocks of bias plus
        rounding constant (`common.bias_blocks`)."""
        values = self.bias_gemm.copy()
        if bias is not None:
            values[:self.layer.o] += check_array(bias, (self.layer.o,), np.int32, "bias")
        return {"ones": ones_vector(self.config),
                "bias_wgt": bias_blocks(wrap32(values), self.config)}

    def input_data(self, x: np.ndarray, residual: np.ndarray | None = None) -> dict:
        """The arena regions one run writes: {region: array} (input, residual)."""
        if self.layer.has_residual != (residual is not None):
            raise ValueError(f"conv2d node {self.node!r} was lowered "
                             f"{'with' if self.layer.has_residual else 'without'} a "
                             f"residual; got {'one' if residual is not None else 'none'}")
        data = {"input": self.pack_input(x)}
        if residual is not None:
            data["residual"] = self.pack_residual(residual)
        return data

    def pack_residual(self, residual: np.ndarray) -> np.ndarray:
        """The residual as the program reads it: int8 in the input layout, its channels
        padded to whole output blocks (`Conv2dLayer.residual_ratio`), or int32 acc
        elements for a LOAD ACC."""
        L, c = self.layer, self.config
        if L.dense:
            residual = _dense_image(check_array(residual, _dense_shape(L, L.o), np.int8,
                                                "residual"), L)
        r = check_array(residual, (L.n, L.o, L.out_h, L.out_w), np.int8, "residual")
        if not L.residual_ratio:
            return pack(r.astype(np.int32), "NCHW", self.out_layout)
        return pack_activation(r, c, c.block_in, channels=L.out_blocks * c.block_out)

    def unpack_output(self, raw: np.ndarray) -> np.ndarray:
        L, c = self.layer, self.config
        y = unpack_activation(raw, c, c.block_out, (L.n, L.o, L.out_h, L.out_w),
                              L.out_planes * c.block_out)
        if not L.dense:
            return y
        return np.ascontiguousarray(y[0, :, :, 0].T) if L.sequence else y.reshape(L.n, L.o)


def _dense_shape(L: Conv2dLayer, channels: int) -> tuple[int, int]:
    """The plain (rows, channels) of a dense layer's operand with `channels` columns."""
    return (L.h if L.sequence else L.n), channels


def _dense_image(x: np.ndarray, L: Conv2dLayer) -> np.ndarray:
    """A dense layer's plain (rows, channels) operand as the NCHW image the layer runs
    over: N 1x1 images, or one rows x 1 image (`Conv2dLayer.sequence`)."""
    if L.sequence:
        return np.ascontiguousarray(x.T[None, :, :, None])
    return x.reshape(x.shape[0], x.shape[1], 1, 1)


def _arena(layer: Conv2dLayer, config: HardwareConfig, n_uops: int) -> tuple[dict, int]:
    L, c = layer, config
    sizes = {
        "uop": n_uops * c.uop_bytes,
        "const": L.const_rows * L.out_blocks * c.acc_elem_bytes,
        "input": L.batch_blocks * L.in_planes * L.h * L.w * c.inp_elem_bytes,
        "weights": L.weight_blocks * L.wgt_taps * c.wgt_elem_bytes,
        # The residual: int8 in the input layout (widened on the GEMM core), or int32 acc
        # elements (LOAD ACC) where block_out is not a multiple of block_in.
        "residual": (0 if not L.has_residual else
                     L.batch_blocks * L.out_planes * L.out_h * L.out_w * c.out_elem_bytes
                     if L.residual_ratio else
                     L.batch_blocks * L.out_blocks * L.out_h * L.out_w * c.acc_elem_bytes),
        "identity": L.residual_ratio * c.wgt_elem_bytes,
        "ones": c.inp_elem_bytes if L.bias_gemm else 0,
        "bias_wgt": L.out_blocks * c.wgt_elem_bytes if L.bias_gemm else 0,
        "output": L.batch_blocks * L.out_planes * L.out_h * L.out_w * c.out_elem_bytes,
    }
    return layout_arena(sizes, config)


def lower_conv2d(node: Node | str, graph: Graph, config: HardwareConfig,
                 schedule: Conv2dSchedule | None = None) -> LoweredConv2d:
    """Lower qconv2d `node` of `graph` to a program for `config` (see the module
    docstring). Raises ValueError for what the back half does not support yet (packed
    layouts, pads >= the kernel's extent) and for a schedule that does not fit."""
    node, (layer, epilogue), s = start_lowering("lower_conv2d", node, graph, config, schedule,
                                                conv2d_layer, choose_conv2d, Conv2dSchedule)
    # Which tile region each constant row applies to (conv tile or residual tile).
    res_base = s.tile_h * s.tile_w * s.tile_co
    rows_used = {st.row: 0 for st in epilogue.main if st.row is not None}
    rows_used.update({st.row: res_base for st in epilogue.residual or () if st.row is not None})
    rows_used.update({st.row: 0 for st in epilogue.clamp or () if st.row is not None})
    uop_table = conv_uop_table(layer, s, config, rows_used)
    regions, arena_bytes = _arena(layer, config, len(uop_table.uops))
    program = _emit(layer, s, config, epilogue, uop_table, regions)
    return LoweredConv2d(node.name, config, layer, s, program, regions, arena_bytes,
                         encode_uops(uop_table.uops, config), epilogue.rows,
                         epilogue.bias_row, epilogue.bias_gemm)


# --- the program ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Tile:
    """One output tile as the program runs it: batch block `nb`, output-channel blocks
    `ob0` .. `ob0 + tco - 1` of `span`, output rows `oh0` .. `oh0 + th - 1` and columns
    `ow0` .. `ow0 + tw - 1`; its input window (`cols` wide) clipped to the image (rows
    `y0`:`y1`, columns `x0`:`x1`), the LOAD's `pads` for the rest; its input-channel
    `chunks` ((first input block, blocks loaded, blocks per output block in the GEMM
    kernel) each)."""

    nb: int
    ob0: int
    oh0: int
    ow0: int
    tco: int
    th: int
    tw: int
    cols: int
    y0: int
    y1: int
    x0: int
    x1: int
    pads: dict
    span: tuple
    chunks: list

    @property
    def plane(self) -> int:
        """acc entries of one output block of the tile."""
        return self.th * self.tw


def _emit(L: Conv2dLayer, s: Conv2dSchedule, c: HardwareConfig, epi: ConvEpilogue,
          u: ConvUops, regions: dict) -> Program:
    """The program of `L` tiled by `s` (see the module docstring): the tables, then the
    tiles in groups of `s.nthreads`, the group's threads interleaved chunk by chunk."""
    e = _ConvEmitter(L, s, c, epi, u, regions)
    e.load_tables()
    for group in e.groups():
        tiles = [e.tile(*start) for start in group]
        # The threads' chunks interleave (a grouped layer's tiles may differ in count).
        for j in range(max(len(tile.chunks) for tile in tiles)):
            for t, tile in enumerate(tiles):
                if j < len(tile.chunks):
                    e.chunk(t, tile, j)
    return e.tokens.finish()  # FINISH waits for the last store


class _ConvEmitter:
    """The steps of a conv2d program, written into one `ProgramBuilder` (`p`) with its
    dependency tokens (`tokens`): `load_tables`, then per chunk of a tile `chunk` (its
    loads, the tile's reset before its first GEMM, the GEMM, and after the last chunk
    the epilogue and the stores). `t` is the virtual thread a tile runs on."""

    def __init__(self, L: Conv2dLayer, s: Conv2dSchedule, c: HardwareConfig,
                 epi: ConvEpilogue, u: ConvUops, regions: dict):
        self.L, self.s, self.c, self.epi, self.u = L, s, c, epi, u

        def base(name: str, elem_bytes: int) -> int:
            return regions[name].offset // elem_bytes

        self.uop0, self.const0 = base("uop", c.uop_bytes), base("const", c.acc_elem_bytes)
        self.res0 = base("residual",
                         c.inp_elem_bytes if L.residual_ratio else c.acc_elem_bytes)
        self.identity0 = base("identity", c.wgt_elem_bytes)
        self.ones0, self.bias_wgt0 = base("ones", c.inp_elem_bytes), base("bias_wgt",
                                                                         c.wgt_elem_bytes)
        self.inp0, self.wgt0 = base("input", c.inp_elem_bytes), base("weights", c.wgt_elem_bytes)
        self.out0 = base("output", c.out_elem_bytes)
        self.ratio = L.residual_ratio
        self.taps = L.wgt_taps     # weight blocks per (output block, input block)
        self.chunk_elems = inp_chunk(L, s)
        self.p = ProgramBuilder(c)
        self.tokens = RegionTokens(self.p)
        # Each span's weights follow the previous span's, (its output blocks, its input
        # blocks or one diagonal block, taps) in blocks.
        self.wgt_span, offset = {}, 0
        for span in L.spans:
            self.wgt_span[span] = offset
            offset += span[1] * (1 if L.paired else span[3]) * self.taps
        # Per thread: (ob0, cb0) of the weights its region holds.
        self.wgt_in_sram = [None] * s.nthreads
        # Per thread: its conv tile region is at zero (the REQ that ends every epilogue
        # with the ALU's REQ clears the accumulators it narrows).
        self.cleared = [False] * s.nthreads

    def load_tables(self):
        """The micro-ops, the constant rows and the identity blocks, once."""
        p, L, u = self.p, self.L, self.u
        p.load(MemoryType.UOP, sram_base=0, dram_base=self.uop0, y_size=1, x_size=len(u.uops),
               x_stride=len(u.uops))
        if L.const_rows:
            n = L.const_rows * L.out_blocks
            p.load(MemoryType.ACC, sram_base=u.const_base, dram_base=self.const0, y_size=1,
                   x_size=n, x_stride=n)
        if self.ratio:  # the identity blocks, once (the first chunk's token covers them)
            p.load(MemoryType.WGT, sram_base=u.identity_base, dram_base=self.identity0,
                   y_size=1, x_size=self.ratio, x_stride=self.ratio)
        if L.bias_gemm:  # the bias GEMM's input vector and blocks, once (likewise)
            p.load(MemoryType.INP, sram_base=u.ones_inp, dram_base=self.ones0, y_size=1,
                   x_size=1, x_stride=1)
            p.load(MemoryType.WGT, sram_base=u.bias_wgt_base, dram_base=self.bias_wgt0,
                   y_size=1, x_size=L.out_blocks, x_stride=L.out_blocks)

    def groups(self) -> list[list[tuple]]:
        """The tiles in program order, (nb, (ob0, tco, span), oh0, ow0) each, in groups of
        `nthreads`. With 2 virtual threads, consecutive tiles alternate between the
        threads: the output-channel tiles (oc_nthread) or output-row tiles (h_nthread)
        are the innermost loop. Every group of `threads` consecutive tiles (the last one
        maybe partial) runs interleaved, thread i taking the group's i-th tile, so that a
        thread is present in every group but the last (which keeps the tokens of each
        queue in program order: the k-th pop always waits for the k-th push)."""
        L, s = self.L, self.s
        threads = s.nthreads
        cos, ohs = L.co_tiles(s.tile_co), range(0, L.out_h, s.tile_h)
        ows = range(0, L.out_w, s.tile_w)
        if s.oc_nthread > 1:
            tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for oh0 in ohs
                     for ow0 in ows for co in cos]
        elif s.h_nthread > 1:
            tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for co in cos
                     for ow0 in ows for oh0 in ohs]
        else:
            tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for co in cos
                     for oh0 in ohs for ow0 in ows]
        return [tiles[i:i + threads] for i in range(0, len(tiles), threads)]

    def tile(self, nb: int, co: tuple, oh0: int, ow0: int) -> _Tile:
        """The tile from (nb, (ob0, tco, span), oh0, ow0): its sizes, its input window
        clipped to the image (the LOAD pads the rest) and its chunks."""
        L, s = self.L, self.s
        ob0, tco, span = co
        th, tw = min(s.tile_h, L.out_h - oh0), min(s.tile_w, L.out_w - ow0)
        rows, cols = window_rows(L, th), window_cols(L, tw)
        r0, c0 = oh0 * L.stride_h - L.pads[0], ow0 * L.stride_w - L.pads[1]
        y0, y1 = max(r0, 0), min(r0 + rows, L.h)
        x0, x1 = max(c0, 0), min(c0 + cols, L.w)
        pads = dict(y_pad_0=y0 - r0, y_pad_1=r0 + rows - y1, x_pad_0=x0 - c0,
                    x_pad_1=c0 + cols - x1)
        if L.diagonal_rows:   # the rows' own input blocks: the rest of a is zeros
            chunks = [(oh0 // L.row_block, th // L.row_block, th // L.row_block)]
        else:
            chunks = self.chunks_of(ob0, tco, span)
        return _Tile(nb, ob0, oh0, ow0, tco, th, tw, cols, y0, y1, x0, x1, pads, span,
                     chunks)

    def chunks_of(self, ob0: int, tco: int, span: tuple) -> list[tuple[int, int, int]]:
        """The input-channel chunks of an output-channel tile: (first input block, blocks
        loaded, blocks per output block in the GEMM kernel). A diagonal tile loads the
        input block of each of its output blocks, and each output block reads one."""
        ob, _, cb, cn = span
        if self.L.diagonal:
            return [(cb + ob0 - ob, tco, 1)]
        if self.L.window:   # each output block's activation block
            g = self.L.inp_group
            return [(cb + (ob0 - ob) * g, tco * g, 1)]
        tci = self.s.tile_ci
        return [(cb0, min(tci, cb + cn - cb0), min(tci, cb + cn - cb0))
                for cb0 in range(cb, cb + cn, tci)]

    def chunk(self, t: int, tile: _Tile, j: int):
        """Chunk `j` of `tile` on thread `t`: its loads, the tile's reset (first chunk),
        its GEMM, and after the last chunk the epilogue and the stores (which overlap
        the other thread's last GEMM)."""
        cb0, loaded, tci = tile.chunks[j]
        self.load_chunk(t, tile, j, cb0, loaded, tci)
        if not j:
            self.reset(t, tile)
        self.gemm(t, tile, j, tci)
        if j + 1 == len(tile.chunks):
            self.epilogue(t, tile)
            self.store(t, tile)

    def load_chunk(self, t: int, tile: _Tile, j: int, cb0: int, loaded: int, tci: int):
        """The chunk's inputs (and with the first chunk the int8 residual) and, unless
        the thread's region holds them, its weights, into thread `t`'s regions."""
        p, L, u = self.p, self.L, self.u
        self.tokens.load_into(("inp", t))  # WAR: its previous GEMM has read the region
        g = L.inp_group   # one LOAD per activation block: g input blocks per pixel
        for lb in range(-(-loaded // g)):
            activation_dma(p, u.inp_base[t] + lb * self.chunk_elems * g,
                           self.inp0 + (tile.nb * L.in_planes + cb0 + lb * g) * L.h * L.w,
                           L.w, tile.y0, tile.y1, tile.x0, tile.x1, g, tile.pads)
        if not j and self.ratio:
            self.load_residual(t, tile)
        if self.wgt_in_sram[t] != (tile.ob0, cb0):
            ob, _, cb, cn = tile.span
            row = tci * self.taps                  # one output block's weights
            stride = self.taps if L.paired else cn * self.taps
            first = self.wgt_span[tile.span] + (tile.ob0 - ob) * stride + (
                0 if L.paired else (cb0 - cb) * self.taps)
            if L.streamed:   # b's buffer: block (ob, ib) at ib * out_blocks + ob
                for obi in range(tile.tco):
                    p.load(MemoryType.WGT, sram_base=u.wgt_base[t] + obi * row,
                           dram_base=self.wgt0 + cb0 * L.out_blocks + tile.ob0 + obi,
                           y_size=tci, x_size=1, x_stride=L.out_blocks)
            else:
                p.load(MemoryType.WGT, sram_base=u.wgt_base[t], dram_base=self.wgt0 + first,
                       y_size=tile.tco, x_size=row, x_stride=stride)
            self.wgt_in_sram[t] = (tile.ob0, cb0)
        self.tokens.loaded()

    def load_residual(self, t: int, tile: _Tile):
        """The int8 residual tile into thread `t`'s inp region, one LOAD per output block
        (its `ratio` input blocks per pixel side by side, see `conv_uop_table`)."""
        L, ratio, og = self.L, self.ratio, self.L.out_group
        if og > 1:   # one input block per og output blocks
            for lb in range(-(-tile.tco // og)):
                activation_dma(self.p, self.u.res_inp[t] + lb * tile.plane,
                               self.res0 + (tile.nb * L.out_planes + tile.ob0 + lb * og) // og
                               * L.out_h * L.out_w, L.out_w, tile.oh0, tile.oh0 + tile.th,
                               tile.ow0, tile.ow0 + tile.tw, 1)
            return
        for obi in range(tile.tco):
            activation_dma(self.p, self.u.res_inp[t] + obi * tile.plane * ratio,
                           self.res0 + (tile.nb * L.out_blocks + tile.ob0 + obi) * ratio
                           * L.out_h * L.out_w, L.out_w, tile.oh0, tile.oh0 + tile.th,
                           tile.ow0, tile.ow0 + tile.tw, ratio)

    def reset(self, t: int, tile: _Tile):
        """Before the tile's first GEMM: its acc tile to zero, and its residual tile to
        zero (to be widened) or loaded as int32 (LOAD ACC)."""
        p, L, u = self.p, self.L, self.u
        plane = tile.plane
        self.tokens.compute_into(("acc", t))  # WAR: its previous tile is stored
        # The acc tile starts at zero (the bias is added onto it): one reset micro-op per
        # acc entry. A LOAD ACC of the bias with stride 0 would read 64 bytes per entry
        # from DRAM, 8 cycles at 8 B/cycle. Where the epilogue ends in a REQ, which
        # clears what it narrows, only the thread's first tile resets, its whole region.
        k = u.reset[t]
        if self.epi.clamp is None:
            p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=tile.tco,
                   iter_in=plane, dst_factor_out=plane, dst_factor_in=1)
        elif not self.cleared[t]:
            region = self.s.tile_h * self.s.tile_w
            p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=self.s.tile_co,
                   iter_in=region, dst_factor_out=region, dst_factor_in=1)
            self.cleared[t] = True
        if L.late_residual:
            pass                    # widened onto the tile after the main epilogue
        elif self.ratio:
            k = u.res_reset[t]
            p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=tile.tco,
                   iter_in=plane, dst_factor_out=plane, dst_factor_in=1)
        elif L.has_residual:
            for obi in range(tile.tco):
                p.load(MemoryType.ACC, sram_base=u.acc_base[t] + u.res_base + obi * plane,
                       dram_base=self.res0 + ((tile.nb * L.out_blocks + tile.ob0 + obi)
                                              * L.out_h + tile.oh0) * L.out_w + tile.ow0,
                       y_size=tile.th, x_size=tile.tw, x_stride=L.out_w)

    def gemm(self, t: int, tile: _Tile, j: int, tci: int):
        """Chunk `j`'s GEMM (after the first chunk's loads, the residual widened into its
        acc tile, unchanged)."""
        p, L, u = self.p, self.L, self.u
        plane = tile.plane
        self.tokens.wait_loaded()  # RAW: this chunk's inputs and weights are in
        if not j and L.bias_gemm:
            # The bias onto the reset tile: the ones vector times each output block's
            # bias block, one micro-op per entry (after the token: the first chunk's
            # loads follow the tables').
            k = u.bias[t, tile.ob0]
            p.gemm(uop_bgn=k, uop_end=k + 1, iter_out=tile.tco, iter_in=plane,
                   dst_factor_out=plane, dst_factor_in=1, src_factor_out=0, src_factor_in=0,
                   wgt_factor_out=1, wgt_factor_in=0)
        if not j and self.ratio and not L.late_residual:
            self.widen_residual(t, tile)
        if L.window:
            kernels = [u.gemm[t, tile.tw, "dw", ky] for ky in range(L.kernel_h)]
            emit_window_gemms(p, kernels, tile, L, self.chunk_elems)
            self.tokens.read(("inp", t))
            return
        bgn, end = u.gemm[t, tile.tw, tci]
        # Output block o of the tile reads the chunk's blocks (the same for every o), or,
        # diagonal, its own input block (the next one along).
        p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tile.tco, iter_in=tile.th,
               dst_factor_out=plane, dst_factor_in=tile.tw,
               src_factor_out=self.chunk_elems if L.diagonal else 0,
               src_factor_in=L.stride_h * tile.cols * L.inp_group,
               wgt_factor_out=tci * self.taps,
               wgt_factor_in=0)
        self.tokens.read(("inp", t))  # its next loads wait for this GEMM (WAR)

    def widen_residual(self, t: int, tile: _Tile):
        """The int8 residual tile through the identity weights into its acc tile (or,
        late, onto the conv tile); where block_in > block_out, through the selection
        blocks, og output blocks out of each input block."""
        L, u, p = self.L, self.u, self.p
        plane = tile.plane
        if L.out_group > 1:
            og = L.out_group
            bgn, end = u.res_widen[t][plane]
            p.gemm(uop_bgn=bgn, uop_end=end, iter_out=-(-tile.tco // og), iter_in=plane,
                   dst_factor_out=og * plane, dst_factor_in=1, src_factor_out=plane,
                   src_factor_in=1, wgt_factor_out=0, wgt_factor_in=0)
        else:
            bgn, end = u.res_widen[t]
            p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tile.tco, iter_in=plane,
                   dst_factor_out=plane, dst_factor_in=1, src_factor_out=plane * self.ratio,
                   src_factor_in=self.ratio, wgt_factor_out=0, wgt_factor_in=0)

    def epilogue(self, t: int, tile: _Tile):
        """The ALU passes over thread `t`'s tile: the main steps, the residual's steps
        and its ADD, the clamp (whose MIN writes the int8 out buffer the stores read)."""
        p, u, epi = self.p, self.u, self.epi
        plane = tile.plane
        # Epilogue over the tile: iter_out over output blocks, iter_in over positions.
        loop = dict(iter_out=tile.tco, iter_in=plane, dst_factor_out=plane, dst_factor_in=1)

        def alu_pass(steps, target, imm_uop):
            for st in steps:
                if st.row is None:
                    p.alu(st.op, uop_bgn=imm_uop, uop_end=imm_uop + 1, use_imm=True,
                          imm=st.imm, **loop)
                else:
                    k = u.alu_vec[t, target, st.row, tile.ob0]
                    p.alu(st.op, uop_bgn=k, uop_end=k + 1, src_factor_out=1, **loop)

        alu_pass(epi.main, 0, u.alu_main[t])
        if self.L.late_residual:
            # The residual as it is, added by the GEMM core onto the requantized tile:
            # this GEMM is now the last to read the thread's inp region (WAR).
            self.widen_residual(t, tile)
            self.tokens.read(("inp", t))
        elif self.L.has_residual:
            alu_pass(epi.residual, u.res_base, u.alu_res[t])
            k = u.alu_add_res[t]
            p.alu(AluOp.ADD, uop_bgn=k, uop_end=k + 1, src_factor_out=plane,
                  src_factor_in=1, **loop)
        # The clamp always runs: its last step writes the int8 out buffer the stores
        # read (with the ALU's REQ it may be the requantization's own last step).
        if epi.clamp is None:
            k = u.alu_main[t]
            p.alu(AluOp.MAX, uop_bgn=k, uop_end=k + 1, use_imm=True, imm=epi.out_min, **loop)
            p.alu(AluOp.MIN, uop_bgn=k, uop_end=k + 1, use_imm=True, imm=epi.out_max, **loop)
        else:
            alu_pass(epi.clamp, 0, u.alu_main[t])
        self.tokens.computed()

    def store(self, t: int, tile: _Tile):
        """Thread `t`'s out tile to DRAM, one 2-D STORE per output block (each out element
        to its place in its activation block: `common.store_activation`)."""
        L, g = self.L, self.L.out_group
        self.tokens.wait_computed()  # RAW: the out tile is written
        for obi in range(tile.tco):
            block, j = divmod(tile.ob0 + obi, g)
            store_activation(self.p, self.u.acc_base[t] + obi * tile.plane,
                             self.out0 + (tile.nb * L.out_planes + block * g) * L.out_h
                             * L.out_w, L.out_w, tile.oh0, tile.th, tile.ow0, tile.tw, g, j)
        self.tokens.stored(("acc", t))  # this thread's next tile waits for it (WAR)


# --- running --------------------------------------------------------------------------------

def run_conv2d(dev, lowered: LoweredConv2d, x_int8: np.ndarray, w_int8: np.ndarray,
               bias_int32: np.ndarray | None, residual: np.ndarray | None = None, *,
               return_stats: bool = False):
    """Write the operands packed into `dev`'s DRAM, run the program, read the output back
    and unpack it: int8 (N, O, Ho, Wo). With `return_stats`, returns (y, stats)."""
    data = {**lowered.static_data(w_int8, bias_int32),
            **lowered.input_data(x_int8, residual)}
    raw, stats = run_arena(dev, lowered, data)
    y = lowered.unpack_output(raw)
    return (y, stats) if return_stats else y
