"""A convolution as the accelerator sees it: the layer and its default schedule. The conv
family's lowering (`vdla.compiler.targets.vdla.conv`) reads both.

* `Conv2dLayer` (``qconv2d``, and ``qdense`` as a 1x1 convolution over a 1x1 image: the
  back half lowers a dense layer exactly as that convolution; ``qmatmul`` of two
  activations as a dense layer whose weights are its second operand's rows, streamed
  from DRAM) with its `ConvEpilogue`;
  `conv2d_layer(node, graph, config)` makes both and raises ValueError, naming the node,
  for what the back half cannot run. A grouped or depthwise layer's block structure
  comes from `vdla.compiler.targets.vdla.grouped`;
* `conv2d_workload`: what a convolution's cycles depend on, the tuner's records key, and
  `alu_passes`, the epilogue's passes as the timing model counts them (for the graph
  estimate and the tuning task alike);
* the default schedule: `choose_conv2d`, the tiling with the fewest estimated cycles
  among `schedule_space`. The tiling itself and its fit are
  `vdla.compiler.targets.vdla.conv_schedule`'s (`Conv2dSchedule`); the timing model that
  ranks the tilings is `vdla.compiler.targets.vdla.timing`'s (`estimate_conv2d`).

Why this module is long: the layer's construction and its default schedule are read
together (a first layer's packed or windowed form is chosen by its default schedule's
estimated cycles, and the chooser ranks the tilings of the layer's fields), and the
conv family keeps its lowering in `conv`, so that a convolution's layer is built in one
module (tests/compiler/targets/vdla/test_structure.py checks what lowering one enters).
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
from vdla.compiler.targets.vdla.common import (ITER_MAX, PAD_MAX, ceil_div, gemm_bias_limit,
                                               inp_group, out_group, remembered_schedule,
                                               tile_candidates)
from vdla.compiler.targets.vdla.requant import (AluStep, check_alu_ops, clamp_steps,
                                                requant_steps)
from vdla.compiler.targets.vdla.sequence import pixel_rows, sequence_rows
from vdla.compiler.targets.vdla import dw_window
from vdla.compiler.targets.vdla.grouped import group_spans
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.compiler.targets.vdla.tap_pack import TapPack, tap_packs
from vdla.compiler.targets.vdla.timing import estimate_conv2d, timing_key
from vdla.config import AluOp, HardwareConfig

__all__ = ["Conv2dLayer", "ConvEpilogue", "alu_passes", "choose_conv2d", "conv2d_layer",
           "matmul_problem",
           "conv2d_workload", "residual_passes", "residual_ratio", "schedule_space"]


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
    # The bias blocks stay in the weight buffer beside the smallest tiling's weights (two
    # threads' blocks of every tap, the residual's identity blocks): a wide layer (a
    # language model's head over its vocabulary) adds its bias on the ALU instead.
    taps = int(np.prod(graph.tensors[node.inputs[1]].shape[2:]))
    room = config.wgt_depth - 2 * taps - residual_ratio(has_residual, config)
    if (has_bias or fold is not None) and (has_bias <= (bias is not None)) \
            and np.abs(wrap32(added)).max() <= gemm_bias_limit(config) \
            and padded // config.block_out <= room:
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
    elements apart.
    `sequence`: a dense layer (`dense`) over a sequence laid out as the image of its rows
    (`vdla.compiler.targets.vdla.sequence`): its rows are the `h` pixels of one
    (1, C, rows, 1) image (`n` is 1), so its output-row tiles share the weight blocks
    they load.
    `streamed`: the weights are an activation in DRAM, not constants written once: a
    ``qmatmul``'s second operand b (N, K), a sequence whose rows are the output channels.
    Its buffer, ``[K / L][N][L]``, holds weight block (output block ob, input block ib)
    whole at element ``ib * out_blocks + ob`` where block_in = block_out = L
    (`matmul_problem`).
    `diagonal_rows`: a streamed layer whose input (a qmatmul's constant a, square) is
    block diagonal: rows of block i are zero outside input block i, as an identity that
    transposes b is. A tile of rows then reads only its own rows' input blocks (one
    chunk, `tile_h` / L blocks: a tile of L rows runs one block where the identity's
    every block would take c / L)."""

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
    sequence: bool = False
    streamed: bool = False
    diagonal_rows: bool = False

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
        if self.diagonal_rows and not (self.streamed and self.h == self.c
                                       and self.c % self.in_blocks == 0
                                       and self.inp_group == 1):
            raise ValueError(f"a diagonal_rows layer is a streamed product of a square, "
                             f"block-diagonal a: {self.h} rows of {self.c} channels in "
                             f"{self.in_blocks} blocks (inp_group {self.inp_group}) are not")
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

    @property
    def row_block(self) -> int:
        """A diagonal_rows layer's block: its rows (and input channels) per input block,
        the rows a tile reads one input block for."""
        return self.c // self.in_blocks

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
    if node.op not in ("qconv2d", "qdense", "qmatmul"):
        raise ValueError(f"lower_conv2d lowers qconv2d, qdense and qmatmul nodes, not "
                         f"{node.name!r} ({node.op})")
    a = node.attrs
    if node.op == "qdense":
        return _dense_layer_and_epilogue(node, graph, config)
    if node.op == "qmatmul":
        return _matmul_layer_and_epilogue(node, graph, config)
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
    for key in ("late_residual", "bias_gemm", "window", "sequence", "streamed",
                "diagonal_rows"):
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
    """A qdense node is a 1x1 convolution: (N, C) x (O, C) over N 1x1 images, or over one
    N x 1 image where its input is a sequence (`sequence.pixel_rows`;
    its residual must be one too)."""
    a = node.attrs
    for key, plain in (("data_layout", "NC"), ("kernel_layout", "OI"), ("out_layout", "NC")):
        if parse_layout(a[key]).name != plain:
            raise ValueError(f"qdense node {node.name!r}: {key} {a[key]!r} is not supported "
                             f"yet; lower_conv2d takes the plain {plain} node and packs itself")
    n, c = graph.tensors[node.inputs[0]].shape
    o, _ = graph.tensors[node.inputs[1]].shape
    has_residual = bool(node.input(3))
    sequence = pixel_rows(graph, node.inputs[0], config)
    if has_residual and pixel_rows(graph, node.input(3), config) != sequence:
        kinds = ("a batch of rows", "a sequence laid out as the image of its rows")
        raise ValueError(f"qdense node {node.name!r}: its input {node.inputs[0]!r} is "
                         f"{kinds[sequence]} but its residual {node.input(3)!r} is "
                         f"{kinds[not sequence]}; both must be laid out alike")
    padded_o = ceil_div(o, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, graph, o, padded_o, has_residual, config)
    rows = n if sequence else 1
    n = 1 if sequence else n
    layer = Conv2dLayer(n=n, c=c, h=rows, w=1, o=o, kernel_h=1, kernel_w=1,
                        batch_blocks=ceil_div(n, config.batch), sequence=sequence,
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows), dense=True,
                        residual_ratio=residual_ratio(has_residual, config),
                        late_residual=late_residual(epilogue, config),
                        bias_gemm=epilogue.bias_gemm is not None,
                        inp_group=inp_group(config), out_group=out_group(config))
    return layer, epilogue


