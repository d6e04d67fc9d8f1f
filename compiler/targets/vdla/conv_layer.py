"""The workloads the accelerator runs, as the back half sees them: a node's sizes in
blocks of the config and the ALU epilogue it needs.

* `Conv2dLayer` (``qconv2d``, and ``qdense`` as a 1x1 convolution over a 1x1 image) with
  its `ConvEpilogue`; `conv2d_layer(node, graph, config)` makes both and raises
  ValueError, naming the node, for what the back half cannot run;
* `Pool2dLayer` (``max_pool2d`` on int8, ``qavg_pool2d``, ``qglobal_avg_pool2d``),
  `pool2d_layer(...)` likewise;
* `conv2d_workload`: what a convolution's cycles depend on, the tuner's records key;
* `window_rows` / `window_cols`: the input window an output tile reads.

Schedules (`vdla.compiler.targets.vdla.schedules`) tile these layers; the timing model
(`cost`) and the lowerings (`conv2d`, `pool`) read them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import parse_layout
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.common import (PAD_MAX, AluStep, ceil_div, check_alu_ops,
                                               requant_steps)
from vdla.compiler.targets.vdla.support import pool_weight_scale
from vdla.config import AluOp, HardwareConfig

__all__ = ["AVG", "MAX", "POOL_OPS", "Conv2dLayer", "ConvEpilogue", "Pool2dLayer",
           "conv2d_layer", "conv2d_workload", "group_spans", "pool2d_layer", "window_cols",
           "window_rows"]

#: The pooling ops the accelerator runs.
POOL_OPS = ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d")

MAX, AVG = "max", "avg"


def window_rows(layer, tile_h: int) -> int:
    """Input rows that `tile_h` output rows of `layer` (a conv or pool layer) read."""
    return (tile_h - 1) * layer.stride_h + layer.kernel_h


def window_cols(layer, tile_w: int) -> int:
    """Input columns that `tile_w` output columns of `layer` read."""
    return (tile_w - 1) * layer.stride_w + layer.kernel_w


# --- convolutions ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ConvEpilogue:
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
                   has_bias: bool, config: HardwareConfig) -> ConvEpilogue:
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
    return ConvEpilogue(tuple(main), tuple(residual) if residual is not None else None, lo, hi,
                     table, bias_row)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conv2dLayer:
    """A conv2d workload as the back half sees it: plain sizes (N, C, H, W, O, kernel),
    strides and pads (top, left, bottom, right), and the block counts of batch, input and
    output channels once padded to the config's batch, block_in and block_out.
    `const_rows`: per-channel constant rows the epilogue keeps in the acc buffer.
    `groups`, `spans`, `diagonal`: a grouped convolution's block structure
    (`group_spans`); a plain one has a single span over every block.
    `residual_ratio`: how the int8 residual reaches the accumulators: ``block_out /
    block_in`` input blocks per output block, widened by identity-weight GEMMs (the
    residual stays int8 in DRAM, in the input layout); 0 when block_out is not a
    multiple of block_in, where the host widens it to int32 for a LOAD ACC."""

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

    def __post_init__(self):
        if not self.spans:
            object.__setattr__(self, "spans", ((0, self.out_blocks, 0, self.in_blocks),))
        if self.diagonal and any(ob != cb or on != cn for ob, on, cb, cn in self.spans):
            raise ValueError(f"a diagonal conv2d layer pairs output block k with input "
                             f"block k; its spans {self.spans} do not")
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
        return conv2d_layer(node, graph, config)[0]

    @property
    def out_h(self) -> int:
        return conv_output_size(self.h, self.kernel_h, self.stride_h, self.pads[0], self.pads[2])

    @property
    def out_w(self) -> int:
        return conv_output_size(self.w, self.kernel_w, self.stride_w, self.pads[1], self.pads[3])

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: the layer's own sizes, without block padding
        (a grouped convolution's output channel sees C / groups input channels)."""
        return (self.n * self.out_h * self.out_w * self.o * (self.c // self.groups)
                * self.kernel_h * self.kernel_w)

    @property
    def weight_blocks(self) -> int:
        """Weight blocks (block_out x block_in, per kernel tap) the GEMM core reads: one
        per (output block, input block) of every span; one per output block of a
        diagonal layer."""
        return sum(on * (1 if self.diagonal else cn) for _, on, _, cn in self.spans)

    @property
    def span_out(self) -> int:
        """The most output blocks of one span: output-channel tiles never cross spans."""
        return max(on for _, on, _, _ in self.spans)

    @property
    def span_in(self) -> int:
        """The most input blocks one GEMM chunk can take (1 for a diagonal layer, whose
        output block k reads only input block k)."""
        return 1 if self.diagonal else max(cn for _, _, _, cn in self.spans)

    @property
    def gemm_uops(self) -> int:
        """GEMM micro-ops of the whole layer: one per (batch block, output position,
        weight block, kernel tap), whatever the tiling."""
        return (self.batch_blocks * self.out_h * self.out_w * self.weight_blocks
                * self.kernel_h * self.kernel_w)

    @property
    def residual_uops(self) -> int:
        """GEMM micro-ops that widen the int8 residual: `residual_ratio` per output
        entry."""
        return (self.batch_blocks * self.out_blocks * self.out_h * self.out_w
                * self.residual_ratio)

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
    if tuple(a["dilations"]) != (1, 1):
        raise ValueError(f"qconv2d node {node.name!r}: dilations={tuple(a['dilations'])} is "
                         "not supported; only (1, 1)")
    n, c, h, w = graph.tensors[node.inputs[0]].shape
    o, i, kh, kw = graph.tensors[node.inputs[1]].shape
    has_residual = bool(node.input(3))
    padded_o = ceil_div(o, config.block_out) * config.block_out
    epilogue = _plan_epilogue(node, o, padded_o, has_residual, bool(node.input(2)), config)
    groups = int(a["groups"])
    spans, diagonal = group_spans(c, o, groups, config)
    layer = Conv2dLayer(n=n, c=c, h=h, w=w, o=o, kernel_h=kh, kernel_w=kw,
                        stride_h=int(a["strides"][0]), stride_w=int(a["strides"][1]),
                        pads=tuple(int(p) for p in a["pads"]),
                        batch_blocks=ceil_div(n, config.batch),
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows),
                        groups=groups, spans=spans if groups > 1 else (), diagonal=diagonal,
                        residual_ratio=residual_ratio(has_residual, config))
    return layer, epilogue


