"""What the CPU target compiles a layer from: its sizes and epilogue, nothing else.

`ConvShape` and `DenseShape` hold everything a convolution's or dense layer's C code
depends on (sizes, groups, strides, pads, which epilogue steps exist, whether an int8
input is known non-negative). They are the tuning records' workload keys, and two nodes
with equal shapes share one generated function.
"""

from __future__ import annotations

import dataclasses

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node

__all__ = ["ConvShape", "DenseShape", "input_nonnegative"]

#: Producers whose int8 output is at least their ``out_min`` attribute.
_CLAMPED = ("qconv2d", "qdense", "qadd")
#: Ops whose output is non-negative when their (first) input is.
_KEEPS_SIGN = ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d", "flatten", "reshape",
               "pad", "transpose")


def input_nonnegative(graph: Graph, tensor: str) -> bool:
    """Whether int8 `tensor` is known to hold no negative value (from its producers)."""
    node = graph.producer(tensor)
    if node is None:
        return False
    if node.op in _CLAMPED:
        return int(node.attrs["out_min"]) >= 0
    if node.op == "relu":
        return True
    if node.op in _KEEPS_SIGN:
        return input_nonnegative(graph, node.inputs[0])
    if node.op == "concat":
        return all(input_nonnegative(graph, t) for t in node.inputs if t)
    return False


