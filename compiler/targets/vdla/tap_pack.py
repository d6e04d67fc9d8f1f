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

__all__ = ["TapPack", "pack_tap_weights", "pack_taps", "tap_pack_for"]


@dataclasses.dataclass(frozen=True)
class TapPack:
    """How one convolution's input columns are packed into channels.

    taps : T, the neighbouring columns packed into one pixel's channels
    channels, width : C and W, the input's own channel count and width
    kernel_w, stride_w, pad_left : the convolution's own kernel width, column stride and
        left padding
    out_w : its output width
    """

    taps: int
    channels: int
    width: int
    kernel_w: int
    stride_w: int
    pad_left: int
    out_w: int

    @property
    def kernel_groups(self) -> int:
        """G: kernel columns of the packed convolution."""
        return math.ceil(self.kernel_w / self.taps)

    @property
    def packed_channels(self) -> int:
        return self.taps * self.channels

    @property
    def packed_width(self) -> int:
        """Columns of ``P`` the packed convolution reads: up to the last output column's
        last kernel group."""
        return self.stride_w * (self.out_w - 1) + (self.kernel_groups - 1) * self.taps + 1


def tap_pack_for(node: Node, graph: Graph, config: HardwareConfig) -> TapPack | None:
    """The packing of qconv2d `node`, or None where it does not apply: a plain (groups 1,
    undilated, no residual) convolution whose C input channels leave room for at least
    two kernel columns in its input blocks, whose input the host writes (a graph input or
    a ``quantize`` output) and nothing but `node` reads."""
    a = node.attrs
    if node.op != "qconv2d" or int(a.get("groups", 1)) != 1 or node.input(3):
        return None
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return None
    x = node.inputs[0]
    _, c, _, w = graph.tensors[x].shape
    _, _, _, kw = graph.tensors[node.inputs[1]].shape
    room = -(-c // config.block_in) * config.block_in    # the channels' padded blocks
    taps = min(kw, room // c)
    if taps < 2:
        return None
    producer = graph.producer(x)
    host_written = x in graph.inputs or (producer is not None and producer.op == "quantize")
    if not host_written or x in graph.outputs or \
            [n.name for n in graph.consumers(x)] != [node.name]:
        return None
    pads = tuple(int(p) for p in a["pads"])
    sw = int(a["strides"][1])
    out_w = conv_output_size(w, kw, sw, pads[1], pads[3])
    return TapPack(taps=taps, channels=c, width=w, kernel_w=kw, stride_w=sw,
                   pad_left=pads[1], out_w=out_w)


def pack_taps(x: np.ndarray, tp: TapPack) -> np.ndarray:
    """The input (N, C, H, W) as ``P`` (N, T*C, H, packed width) (module docstring)."""
    n, c, h, w = x.shape
    span = tp.packed_width + tp.taps - 1          # X columns P's last pixel reaches
    padded = np.zeros((n, c, h, span), x.dtype)
    keep = min(w, span - tp.pad_left)
    padded[..., tp.pad_left:tp.pad_left + keep] = x[..., :keep]
    return np.concatenate([padded[..., t:t + tp.packed_width] for t in range(tp.taps)],
                          axis=1)


def pack_tap_weights(w: np.ndarray, tp: TapPack) -> np.ndarray:
    """The weights (O, C, kh, kw) as ``W'`` (O, T*C, kh, G) (module docstring)."""
    o, c, kh, kw = w.shape
    out = np.zeros((o, tp.taps, c, kh, tp.kernel_groups), w.dtype)
    for g in range(tp.kernel_groups):
        for t in range(tp.taps):
            if g * tp.taps + t < kw:
                out[:, t, :, :, g] = w[:, :, :, g * tp.taps + t]
    return out.reshape(o, tp.taps * c, kh, tp.kernel_groups)
