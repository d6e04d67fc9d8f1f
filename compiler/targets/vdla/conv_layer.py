"""A convolution as the accelerator sees it: the layer, its tiling, and what the tiling
costs. The conv family's lowering (`vdla.compiler.targets.vdla.conv`) reads all three.

* `Conv2dLayer` (``qconv2d``, and ``qdense`` as a 1x1 convolution over a 1x1 image: the
  back half lowers a dense layer exactly as that convolution) with its `ConvEpilogue`;
  `conv2d_layer(node, graph, config)` makes both and raises ValueError, naming the node,
  for what the back half cannot run. A grouped or depthwise layer's block structure
  comes from `vdla.compiler.targets.vdla.grouped`;
* `conv2d_workload`: what a convolution's cycles depend on, the tuner's records key, and
  `alu_passes`, the epilogue's passes as the timing model counts them (for the graph
  estimate and the tuning task alike);
* `Conv2dSchedule(tile_h, tile_w, tile_ci, tile_co, oc_nthread, h_nthread)`: the tiling,
  and whether it fits the config's buffers (`needs`, `overflows`, `fits`, `check`, which
  names every buffer it overflows and by how much), with the buffer regions and the
  micro-op count it implies (`conv_uop_count`);
* the timing model: `estimate_conv2d(layer, schedule, config)` predicts the cycles of the
  program that `lower_conv2d` emits, from the work each module does and how the virtual
  threads let it overlap. It is not cycle-accurate (the Verilator backend is); it ranks
  schedules, which is what the default chooser (`choose_conv2d`, over `schedule_space`)
  and the tuner's pre-screening need, and it explains a layer's time (`Conv2dEstimate`
  splits it into GEMM, epilogue, load and store). The hardware facts it rests on are
  `vdla.compiler.targets.vdla.common`'s.

How the modules overlap (see `vdla.compiler.targets.vdla.conv` for the program): with one
virtual thread a chunk's loads and its GEMM alternate (the next loads overwrite what the
GEMM reads), and only the next tile's first loads overlap the epilogue and stores; with
two, one thread's loads run during the other's GEMM, so a chunk pair takes the longer of
the two, and epilogues and stores hide behind the other thread's work.

Why this module is long: the layer, its schedule and its timing model are read together
(the schedule's fit counts the layer's buffers and micro-ops; the chooser ranks the
tilings the schedule admits with the model), and the conv family is two modules, this
one and `conv`, so that lowering one convolution enters three modules of the target with
`common` (tests/compiler/targets/vdla/test_structure.py checks it).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import parse_layout
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import wrap32
from vdla.compiler.targets.vdla.common import (DMA_CYCLES, INSN_CYCLES, dma_row_cycles,
                                               ITER_MAX, PAD_ELEM_CYCLES, PAD_MAX, ceil_div,
                                               check_tile_sizes, gemm_bias_limit, inp_group,
                                               out_group,
                                               overflow_detail, remembered_schedule,
                                               store_cycles, tile_candidates,
                                               tile_split, vector_pass_cycles, window_cols,
                                               window_rows)
from vdla.compiler.targets.vdla.requant import (AluStep, check_alu_ops, clamp_steps,
                                                requant_steps)
from vdla.compiler.targets.vdla import dw_window
from vdla.compiler.targets.vdla.grouped import group_spans
from vdla.compiler.targets.vdla.tap_pack import TapPack, tap_packs
from vdla.config import AluOp, HardwareConfig

__all__ = ["Conv2dEstimate", "Conv2dLayer", "Conv2dSchedule", "ConvEpilogue", "acc_region",
           "alu_passes", "choose_conv2d", "chunk_sizes", "co_starts", "conv2d_layer",
           "conv2d_workload", "conv_uop_count", "estimate_conv2d", "inp_blocks", "inp_chunk",
           "residual_inp", "residual_passes", "residual_ratio", "schedule_space"]


# --- the layer ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ConvEpilogue:
    """The ALU work after the GEMMs: `main` on the conv tile, `residual` on the residual
    tile (then ADDed), then a MAX/MIN clamp. `rows` (R, padded O) int32 are the vector
    operands. Row `bias_row` (if any) holds the requantization's rounding constant when it
    is folded into the bias; the host adds the bias to it when it packs the rows. Or,
    where bias and rounding fit (`common.gemm_bias_limit`), `bias_gemm` (padded O,) int64
    holds that rounding constant (zeros without one), the host adds the bias, and one
    GEMM micro-op per acc entry adds the sum (`common.bias_blocks`) instead of the
    two-cycle vector ADD. `clamp`: the steps that clamp to [out_min, out_max] after the
    residual, or None for a MAX and a MIN with immediates; with the ALU's REQ, () where
    `main` ends in a REQ that shifts and clamps at once (`requant.clamp_steps`)."""

    main: tuple[AluStep, ...]
    residual: tuple[AluStep, ...] | None
    out_min: int
    out_max: int
    rows: np.ndarray
    bias_row: int | None
    bias_gemm: np.ndarray | None = None
    clamp: tuple[AluStep, ...] | None = None


def _plan_epilogue(node: Node, graph: Graph, channels: int, padded: int, has_residual: bool,
                   config: HardwareConfig) -> ConvEpilogue:
    a = node.attrs
    rows: list[np.ndarray] = []
    main, fold = requant_steps(node, a["multiplier"], a["shift"], channels, padded, rows,
                                fold=a["multiplier"] is None)
    # The bias (plus the folded rounding constant): one GEMM micro-op per acc entry where
    # the sum fits the bias GEMM's weights, else one vector ADD before the rest.
    has_bias = bool(node.input(2))
    bias = graph.constant(node.input(2)) if has_bias else None
    constant = fold if fold is not None else np.zeros(padded, np.int64)
    added = constant.copy()
    if bias is not None:
        added[:channels] += np.asarray(bias, np.int64).reshape(-1)[:channels]
    bias_row = bias_gemm = None
    if (has_bias or fold is not None) and (has_bias <= (bias is not None)) \
            and np.abs(wrap32(added)).max() <= gemm_bias_limit(config):
        bias_gemm = constant
    elif has_bias or fold is not None:
        bias_row = len(rows)
        rows.append(constant)
        main = [AluStep(AluOp.ADD, row=bias_row)] + main
    residual = None
    if has_residual:
        residual, _ = requant_steps(node, a["residual_multiplier"], a["residual_shift"],
                                     channels, padded, rows, fold=False)
    lo, hi = int(a["out_min"]), int(a["out_max"])
    if not -128 <= lo <= hi <= 127:
        raise ValueError(f"qconv2d node {node.name!r}: out_min {lo} and out_max {hi} must "
                         "satisfy -128 <= out_min <= out_max <= 127")
    main, clamp = clamp_steps(main, rows, padded, lo, hi, not has_residual, config)
    check_alu_ops(node, main + (residual or []), config)
    table = (np.stack(rows) if rows else np.zeros((0, padded), np.int64)).astype(np.int32)
    return ConvEpilogue(tuple(main), tuple(residual) if residual is not None else None, lo, hi,
                        table, bias_row, bias_gemm, clamp)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conv2dLayer:
    """A conv2d workload as the back half sees it: plain sizes (N, C, H, W, O, kernel),
    strides and pads (top, left, bottom, right), and the block counts of batch, input and
    output channels once padded to the config's batch, block_in and block_out.
    `const_rows`: per-channel constant rows the epilogue keeps in the acc buffer.
    `groups`, `spans`, `diagonal`: a grouped convolution's block structure
    (`group_spans`); a plain one has a single span over every block.
    `residual_ratio`: how the int8 residual reaches the accumulators: ``block_out /
    block_in`` input blocks per output block, widened by identity-weight GEMMs, or where
    block_in = r x block_out, r selection blocks (each output block out of its input
    block); the residual stays int8 in DRAM, in the activation layout. 0 (the host
    widens it to int32 for a LOAD ACC) only where neither block divides the other.
    `late_residual`: the residual needs no requantization, so the identity GEMMs widen it
    straight onto the requantized tile (the GEMM's int32 add is the ALU ADD's), after the
    main epilogue: no residual acc tile, no reset of it, no vector ADD.
    `bias_gemm`: the bias is added by one GEMM micro-op per acc entry (`ConvEpilogue`).
    `dilation_h`, `dilation_w`: the kernel taps' spacing; `packed`: the `TapPack` of a
    first layer run with kernel taps packed into channels (its `c`, `h`, `w`, kernel,
    strides, `pads` and `dilation_w` are the packed convolution's).
    `window`: a depthwise layer run on the GEMM core's depthwise window
    (`vdla.compiler.targets.vdla.dw_window`): output block k reads activation block k
    (like `diagonal`, but on any block_out multiple of block_in), `wgt_taps` weight
    blocks per output block.
    `inp_group` / `out_group`: inp / out elements per pixel of an activation block in DRAM
    (`common.inp_group`, `common.out_group`; 1 and 1 when block_in == block_out): a LOAD
    INP brings a pixel's `inp_group` elements contiguously and the micro-ops index the
    inp buffer ``pixel * inp_group + j``; a STORE writes each out element `out_group`
    elements apart."""

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
    groups: int = 1
    spans: tuple[tuple[int, int, int, int], ...] = ()
    diagonal: bool = False
    residual_ratio: int = 0
    late_residual: bool = False
    bias_gemm: bool = False
    dilation_h: int = 1
    dilation_w: int = 1
    packed: TapPack | None = None
    inp_group: int = 1
    out_group: int = 1
    window: bool = False

    def __post_init__(self):
        if not self.spans:
            object.__setattr__(self, "spans", ((0, self.out_blocks, 0, self.in_blocks),))
        if self.window and (self.diagonal or len(self.spans) != 1 or self.c != self.o
                            or self.groups != self.c):
            raise ValueError(f"a window conv2d layer is depthwise (c == o == groups) with "
                             f"one span, not {self.c}, {self.o}, groups {self.groups}, "
                             f"spans {self.spans}")
        if self.diagonal and any(ob != cb or on != cn for ob, on, cb, cn in self.spans):
            raise ValueError(f"a diagonal conv2d layer pairs output block k with input "
                             f"block k; its spans {self.spans} do not")
        top, left, bottom, right = self.pads
        if any(not 0 <= p <= PAD_MAX for p in self.pads):
            raise ValueError(f"conv2d pads {self.pads} must each be 0..{PAD_MAX}: the LOAD's "
                             "padding fields have 4 bits")
        # A pad as large as the kernel makes output rows/columns that see only padding;
        # their input tile would be empty, which a LOAD cannot express.
        if max(top, bottom) >= self.span_h or max(left, right) >= self.span_w:
            raise ValueError(f"conv2d pads {self.pads} must be smaller than the kernel's "
                             f"extent ({self.span_h}x{self.span_w}): an output that sees "
                             "only padding is not supported")
        g = self.inp_group
        if g > 1 and max(left, right) * g > PAD_MAX:
            raise ValueError(f"conv2d pads {self.pads}: a LOAD pads {g} inp elements per "
                             f"pixel of an activation block (block_out / block_in), so "
                             f"{max(left, right)} columns are {max(left, right) * g}, more "
                             f"than the LOAD's {PAD_MAX}")
        if g > 1 and any(cb % g for _, _, cb, _ in self.spans):
            raise ValueError(f"conv2d spans {self.spans}: a span's input blocks must start "
                             f"at an activation block (every {g} input blocks)")
        og = self.out_group
        if og > 1 and self.has_residual and (
                any(ob % og for ob, _, _, _ in self.spans)
                or (self.out_blocks % og and self.out_blocks > og)):
            raise ValueError(f"conv2d with a residual: its output blocks {self.spans} must "
                             f"fill whole activation blocks ({og} output blocks each) for "
                             "the residual's selection GEMMs")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(f"conv2d of a {self.h}x{self.w} image with a {self.kernel_h}x"
                             f"{self.kernel_w} kernel and pads {self.pads} has no output")

    @classmethod
    def from_node(cls, node: Node, graph: Graph, config: HardwareConfig) -> "Conv2dLayer":
        return conv2d_layer(node, graph, config)[0]

    @property
    def span_h(self) -> int:
        """Input rows one output row reads (the kernel's rows, dilated)."""
        return (self.kernel_h - 1) * self.dilation_h + 1

    @property
    def span_w(self) -> int:
        """Input columns one output column reads."""
        return (self.kernel_w - 1) * self.dilation_w + 1

    @property
    def out_h(self) -> int:
        return conv_output_size(self.h, self.kernel_h, self.stride_h, self.pads[0], self.pads[2],
                                self.dilation_h)

    @property
    def out_w(self) -> int:
        return conv_output_size(self.w, self.kernel_w, self.stride_w, self.pads[1], self.pads[3],
                                self.dilation_w)

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: the layer's own sizes, without block padding
        (a grouped convolution's output channel sees C / groups input channels; a
        tap-packed one its own C x kh x kw, not the packed kernel's zeros)."""
        if self.packed is not None:
            kernel_h = self.packed.kernel_h if self.packed.im2col else self.kernel_h
            return (self.n * self.out_h * self.out_w * self.o * self.packed.channels
                    * kernel_h * self.packed.kernel_w)
        return (self.n * self.out_h * self.out_w * self.o * (self.c // self.groups)
                * self.kernel_h * self.kernel_w)

    @property
    def in_planes(self) -> int:
        """inp elements per pixel of the input in DRAM: its blocks of block_in channels,
        padded to whole activation blocks."""
        return ceil_div(self.in_blocks, self.inp_group) * self.inp_group

    @property
    def out_planes(self) -> int:
        """out elements per pixel of the output in DRAM: its blocks of block_out channels,
        padded to whole activation blocks."""
        return ceil_div(self.out_blocks, self.out_group) * self.out_group

    @property
    def weight_blocks(self) -> int:
        """Weight blocks (block_out x block_in, per kernel tap) the GEMM core reads: one
        per (output block, input block) of every span; one per output block of a
        diagonal layer."""
        return sum(on * (1 if self.paired else cn) for _, on, _, cn in self.spans)

    @property
    def paired(self) -> bool:
        """Output block k reads only its own input (activation) block: a diagonal or a
        window layer."""
        return self.diagonal or self.window

    @property
    def wgt_taps(self) -> int:
        """Weight blocks per (output block, input block) of a span: one per kernel tap,
        or a window layer's rows (`dw_window.wgt_rows`)."""
        return dw_window.wgt_rows(self) if self.window else self.kernel_h * self.kernel_w

    @property
    def span_out(self) -> int:
        """The most output blocks of one span: output-channel tiles never cross spans."""
        return max(on for _, on, _, _ in self.spans)

    @property
    def span_in(self) -> int:
        """The most input blocks one GEMM chunk can take (1 for a diagonal layer, whose
        output block k reads only input block k)."""
        return 1 if self.paired else max(cn for _, _, _, cn in self.spans)

    @property
    def gemm_uops(self) -> int:
        """GEMM micro-ops of the whole layer: one per (batch block, output position,
        weight block, kernel tap), whatever the tiling; a window layer's count its
        micro-ops with full-width tiles (`dw_window.layer_uops`)."""
        if self.window:
            return dw_window.layer_uops(self)
        return (self.batch_blocks * self.out_h * self.out_w * self.weight_blocks
                * self.kernel_h * self.kernel_w)

    @property
    def residual_uops(self) -> int:
        """GEMM micro-ops that widen the int8 residual: `residual_ratio` per output
        entry (one, a selection, where block_in > block_out)."""
        return (self.batch_blocks * self.out_blocks * self.out_h * self.out_w
                * (min(self.residual_ratio, 1) if self.out_group > 1 else self.residual_ratio))

    @property
    def bias_uops(self) -> int:
        """GEMM micro-ops that add the bias (`bias_gemm`): one per output entry."""
        return (self.batch_blocks * self.out_blocks * self.out_h * self.out_w
                if self.bias_gemm else 0)

    def co_tiles(self, tile_co: int) -> list[tuple[int, int, tuple[int, int, int, int]]]:
        """The output-channel tiles: (first block, blocks, span) for tiles of at most
        `tile_co` blocks, each inside one span."""
        tiles = []
        for span in self.spans:
            ob, on = span[0], span[1]
            tiles += [(ob0, min(tile_co, ob + on - ob0), span)
                      for ob0 in range(ob, ob + on, tile_co)]
        return tiles


def conv2d_layer(node: Node, graph: Graph,
                 config: HardwareConfig) -> tuple[Conv2dLayer, ConvEpilogue]:
    """The layer and epilogue of a ``qconv2d``/``qdense`` node; ValueError naming the
    node for what the back half cannot run (groups, dilation, packed layouts, pads, a
    multiplier without MUL, clamp bounds outside int8)."""
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
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    o, i, kh, kw = graph.tensors[node.inputs[1]].shape
    has_residual = bool(node.input(3))
    padded_o = ceil_div(o, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, graph, o, padded_o, has_residual, config)
    groups = int(a["groups"])
    # A plain convolution is one span over every block (the layer's default).
    spans, diagonal = group_spans(c, o, groups, config) if groups != 1 else ((), False)
    pads = tuple(int(p) for p in a["pads"])
    dilation_h, dilation_w = (int(d) for d in a["dilations"])

    def layer_of(c, h, w, kh, kw, strides, pads, dilation_w, packed) -> Conv2dLayer:
        return Conv2dLayer(n=n, c=c, h=h, w=w, o=o, kernel_h=kh, kernel_w=kw,
                           stride_h=strides[0], stride_w=strides[1], pads=pads,
                           batch_blocks=ceil_div(n, config.batch),
                           in_blocks=ceil_div(c, config.block_in),
                           out_blocks=ceil_div(o, config.block_out),
                           has_residual=has_residual, const_rows=len(epilogue.rows),
                           groups=groups, spans=spans if groups > 1 else (),
                           diagonal=diagonal,
                           residual_ratio=residual_ratio(has_residual, config),
                           late_residual=late_residual(epilogue, config),
                           bias_gemm=epilogue.bias_gemm is not None,
                           dilation_h=dilation_h, dilation_w=dilation_w, packed=packed,
                           inp_group=inp_group(config), out_group=out_group(config))

    strides = tuple(int(v) for v in a["strides"])
    layer = layer_of(c, h, w, kh, kw, strides, pads, dilation_w, None)
    # A host-written input with few channels: kernel taps packed into its channels
    # (`vdla.compiler.targets.vdla.tap_pack`): the layer the GEMM core runs is then the
    # packed one, over P, with a column dilation and P's own column padding (or, im2col,
    # a 1x1 convolution), where the timing model finds it faster.
    options = [layer]
    for tp in tap_packs(node, graph, config):
        if tp.im2col:
            options.append(layer_of(tp.packed_channels, tp.out_h, tp.out_w, 1, 1, (1, 1),
                                    (0, 0, 0, 0), 1, tp))
        else:
            options.append(layer_of(tp.packed_channels, h, tp.packed_width, kh,
                                    tp.kernel_groups, strides, (pads[0], 0, pads[2], 0),
                                    tp.taps, tp))
    # A depthwise layer on a config with the depthwise window: T taps a micro-op, where
    # the timing model finds it faster than the diagonal or span GEMM (stride 2 may not
    # be: its walk visits every input column).
    if dw_window.window_eligible(c, o, groups, kw, dilation_w, config):
        options.append(dataclasses.replace(
            layer, spans=((0, layer.out_blocks, 0, layer.in_blocks),), diagonal=False,
            window=True))
    if len(options) > 1:
        layer = min(options, key=lambda opt: _fastest(opt, config))
    return layer, epilogue


def _fastest(layer: Conv2dLayer, config: HardwareConfig) -> float:
    """The estimated cycles of `layer`'s default schedule (inf when none fits)."""
    try:
        return estimate_conv2d(layer, choose_conv2d(layer, config), config).cycles
    except ValueError:
        return math.inf


def late_residual(epilogue: ConvEpilogue, config: HardwareConfig) -> bool:
    """Whether the int8 residual is added by the identity GEMMs after the main epilogue
    (`Conv2dLayer.late_residual`): it is widened on the GEMM core at all, and it is added
    as it is (its requantization has no step)."""
    return (epilogue.residual is not None and not epilogue.residual
            and residual_ratio(True, config) > 0 and out_group(config) == 1)


def residual_ratio(has_residual: bool, config: HardwareConfig) -> int:
    """`Conv2dLayer.residual_ratio` for `config`: input blocks per output block when the
    GEMM core can widen the int8 residual (identity weights map whole input blocks into an
    output block); where block_in = r x block_out, r (selection blocks pick each output
    block out of an input block, `common.identity_blocks`); else 0."""
    if not has_residual:
        return 0
    if config.block_in > config.block_out and config.block_in % config.block_out == 0:
        return config.block_in // config.block_out
    if config.block_out % config.block_in:
        return 0
    return config.block_out // config.block_in


def conv2d_workload(node: Node, graph: Graph, config: HardwareConfig) -> dict:
    """What the cycles of a lowered ``qconv2d``/``qdense`` node depend on, as plain JSON
    values: the `Conv2dLayer` fields and the ALU passes of its epilogue (each step's op and
    whether its operand is an immediate or a constant row). Two nodes with the same
    workload have the same schedule space and the same cycles per schedule, so the tuner
    keys its records on this. The clamp's bounds are not part of it: MAX and MIN run
    whatever they are (the out buffer narrows by truncation). Raises ValueError as
    `lower_conv2d` does."""
    layer, epi = conv2d_layer(node, graph, config)

    def steps(seq):
        return None if seq is None else [
            f"{s.op.name}:{'row' if s.row is not None else 'imm'}" for s in seq]

    fields = dataclasses.asdict(layer)
    fields["pads"] = list(layer.pads)
    if layer.groups == 1:   # records written before grouped convolutions keep their key
        for key in ("groups", "spans", "diagonal"):
            del fields[key]
    if not layer.has_residual:
        del fields["residual_ratio"]
    for key in ("late_residual", "bias_gemm", "window"):
        if not fields[key]:
            del fields[key]
    # Undilated, unpacked layers keep the keys their records were written with.
    for key in ("dilation_h", "dilation_w"):
        if fields[key] == 1:
            del fields[key]
    if layer.packed is None:
        del fields["packed"]
    for key in ("inp_group", "out_group"):   # keys of configs whose blocks agree stay
        if fields[key] == 1:
            del fields[key]
    else:
        fields["spans"] = [list(span) for span in layer.spans]
    clamp = {} if epi.clamp is None else {"clamp": steps(epi.clamp)}
    return {"op": node.op, **fields, "epilogue": steps(epi.main),
            "residual_epilogue": steps(epi.residual), **clamp}


def _dense_layer_and_epilogue(node: Node, graph: Graph,
                              config: HardwareConfig) -> tuple[Conv2dLayer, ConvEpilogue]:
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
    epilogue = _plan_epilogue(node, graph, o, padded_o, has_residual, config)
    layer = Conv2dLayer(n=n, c=c, h=1, w=1, o=o, kernel_h=1, kernel_w=1,
                        batch_blocks=ceil_div(n, config.batch),
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows), dense=True,
                        residual_ratio=residual_ratio(has_residual, config),
                        late_residual=late_residual(epilogue, config),
                        bias_gemm=epilogue.bias_gemm is not None,
                        inp_group=inp_group(config), out_group=out_group(config))
    return layer, epilogue


def residual_passes(workload: dict) -> tuple[int, int] | None:
    """(passes with an immediate, passes with a vector operand) of the residual's
    requantization (None without a residual)."""
    steps = workload.get("residual_epilogue")
    if steps is None:
        return None
    vec = sum(s.endswith(":row") for s in steps)
    return len(steps) - vec, vec


def alu_passes(workload: dict) -> tuple[int, int]:
    """(passes with an immediate, passes with a vector operand) of the main epilogue,
    the clamp included (a MAX and a MIN, or its REQ steps; as `estimate_conv2d` counts
    them)."""
    steps = workload["epilogue"] + workload.get("clamp", ["MAX:imm", "MIN:imm"])
    vec = sum(s.endswith(":row") for s in steps)
    return len(steps) - vec, vec


# --- the schedule ---------------------------------------------------------------------------

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
        # A tile's channels stay inside one span (one group's block range); a chunk
        # takes whole activation blocks (`Conv2dLayer.inp_group` input blocks each).
        g, og = layer.inp_group, layer.out_group if layer.has_residual else 1
        return Conv2dSchedule(min(self.tile_h, layer.out_h), min(self.tile_w, layer.out_w),
                              min(ceil_div(self.tile_ci, g) * g, layer.span_in),
                              min(ceil_div(self.tile_co, og) * og, layer.span_out),
                              self.oc_nthread,
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


def conv_uop_count(layer: Conv2dLayer, s) -> int:
    """len(conv_uop_table(layer, s).uops), without building it."""
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


# --- the timing model and the default schedule ----------------------------------------------

@dataclasses.dataclass(frozen=True)
class Conv2dEstimate:
    """Predicted cycles of a lowered conv2d and the work behind them (module-busy cycles
    summed over the layer): `gemm` (useful GEMM micro-ops), `epilogue` (reset, ALU
    passes, residual loads and instruction overheads on the compute module), `load` and
    `store` (DMA cycles of the load and store modules)."""

    cycles: int
    gemm: int
    epilogue: int
    load: int
    store: int

    @property
    def compute(self) -> int:
        return self.gemm + self.epilogue


@dataclasses.dataclass(frozen=True)
class _TileClass:
    """What `estimate_conv2d` keeps of a class of tiles (same rows, columns and channel
    tiling) for the terms between consecutive tiles, in cycles: its first chunk's loads
    (`first_load`); what of it the next tile's first loads may overlap with one thread
    (`overlap`: its epilogue but the bias GEMM, and its stores); its GEMMs with the
    epilogue (`compute`); its stores (`store`); with two threads, what of its epilogue
    runs after its GEMMs have freed its inp buffer (`released`), and its reset (`reset`:
    0 where a REQ clears the tile)."""

    first_load: float
    overlap: float
    compute: float
    store: float
    released: float
    reset: float


def _channel_tilings(layer: Conv2dLayer, s: Conv2dSchedule) -> tuple[list, int, bool]:
    """How clamped schedule `s` cuts `layer`'s channels, as `estimate_conv2d` counts
    them: (tilings, output-channel tiles, weight reuse). `tilings` lists the
    output-channel tiles (tco, count) and their input-channel chunks (blocks per output
    block, count), per span of a grouped layer (one span otherwise)."""
    tilings = []
    for _, on, _, cn in layer.spans:
        chunks = [(1, 1)] if layer.paired else tile_split(cn, min(s.tile_ci, cn))
        tilings += [(tco, nco, chunks) for tco, nco in tile_split(on, s.tile_co)]
    n_chunks = max(sum(n for _, n in chunks) for _, _, chunks in tilings)
    co_tiles = sum(nco for _, nco, _ in tilings)
    # Weights are loaded again for every tile, except with a single input-channel chunk
    # when a thread's next tile uses the same output-channel blocks (see the emitter's
    # `load_chunk` in `vdla.compiler.targets.vdla.conv`).
    if n_chunks > 1:
        weight_reuse = False
    elif s.oc_nthread > 1:
        weight_reuse = co_tiles <= 2
    else:
        weight_reuse = True
    return tilings, co_tiles, weight_reuse


def estimate_conv2d(layer: Conv2dLayer, schedule: Conv2dSchedule, config: HardwareConfig, *,
                    alu_passes: tuple[int, int] | None = None,
                    residual_passes: tuple[int, int] | None = None,
                    bytes_per_cycle: float | None = None) -> Conv2dEstimate:
    """Predict the cycles of `layer` lowered with `schedule` on `config`.

    `alu_passes` = (passes with an immediate, passes with a vector operand) of the
    epilogue over the conv tile; the default is what a requantized, clamped conv with a
    bias needs (SHR, MAX, MIN, or with the ALU's REQ one REQ; the bias ADD unless the
    bias GEMM adds it). The residual's
    passes are counted from `layer.has_residual` (int8 loads widened on the GEMM core, or
    a LOAD ACC; then `residual_passes`, the residual's requantization as (immediate,
    vector) passes, default a shift; then an ADD). `bytes_per_cycle`: the DRAM's each
    way, default the config's `dram_bytes_per_cycle`."""
    s = schedule.clamped(layer)
    c = config
    bw = float(bytes_per_cycle or config.dram_bytes_per_cycle)
    if alu_passes is None:   # a shift, the clamp (MAX, MIN or REQ's), a bias ADD row
        alu_passes = ((1 if AluOp.REQ in config.alu_ops else 3), 0 if layer.bias_gemm else 1)
    imm, vec = alu_passes
    res_passes = residual_passes if residual_passes is not None else (1, 0)
    # With the ALU's REQ the epilogue ends in one (`requant.clamp_steps`), which clears
    # the tile: each thread resets its region once instead of every tile.
    reset = 0 if AluOp.REQ in c.alu_ops else 1
    threads = s.nthreads
    tilings, co_tiles, weight_reuse = _channel_tilings(layer, s)

    gemm = epilogue = load = store = 0
    serial = 0          # one thread: the time of the modules taking turns
    paired = 0          # two threads: per chunk, the longer of loads and GEMMs
    first_load = last_store = first_compute = 0
    head_load = head_gemm = None   # the first chunk's loads and GEMMs
    last_paired = last = None      # the last tile's time, `_pair_run`'s arguments
    sides = {}               # (rows, columns, `tilings` index) -> `_TileClass`
    tiles, lone = 0, 0.0     # tiles in all; what the last one adds running alone
    load_waits = 0.0         # two threads: the load module's waits for their buffers
    for th, nh in tile_split(layer.out_h, s.tile_h):
        rows = window_rows(layer, th)
        for tw, nw in tile_split(layer.out_w, s.tile_w):
            cols = window_cols(layer, tw)
            pads = _window_pads(layer, s, th, tw)
            plane = th * tw
            seqs = []
            for k, (tco, nco, chunks) in enumerate(tilings):
                m = nh * nw * nco * layer.batch_blocks
                tile_load, tile_gemm, chunk_pairs, seq, res_epi, res_head = _tile_costs(
                    layer, chunks, tco, (rows, cols, pads), (th, tw), weight_reuse, c, bw,
                    res_passes)
                entries = plane * tco
                epi = _epilogue_cycles(layer, entries, tco, c, (imm, vec), reset) + res_epi
                st = store_cycles(entries, tco * (1 if tw == layer.out_w or layer.out_group == 1
                                                  else th), c, bw, layer.out_group)
                tile_chunks = sum(n for _, n in chunks)
                # GEMM instructions: one a chunk, or a window layer's one per kernel row.
                insns = tile_chunks * (layer.kernel_h if layer.window else 1)
                gemm += m * (tile_gemm - insns * INSN_CYCLES)
                epilogue += m * (epi + insns * INSN_CYCLES)
                load += m * tile_load
                store += m * st
                # For `_serial_overlaps`, `_store_waits` and `_weight_switches`.
                run = _pair_args(layer, seq, (epi, res_head, st), entries, reset, c)
                sides[th, tw, k] = _TileClass(
                    tile_load / tile_chunks, epi + st - _head_cycles(layer, entries, reset=0),
                    tile_gemm + epi, st, run[1] - run[4], reset * (entries + INSN_CYCLES))
                tile_paired = _tile_paired(layer, chunk_pairs, (seq[0][0], seq[0][1] - res_head),
                                           tile_gemm, epi)
                serial += m * (tile_load + tile_gemm + epi + st)
                paired += m * tile_paired
                if threads == 2:
                    more, waits = _pair_terms(m, run, tile_paired, first_class=not tiles)
                    paired += more
                    load_waits += waits * (s.oc_nthread == 2)   # `_pair_terms`
                tiles += m
                seqs.append(seq)
                if len(seqs) == 2 and s.oc_nthread == 2 and len(layer.spans) == 1:
                    paired += nh * nw * layer.batch_blocks * _mixed_pair(*seqs, co_tiles)
                # The last tile in program order is an edge tile of every axis.
                lone = (tile_load + tile_gemm + epi + st - tile_paired
                        - min(sides[th, tw, k].first_load, sides[th, tw, k].overlap))
                last_paired = tile_paired
                last = run
                first_load = max(first_load, tile_load / tile_chunks)
                head_load = seq[0][0] if head_load is None else head_load
                head_gemm = seq[0][1] - res_head if head_gemm is None else head_gemm
                first_compute = max(first_compute, tile_gemm + epi)
                last_store = max(last_store, st)
    # Each thread loads the weights of its output-channel blocks once per batch block;
    # threads over rows each load every block's (into their own region).
    once = weight_reuse * s.h_nthread * (layer.batch_blocks * layer.weight_blocks
                                         * layer.wgt_taps * c.wgt_elem_bytes / bw
                                         + co_tiles * DMA_CYCLES)
    load += once
    serial += once
    table_load, table_compute = _table_cycles(layer, s, c, bw)
    load += table_load
    # Without a reset per tile, each thread resets its whole region once, first.
    region_resets = 0 if reset else threads * (s.tile_h * s.tile_w * s.tile_co + INSN_CYCLES)
    # The tables load on both modules at once (`_table_cycles`); then the compute module
    # resets its regions, and the load module loads the first inputs.
    if threads == 1:
        cycles = (serial - _serial_overlaps(layer, s, tilings, sides)
                  + max(table_load, table_compute + region_resets - first_load))
    else:
        # The busiest module bounds the time; chunk pairs add the waits of a thread whose
        # loads take longer than the other's GEMM; weight switches stall the compute
        # module only (`_weight_switches`); a load-bound layer ends with its drain.
        switches = (_weight_switches(layer, s, tilings, once, c, bw, first_load,
                                     first_compute, (head_load, last_paired, sides))
                    if weight_reuse else 0.0) + _store_waits(layer, s, tilings, sides)
        cycles = _two_thread_cycles(
            paired + switches, load, store,
            (table_load, first_load, head_load, head_gemm, table_compute + region_resets),
            (last_store, lone if tiles % 2 else 0.0, load_waits, _pair_run(*last)[1]))
    return Conv2dEstimate(int(math.ceil(cycles)), int(gemm), int(epilogue + region_resets),
                          int(load), int(store))


def _two_thread_cycles(compute: float, load: float, store: float, head: tuple,
                       tail: tuple) -> float:
    """Two threads: the longer of the compute module's chain (its pairs and weight
    switches, `compute`) and the load module's (`load`, the tables' included), from the
    head: (table loads, the first loads before any GEMM, the first chunk's loads and
    GEMMs, the compute module's table loads and resets) and the tail: (the last store,
    what an odd tile count's lone last tile adds, the load module's waits, the drain
    after the last load, `_pair_run`'s).

    The first chunk's loads are in the head, so neither chain counts them again: not
    the pairs (where they outlast its GEMMs, their pair's share is those loads) nor the
    loads after the head. Counted twice, load-bound layers with two threads over output
    channels came out up to 36% high (ResNet-18's C6/r on a 1x32x32 core, tile_ci=1:
    11,694 cycles on Verilator, 13,824 when counted twice, 11,657 now); over the
    recorded Verilator sets of `bench/datasets` the mean error fell from 1.2-3.0% to
    0.7-1.3% (`bench/timing_records.py`)."""
    table_load, first_load, head_load, head_gemm, compute_head = head
    last_store, lone, load_waits, drain = tail
    excess = max(0.0, head_load - head_gemm)
    cycles = (max(compute - excess, load - table_load - head_load, store) + last_store
              + max(table_load + first_load, compute_head))
    # An odd tile count leaves the last group one thread: its loads and GEMMs take turns.
    # A load-bound layer's drain below already holds its tail.
    cycles += max(0.0, lone)
    # The loads, their waits for the compute module and, from the last load's end to the
    # last store's, the drain of the last tiles.
    return max(cycles, load + load_waits + drain)


def _serial_overlaps(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """One thread: what the tiles' first loads overlap in all. Each tile's overlap its
    predecessor's epilogue and stores, but for its bias GEMM, which waits for them, in
    program order (batch blocks, output-channel tiles, rows, columns: `_ConvEmitter.groups`
    in `vdla.compiler.targets.vdla.conv`); the first tile's overlap nothing. `sides` maps
    a tile class (rows, columns, index in `tilings`) to its `_TileClass`. The stem of
    ResNet-18 on a 1x16x32 core at 8 bytes a cycle: 9,172 cycles a tile on Verilator,
    8,826 when the bias GEMM overlapped too; its layer4.0.downsample on 1x32x16 (tiles of
    two rows and a last one of one): 60,295 cycles on Verilator, 58,217 when each tile
    overlapped its own class's epilogue, 58,817 so."""
    rows, cols = tile_split(layer.out_h, s.tile_h), tile_split(layer.out_w, s.tile_w)
    cos = [(k, nco) for k, (_, nco, _) in enumerate(tilings)]
    nb = layer.batch_blocks

    def overlaps(prev, cur, n):
        return n * min(sides[cur].first_load, sides[prev].overlap)

    total = 0.0
    for k, nco in cos:
        for th, nh in rows:          # along a row
            total += sum(overlaps((th, a, k), (th, b, k), n * nh * nco * nb)
                         for (a, b), n in _steps(cols).items())
        total += sum(overlaps((a, cols[-1][0], k), (b, cols[0][0], k), n * nco * nb)
                     for (a, b), n in _steps(rows).items())
    first, last = (rows[0][0], cols[0][0]), (rows[-1][0], cols[-1][0])
    total += sum(overlaps((*last, a), (*first, b), n * nb) for (a, b), n in _steps(cos).items())
    return total + overlaps((*last, cos[-1][0]), (*first, cos[0][0]), nb - 1)


def _store_waits(layer: Conv2dLayer, s: Conv2dSchedule, tilings, sides: dict) -> float:
    """Two threads over rows: the compute module's waits where a tile is followed by one
    of another class. A tile's first GEMM waits for the stores of its thread's previous
    tile, two tiles back, which run during the tile between; each class's own pairs
    count that wait (`_pair_run`), but a short last row tile between two whole ones hides
    less of the whole tile's stores. `sides` maps a tile class to its `_TileClass`; the
    order is `_ConvEmitter.groups`' (batch blocks, output channels, columns, rows).
    MobileNet-v1's features.1.pw on 1x16x32-req-hold-dw3, tiles of five rows and a last
    one of one: the compute module waits 850 cycles after each last row tile but the
    layer's last on Verilator, 848 here (83,540 cycles; 80,562 without it)."""
    if s.h_nthread != 2:
        return 0.0
    levels = [[(k, nco) for k, (_, nco, _) in enumerate(tilings)],
              tile_split(layer.out_w, s.tile_w), tile_split(layer.out_h, s.tile_h)]
    nb = layer.batch_blocks

    def wait(a, b, n=1):      # classes as (rows, columns, output-channel tiling)
        prev, cur = sides[a[::-1]], sides[b[::-1]]
        st_a, comp_b, st_b = prev.store, cur.compute, cur.store
        return n * max(0.0, st_a - comp_b - max(0.0, st_b - comp_b))

    (ks, cols, rows), last = levels, tuple(level[-1][0] for level in levels)
    total = sum(wait((k, tw, a), (k, tw, b), n * nco * nw * nb)
                for k, nco in ks for tw, nw in cols for (a, b), n in _steps(rows).items())
    total += sum(wait((k, a, rows[-1][0]), (k, b, rows[0][0]), n * nco * nb)
                 for k, nco in ks for (a, b), n in _steps(cols).items())
    total += sum(wait((a, cols[-1][0], rows[-1][0]), (b, cols[0][0], rows[0][0]), n * nb)
                 for (a, b), n in _steps(ks).items())
    total += wait(last, (ks[0][0], cols[0][0], rows[0][0]), nb - 1)
    # The layer's last tile has no tile after it to wait: its predecessor's class.
    for i in (2, 1, 0):
        if levels[i][-1][1] > 1:
            break
        if len(levels[i]) > 1:
            return total - wait((*last[:i], levels[i][-2][0], *last[i + 1:]), last)
    return total


def _steps(classes: list[tuple]) -> dict[tuple, int]:
    """The steps between consecutive items of the sequence of `classes` (class, count),
    each class repeated count times: {(previous, next): steps}."""
    steps: dict[tuple, int] = {}
    for i, (k, n) in enumerate(classes):
        pairs = [((k, k), n - 1)] + ([((classes[i - 1][0], k), 1)] if i else [])
        for key, count in pairs:
            steps[key] = steps.get(key, 0) + count
    return steps


def _tile_paired(layer: Conv2dLayer, chunk_pairs: float, first: tuple[float, float],
                 tile_gemm: float, epi: float) -> float:
    """A tile's time with two threads, to first order: its chunks' longer of loads and
    GEMMs, and its epilogue. `first`: its first chunk's (loads, GEMMs)."""
    if layer.inp_group == 1:
        # A tile's first loads also run during the other thread's epilogue, which hides
        # what they take beyond its first GEMM.
        return chunk_pairs + epi - min(epi, max(0.0, first[0] - first[1]))
    # Loading whole activation blocks (block_out > block_in) makes a narrow layer
    # load-bound (a stem: 3 channels in a 32-channel block), and a load-bound pair hides
    # the epilogue behind the other thread's loads (1x8x32's MobileNet stem: 247,498
    # cycles against Verilator's 248,246, not 329,274).
    return max(chunk_pairs, tile_gemm + epi)


def _mixed_pair(whole: list[tuple[float, float]], short: list[tuple[float, float]],
                co_tiles: int) -> float:
    """Two threads over output channels whose channels end in a short output-channel
    tile, an even count of them: each position's last group pairs a whole tile with the
    short one. What that pair takes beyond each tile's own chunks (`_tile_paired`), from
    the chunks' (loads, GEMMs): a thread's next chunk loads only after its GEMMs, so a
    chunk pair takes at least one thread's loads and GEMMs in turn, which the short
    tile's chunks cannot hide (ResNet-18's layer4.1.conv2 on VTA's default sizes, tiles of
    6 and 2 output blocks: the compute module waits 1,031 cycles a chunk on Verilator,
    1,080 here; 501,544 cycles against 468,440 without it). An odd count leaves the short
    tile alone in its group (`estimate_conv2d`'s lone tile)."""
    if co_tiles % 2:
        return 0.0
    return sum(max(g0 + g1, l0 + l1, l0 + g0, l1 + g1) - max(l0, g0) - max(l1, g1)
               for (l0, g0), (l1, g1) in zip(whole, short))


def _pair_terms(m: int, run: tuple, tile_paired: float, first_class: bool):
    """What `m` tiles of one class add, with two threads, to the compute module's time
    beyond `tile_paired` each (the steady pairs after the first two tiles, where there
    are two pairs or more; less than nothing where `_tile_paired` overstates a pair, as
    it does a load-bound one: MobileNet-v1's features.11.pw on 1x32x16, two pairs, 101,938
    cycles on Verilator, 105,763 without the term, 103,797 with it), and the load
    module's waits (`_pair_run`'s, the first pair of the layer's from free buffers).
    `run`: `_pair_run`'s arguments. The waits are measured over output channels
    (`oc_nthread`); over rows (weights kept, a residual in the first chunk) they
    overstate, and `estimate_conv2d` leaves them out: ResNet-50's layer3.1.conv3 on
    1x32x16 takes 244,530 cycles on Verilator, 252,469 with them."""
    waits = _pair_run(*run)[2]
    load_waits = m / 2 * waits[1] - (waits[1] - waits[0]) * first_class
    more = 0.0
    if m >= 4:
        more = (m - 2) * (_pair_period(*run[:3], run[4]) / 2 - tile_paired)
    return more, load_waits


def _pair_period(chunks: list[tuple[float, float]], epilogue: float, store: float,
                 held: float = 0.0) -> float:
    """The steady-state cycles of a pair of tiles of two threads (`_pair_run`)."""
    ends = _pair_run(chunks, epilogue, store, 4, held)[0]
    return ends[-1] - ends[-2]


def _pair_run(chunks: list[tuple[float, float]], epilogue: float, store: float,
              pairs: int = 4, held: float = 0.0) -> tuple[tuple[float, ...], float,
                                                         tuple[float, ...]]:
    """`_simulate_pairs`, remembered: a space's schedules share few distinct chunk
    patterns, and ranking a whole space (the pretrained tuner, the learned chooser) asks
    for the same ones hundreds of thousands of times."""
    return _simulate_pairs(tuple(chunks), epilogue, store, pairs, held)


@functools.lru_cache(maxsize=1 << 16)
def _simulate_pairs(chunks: tuple[tuple[float, float], ...], epilogue: float, store: float,
                    pairs: int, held: float) -> tuple[tuple[float, ...], float,
                                                      tuple[float, ...]]:
    """The steady-state cycles of a pair of tiles (one per thread) of two threads that
    take turns chunk by chunk, from their dependencies, module by module in program
    order: a chunk's loads wait for the thread's previous chunk's GEMMs (its buffer) and
    for the loads before them; a chunk's GEMMs for its loads and the compute module; a
    tile's first GEMM for the thread's previous stores (the GEMMs write the out buffer
    the stores read); a tile's stores for its epilogue and the stores before them.
    `chunks` are each chunk's (loads, GEMMs) in program order, so chunks that differ
    keep their own waits; `epilogue` and `store` are per tile. The residual's reset and
    widening run before a tile's first GEMMs (in its first chunk's GEMMs here, not in
    its `epilogue`); a late residual is widened in the epilogue from the thread's inp
    buffer, which the epilogue then holds for its first `held` cycles, all but the
    clamp (ResNet-50's layer3.1.conv3 on pynq-z1-plus: the next tile's first loads wait
    946 cycles, the shift and the widening GEMM; on a 1x16x32 core without REQ, two
    threads over rows of seven: 21,314 cycles a pair on Verilator, 23,488 when the
    clamp held the buffer too, 21,693 now).

    When the stores take longer than the compute between a thread's epilogue and its
    next tile (the other thread's last chunk and epilogue), the compute module waits:
    pointwise layers of a 1x16x32 core whose tiles load as long as they compute
    (MobileNet-v1's features.2.pw: 9,611 cycles a pair on Verilator, 9,591 here).
    Simulated over a few pairs: every pair after the first repeats the same waits.
    `estimate_conv2d` adds what this differs from `_tile_paired` by to the pairs after
    the first of a tile class with two pairs or more (`_pair_terms`).

    Returns each pair's end on the compute module, the *drain* and each pair's *load
    waits*. The load waits are the time the load module waits for a thread's buffer (a
    chunk's loads for its own thread's previous GEMMs): a layer bound by its loads still
    waits there where its chunks differ, a short last chunk loading before the other
    thread's long one has computed (MobileNet-v1's features.11.pw on pynq-z1-plus,
    chunks of 6 input blocks and a last one of 2: 1,837 cycles a pair on Verilator,
    1,468 here; 64,074 cycles against 60,474 without them, 63,410 with them). The drain
    is from the last load's end to the last store's: a load-bound layer ends that long
    after its loads, for the compute module still has the last pair's GEMMs and
    epilogues in program order, then the stores come (on a 1x16x32 core at 12 bytes a
    cycle, ResNet-18's layer4.0.downsample with its residual fused ends 3,849 cycles
    after its last chunk's GEMM starts, both threads' epilogues, 1,213 cycles each,
    after it; the model's tail had been the first load and the last store, 1,468:
    33,044 cycles against Verilator's 35,501, now 35,840)."""
    compute = loads = stores = 0.0
    stored = [0.0, 0.0]       # each thread's last store's end
    computed = [0.0, 0.0]     # each thread's last chunk's end (its buffers free)
    ends, waits = [], []
    for _ in range(pairs):
        waits.append(0.0)
        for j, (load, gemm) in enumerate(chunks):
            for t in (0, 1):
                waits[-1] += max(0.0, computed[t] - loads)
                loads = max(loads, computed[t]) + load
                start = max(compute, loads, stored[t] if j == 0 else 0.0)
                compute = computed[t] = start + gemm
                if j == len(chunks) - 1:
                    computed[t] += held
                    compute += epilogue
                    stores = stored[t] = max(stores, compute) + store
        ends.append(compute)
    return tuple(ends), stores - loads, tuple(waits)


def _weight_switches(layer: Conv2dLayer, s: Conv2dSchedule, tilings, once: float,
                     c: HardwareConfig, bw: float, first_load: float,
                     tile_compute: float, edges: tuple[float, float, float]) -> float:
    """Two threads that load each weight block once: what their weight loads add to the
    busiest module's time. `once` is every weight load; `first_load` and `tile_compute`
    a tile's first loads and its compute (the most of each over the layer's tiles);
    `edges` the first tile's first loads, the last tile's time with two threads
    (`_tile_paired`) and `estimate_conv2d`'s tile classes (`sides`).
    Weight switches stall the compute module (a thread waits for its new weights): they
    add to its time, not to the load module's, which already counts every weight load
    (`once`). So a load-bound layer pays none (MobileNet-v1's features.3.dw on the 1x16x32
    window: 60,545 cycles on Verilator, 62,785 with the switches added on top of the
    loads)."""
    first_gap = first_load - tile_compute
    if s.h_nthread > 1:
        # Threads over rows switch output-channel tiles together, each loading its own
        # copy of the tile's weights. The first copy and the first thread's first inputs
        # load while the other thread computes the last tile of the previous
        # output-channel tile, a bottom edge tile that may be short (at the start, while
        # the compute module waits); the second copy and its first inputs while the first
        # thread's first tile computes. MobileNet-v1's features.3.dw on pynq-z1-plus
        # (three rows a tile, the last tile one row): the compute module waits 694
        # cycles at each switch on Verilator, 1,221 of loads against 529 of compute.
        # Elsewhere the first thread's loads start when its inp buffer frees, after its
        # previous tile's GEMMs: a whole row tile's, two tiles back. So the rest of that
        # tile's epilogue (`released`: all of it but for a late residual's widening)
        # hides them too, and so does the new tile's reset, which needs no loads.
        # ResNet-50's layer3.1.conv3 on a 1x16x32 core at 8 bytes a cycle (rows of
        # three, the residual late): 3,300 cycles of waits at a switch on Verilator;
        # 207,877 cycles in all, 183,498 with the weights alone against a whole tile.
        # MobileNet-v1's features.5.dw on 1x32x16 (rows of five, the last tile of four):
        # 215 cycles at a switch on Verilator, 451 with the short tile's epilogue
        # released and no reset. Window layers keep their measured rule.
        head_load, last_paired, sides = edges
        taps = layer.wgt_taps
        total, started = 0.0, False
        whole, cols = s.tile_h, tile_split(layer.out_w, s.tile_w)[-1][0]
        for k, (tco, nco, chunks) in enumerate(tilings):
            w = tco * chunks[0][0] * taps * c.wgt_elem_bytes / bw + DMA_CYCLES
            released, own_reset = (sides[whole, cols, k].released,
                                   sides[whole, cols, k].reset)
            for _ in range(nco * layer.batch_blocks):
                first = (max(0.0, w + head_load - last_paired) if layer.window
                         else max(0.0, w + head_load - last_paired - released - own_reset))
                total += (first if started else w) + max(0.0, w + first_gap)
                started = True
        return total
    # Threads over output channels start at the same time: the first thread's weights
    # load while the compute module waits, and the second thread's weights and first
    # loads after them, while only the first thread's first tile computes.
    return once / 2 + max(0.0, once / 2 + first_gap)


def _pair_args(layer: Conv2dLayer, seq: list, tile: tuple[float, float, float],
               entries: int, reset: int, c: HardwareConfig) -> tuple:
    """`_pair_run`'s arguments for a tile of `entries` acc entries, chunks `seq`, and
    `tile` = (epilogue, its residual's head, stores): with two threads the tile's own
    reset and bias GEMM (`_head_cycles`), like its residual's reset and widening, run
    before its first chunk's GEMMs; a late residual holds the inp buffer for all of the
    epilogue but the clamp. ResNet-50's layer3.0.conv3 on 1x32x16 (rows of five, chunks
    of 3, 3 and 2 input blocks): 16,642 cycles a pair on Verilator; 17,551 when the
    epilogue took them, for the other thread's first chunk then waited for its loads;
    16,704 so."""
    epi, res_head, st = tile
    own = _head_cycles(layer, entries, reset)
    pair_epi = epi - res_head - own
    late = layer.late_residual and bool(layer.residual_ratio)   # widened in the epilogue
    return ([(seq[0][0], seq[0][1] + own), *seq[1:]], pair_epi, st, 2,
            pair_epi - _clamp_cycles(entries, c) if late else 0.0)


def _head_cycles(layer: Conv2dLayer, entries: int, reset: int) -> float:
    """What of a tile's epilogue (`_epilogue_cycles`) runs before its first chunk's GEMMs:
    the reset of its `entries` acc entries (`reset`: 0 where a REQ clears them) and the
    bias GEMM."""
    return (reset + layer.bias_gemm) * (entries + INSN_CYCLES)


def _clamp_cycles(entries: int, c: HardwareConfig) -> float:
    """The clamp's cycles over a tile of `entries` acc entries (MAX and MIN, or with the
    ALU's REQ one REQ): what follows a late residual's widening in the epilogue."""
    return (1 if AluOp.REQ in c.alu_ops else 2) * (entries + INSN_CYCLES)


def _epilogue_cycles(layer: Conv2dLayer, entries: int, tco: int, c: HardwareConfig,
                     passes: tuple[int, int], reset: int) -> float:
    """Compute cycles of a tile's epilogue over `entries` acc entries in `tco` output
    blocks: the reset micro-op (`reset`: 0 where the epilogue's REQ clears the tile), the
    bias GEMM's, then the ALU `passes` (immediate, vector), each pass an instruction."""
    imm, vec = passes
    epi = (entries * (reset + imm) + vec * vector_pass_cycles(entries, tco, c)
           + (1 + reset + imm + vec) * INSN_CYCLES)
    if layer.bias_gemm:    # the bias GEMM: one micro-op per acc entry
        epi += entries + INSN_CYCLES
    return epi


def _window_pads(layer: Conv2dLayer, s: Conv2dSchedule, th: int, tw: int) -> float:
    """The mean count of a `th` x `tw` tile's input window positions that lie in the
    padding (the LOAD writes each zero in a cycle while its reads of the rest run ahead:
    `PAD_ELEM_CYCLES`), over the layer's tiles of that size."""

    def inside(out, tile, size, stride, pad, window, extent) -> float:
        starts = [o0 for o0 in range(0, out, tile) if min(tile, out - o0) == size]
        return sum(min(o0 * stride - pad + window, extent) - max(o0 * stride - pad, 0)
                   for o0 in starts) / len(starts)

    rows, cols = window_rows(layer, th), window_cols(layer, tw)
    return rows * cols - (
        inside(layer.out_h, s.tile_h, th, layer.stride_h, layer.pads[0], rows, layer.h)
        * inside(layer.out_w, s.tile_w, tw, layer.stride_w, layer.pads[1], cols, layer.w))


def _tile_costs(layer: Conv2dLayer, chunks, tco: int, window: tuple[int, int, float],
                tile: tuple[int, int], weight_reuse: bool, c: HardwareConfig, bw: float,
                res_passes: tuple[int, int]):
    """One tile's chunks with its residual (`_chunk_costs`, `_residual_cost`): (load
    cycles, GEMM cycles, the sum over chunks of the longer of the two, each chunk's (load,
    GEMM), the residual's compute cycles, those of them before the first GEMMs).
    `window`: the input rows and columns, and the positions in the padding."""
    tile_load, tile_gemm, chunk_pairs, seq = _chunk_costs(
        layer, chunks, tco, window[:2], tile, weight_reuse, c, bw, window[2])
    first = seq[0]
    res, res_epi, res_head = _residual_cost(layer, tile[0] * tile[1], tco, c, bw, res_passes)
    if res:
        # The residual tile comes with the first chunk's loads; with two threads it loads
        # during the other thread's GEMM too.
        tile_load += res
        chunk_pairs += max(first[0] + res, first[1]) - max(*first)
    # Its reset and widening run before the first chunk's GEMMs (or, late, in the
    # epilogue: `res_head` is 0).
    seq = [(first[0] + res, first[1] + res_head), *seq[1:]]
    return tile_load, tile_gemm, chunk_pairs, seq, res_epi, res_head


def _chunk_costs(layer: Conv2dLayer, chunks, tco: int, window: tuple[int, int],
                 tile: tuple[int, int],
                 weight_reuse: bool, c: HardwareConfig, bw: float, pads: float = 0.0):
    """One tile's input-channel chunks: (load cycles, GEMM cycles, the sum over chunks of
    the longer of the two, and each chunk's (load, GEMM) in order). A chunk loads whole
    activation blocks of its `window` (rows, columns) of input positions, `pads` of them
    in the padding (a
    diagonal tile one input block per output block) and, unless they are reused, its
    weights: one 2-D DMA per activation block and one of weights, each paying the DRAM
    latency (measured: bytes / 8 + 36 cycles a DMA, whatever its rows). `tile`: the
    tile's (rows, columns); a window layer's GEMMs are `dw_window.tile_gemm_cycles`."""
    taps = layer.wgt_taps
    grp = layer.inp_group
    plane = tile[0] * tile[1]
    rows, window = window[0], window[0] * window[1]
    # A row of one activation DMA: its columns of `grp` elements (`activation_dma`).
    row_cycles = window // rows * grp * c.inp_elem_bytes / bw
    tile_load = tile_gemm = chunk_pairs = 0.0
    seq = []
    for tci, nci in chunks:
        blocks = (tco * grp if layer.window else tco if layer.diagonal
                  else ceil_div(tci, grp) * grp)
        wgt = 0 if weight_reuse else tco * tci * taps * c.wgt_elem_bytes
        dmas = blocks if layer.diagonal else blocks // grp
        data = blocks * (window - pads)
        # The LOAD's writer takes a bus word (or an element narrower) a cycle, and writes
        # a zero for each padded element meanwhile: the padding costs only where the
        # writer, not the DRAM, is the limit (a 128-bit bus at 12 bytes a cycle keeps
        # ahead of the DRAM: MobileNet-v1's features.11.dw on 1x16x32, 58 padded elements
        # a tile, loads its inputs in 565 cycles on Verilator, 563 without them).
        inp = max(data * c.inp_elem_bytes / bw,
                  data * max(1, c.inp_elem_bytes / (c.dram_bus_width // 8))
                  + blocks * pads * PAD_ELEM_CYCLES)
        ld = (inp + wgt / bw + (dmas + (wgt > 0)) * DMA_CYCLES
              + dmas * dma_row_cycles(rows, row_cycles))
        g = (dw_window.tile_gemm_cycles(layer, *tile, tco, c) if layer.window
             else plane * tco * tci * taps + INSN_CYCLES)
        tile_load += nci * ld
        tile_gemm += nci * g
        chunk_pairs += nci * max(ld, g)
        seq += [(ld, g)] * nci
    return tile_load, tile_gemm, chunk_pairs, seq


def _residual_cost(layer: Conv2dLayer, plane: int, tco: int, c: HardwareConfig, bw: float,
                   passes: tuple[int, int]) -> tuple[float, float, float]:
    """(load-module cycles, compute cycles, those of them before the tile's first GEMMs)
    of one tile's residual (`plane` positions x
    `tco` output blocks; `passes` its requantization's (immediate, vector) ALU passes).
    The int8 residual tile comes with the first chunk's loads, one DMA per output block
    (its ratio input blocks side by side); the compute module resets its acc tile, widens
    it (one identity GEMM micro-op per input block), requantizes it and ADDs it (a vector
    operand: two cycles), or, late, widens it onto the requantized tile. Where block_out
    is no multiple of block_in, a LOAD ACC of int32 entries on the compute module."""
    imm, vec = passes
    entries = plane * tco
    if layer.residual_ratio:
        widen, og = layer.residual_ratio, layer.out_group
        load = entries * widen * c.inp_elem_bytes / bw + tco * DMA_CYCLES
        if og > 1:   # one input block per og output blocks, one selection each
            widen = 1
            load = ceil_div(tco, og) * (plane * c.inp_elem_bytes / bw + DMA_CYCLES)
        if layer.late_residual:
            return load, entries * widen + INSN_CYCLES, 0.0
        # Its reset and widening (first), its immediate passes, its vector passes (held on
        # an alu_hold config), then the ADD onto the conv tile (src moves: never held).
        return load, (entries * (1 + widen + imm + 2) + vec * vector_pass_cycles(entries, tco, c)
                      + (2 + imm + vec) * INSN_CYCLES), entries * (1 + widen) + INSN_CYCLES
    if layer.has_residual:
        return 0.0, (entries * (c.acc_elem_bytes / bw + imm + 2)
                     + vec * vector_pass_cycles(entries, tco, c) + tco * DMA_CYCLES), 0.0
    return 0.0, 0.0, 0.0


def _table_cycles(layer: Conv2dLayer, s, c: HardwareConfig, bw: float) -> tuple[float, float]:
    """The tables a program loads first, as (load-module cycles: the identity and bias
    blocks and the ones vector; compute-module cycles: the micro-ops and the constant
    rows, a LOAD UOP and a LOAD ACC).

    Both modules load at once over one read channel, so the load module's tables end no
    sooner than the channel has carried all of them (`_shared_tables`)."""
    load_bytes = ((layer.residual_ratio + layer.bias_gemm * layer.out_blocks)
                  * c.wgt_elem_bytes + layer.bias_gemm * c.inp_elem_bytes)
    load = load_bytes / bw + (2 * layer.bias_gemm + (layer.residual_ratio > 0)) * DMA_CYCLES
    uops = conv_uop_count(layer, s)
    const_bytes = layer.const_rows * layer.out_blocks * c.acc_elem_bytes
    compute = (uops * c.uop_bytes + const_bytes) / bw + (1 + (layer.const_rows > 0)) * DMA_CYCLES
    if load_bytes:
        load = max(load, _shared_tables(uops, load_bytes + const_bytes, c, bw))
    return load, compute


def _shared_tables(uops: int, other_bytes: int, c: HardwareConfig, bw: float) -> float:
    """Cycles for the one read channel to carry the micro-op table and `other_bytes` of
    other tables, both modules loading at once: a DMA latency on each module, the other
    bytes at the DRAM's rate, and the micro-ops no faster than the DMA writer takes them,
    one a cycle (narrower than a bus word, they are picked out of each beat one by one,
    and the channel's beats wait for them).

    Measured on MobileNet-v1 `features.12.dw` on 1x16x32-req-dw3 at 8 bytes a cycle
    (110 micro-ops, 4,096 bytes of constant rows on the compute module; the 16,400-byte
    bias row and ones vector on the load module): the load module's tables end at cycle
    3,040; this bound gives 2,752, the two modules apart 2,130."""
    return uops * max(1.0, c.uop_bytes / bw) + other_bytes / bw + 2 * DMA_CYCLES


def schedule_space(layer: Conv2dLayer, config: HardwareConfig, *,
                   threads: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2)),
                   width_tiles: int | None = 4):
    """Every schedule of `layer` that fits `config`: tile sizes that give distinct tile
    counts, (oc_nthread, h_nthread) from `threads`; `width_tiles` limits the output-width
    tilings tried to the widest few (full rows make the longest DMA rows)."""
    for oc, hn in threads:
        for tw in tile_candidates(layer.out_w, width_tiles):
            for th in tile_candidates(layer.out_h):
                if th * tw > ITER_MAX:
                    continue
                for tci in tile_candidates(layer.span_in):
                    for tco in tile_candidates(layer.span_out):
                        s = Conv2dSchedule(th, tw, tci, tco, oc, hn)
                        if (oc == 2 and len(layer.co_tiles(tco)) < 2) or (
                                hn == 2 and th >= layer.out_h):
                            continue  # one tile along the threaded axis: nothing to overlap
                        if s.fits(layer, config):
                            yield s


@functools.lru_cache(maxsize=256)
def choose_conv2d(layer: Conv2dLayer, config: HardwareConfig, *,
                  nthreads: int | None = None) -> Conv2dSchedule:
    """The schedule of `layer` with the fewest estimated cycles (`estimate_conv2d`) among
    `schedule_space`; `nthreads` (1 or 2) restricts the virtual threads. The widest few
    output-width tilings are searched first (full rows make the longest DMA rows) and
    every width only when none of those fits, so a schedule is found whenever the
    smallest tiling fits. Raises ValueError when nothing fits (naming the buffers the
    smallest tiles overflow).

    The search ranks tens of thousands of schedules for a model, so its answers are
    remembered on disk across processes too (`common.remembered_schedule`)."""
    options = {None: ((1, 1), (2, 1), (1, 2)), 1: ((1, 1),), 2: ((2, 1), (1, 2))}
    if nthreads not in options:
        raise ValueError(f"nthreads must be 1, 2 or None (either), not {nthreads!r}")
    threads = options[nthreads]
    return remembered_schedule(
        "conv2d", layer, config, lambda: _search_conv2d(layer, config, nthreads, threads),
        Conv2dSchedule, lambda s: (s.oc_nthread, s.h_nthread) in threads, nthreads=nthreads)


def _search_conv2d(layer: Conv2dLayer, config: HardwareConfig, nthreads: int | None,
                   threads: tuple[tuple[int, int], ...]) -> Conv2dSchedule:
    """`choose_conv2d`'s search, over the (oc_nthread, h_nthread) pairs `threads`."""
    best, best_cycles = None, None
    for width_tiles in (4, None):
        for s in schedule_space(layer, config, threads=threads, width_tiles=width_tiles):
            cycles = estimate_conv2d(layer, s, config).cycles
            # Ties go to fewer, larger tiles (fewer instructions).
            key = (cycles, -s.tile_h * s.tile_w * s.tile_ci * s.tile_co)
            if best is None or key < best_cycles:
                best, best_cycles = s, key
        if best is not None:
            break
    if best is None:
        Conv2dSchedule(1, 1, 1, 1).check(layer, config)  # raises, naming the buffers
        raise ValueError(f"conv2d layer {layer} has no schedule with {nthreads} virtual "
                         f"threads that fits config {config.name}")
    return best