def matmul_problem(node: Node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why ``qmatmul`` `node` cannot run on the GEMM core of `config` (None when it can):
    ``a @ b^T`` of two int8 sequences (``transpose_b``; a may be a constant, written
    once with the program: an identity a transposes b), b's rows loaded as weight
    blocks where they lie, which needs block_in = block_out (a weight block's rows are
    then L consecutive rows of one channel block of b's buffer), b's rows a whole
    number of blocks (so every block starts at a block boundary) and whole blocks of
    columns (a weight's pad lanes are zeros, an activation's need not be)."""
    a, b = node.inputs[:2]
    if config.block_in != config.block_out:
        return (f"b's rows are weight blocks only where block_in = block_out; this config "
                f"has {config.block_in} and {config.block_out}")
    if not node.attrs.get("transpose_b"):
        return ("a @ b needs b transposed; only a @ b^T (transpose_b) reads b's rows as "
                "weight blocks where they lie")
    for what, name in (("a", a), ("b", b)):
        t = graph.tensors[name]
        if t.is_constant and what == "b":
            return f"{what} {name!r} is a constant (a dense layer's weights run as qdense)"
        if t.dtype != "int8" or not pixel_rows(graph, name, config):
            return (f"{what} {name!r} ({t.dtype} {tuple(t.shape)}) is not an int8 sequence "
                    "(S, D) or (1, S, D) on a batch-1 config")
    rows, columns = sequence_rows(graph.tensors[b].shape)
    if rows % config.block_out:
        return (f"b {b!r} has {rows} rows, not a multiple of the block ({config.block_out}): "
                "its weight blocks would straddle its channel blocks")
    if columns % config.block_in:
        return (f"a and b have {columns} columns, not a multiple of the block "
                f"({config.block_in}): the pad lanes of two activations would meet")
    return None


def _matmul_layer_and_epilogue(node: Node, graph: Graph,
                               config: HardwareConfig) -> tuple[Conv2dLayer, ConvEpilogue]:
    """A qmatmul ``a @ b^T`` is a dense layer over a's rows whose weights are b's rows,
    streamed from b's buffer (`Conv2dLayer.streamed`)."""
    problem = matmul_problem(node, graph, config)
    if problem:
        raise ValueError(f"qmatmul node {node.name!r}: {problem}")
    m, k = sequence_rows(graph.tensors[node.inputs[0]].shape)     # the IR checked k
    n = sequence_rows(graph.tensors[node.inputs[1]].shape)[0]
    padded_o = ceil_div(n, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, graph, n, padded_o, False, config)
    layer = Conv2dLayer(n=1, c=k, h=m, w=1, o=n, kernel_h=1, kernel_w=1, batch_blocks=1,
                        in_blocks=ceil_div(k, config.block_in),
                        out_blocks=ceil_div(n, config.block_out),
                        const_rows=len(epilogue.rows), dense=True, sequence=True,
                        streamed=True, bias_gemm=epilogue.bias_gemm is not None,
                        inp_group=inp_group(config), out_group=out_group(config),
                        diagonal_rows=block_diagonal(graph.constant(node.inputs[0]),
                                                     config.block_in))
    return layer, epilogue


def block_diagonal(a: np.ndarray | None, block: int) -> bool:
    """Whether constant `a` (None: an activation) is square, whole `block`s, and zero
    outside its diagonal blocks (an identity that transposes a product's b is)."""
    if a is None:
        return False
    a = np.asarray(a).reshape(-1, np.asarray(a).shape[-1])
    m, k = a.shape
    if m != k or m % block:
        return False
    blocks = a.reshape(m // block, block, k // block, block).copy()
    for i in range(m // block):
        blocks[i, :, i, :] = 0
    return not blocks.any()


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


# --- the default schedule ---------------------------------------------------------------


def schedule_space(layer: Conv2dLayer, config: HardwareConfig, *,
                   threads: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2)),
                   width_tiles: int | None = 4):
    """Every schedule of `layer` that fits `config`: tile sizes that give distinct tile
    counts, (oc_nthread, h_nthread) from `threads`; `width_tiles` limits the output-width
    tilings tried to the widest few (full rows make the longest DMA rows)."""
    return (s for s in _tilings(layer, threads, width_tiles) if s.fits(layer, config))


@functools.lru_cache(maxsize=128)
def _tilings(layer: Conv2dLayer, threads: tuple[tuple[int, int], ...],
             width_tiles: int | None) -> tuple[Conv2dSchedule, ...]:
    """`schedule_space` before the fit to a config's buffers, in its order: what the
    layer alone decides (remembered: a sweep asks for it at every point)."""
    out = []
    for oc, hn in threads:
        for tw in tile_candidates(layer.out_w, width_tiles):
            for th in tile_candidates(layer.out_h):
                if th * tw > ITER_MAX:
                    continue
                for tci in tile_candidates(layer.span_in):
                    for tco in tile_candidates(layer.span_out):
                        if (oc == 2 and len(layer.co_tiles(tco)) < 2) or (
                                hn == 2 and th >= layer.out_h):
                            continue  # one tile along the threaded axis: nothing to overlap
                        out.append(Conv2dSchedule(th, tw, tci, tco, oc, hn))
    return tuple(out)


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
    """`choose_conv2d`'s search, over the (oc_nthread, h_nthread) pairs `threads`: the
    schedule of `schedule_space` with the fewest estimated cycles, ties to fewer, larger
    tiles (fewer instructions) and then to the space's order (as a scan that keeps the
    first best finds), the widest few output-width tilings first (`_Space.best`)."""
    for width_tiles in (4, None):
        best = _space(layer, config, threads, width_tiles).best(layer, config)
        if best is not None:
            return best
    Conv2dSchedule(1, 1, 1, 1).check(layer, config)  # raises, naming the buffers
    raise ValueError(f"conv2d layer {layer} has no schedule with {nthreads} virtual "
                     f"threads that fits config {config.name}")


class _Space:
    """A layer's tilings (`_tilings`) with what the search reads of each, shared by
    every config of one `timing.timing_key`: neither a tiling's estimate nor what it
    needs of each buffer reads a buffer's size (`Conv2dSchedule.needs` compares the
    needs with the config's depths), so configs that differ only in their buffers (most
    points of a sweep) share them, and a search is a comparison of arrays.

    `need`: each tiling's need of each buffer (`Conv2dSchedule.needs`' order); `ok`:
    the tilings whose fit reads no buffer (the GEMM loop's count, the threads' chunk
    counts); `size`: elements of a tile (the ties' order); `cycles`: the estimates
    made so far, where `known` (only tilings that fit some config are estimated)."""

    def __init__(self, layer: Conv2dLayer, config: HardwareConfig,
                 tilings: tuple[Conv2dSchedule, ...]):
        self.tilings = tilings
        self.need = np.array([[n for n, _ in t.needs(layer, config).values()]
                              for t in tilings], np.int64).reshape(len(tilings), -1)
        # The fit's other limit, the GEMM loop's count ("iter" of `overflows`), no tiling
        # passes: `_tilings` leaves out those past it, and a clamped tile is no larger.
        self.ok = np.array([not t.uneven_chunks(layer) for t in tilings], bool)
        self.size = np.array([t.tile_h * t.tile_w * t.tile_ci * t.tile_co for t in tilings],
                             np.int64)
        self.cycles = np.zeros(len(tilings), np.int64)
        self.known = np.zeros(len(tilings), bool)

    def best(self, layer: Conv2dLayer, config: HardwareConfig) -> Conv2dSchedule | None:
        """The fitting tiling of `config` with the fewest cycles, then the largest tile,
        then the first; None when none fits. The estimates a fitting tiling lacks are
        made now (with `config`: its estimate is every config's of the key)."""
        if not self.tilings:
            return None
        depth = np.array([d for _, d in self.tilings[0].needs(layer, config).values()],
                         np.int64)
        fit = np.flatnonzero(self.ok & (self.need <= depth).all(axis=1))
        if not fit.size:
            return None
        for i in fit[~self.known[fit]]:
            self.cycles[i] = estimate_conv2d(layer, self.tilings[i], config).cycles
            self.known[i] = True
        # lexsort's last key is the first compared; the index breaks the remaining ties.
        best = fit[np.lexsort((fit, -self.size[fit], self.cycles[fit]))[0]]
        return self.tilings[best]


#: `_space`'s answers, oldest first: (layer, `timing_key`, threads, width_tiles) ->
#: `_Space`. Bounded (a ResNet-18 is about 25 spaces a key, each thousands of tilings):
#: a grid sweep meets its keys one or two at a time, varying the buffers faster.
_SPACES: dict[tuple, _Space] = {}
_SPACES_KEPT = 128


def _space(layer: Conv2dLayer, config: HardwareConfig, threads: tuple[tuple[int, int], ...],
           width_tiles: int | None) -> _Space:
    """The `_Space` of `layer`'s tilings for configs of `config`'s `timing_key`."""
    key = (layer, timing_key(config), threads, width_tiles)
    space = _SPACES.get(key)
    if space is None:
        space = _Space(layer, config, _tilings(layer, threads, width_tiles))
        if len(_SPACES) >= _SPACES_KEPT:
            del _SPACES[next(iter(_SPACES))]
        _SPACES[key] = space
    return space
