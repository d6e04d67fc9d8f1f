"""Single conv2d workloads: ResNet-18's benchmark layers (DESIGN.md, as in VTA's
benchmark) and a one-node quantized graph for any of them.

A workload is (H, W, Cin, Cout, k, pad, stride), batch 1. `parse_workload` reads a name
(``C5``) or the seven numbers (``"28,28,128,128,3,1,1"``); `workload_graph` builds a graph
with one ``qconv2d`` node as ResNet-18 runs it after the front half: random int8 weights,
an int32 bias, a per-tensor requantization shift and a ReLU clamp, and a random int8 input.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import conv_output_size

__all__ = ["RESNET18", "ConvWorkload", "parse_workload", "workload_graph"]


class ConvWorkload(NamedTuple):
    h: int
    w: int
    cin: int
    cout: int
    k: int
    pad: int
    stride: int

    @property
    def macs(self) -> int:
        ho = conv_output_size(self.h, self.k, self.stride, self.pad, self.pad)
        wo = conv_output_size(self.w, self.k, self.stride, self.pad, self.pad)
        return ho * wo * self.cout * self.cin * self.k * self.k


#: ResNet-18's conv workloads C1-C11 (H, W, Cin, Cout, k, pad, stride), batch 1.
RESNET18: dict[str, ConvWorkload] = {name: ConvWorkload(*shape) for name, shape in {
    "C1": (224, 224, 3, 64, 7, 3, 2),
    "C2": (56, 56, 64, 64, 3, 1, 1),
    "C3": (56, 56, 64, 128, 3, 1, 2),
    "C4": (56, 56, 64, 128, 1, 0, 2),
    "C5": (28, 28, 128, 128, 3, 1, 1),
    "C6": (28, 28, 128, 256, 3, 1, 2),
    "C7": (28, 28, 128, 256, 1, 0, 2),
    "C8": (14, 14, 256, 256, 3, 1, 1),
    "C9": (14, 14, 256, 512, 3, 1, 2),
    "C10": (14, 14, 256, 512, 1, 0, 2),
    "C11": (7, 7, 512, 512, 3, 1, 1),
}.items()}


def parse_workload(spec: str) -> tuple[str, ConvWorkload]:
    """(name, workload) from a ResNet-18 workload name (``C5``, any case) or
    ``H,W,Cin,Cout,k,pad,stride``. Raises ValueError naming what is wrong."""
    text = str(spec).strip()
    if text.upper() in RESNET18:
        return text.upper(), RESNET18[text.upper()]
    parts = text.split(",")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 7:
        raise ValueError(f"workload {spec!r} is neither a ResNet-18 workload name "
                         f"({', '.join(RESNET18)}) nor H,W,Cin,Cout,k,pad,stride (7 integers)")
    w = ConvWorkload(*values)
    if min(w.h, w.w, w.cin, w.cout, w.k, w.stride) < 1 or w.pad < 0:
        raise ValueError(f"workload {spec!r}: sizes, kernel and stride must be >= 1 and the "
                         "pad >= 0")
    if (w.h + 2 * w.pad - w.k) < 0 or (w.w + 2 * w.pad - w.k) < 0:
        raise ValueError(f"workload {spec!r}: a {w.k}x{w.k} kernel does not fit the padded "
                         f"{w.h}x{w.w} input")
    return text, w


def workload_graph(workload: ConvWorkload, *, seed: int = 0, shift: int = 10,
                   relu: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """A graph with one qconv2d node ``conv`` computing `workload` (seeded random int8
    weights in [-8, 8), int32 bias, requantization by `shift`, ReLU clamp when `relu`),
    and a feed {"x": int8 input}. Small weights keep the outputs spread over int8 at
    shift 10, so a wrong accumulation shows in the result."""
    rng = np.random.default_rng(seed)
    w = workload
    g = Graph(f"conv_{w.h}x{w.w}_{w.cin}_{w.cout}_k{w.k}p{w.pad}s{w.stride}")
    x = g.add_input("x", (1, w.cin, w.h, w.w), "int8")
    weights = g.add_constant("w", rng.integers(-8, 8, (w.cout, w.cin, w.k, w.k))
                             .astype(np.int8), "int8")
    bias = g.add_constant("b", rng.integers(-2000, 2000, (w.cout,)).astype(np.int32), "int32")
    y = g.add_node("qconv2d", [x, weights, bias], name="conv", strides=(w.stride, w.stride),
                   pads=(w.pad,) * 4, shift=(shift,), out_min=0 if relu else -128,
                   out_max=127)
    g.set_outputs([y])
    feed = {"x": rng.integers(-128, 128, (1, w.cin, w.h, w.w)).astype(np.int8)}
    return g, feed
