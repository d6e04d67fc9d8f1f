"""One ``qconv2d`` or ``qdense`` node tensorized into a vdla program.

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
   second acc region by identity-weight GEMMs, requantized there, ADDed), then MAX/MIN
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
over the batch rows), input int8 ``NCHW{batch}n{block_in}c``, weights int8
``OIHW{block_out}o{block_in}i``, the residual int8 ``NCHW{batch}n{block_in}c`` (its
channels padded to whole output blocks) and the identity weight blocks that widen it, and
the int8 output ``NCHW{batch}n{block_out}c``. The residual stays int8 so that it can be
another op's output in place; where block_out is not a multiple of block_in (no identity
maps an input block into an output block) it is int32 acc elements instead, widened by
the host, and a LOAD ACC on the compute module reads it. The program is emitted for an
arena at address 0 and relocated to wherever the arena is allocated.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import pack, unpack
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import wrap32
from vdla.compiler.targets.vdla.common import (ArenaProgram, acc_rows, check_array,
                                               identity_blocks, layout_arena, run_arena)
from vdla.compiler.targets.vdla.cost import choose_conv2d
from vdla.compiler.targets.vdla.conv_layer import (Conv2dLayer, ConvEpilogue, conv2d_layer,
                                               window_cols, window_rows)
from vdla.compiler.targets.vdla.schedules import Conv2dSchedule
from vdla.compiler.targets.vdla.uops import ConvUops, conv_uop_table, inp_chunk
from vdla.config import AluOp, HardwareConfig
from vdla.isa import MemoryType, Program, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import RegionTokens

__all__ = ["LoweredConv2d", "lower_conv2d", "run_conv2d"]


# --- lowering ---------------------------------------------------------------------------------

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

    @property
    def kernel_layout(self) -> str:
        return f"OIHW{self.config.block_out}o{self.config.block_in}i"

    # Host-side packing of the operands into the arena's formats.

    def pack_input(self, x: np.ndarray) -> np.ndarray:
        L = self.layer
        if L.dense:
            x = check_array(x, (L.n, L.c), np.int8, "input").reshape(L.n, L.c, 1, 1)
        return pack(check_array(x, (L.n, L.c, L.h, L.w), np.int8, "input"), "NCHW",
                    self.data_layout)

    def pack_weights(self, w: np.ndarray) -> np.ndarray:
        """Weights (O, C / groups, kh, kw) int8 -> the arena's weight blocks: per span,
        (output blocks, input blocks, kh, kw, block_out, block_in), the spans one after
        the other; a diagonal layer's block k holds channel k's taps on its diagonal."""
        L, c = self.layer, self.config
        if L.dense:
            w = check_array(w, (L.o, L.c), np.int8, "weights").reshape(L.o, L.c, 1, 1)
        w = check_array(w, (L.o, L.c // L.groups, L.kernel_h, L.kernel_w), np.int8, "weights")
        if L.groups == 1:
            return pack(w, "OIHW", self.kernel_layout)
        if L.diagonal:
            blocks = np.zeros((L.out_blocks, L.kernel_h, L.kernel_w, c.block_out, c.block_in),
                              np.int8)
            lanes = np.arange(c.block_out)
            taps = np.zeros((L.out_blocks * c.block_out, L.kernel_h, L.kernel_w), np.int8)
            taps[:L.o] = w[:, 0]
            blocks[:, :, :, lanes, lanes] = taps.reshape(
                L.out_blocks, c.block_out, L.kernel_h, L.kernel_w).transpose(0, 2, 3, 1)
            return blocks
        # Grouped: the dense (O, C) weights with zeros outside each output channel's group,
        # then each span's block range.
        cg, og = L.c // L.groups, L.o // L.groups
        full = np.zeros((L.o, L.c, L.kernel_h, L.kernel_w), np.int8)
        for g in range(L.groups):
            full[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og]
        packed = pack(full, "OIHW", self.kernel_layout)
        return np.concatenate([packed[ob:ob + on, cb:cb + cn].reshape(-1)
                               for ob, on, cb, cn in L.spans])

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

    def static_data(self, weights: np.ndarray, bias: np.ndarray | None) -> dict:
        """The arena regions that stay the same from run to run: {region: array}
        (micro-ops, constant rows with the bias, packed weights)."""
        data = {"uop": np.frombuffer(self.uop_bytes, np.uint8),
                "weights": self.pack_weights(weights)}
        if self.layer.residual_ratio:
            data["identity"] = identity_blocks(self.config, self.layer.residual_ratio)
        if len(self.const_rows):
            data["const"] = self.pack_constants(bias)
        elif bias is not None:
            raise ValueError(f"conv2d node {self.node!r} was lowered without a bias")
        return data

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
            residual = check_array(residual, (L.n, L.o), np.int8,
                                   "residual").reshape(L.n, L.o, 1, 1)
        r = check_array(residual, (L.n, L.o, L.out_h, L.out_w), np.int8, "residual")
        if not L.residual_ratio:
            return pack(r.astype(np.int32), "NCHW", self.out_layout)
        r = np.pad(r, ((0, 0), (0, L.out_blocks * c.block_out - L.o), (0, 0), (0, 0)))
        return pack(r, "NCHW", self.data_layout)

    def unpack_output(self, raw: np.ndarray) -> np.ndarray:
        L, c = self.layer, self.config
        shape = (L.batch_blocks, L.out_blocks, L.out_h, L.out_w, c.batch, c.block_out)
        y = unpack(raw.view(np.int8).reshape(shape), self.out_layout, "NCHW",
                   channels=L.o, batch=L.n)
        return y.reshape(L.n, L.o) if L.dense else y


def _arena(layer: Conv2dLayer, config: HardwareConfig, n_uops: int) -> tuple[dict, int]:
    L, c = layer, config
    sizes = {
        "uop": n_uops * c.uop_bytes,
        "const": L.const_rows * L.out_blocks * c.acc_elem_bytes,
        "input": L.batch_blocks * L.in_blocks * L.h * L.w * c.inp_elem_bytes,
        "weights": L.weight_blocks * L.kernel_h * L.kernel_w * c.wgt_elem_bytes,
        # The residual: int8 in the input layout (widened on the GEMM core), or int32 acc
        # elements (LOAD ACC) where block_out is not a multiple of block_in.
        "residual": (0 if not L.has_residual else
                     L.batch_blocks * L.out_blocks * L.residual_ratio * L.out_h * L.out_w
                     * c.inp_elem_bytes if L.residual_ratio else
                     L.batch_blocks * L.out_blocks * L.out_h * L.out_w * c.acc_elem_bytes),
        "identity": L.residual_ratio * c.wgt_elem_bytes,
        "output": L.batch_blocks * L.out_blocks * L.out_h * L.out_w * c.out_elem_bytes,
    }
    return layout_arena(sizes, config)


def lower_conv2d(node: Node | str, graph: Graph, config: HardwareConfig,
                 schedule: Conv2dSchedule | None = None) -> LoweredConv2d:
    """Lower qconv2d `node` of `graph` to a program for `config` (see the module
    docstring). Raises ValueError for what the back half does not support yet (groups,
    dilation, packed layouts, pads >= kernel) and for a schedule that does not fit."""
    if isinstance(node, str):
        node = graph.node(node)
    layer, epilogue = conv2d_layer(node, graph, config)
    schedule = schedule or choose_conv2d(layer, config)
    if not isinstance(schedule, Conv2dSchedule):
        raise TypeError(f"lower_conv2d: schedule must be a Conv2dSchedule, not "
                        f"{type(schedule).__name__}")
    schedule.check(layer, config)
    s = schedule.clamped(layer)
    # Which tile region each constant row applies to (conv tile or residual tile).
    res_base = s.tile_h * s.tile_w * s.tile_co
    rows_used = {st.row: 0 for st in epilogue.main if st.row is not None}
    rows_used.update({st.row: res_base for st in epilogue.residual or () if st.row is not None})
    uop_table = conv_uop_table(layer, s, config, rows_used)
    regions, arena_bytes = _arena(layer, config, len(uop_table.uops))
    program = _emit(layer, s, config, epilogue, uop_table, regions)
    return LoweredConv2d(node.name, config, layer, s, program, regions, arena_bytes,
                         encode_uops(uop_table.uops, config), epilogue.rows,
                         epilogue.bias_row)



def _emit(L: Conv2dLayer, s: Conv2dSchedule, c: HardwareConfig, epi: ConvEpilogue,
          u: ConvUops, regions: dict) -> Program:
    def base(name: str, elem_bytes: int) -> int:
        return regions[name].offset // elem_bytes

    uop0, const0 = base("uop", c.uop_bytes), base("const", c.acc_elem_bytes)
    res0 = base("residual", c.inp_elem_bytes if L.residual_ratio else c.acc_elem_bytes)
    ratio = L.residual_ratio
    inp0, wgt0 = base("input", c.inp_elem_bytes), base("weights", c.wgt_elem_bytes)
    out0 = base("output", c.out_elem_bytes)
    kh, kw, sh, sw = L.kernel_h, L.kernel_w, L.stride_h, L.stride_w
    top, left = L.pads[0], L.pads[1]
    taps = kh * kw
    ho, wo = L.out_h, L.out_w

    p = ProgramBuilder(c)
    tokens = RegionTokens(p)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop0, y_size=1, x_size=len(u.uops),
           x_stride=len(u.uops))
    if L.const_rows:
        n = L.const_rows * L.out_blocks
        p.load(MemoryType.ACC, sram_base=u.const_base, dram_base=const0, y_size=1, x_size=n,
               x_stride=n)
    if ratio:  # the identity blocks, once (the first chunk's token covers them)
        p.load(MemoryType.WGT, sram_base=u.identity_base,
               dram_base=base("identity", c.wgt_elem_bytes), y_size=1, x_size=ratio,
               x_stride=ratio)

    # The tiles in program order. With 2 virtual threads, consecutive tiles alternate
    # between the threads: the output-channel tiles (oc_nthread) or output-row tiles
    # (h_nthread) are the innermost loop. Every group of `threads` consecutive tiles (the
    # last one maybe partial) runs interleaved, thread i taking the group's i-th tile, so
    # that a thread is present in every group but the last (which keeps the tokens of
    # each queue in program order: the k-th pop always waits for the k-th push).
    threads = s.nthreads
    cos, ohs = L.co_tiles(s.tile_co), range(0, ho, s.tile_h)
    ows = range(0, wo, s.tile_w)
    if s.oc_nthread > 1:
        tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for oh0 in ohs
                 for ow0 in ows for co in cos]
    elif s.h_nthread > 1:
        tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for co in cos
                 for ow0 in ows for oh0 in ohs]
    else:
        tiles = [(nb, co, oh0, ow0) for nb in range(L.batch_blocks) for co in cos
                 for oh0 in ohs for ow0 in ows]
    groups = [tiles[i:i + threads] for i in range(0, len(tiles), threads)]
    chunk = inp_chunk(L, s)
    # Each span's weights follow the previous span's, (its output blocks, its input blocks
    # or one diagonal block, taps) in blocks.
    wgt_span, offset = {}, 0
    for span in L.spans:
        wgt_span[span] = offset
        offset += span[1] * (1 if L.diagonal else span[3]) * taps
    wgt_in_sram = [None] * threads  # per thread: (ob0, cb0) of the weights its region holds

    def chunks_of(ob0, tco, span):
        """The input-channel chunks of an output-channel tile: (first input block, blocks
        loaded, blocks per output block in the GEMM kernel). A diagonal tile loads the
        input block of each of its output blocks, and each output block reads one."""
        ob, _, cb, cn = span
        if L.diagonal:
            return [(cb + ob0 - ob, tco, 1)]
        return [(cb0, min(s.tile_ci, cb + cn - cb0), min(s.tile_ci, cb + cn - cb0))
                for cb0 in range(cb, cb + cn, s.tile_ci)]

    def epilogue(t, nb, ob0, oh0, ow0, tco, th, tw):
        """The ALU passes over thread t's tile, then its stores."""
        plane = th * tw
        acc_t = u.acc_base[t]
        # Epilogue over the tile: iter_out over output blocks, iter_in over positions.
        loop = dict(iter_out=tco, iter_in=plane, dst_factor_out=plane, dst_factor_in=1)

        def alu_pass(steps, target, imm_uop):
            for st in steps:
                if st.row is None:
                    p.alu(st.op, uop_bgn=imm_uop, uop_end=imm_uop + 1, use_imm=True,
                          imm=st.imm, **loop)
                else:
                    k = u.alu_vec[t, target, st.row, ob0]
                    p.alu(st.op, uop_bgn=k, uop_end=k + 1, src_factor_out=1, **loop)

        alu_pass(epi.main, 0, u.alu_main[t])
        if L.has_residual:
            alu_pass(epi.residual, u.res_base, u.alu_res[t])
            k = u.alu_add_res[t]
            p.alu(AluOp.ADD, uop_bgn=k, uop_end=k + 1, src_factor_out=plane,
                  src_factor_in=1, **loop)
        # The clamp always runs: its MIN writes the int8 out buffer the stores read.
        k = u.alu_main[t]
        p.alu(AluOp.MAX, uop_bgn=k, uop_end=k + 1, use_imm=True, imm=epi.out_min, **loop)
        p.alu(AluOp.MIN, uop_bgn=k, uop_end=k + 1, use_imm=True, imm=epi.out_max, **loop)
        tokens.computed()

        tokens.wait_computed()  # RAW: the out tile is written
        for obi in range(tco):
            p.store(sram_base=acc_t + obi * plane,
                    dram_base=out0 + ((nb * L.out_blocks + ob0 + obi) * ho + oh0) * wo + ow0,
                    y_size=th, x_size=tw, x_stride=wo)
        tokens.stored(("acc", t))  # this thread's next tile waits for it (WAR)

    for g, group in enumerate(groups):
        info = []
        for t, (nb, (ob0, tco, span), oh0, ow0) in enumerate(group):
            th, tw = min(s.tile_h, ho - oh0), min(s.tile_w, wo - ow0)
            # Input window of the tile, clipped to the image; the LOAD pads the rest.
            rows, cols = window_rows(L, th), window_cols(L, tw)
            r0, c0 = oh0 * sh - top, ow0 * sw - left
            y0, y1 = max(r0, 0), min(r0 + rows, L.h)
            x0, x1 = max(c0, 0), min(c0 + cols, L.w)
            pads = dict(y_pad_0=y0 - r0, y_pad_1=r0 + rows - y1, x_pad_0=x0 - c0,
                        x_pad_1=c0 + cols - x1)
            info.append((nb, ob0, oh0, ow0, tco, th, tw, cols, y0, y1, x0, x1, pads, span,
                         chunks_of(ob0, tco, span)))

        # The threads' chunks interleave (a grouped layer's tiles may differ in count).
        for j in range(max(len(tile[-1]) for tile in info)):
            for t, (nb, ob0, oh0, ow0, tco, th, tw, cols, y0, y1, x0, x1, pads, span,
                    chunks) in enumerate(info):
                if j >= len(chunks):
                    continue
                cb0, loaded, tci = chunks[j]
                last_chunk = j + 1 == len(chunks)
                plane = th * tw
                acc_t = u.acc_base[t]
                # Loads into this thread's inp/wgt region.
                tokens.load_into(("inp", t))  # WAR: its previous GEMM has read the region
                for cbi in range(loaded):
                    p.load(MemoryType.INP, sram_base=u.inp_base[t] + cbi * chunk,
                           dram_base=inp0 + ((nb * L.in_blocks + cb0 + cbi) * L.h + y0) * L.w
                           + x0, y_size=y1 - y0, x_size=x1 - x0, x_stride=L.w, **pads)
                if not j and ratio:  # the int8 residual tile, j-major (see conv_uop_table)
                    full = s.tile_co * s.tile_h * s.tile_w
                    for obi in range(tco):
                        for jj in range(ratio):
                            p.load(MemoryType.INP,
                                   sram_base=u.res_inp[t] + jj * full + obi * plane,
                                   dram_base=res0 + (((nb * L.out_blocks + ob0 + obi) * ratio
                                                      + jj) * ho + oh0) * wo + ow0,
                                   y_size=th, x_size=tw, x_stride=wo)
                if wgt_in_sram[t] != (ob0, cb0):
                    ob, _, cb, cn = span
                    row = tci * taps                  # one output block's weights
                    stride = taps if L.diagonal else cn * taps
                    first = wgt_span[span] + (ob0 - ob) * stride + (
                        0 if L.diagonal else (cb0 - cb) * taps)
                    p.load(MemoryType.WGT, sram_base=u.wgt_base[t], dram_base=wgt0 + first,
                           y_size=tco, x_size=row, x_stride=stride)
                    wgt_in_sram[t] = (ob0, cb0)
                tokens.loaded()

                if not j:
                    tokens.compute_into(("acc", t))  # WAR: its previous tile is stored
                    # The acc tile starts at zero (the bias is an ALU ADD in the epilogue):
                    # one reset micro-op per acc entry. A LOAD ACC of the bias with stride 0
                    # would read 64 bytes per entry from DRAM, 8 cycles at 8 B/cycle.
                    k = u.reset[t]
                    p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=tco,
                           iter_in=plane, dst_factor_out=plane, dst_factor_in=1)
                    if ratio:
                        k = u.res_reset[t]
                        p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=tco,
                               iter_in=plane, dst_factor_out=plane, dst_factor_in=1)
                    elif L.has_residual:
                        for obi in range(tco):
                            p.load(MemoryType.ACC, sram_base=acc_t + u.res_base + obi * plane,
                                   dram_base=res0 + ((nb * L.out_blocks + ob0 + obi) * ho
                                                     + oh0) * wo + ow0,
                                   y_size=th, x_size=tw, x_stride=wo)
                tokens.wait_loaded()  # RAW: this chunk's inputs and weights are in
                if not j and ratio:   # the residual into its acc tile, unchanged
                    bgn, end = u.res_widen[t]
                    p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tco, iter_in=plane,
                           dst_factor_out=plane, dst_factor_in=1, src_factor_out=plane,
                           src_factor_in=1, wgt_factor_out=0, wgt_factor_in=0)
                bgn, end = u.gemm[t, tw, tci]
                # Output block o of the tile reads the chunk's blocks (the same for every
                # o), or, diagonal, its own input block (the next one along).
                p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tco, iter_in=th,
                       dst_factor_out=plane, dst_factor_in=tw,
                       src_factor_out=chunk if L.diagonal else 0, src_factor_in=sh * cols,
                       wgt_factor_out=tci * taps, wgt_factor_in=0)
                tokens.read(("inp", t))  # its next loads wait for this GEMM (WAR)
                if last_chunk:  # its stores overlap the other thread's last GEMM
                    epilogue(t, nb, ob0, oh0, ow0, tco, th, tw)

    return tokens.finish()  # FINISH waits for the last store


# --- running ------------------------------------------------------------------------------------

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
