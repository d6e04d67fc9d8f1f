"""Kernel columns packed into input channels: a first convolution with few input channels
(an RGB image: 3 of the 16 channels of an input block) run with far fewer GEMM micro-ops.

The GEMM core multiplies a whole ``block_in`` input block per micro-op, so a convolution
over C < block_in channels wastes ``1 - C / block_in`` of it on every kernel tap: ResNet's
7x7 stride-2 conv1 over 3 channels runs 49 micro-ops per output entry at 3/16 useful
lanes, a quarter of ResNet-18's cycles at 16% GEMM utilization. Packing ``T`` neighbouring
columns into the channels fills the block instead (``T = min(kw, block_in // C)``, 5 for
3 channels in 16):

    P[n, t*C + c, y, x'] = X[n, c, y, x' + t - pad_left]        (0 outside the image)

Output column ``ox`` of the convolution reads ``X`` columns ``sw*ox - pad_left + kx``;
those are ``P`` columns ``sw*ox + g*T`` for ``kx = g*T + t``. So the convolution is, over
``P``, a convolution with ``G = ceil(kw / T)`` kernel columns, the same stride, a column
dilation of ``T``, no column padding (``P`` holds it), and weights

    W'[o, t*C + c, ky, g] = W[o, c, ky, g*T + t]                  (0 for g*T + t >= kw)

It is the same sum, term for term, so the result is bit-exact. ResNet's conv1 becomes
7 x 2 = 14 micro-ops per output entry instead of 49 (15 of 16 lanes used on 10 of its 14
taps); MobileNet's 3x3 conv1 3 instead of 9. ``P`` takes ``block_in`` bytes per pixel,
as the channel-padded input did.

*Every tap* (``im2col``): where the whole kernel's taps, ``kh * kw * C`` channels, take
fewer input blocks than the column packing takes micro-ops per output entry, the host
writes one pixel per *output* position holding every tap it reads,

    P[n, (ky*kw + kx)*C + c, oy, ox] = X[n, c, sh*oy - pad_top + ky, sw*ox - pad_left + kx]

and the layer is a 1x1 convolution over ``P`` with weights ``W'[o, (ky*kw + kx)*C + c] =
W[o, c, ky, kx]``: MobileNet's 3x3 stride-2 conv1 runs 2 micro-ops per output entry.
It is offered only where ``P`` is no larger than the channel-padded image the host would
write anyway (MobileNet's: 0.4 MB against 0.8 MB): the host's work must not grow for the
accelerator's cycles. ResNet's 7x7 conv1 would run 10 micro-ops instead of 14 (8.73 M
cycles for ResNet-18 instead of 8.93 M, measured) but its ``P`` is 2.0 MB against 0.8 MB,
an im2col the host (a board's ARM core) would compute and copy on every inference.

Who writes ``P``: the host, when it writes the input anyway. The packing applies only to
a convolution whose input is a graph input or a ``quantize`` output (the host's float to
int8 conversion) read by this convolution alone: the host then writes ``P`` instead of
the channel-padded image (`vdla.compiler.targets.vdla.target` and the lowering's
`pack_input`), and no accelerator op ever writes or reads ``X``. A convolution fed by
another accelerator op keeps its plain form (its producer stores whole pixels).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node
from vdla.config import HardwareConfig

__all__ = ["TapPack", "pack_tap_weights", "pack_taps", "tap_packs"]


@dataclasses.dataclass(frozen=True)
class TapPack:
    """How one convolution's input columns are packed into channels.

    taps : T, the neighbouring columns packed into one pixel's channels
    channels, width : C and W, the input's own channel count and width
    kernel_w, stride_w, pad_left : the convolution's own kernel width, column stride and
        left padding
    out_w : its output width
    im2col : every tap packed (then `taps` is 0 and the fields below are used too)
    kernel_h, stride_h, pad_top, height, out_h : the rows' counterparts
    """

    taps: int
    channels: int
    width: int
    kernel_w: int
    stride_w: int
    pad_left: int
    out_w: int
    im2col: bool = False
    kernel_h: int = 1
    stride_h: int = 1
    pad_top: int = 0
    height: int = 1
    out_h: int = 1

    @property
    def kernel_groups(self) -> int:
        """G: kernel columns of the packed convolution."""
        return math.ceil(self.kernel_w / self.taps)

    @property
    def packed_channels(self) -> int:
        if self.im2col:
            return self.kernel_h * self.kernel_w * self.channels
        return self.taps * self.channels

    def packed_shape(self, n: int, h: int) -> tuple[int, int, int, int]:
        """``P``'s shape for a batch of `n` images of `h` rows."""
        if self.im2col:
            return (n, self.packed_channels, self.out_h, self.out_w)
        return (n, self.packed_channels, h, self.packed_width)

    @property
    def packed_width(self) -> int:
        """Columns of ``P`` the packed convolution reads: up to the last output column's
        last kernel group."""
        return self.stride_w * (self.out_w - 1) + (self.kernel_groups - 1) * self.taps + 1