def residual_ratio(has_residual: bool, config: HardwareConfig) -> int:
    """`Conv2dLayer.residual_ratio` for `config`: input blocks per output block when the
    GEMM core can widen the int8 residual (identity weights map whole input blocks into an
    output block), else 0."""
    if not has_residual or config.block_out % config.block_in:
        return 0
    return config.block_out // config.block_in


def group_spans(c: int, o: int, groups: int,
                config: HardwareConfig) -> tuple[tuple[tuple[int, int, int, int], ...], bool]:
    """How a convolution of `c` input and `o` output channels in `groups` groups falls
    into the config's blocks: ``(spans, diagonal)``.

    A span ``(ob, on, cb, cn)`` is a run of `on` output blocks from block `ob` whose
    channels all read input blocks `cb` .. `cb + cn - 1`: a dense GEMM over that block
    range, the weights outside the output channels' groups zero. Groups whose channels
    fill whole blocks give one span per group (a per-group GEMM, no wasted MACs); a
    block that straddles groups reads the input blocks of all of them (the zeros pad the
    GEMM, still exact). `diagonal` is the depthwise case with ``c == o == groups`` and
    ``block_in == block_out``: output block k reads input block k only, through weight
    blocks that are diagonal per kernel tap (so each GEMM micro-op does block_out useful
    MACs of block_in x block_out); it is one span whose tiles load the input block of
    each output block."""
    if groups < 1 or c % groups or o % groups:
        raise ValueError(f"groups={groups} must divide the input channels ({c}) and the "
                         f"output channels ({o})")
    bi, bo = config.block_in, config.block_out
    in_blocks, out_blocks = ceil_div(c, bi), ceil_div(o, bo)
    if groups == 1:
        return ((0, out_blocks, 0, in_blocks),), False
    if c == o == groups and bi == bo:
        return ((0, out_blocks, 0, in_blocks),), True
    cg, og = c // groups, o // groups
    ranges = []
    for ob in range(out_blocks):
        g0, g1 = ob * bo // og, (min((ob + 1) * bo, o) - 1) // og
        ranges.append((g0 * cg // bi, ceil_div((g1 + 1) * cg, bi)))
    spans = []
    for ob, (lo, hi) in enumerate(ranges):
        if spans and (spans[-1][2], spans[-1][2] + spans[-1][3]) == (lo, hi):
            first, count, _, _ = spans[-1]
            spans[-1] = (first, count + 1, lo, hi - lo)
        else:
            spans.append((ob, 1, lo, hi - lo))
    return tuple(spans), False


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
    else:
        fields["spans"] = [list(span) for span in layer.spans]
    return {"op": node.op, **fields, "epilogue": steps(epi.main),
            "residual_epilogue": steps(epi.residual)}


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
    epilogue = _plan_epilogue(node, o, padded_o, has_residual, bool(node.input(2)), config)
    layer = Conv2dLayer(n=n, c=c, h=1, w=1, o=o, kernel_h=1, kernel_w=1,
                        batch_blocks=ceil_div(n, config.batch),
                        in_blocks=ceil_div(c, config.block_in),
                        out_blocks=ceil_div(o, config.block_out),
                        has_residual=has_residual, const_rows=len(epilogue.rows), dense=True,
                        residual_ratio=residual_ratio(has_residual, config))
    return layer, epilogue


# --- pooling ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Pool2dLayer:
    """A pooling workload: `kind` ("max" or "avg"), plain sizes (N, C, H, W), the window
    (kernel, strides, top and left pads), the output size (which includes a ceil-mode
    window), and the block counts: `batch_blocks`, output channel `blocks`, and `ratio`
    input blocks per output block. The epilogue (average pooling): `imm_passes` ALU passes
    with an immediate and `vec_passes` with a vector operand, which reads one of the
    `const_rows` per-channel constant rows kept in the acc buffer. `weight_scale`: the
    int8 value of the identity weights (an average pool's multiplier up to 127, applied
    by the GEMM core; 1 otherwise)."""

    kind: str
    n: int
    c: int
    h: int
    w: int
    kernel_h: int
    kernel_w: int
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    out_h: int
    out_w: int
    batch_blocks: int
    blocks: int
    ratio: int = 1
    const_rows: int = 0
    imm_passes: int = 0
    vec_passes: int = 0
    weight_scale: int = 1

    def __post_init__(self):
        if self.kind not in (MAX, AVG):
            raise ValueError(f"pool kind must be {MAX!r} or {AVG!r}, not {self.kind!r}")
        # A window that starts at or beyond the image's far edge, or one that lies in the
        # padding only, has no input to load (the ISA's LOAD cannot load nothing).
        for axis, pad, k, size, out, stride in (
                ("rows", self.pad_top, self.kernel_h, self.h, self.out_h, self.stride_h),
                ("columns", self.pad_left, self.kernel_w, self.w, self.out_w, self.stride_w)):
            if pad >= k:
                raise ValueError(f"pool pad {pad} on the {axis} must be smaller than the "
                                 f"kernel ({k}): a window that sees only padding is not "
                                 "supported")
            if (out - 1) * stride - pad >= size:
                raise ValueError(f"pool: the last window along the {axis} starts past the "
                                 f"input ({size}); it would see only padding")
            far = (out - 1) * stride + k - pad - size   # padding beyond the far edge
            if pad > PAD_MAX or far > PAD_MAX:
                raise ValueError(f"pool padding {max(pad, far)} along the {axis} exceeds "
                                 f"the LOAD's {PAD_MAX} per side")

    @property
    def in_blocks(self) -> int:
        """Input channel blocks (the channels padded to whole output blocks)."""
        return self.blocks * self.ratio

    @property
    def taps(self) -> int:
        return self.kernel_h * self.kernel_w

    @property
    def macs(self) -> int:
        """Useful multiply-accumulates: none (the GEMM core sums or copies windows)."""
        return 0


def _pool_epilogue(node: Node, kind: str, channels: int, padded: int,
              config: HardwareConfig) -> tuple[tuple[AluStep, ...], np.ndarray]:
    """An average pool's requantization steps and their constant rows (R, padded) int32;
    nothing for a max pool (its int8 maximum needs no clamp)."""
    rows: list[np.ndarray] = []
    steps: list[AluStep] = []
    if kind == AVG:
        # A multiplier the identity weights carry (`pool_weight_scale`) is no ALU step.
        multiplier = None if pool_weight_scale(node) > 1 else node.attrs["multiplier"]
        steps, _ = requant_steps(node, multiplier, node.attrs["shift"],
                                 channels, padded, rows, fold=False)
        check_alu_ops(node, steps, config)
        steps += [AluStep(AluOp.MAX, imm=-128), AluStep(AluOp.MIN, imm=127)]
    table = (np.stack(rows) if rows else np.zeros((0, padded), np.int64)).astype(np.int32)
    return tuple(steps), table


def pool2d_layer(node: Node, graph: Graph, config: HardwareConfig):
    """(layer, epilogue steps, constant rows) of a pooling node (`POOL_OPS`); ValueError
    naming the node for what the back half cannot run."""
    if node.op not in POOL_OPS:
        raise ValueError(f"lower_pool2d lowers {', '.join(POOL_OPS)} nodes, not "
                         f"{node.name!r} ({node.op})")
    x = graph.tensors[node.inputs[0]]
    if x.dtype != "int8":
        raise ValueError(f"{node.op} node {node.name!r} pools {x.dtype} data; the "
                         "accelerator pools int8 only")
    if x.layout:
        raise ValueError(f"{node.op} node {node.name!r}: its input has layout {x.layout!r}; "
                         "lower_pool2d takes the plain NCHW node and packs itself")
    if config.block_out % config.block_in:
        raise ValueError(f"{node.op} node {node.name!r}: pooling on vdla needs block_out to "
                         f"be a multiple of block_in (config {config.name} has block_in="
                         f"{config.block_in}, block_out={config.block_out}): identity "
                         "weights map whole input blocks into an output block")
    n, c, h, w = x.shape
    _, _, out_h, out_w = graph.tensors[node.outputs[0]].shape
    a = node.attrs
    if node.op == "qglobal_avg_pool2d":
        kernel, strides, pads = (h, w), (1, 1), (0, 0, 0, 0)
    else:
        kernel, strides, pads = a["kernel"], a["strides"], a["pads"]
    kind = MAX if node.op == "max_pool2d" else AVG
    blocks = ceil_div(c, config.block_out)
    steps, rows = _pool_epilogue(node, kind, c, blocks * config.block_out, config)
    layer = Pool2dLayer(kind=kind, n=n, c=c, h=h, w=w, kernel_h=int(kernel[0]),
                        kernel_w=int(kernel[1]), stride_h=int(strides[0]),
                        stride_w=int(strides[1]), pad_top=int(pads[0]), pad_left=int(pads[1]),
                        out_h=out_h, out_w=out_w, batch_blocks=ceil_div(n, config.batch),
                        blocks=blocks, ratio=config.block_out // config.block_in,
                        const_rows=len(rows),
                        weight_scale=pool_weight_scale(node) if kind == AVG else 1,
                        imm_passes=sum(st.row is None for st in steps),
                        vec_passes=sum(st.row is not None for st in steps))
    return layer, steps, rows
