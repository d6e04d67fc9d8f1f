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
   `vdla.compiler.quantization` documents), requantization exactly as
   `vdla.compiler.quantization.requantize` (MUL, rounding ADD, SHR), the residual (loaded
   with LOAD ACC into a second acc region, requantized there, ADDed), then MAX/MIN clamp;
   the last ALU op also writes the int8 out buffer, which STOREs copy to DRAM. Per-tensor
   values are immediates; per-channel values (and a rounding constant too large for the
   16-bit immediate) are vector operands: rows of per-channel constants loaded once into a
   reserved region at the top of the acc buffer.

Dependency tokens (``ProgramBuilder.dep_push/dep_pop``): load->compute after each chunk's
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
``OIHW{block_out}o{block_in}i``, the residual as int32 acc elements in
``NCHW{batch}n{block_out}c`` (LOAD ACC reads int32 elements, so the host widens the int8
residual), and the int8 output ``NCHW{batch}n{block_out}c``. The program is emitted for an
arena at address 0 and relocated to wherever the arena is allocated.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.backend.common import (ITER_MAX, PAD_MAX, AluStep, ArenaProgram,
                                          acc_rows, ceil_div, check_alu_ops, check_array,
                                          layout_arena, requant_steps, run_arena)
from vdla.compiler.graph import Graph, Node
from vdla.compiler.layout import pack, parse_layout, unpack
from vdla.compiler.ops import conv_output_size
from vdla.compiler.quantization import wrap32
from vdla.config import AluOp, HardwareConfig
from vdla.isa import MemoryType, Program, Uop, encode_uops
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder

__all__ = ["Conv2dLayer", "Conv2dSchedule", "LoweredConv2d", "conv2d_workload", "lower_conv2d",
           "run_conv2d"]

# --- the workload -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Epilogue:
    """The ALU work after the GEMMs: `main` on the conv tile, `residual` on the residual
    tile (then ADDed), then a MAX/MIN clamp. `rows` (R, padded O) int32 are the vector
    operands. Row `bias_row` (if any) holds the requantization's rounding constant when it
    is folded into the bias; the host adds the bias to it when it packs the rows."""

    main: tuple[AluStep, ...]
    residual: tuple[AluStep, ...] | None
    out_min: int
    out_max: int
    rows: np.ndarray
    bias_row: int | None


def _plan_epilogue(node: Node, channels: int, padded: int, has_residual: bool,
                   has_bias: bool, config: HardwareConfig) -> _Epilogue:
    a = node.attrs
    rows: list[np.ndarray] = []
    main, fold = requant_steps(node, a["multiplier"], a["shift"], channels, padded, rows,
                                fold=a["multiplier"] is None)
    # The bias (plus the folded rounding constant) is one vector ADD before the rest.
    bias_row = None
    if has_bias or fold is not None:
        bias_row = len(rows)
        rows.append(fold if fold is not None else np.zeros(padded, np.int64))
        main = [AluStep(AluOp.ADD, row=bias_row)] + main
    residual = None
    if has_residual:
        residual, _ = requant_steps(node, a["residual_multiplier"], a["residual_shift"],
                                     channels, padded, rows, fold=False)
    lo, hi = int(a["out_min"]), int(a["out_max"])
    if not -128 <= lo <= hi <= 127:
        raise ValueError(f"qconv2d node {node.name!r}: out_min {lo} and out_max {hi} must "
                         "satisfy -128 <= out_min <= out_max <= 127")
    check_alu_ops(node, main + (residual or []), config)
    table = (np.stack(rows) if rows else np.zeros((0, padded), np.int64)).astype(np.int32)
    return _Epilogue(tuple(main), tuple(residual) if residual is not None else None, lo, hi,
                     table, bias_row)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conv2dLayer:
    """A conv2d workload as the back half sees it: plain sizes (N, C, H, W, O, kernel),
    strides and pads (top, left, bottom, right), and the block counts of batch, input and
    output channels once padded to the config's batch, block_in and block_out.
    `const_rows`: per-channel constant rows the epilogue keeps in the acc buffer."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kernel_h: int
    kernel_w: int
    stride_h: int = 1
    stride_w: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    batch_blocks: int
    in_blocks: int
    out_blocks: int
    has_residual: bool = False
    const_rows: int = 0
    dense: bool = False

    def __post_init__(self):
        top, left, bottom, right = self.pads
        if any(not 0 <= p <= PAD_MAX for p in self.pads):
            raise ValueError(f"conv2d pads {self.pads} must each be 0..{PAD_MAX}: the LOAD's "
                             "padding fields have 4 bits")
        # A pad as large as the kernel makes output rows/columns that see only padding;
        # their input tile would be empty, which a LOAD cannot express.
        if max(top, bottom) >= self.kernel_h or max(left, right) >= self.kernel_w:
            raise ValueError(f"conv2d pads {self.pads} must be smaller than the kernel "
                             f"({self.kernel_h}x{self.kernel_w}): an output that sees only "
                             "padding is not supported")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(f"conv2d of a {self.h}x{self.w} image with a {self.kernel_h}x"
                             f"{self.kernel_w} kernel and pads {self.pads} has no output")

    @classmethod
    def from_node(cls, node: Node, graph: Graph, config: HardwareConfig) -> "Conv2dLayer":
        return _layer_and_epilogue(node, graph, config)[0]

    @property
    def out_h(self) -> int:
        return conv_output_size(self.h, self.kernel_h, self.stride_h, self.pads[0], self.pads[2])

    @property
    def out_w(self) -> int:
        return conv_output_size(self.w, self.kernel_w, self.stride_w, self.pads[1], self.pads[3])

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: the layer's own sizes, without block padding."""
        return (self.n * self.out_h * self.out_w * self.o * self.c * self.kernel_h
                * self.kernel_w)

    @property
    def gemm_uops(self) -> int:
        """GEMM micro-ops of the whole layer: one per (batch block, output position,
        output block, input block, kernel tap), whatever the tiling."""
        return (self.batch_blocks * self.out_h * self.out_w * self.out_blocks
                * self.in_blocks * self.kernel_h * self.kernel_w)