def tap_packs(node: Node, graph: Graph, config: HardwareConfig) -> list[TapPack]:
    """The packings qconv2d `node` could run with, each taking fewer GEMM micro-ops per
    output entry than the plain layer (the column packing, im2col; none where packing
    does not apply): a plain (groups 1, undilated, no residual) convolution whose input
    the host writes (a graph input or a ``quantize`` output) and nothing but `node` reads.
    Which one runs, if any, the timing model decides
    (`vdla.compiler.targets.vdla.conv_layer.conv2d_layer`): im2col's larger input can
    make a layer load-bound."""
    a = node.attrs
    if node.op != "qconv2d" or int(a.get("groups", 1)) != 1 or node.input(3):
        return []
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return []
    x = node.inputs[0]
    _, c, h, w = graph.tensors[x].shape
    _, _, kh, kw = graph.tensors[node.inputs[1]].shape
    blocks = -(-c // config.block_in)
    taps = min(kw, blocks * config.block_in // c)
    # Micro-ops per output entry: the plain layer's, the column packing's, im2col's.
    plain = kh * kw * blocks
    columns = kh * math.ceil(kw / taps) * blocks
    im2col = -(-kh * kw * c // config.block_in)
    producer = graph.producer(x)
    host_written = x in graph.inputs or (producer is not None and producer.op == "quantize")
    if not host_written or x in graph.outputs or \
            [n.name for n in graph.consumers(x)] != [node.name]:
        return []
    pads = tuple(int(p) for p in a["pads"])
    sh, sw = (int(s) for s in a["strides"])
    out_w = conv_output_size(w, kw, sw, pads[1], pads[3])
    packs = []
    if columns < plain:
        packs.append(TapPack(taps=taps, channels=c, width=w, kernel_w=kw, stride_w=sw,
                             pad_left=pads[1], out_w=out_w))
    out_h = conv_output_size(h, kh, sh, pads[0], pads[2])
    image_bytes = blocks * config.block_in * h * w
    if im2col < plain and kh * kw > 1 and im2col * config.block_in * out_h * out_w \
            <= image_bytes:
        packs.append(TapPack(taps=0, channels=c, width=w, kernel_w=kw, stride_w=sw,
                             pad_left=pads[1], out_w=out_w, im2col=True, kernel_h=kh,
                             stride_h=sh, pad_top=pads[0], height=h, out_h=out_h))
    return packs


def pack_taps(x: np.ndarray, tp: TapPack) -> np.ndarray:
    """The input (N, C, H, W) as ``P`` (N, T*C, H, packed width), or with `im2col`
    (N, kh*kw*C, out_h, out_w) (module docstring)."""
    n, c, h, w = x.shape
    if tp.im2col:
        top, left = tp.pad_top, tp.pad_left
        rows = tp.stride_h * (tp.out_h - 1) + tp.kernel_h
        cols = tp.stride_w * (tp.out_w - 1) + tp.kernel_w
        padded = np.zeros((n, c, max(rows, top + h), max(cols, left + w)), x.dtype)
        padded[:, :, top:top + h, left:left + w] = x
        taps = [padded[:, :, ky:ky + tp.stride_h * (tp.out_h - 1) + 1:tp.stride_h,
                       kx:kx + tp.stride_w * (tp.out_w - 1) + 1:tp.stride_w]
                for ky in range(tp.kernel_h) for kx in range(tp.kernel_w)]
        return np.concatenate(taps, axis=1)
    span = tp.packed_width + tp.taps - 1          # X columns P's last pixel reaches
    padded = np.zeros((n, c, h, span), x.dtype)
    keep = min(w, span - tp.pad_left)
    padded[..., tp.pad_left:tp.pad_left + keep] = x[..., :keep]
    return np.concatenate([padded[..., t:t + tp.packed_width] for t in range(tp.taps)],
                          axis=1)


def pack_tap_weights(w: np.ndarray, tp: TapPack) -> np.ndarray:
    """The weights (O, C, kh, kw) as ``W'`` (O, T*C, kh, G), or with `im2col`
    (O, kh*kw*C, 1, 1) (module docstring)."""
    o, c, kh, kw = w.shape
    if tp.im2col:
        return np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(o, kh * kw * c, 1, 1)
    out = np.zeros((o, tp.taps, c, kh, tp.kernel_groups), w.dtype)
    for g in range(tp.kernel_groups):
        for t in range(tp.taps):
            if g * tp.taps + t < kw:
                out[:, t, :, :, g] = w[:, :, :, g * tp.taps + t]
    return out.reshape(o, tp.taps * c, kh, tp.kernel_groups)