@dataclasses.dataclass(frozen=True)
class ConvShape:
    """A convolution's sizes and epilogue: everything its C code depends on.

    n, c, h, w : input; o : output channels; groups; kh, kw : kernel; sh, sw : strides;
    dh, dw : dilations; pt, pl, pb, pr : pads
    dtype : ``int8`` or ``float32``
    bias, residual : whether the node has them
    multiplier, residual_multiplier : int8: whether those requantization steps exist
    offset : int8: the input may be negative (stored as x + 128)
    activation : float32: None, ``relu`` or ``clip``
    """

    n: int
    c: int
    h: int
    w: int
    o: int
    groups: int
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pt: int = 0
    pl: int = 0
    pb: int = 0
    pr: int = 0
    dtype: str = "int8"
    bias: bool = True
    residual: bool = False
    multiplier: bool = False
    residual_multiplier: bool = False
    offset: bool = True
    activation: str | None = None

    @classmethod
    def from_node(cls, node: Node, graph: Graph, *, nonnegative: bool | None = None
                  ) -> "ConvShape":
        """The shape of ``conv2d``/``qconv2d`` node `node`. `nonnegative` overrides what
        the graph says of the input's sign (a tuning task's one-node graph has no
        producer)."""
        a = node.attrs
        n, c, h, w = graph.tensors[node.inputs[0]].shape
        o, _, kh, kw = graph.tensors[node.inputs[1]].shape
        int8 = node.op == "qconv2d"
        if nonnegative is None:
            nonnegative = int8 and input_nonnegative(graph, node.inputs[0])
        act = None if int8 else a.get("activation")
        return cls(n=n, c=c, h=h, w=w, o=o, groups=int(a["groups"]), kh=kh, kw=kw,
                   sh=a["strides"][0], sw=a["strides"][1], dh=a["dilations"][0],
                   dw=a["dilations"][1], pt=a["pads"][0], pl=a["pads"][1],
                   pb=a["pads"][2], pr=a["pads"][3],
                   dtype="int8" if int8 else "float32", bias=bool(node.input(2)),
                   residual=bool(node.input(3)),
                   multiplier=int8 and a["multiplier"] is not None,
                   residual_multiplier=int8 and bool(node.input(3))
                   and a["residual_multiplier"] is not None,
                   offset=int8 and not nonnegative, activation=act)

    # --- sizes ---------------------------------------------------------------------------

    @property
    def int8(self) -> bool:
        return self.dtype == "int8"

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def depthwise(self) -> bool:
        """One input channel per group: each output reads one input plane."""
        return self.cg == 1

    @property
    def pointwise(self) -> bool:
        """A float32 1x1 convolution with stride 1, no padding and one group: a GEMM of
        the weights by the input's pixels, read in place
        (`vdla.compiler.targets.cpu.pointwise`)."""
        return (not self.int8 and self.groups == 1 and self.kh == self.kw == 1
                and self.sh == self.sw == 1 and not any((self.pt, self.pl, self.pb, self.pr)))

    @property
    def ci_step(self) -> int:
        """Input channels per reduction step (int8 GEMM: four to a 32-bit lane)."""
        return 4 if self.int8 and not self.depthwise else 1

    @property
    def cg_padded(self) -> int:
        return -(-self.cg // self.ci_step) * self.ci_step

    def og_padded(self, mr: int) -> int:
        return -(-self.og // mr) * mr

    @property
    def ho(self) -> int:
        return conv_output_size(self.h, self.kh, self.sh, self.pt, self.pb, self.dh)

    @property
    def wo(self) -> int:
        return conv_output_size(self.w, self.kw, self.sw, self.pl, self.pr, self.dw)

    @property
    def hq(self) -> int:
        """Rows of a phase plane (the padded input's rows of one stride phase)."""
        return -(-(self.h + self.pt + self.pb) // self.sh)

    @property
    def grid_pitch(self) -> int:
        """Columns of a phase plane, and of the computed grid's rows."""
        return max(-(-(self.w + self.pl + self.pr) // self.sw), self.wo)

    @property
    def taps(self) -> list[tuple[int, int]]:
        """Each tap's (phase index, offset from the output's grid index), in (kh, kw)
        order."""
        out = []
        for i in range(self.kh):
            for j in range(self.kw):
                phase = self.phases.index(((i * self.dh) % self.sh, (j * self.dw) % self.sw))
                out.append((phase, (i * self.dh // self.sh) * self.grid_pitch
                            + j * self.dw // self.sw))
        return out

    @property
    def phases(self) -> list[tuple[int, int]]:
        """The stride phases (row, column) some tap reads, in order."""
        return sorted({((i * self.dh) % self.sh, (j * self.dw) % self.sw)
                       for i in range(self.kh) for j in range(self.kw)})

    @property
    def reduction_steps(self) -> int:
        return self.cg_padded // self.ci_step * self.kh * self.kw

    @property
    def macs(self) -> int:
        return self.n * self.o * self.ho * self.wo * self.cg * self.kh * self.kw

    def plane_rows(self, block: int) -> int:
        """Rows a phase plane is allocated with: the padded input's, and enough more that
        a register tile of `block` pixels at the grid's end reads inside it."""
        reads = self.ho * self.grid_pitch + block + max(off for _, off in self.taps)
        return max(self.hq, -(-reads // self.grid_pitch))

    def describe(self) -> str:
        text = (f"{self.n}x{self.c}x{self.h}x{self.w} -> {self.o}, k{self.kh}x{self.kw} "
                f"s{self.sh}")
        if self.groups > 1:
            text += " depthwise" if self.depthwise and self.og == 1 else f" g{self.groups}"
        return text + (" +residual" if self.residual else "")


@dataclasses.dataclass(frozen=True)
class DenseShape:
    """n rows of k inputs to o outputs; the epilogue as in `ConvShape`."""

    n: int
    k: int
    o: int
    dtype: str = "int8"
    bias: bool = True
    residual: bool = False
    offset: bool = True
    activation: str | None = None

    @classmethod
    def from_node(cls, node: Node, graph: Graph, *, nonnegative: bool | None = None
                  ) -> "DenseShape":
        n, k = graph.tensors[node.inputs[0]].shape
        o = graph.tensors[node.inputs[1]].shape[0]
        int8 = node.op == "qdense"
        if nonnegative is None:
            nonnegative = int8 and input_nonnegative(graph, node.inputs[0])
        return cls(n=n, k=k, o=o, dtype="int8" if int8 else "float32",
                   bias=bool(node.input(2)), residual=bool(node.input(3)),
                   offset=int8 and not nonnegative,
                   activation=None if int8 else node.attrs.get("activation"))

    @property
    def int8(self) -> bool:
        return self.dtype == "int8"

    @property
    def k_padded(self) -> int:
        return -(-self.k // 4) * 4 if self.int8 else self.k

    @property
    def macs(self) -> int:
        return self.n * self.k * self.o

    def describe(self) -> str:
        return f"{self.n}x{self.k} -> {self.o}" + (" +residual" if self.residual else "")