def _layer_and_epilogue(node: Node, graph: Graph,
                        config: HardwareConfig) -> tuple[Conv2dLayer, _Epilogue]:
    if node.op not in ("qconv2d", "qdense"):
        raise ValueError(f"lower_conv2d lowers qconv2d and qdense nodes, not {node.name!r} "
                         f"({node.op})")
    a = node.attrs
    if node.op == "qdense":
        return _dense_layer_and_epilogue(node, graph, config)
    for key, plain in (("data_layout", "NCHW"), ("kernel_layout", "OIHW"), ("out_layout", "NCHW")):
        if parse_layout(a[key]).name != plain:
            raise ValueError(f"qconv2d node {node.name!r}: {key} {a[key]!r} is not supported "
                             f"yet; lower_conv2d takes the plain {plain} node and packs itself")
    if int(a["groups"]) != 1:
        raise ValueError(f"qconv2d node {node.name!r}: groups={a['groups']} is not supported; "
                         "a grouped/depthwise conv has one input channel per group, which "
                         "wastes the GEMM core's block_in lanes (it runs on the host)")
    if tuple(a["dilations"]) != (1, 1):
        raise ValueError(f"qconv2d node {node.name!r}: dilations={tuple(a['dilations'])} is "
                         "not supported; only (1, 1)")
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    o, i, kh, kw = graph.tensors[node.inputs[1]].shape
    has_residual = bool(node.input(3))
    padded_o = ceil_div(o, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, o, padded_o, has_residual, bool(node.input(2)), config)
    layer = Conv2dLayer(n=n, c=c, h=h, w=w, o=o, kernel_h=kh, kernel_w=kw,
                        stride_h=int(a["strides"][0]), stride_w=int(a["strides"][1]),
                        pads=tuple(int(p) for p in a["pads"]),
                        batch_blocks=ceil_div(n, config.batch),
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows))
    return layer, epilogue


def conv2d_workload(node: Node, graph: Graph, config: HardwareConfig) -> dict:
    """What the cycles of a lowered ``qconv2d``/``qdense`` node depend on, as plain JSON
    values: the `Conv2dLayer` fields and the ALU passes of its epilogue (each step's op and
    whether its operand is an immediate or a constant row). Two nodes with the same
    workload have the same schedule space and the same cycles per schedule, so the tuner
    keys its records on this. The clamp's bounds are not part of it: MAX and MIN run
    whatever they are (the out buffer narrows by truncation). Raises ValueError as
    `lower_conv2d` does."""
    layer, epi = _layer_and_epilogue(node, graph, config)

    def steps(seq):
        return None if seq is None else [
            f"{s.op.name}:{'row' if s.row is not None else 'imm'}" for s in seq]

    fields = dataclasses.asdict(layer)
    fields["pads"] = list(layer.pads)
    return {"op": node.op, **fields, "epilogue": steps(epi.main),
            "residual_epilogue": steps(epi.residual)}


def _dense_layer_and_epilogue(node: Node, graph: Graph,
                              config: HardwareConfig) -> tuple[Conv2dLayer, _Epilogue]:
    """A qdense node is a 1x1 convolution over a 1x1 image: (N, C) x (O, C)."""
    a = node.attrs
    for key, plain in (("data_layout", "NC"), ("kernel_layout", "OI"), ("out_layout", "NC")):
        if parse_layout(a[key]).name != plain:
            raise ValueError(f"qdense node {node.name!r}: {key} {a[key]!r} is not supported "
                             f"yet; lower_conv2d takes the plain {plain} node and packs itself")
    n, c = graph.tensors[node.inputs[0]].shape
    o, _ = graph.tensors[node.inputs[1]].shape
    has_residual = bool(node.input(3))
    padded_o = ceil_div(o, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, o, padded_o, has_residual, bool(node.input(2)), config)
    layer = Conv2dLayer(n=n, c=c, h=1, w=1, o=o, kernel_h=1, kernel_w=1,
                        batch_blocks=ceil_div(n, config.batch),
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows), dense=True)
    return layer, epilogue


# --- the schedule ------------------------------------------------------------------------------

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
        return Conv2dSchedule(min(self.tile_h, layer.out_h), min(self.tile_w, layer.out_w),
                              min(self.tile_ci, layer.in_blocks),
                              min(self.tile_co, layer.out_blocks), self.oc_nthread,
                              self.h_nthread)

    def needs(self, layer: Conv2dLayer, config: HardwareConfig) -> dict[str, tuple[int, int]]:
        """Elements each buffer needs for this tiling (all virtual threads' regions
        together), and its depth: {name: (need, depth)}."""
        s = self.clamped(layer)
        t = s.nthreads
        tile = s.tile_h * s.tile_w * s.tile_co
        acc_region = _acc_region(layer, s)
        return {
            "inp": (t * s.tile_ci * _inp_chunk(layer, s), config.inp_depth),
            "wgt": (t * s.tile_co * s.tile_ci * layer.kernel_h * layer.kernel_w,
                    config.wgt_depth),
            "acc": (t * acc_region + layer.const_rows * layer.out_blocks, config.acc_depth),
            "out": ((t - 1) * acc_region + tile, config.out_depth),
            "uop": (_uop_count(layer, s), config.uop_depth),
        }

    def overflows(self, layer: Conv2dLayer, config: HardwareConfig) -> dict[str, tuple[int, int]]:
        """The limits this tiling exceeds: {buffer or "iter": (need, limit)}; empty when
        it fits. "iter" is the GEMM loop count of a tile (tile_h * tile_w)."""
        s = self.clamped(layer)
        over = {k: v for k, v in self.needs(layer, config).items() if v[0] > v[1]}
        if s.tile_h * s.tile_w > ITER_MAX:
            over["iter"] = (s.tile_h * s.tile_w, ITER_MAX)
        return over

    def fits(self, layer: Conv2dLayer, config: HardwareConfig) -> bool:
        """Whether `check` would pass."""
        return not self.overflows(layer, config)

    def check(self, layer: Conv2dLayer, config: HardwareConfig):
        """Raise ValueError naming every buffer this tiling overflows, and by how much."""
        s = self.clamped(layer)
        over = self.overflows(layer, config)
        if over:
            detail = "; ".join(f"{name} needs {need} elements, has {depth} (over by "
                               f"{need - depth})" for name, (need, depth) in over.items())
            threads = (f" with {s.nthreads} virtual threads (one buffer region each)"
                       if s.nthreads > 1 else "")
            raise ValueError(f"conv2d schedule {self} does not fit config {config.name}"
                             f"{threads}: {detail}")

    @classmethod
    def default(cls, layer: Conv2dLayer, config: HardwareConfig, *,
                nthreads: int | None = None) -> "Conv2dSchedule":
        """The schedule with the fewest cycles by the analytical timing model
        (`vdla.compiler.backend.cost.choose_conv2d`) among tilings that fit, with one or
        two virtual threads (`nthreads` 1 or 2 restricts it). Raises ValueError, naming
        the buffers, when not even 1x1x1x1 tiles fit."""
        from vdla.compiler.backend.cost import choose_conv2d

        return choose_conv2d(layer, config, nthreads=nthreads)


def _acc_region(layer: Conv2dLayer, s: Conv2dSchedule) -> int:
    """acc (and out) elements of one virtual thread: its tile, and its residual tile."""
    return s.tile_h * s.tile_w * s.tile_co * (2 if layer.has_residual else 1)


def _inp_rows(layer: Conv2dLayer, tile_h: int) -> int:
    return (tile_h - 1) * layer.stride_h + layer.kernel_h


def _inp_cols(layer: Conv2dLayer, tile_w: int) -> int:
    return (tile_w - 1) * layer.stride_w + layer.kernel_w


def _inp_chunk(layer: Conv2dLayer, s: Conv2dSchedule) -> int:
    """inp elements between consecutive channel blocks of an input tile (a full tile's
    padded window, so edge tiles keep the same micro-ops' channel offsets)."""
    return _inp_rows(layer, s.tile_h) * _inp_cols(layer, s.tile_w)


# --- micro-ops -------------------------------------------------------------------------------------

@dataclasses.dataclass
class _UopTable:
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


def _uop_count(layer: Conv2dLayer, s: Conv2dSchedule) -> int:
    """len(_uop_table(layer, s).uops), without building it."""
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = {s.tile_ci, layer.in_blocks % s.tile_ci or s.tile_ci}
    gemm = sum(w * ci for w in widths for ci in cis) * layer.kernel_h * layer.kernel_w
    alu = 2 + (2 if layer.has_residual else 0) + layer.const_rows * ceil_div(
        layer.out_blocks, s.tile_co)
    return s.nthreads * (gemm + alu)


def _uop_table(layer: Conv2dLayer, s: Conv2dSchedule, config: HardwareConfig | None = None,
               rows_used: dict | None = None) -> _UopTable:
    kh, kw = layer.kernel_h, layer.kernel_w
    chunk = _inp_chunk(layer, s)
    threads = s.nthreads
    inp_region = s.tile_ci * chunk
    wgt_region = s.tile_co * s.tile_ci * kh * kw
    acc_region = _acc_region(layer, s)
    tile = s.tile_h * s.tile_w * s.tile_co
    depth = config.acc_depth if config is not None else 1 << 30
    const_base = depth - layer.const_rows * layer.out_blocks
    table = _UopTable([], {}, tile, const_base)
    uops = table.uops
    widths = {s.tile_w, layer.out_w % s.tile_w or s.tile_w}
    cis = {s.tile_ci, layer.in_blocks % s.tile_ci or s.tile_ci}
    for t in range(threads):
        ib, wb, ab = t * inp_region, t * wgt_region, t * acc_region
        table.inp_base.append(ib)
        table.wgt_base.append(wb)
        table.acc_base.append(ab)
        for tw in sorted(widths):
            cols = _inp_cols(layer, tw)
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
            for ob0 in range(0, layer.out_blocks, s.tile_co):
                table.alu_vec[t, target, row, ob0] = len(uops)
                uops.append(Uop(ab + target, const_base + row * layer.out_blocks + ob0))
    return table


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
        L = self.layer
        if L.dense:
            w = check_array(w, (L.o, L.c), np.int8, "weights").reshape(L.o, L.c, 1, 1)
        return pack(check_array(w, (L.o, L.c, L.kernel_h, L.kernel_w), np.int8, "weights"),
                    "OIHW", self.kernel_layout)

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
        L = self.layer
        if L.dense:
            residual = check_array(residual, (L.n, L.o), np.int8, "residual").reshape(L.n, L.o, 1, 1)
        r = check_array(residual, (L.n, L.o, L.out_h, L.out_w), np.int8, "residual")
        return pack(r.astype(np.int32), "NCHW", self.out_layout)

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
        "weights": L.out_blocks * L.in_blocks * L.kernel_h * L.kernel_w * c.wgt_elem_bytes,
        "residual": (L.batch_blocks * L.out_blocks * L.out_h * L.out_w * c.acc_elem_bytes
                     if L.has_residual else 0),
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
    layer, epilogue = _layer_and_epilogue(node, graph, config)
    schedule = schedule or Conv2dSchedule.default(layer, config)
    schedule.check(layer, config)
    s = schedule.clamped(layer)
    # Which tile region each constant row applies to (conv tile or residual tile).
    res_base = s.tile_h * s.tile_w * s.tile_co
    rows_used = {st.row: 0 for st in epilogue.main if st.row is not None}
    rows_used.update({st.row: res_base for st in epilogue.residual or () if st.row is not None})
    uop_table = _uop_table(layer, s, config, rows_used)
    regions, arena_bytes = _arena(layer, config, len(uop_table.uops))
    program = _emit(layer, s, config, epilogue, uop_table, regions)
    return LoweredConv2d(node.name, config, layer, s, program, regions, arena_bytes,
                         encode_uops(uop_table.uops, config), epilogue.rows,
                         epilogue.bias_row)


def _emit(L: Conv2dLayer, s: Conv2dSchedule, c: HardwareConfig, epi: _Epilogue,
          u: _UopTable, regions: dict) -> Program:
    def base(name: str, elem_bytes: int) -> int:
        return regions[name].offset // elem_bytes

    uop0, const0 = base("uop", c.uop_bytes), base("const", c.acc_elem_bytes)
    res0 = base("residual", c.acc_elem_bytes)
    inp0, wgt0 = base("input", c.inp_elem_bytes), base("weights", c.wgt_elem_bytes)
    out0 = base("output", c.out_elem_bytes)
    kh, kw, sh, sw = L.kernel_h, L.kernel_w, L.stride_h, L.stride_w
    top, left = L.pads[0], L.pads[1]
    taps = kh * kw
    ho, wo = L.out_h, L.out_w

    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop0, y_size=1, x_size=len(u.uops),
           x_stride=len(u.uops))
    if L.const_rows:
        n = L.const_rows * L.out_blocks
        p.load(MemoryType.ACC, sram_base=u.const_base, dram_base=const0, y_size=1, x_size=n,
               x_stride=n)

    # The tiles in program order. With 2 virtual threads, consecutive tiles alternate
    # between the threads: the output-channel tiles (oc_nthread) or output-row tiles
    # (h_nthread) are the innermost loop. Every group of `threads` consecutive tiles (the
    # last one maybe partial) runs interleaved, thread i taking the group's i-th tile, so
    # that a thread is present in every group but the last (which keeps the tokens of
    # each queue in program order: the k-th pop always waits for the k-th push).
    threads = s.nthreads
    obs, ohs = range(0, L.out_blocks, s.tile_co), range(0, ho, s.tile_h)
    ows = range(0, wo, s.tile_w)
    if s.oc_nthread > 1:
        tiles = [(nb, ob0, oh0, ow0) for nb in range(L.batch_blocks) for oh0 in ohs
                 for ow0 in ows for ob0 in obs]
    elif s.h_nthread > 1:
        tiles = [(nb, ob0, oh0, ow0) for nb in range(L.batch_blocks) for ob0 in obs
                 for ow0 in ows for oh0 in ohs]
    else:
        tiles = [(nb, ob0, oh0, ow0) for nb in range(L.batch_blocks) for ob0 in obs
                 for oh0 in ohs for ow0 in ows]
    groups = [tiles[i:i + threads] for i in range(0, len(tiles), threads)]
    chunks = list(range(0, L.in_blocks, s.tile_ci))
    chunk = _inp_chunk(L, s)
    wgt_in_sram = [None] * threads  # per thread: (ob0, cb0) of the weights its region holds

    def epilogue(t, nb, ob0, oh0, ow0, tco, th, tw, later):
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
        p.dep_push(COMPUTE, STORE)

        p.dep_pop(COMPUTE, STORE)  # RAW: the out tile is written
        for obi in range(tco):
            p.store(sram_base=acc_t + obi * plane,
                    dram_base=out0 + ((nb * L.out_blocks + ob0 + obi) * ho + oh0) * wo + ow0,
                    y_size=th, x_size=tw, x_stride=wo)
        if later:
            p.dep_push(STORE, COMPUTE)  # popped by this thread's tile in the next group

    for g, group in enumerate(groups):
        # A thread's regions are used again by the next group when it is present there.
        later = [g + 1 < len(groups) and t < len(groups[g + 1]) for t in range(threads)]
        info = []
        for t, (nb, ob0, oh0, ow0) in enumerate(group):
            tco, th, tw = (min(s.tile_co, L.out_blocks - ob0), min(s.tile_h, ho - oh0),
                           min(s.tile_w, wo - ow0))
            # Input window of the tile, clipped to the image; the LOAD pads the rest.
            rows, cols = _inp_rows(L, th), _inp_cols(L, tw)
            r0, c0 = oh0 * sh - top, ow0 * sw - left
            y0, y1 = max(r0, 0), min(r0 + rows, L.h)
            x0, x1 = max(c0, 0), min(c0 + cols, L.w)
            pads = dict(y_pad_0=y0 - r0, y_pad_1=r0 + rows - y1, x_pad_0=x0 - c0,
                        x_pad_1=c0 + cols - x1)
            info.append((nb, ob0, oh0, ow0, tco, th, tw, cols, y0, y1, x0, x1, pads))

        for j, cb0 in enumerate(chunks):
            tci = min(s.tile_ci, L.in_blocks - cb0)
            last_chunk = j + 1 == len(chunks)
            for t, (nb, ob0, oh0, ow0, tco, th, tw, cols, y0, y1, x0, x1, pads) in enumerate(
                    info):
                plane = th * tw
                acc_t = u.acc_base[t]
                # Loads into this thread's inp/wgt region.
                if g or j:
                    p.dep_pop(COMPUTE, LOAD)  # WAR: its previous GEMM has read the region
                for cbi in range(tci):
                    p.load(MemoryType.INP, sram_base=u.inp_base[t] + cbi * chunk,
                           dram_base=inp0 + ((nb * L.in_blocks + cb0 + cbi) * L.h + y0) * L.w
                           + x0, y_size=y1 - y0, x_size=x1 - x0, x_stride=L.w, **pads)
                if wgt_in_sram[t] != (ob0, cb0):
                    p.load(MemoryType.WGT, sram_base=u.wgt_base[t],
                           dram_base=wgt0 + (ob0 * L.in_blocks + cb0) * taps,
                           y_size=tco, x_size=tci * taps, x_stride=L.in_blocks * taps)
                    wgt_in_sram[t] = (ob0, cb0)
                p.dep_push(LOAD, COMPUTE)

                if not j:
                    if g:
                        p.dep_pop(STORE, COMPUTE)  # WAR: its previous tile's stores are done
                    # The acc tile starts at zero (the bias is an ALU ADD in the epilogue):
                    # one reset micro-op per acc entry. A LOAD ACC of the bias with stride 0
                    # would read 64 bytes per entry from DRAM, 8 cycles at 8 B/cycle.
                    k = u.reset[t]
                    p.gemm(reset_reg=True, uop_bgn=k, uop_end=k + 1, iter_out=tco,
                           iter_in=plane, dst_factor_out=plane, dst_factor_in=1)
                    if L.has_residual:
                        for obi in range(tco):
                            p.load(MemoryType.ACC, sram_base=acc_t + u.res_base + obi * plane,
                                   dram_base=res0 + ((nb * L.out_blocks + ob0 + obi) * ho
                                                     + oh0) * wo + ow0,
                                   y_size=th, x_size=tw, x_stride=wo)
                p.dep_pop(LOAD, COMPUTE)  # RAW: this chunk's inputs and weights are in
                bgn, end = u.gemm[t, tw, tci]
                p.gemm(uop_bgn=bgn, uop_end=end, iter_out=tco, iter_in=th,
                       dst_factor_out=plane, dst_factor_in=tw,
                       src_factor_out=0, src_factor_in=sh * cols,
                       wgt_factor_out=tci * taps, wgt_factor_in=0)
                if not last_chunk or later[t]:
                    p.dep_push(COMPUTE, LOAD)
                if last_chunk:  # its stores overlap the other thread's last GEMM
                    epilogue(t, nb, ob0, oh0, ow0, tco, th, tw, later[t])

    # FINISH waits for the last store; the store module runs in order, so for all of them.
    p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    return p.finish()


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
