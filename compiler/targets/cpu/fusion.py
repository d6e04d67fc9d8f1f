"""A depthwise convolution and the pointwise one that reads it, fused into one kernel.

MobileNet's pairs: a 3x3 depthwise layer writes a plane of channels that only the 1x1
layer after it reads. On the large planes (112x112x32 float32 is 1.6 MB) that plane
leaves the cores' L2 between the two layers, and the pointwise layer reads it back from
L3 or memory. The fused kernel cuts the output rows in bands and, per band, on one
thread, runs the depthwise layer's rows into a buffer and then the pointwise layer's
same rows from it, while they are in L2 (a 1x1 layer of stride 1 reads exactly its own
rows). Both parts are the blocked kernels' own C (`lower.node_kernel` with
``band=True``): the same tiles, epilogues and requantization, so the outputs are the
unfused kernels' to the bit.

    pairs = fusions(graph, nodes, schedules, isa)   # pointwise name -> Fusion

Fused where it saves a pass over memory and costs no other: both layers blocked with
one vector width, the depthwise output read by the pointwise layer alone, an image of
it at least `MIN_BYTES`, and the pointwise weights at most `MAX_WEIGHT_BYTES` (a band
reads them all; tiles that do not fit in cache would trade the saved pass for another).
The whole-graph runner calls the fused kernel in place of the two
(`program.plan_steps`); the session's op-by-op calls still run each layer alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.blocked import keeps_rows
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, align
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["BAND_BYTES", "Fusion", "MAX_WEIGHT_BYTES", "MIN_BYTES", "fused_kernel",
           "fusions"]

#: An image of the depthwise output from this size on leaves a core's share of L2
#: (1 MB on the EPYC, shared with the weights and the input rows).
MIN_BYTES = 512 * 1024
#: Pointwise weights up to this size: every band reads them all.
MAX_WEIGHT_BYTES = 256 * 1024
#: A band's depthwise output, about: small enough to stay in L2 with the input rows
#: around it and the pointwise weights, large enough that the pointwise weights are read
#: few times. MobileNet-v1 float32's pairs (bench/cpu_fusion.py, 2 threads): with 96 KB
#: bands 0.89-1.02x the unfused layers, 32 KB 0.91-1.00x, 256 KB 1.00-1.04x.
BAND_BYTES = 256 * 1024

_CONVS = ("conv2d", "qconv2d")


@dataclasses.dataclass(frozen=True)
class Fusion:
    """The depthwise node `first` fused with the pointwise node reading it; `kernel` runs
    both, reading `first`'s input (and the pointwise residual, if any)."""

    first: str
    kernel: Kernel


def _shape(node: Node, graph: Graph) -> ConvShape:
    return ConvShape.from_node(node, graph)


def _blocked(schedule: Any) -> bool:
    return getattr(schedule, "layout", "plain") != "plain" and not schedule.wino


def _pair(graph: Graph, d: Node, p: Node, sd: Any, sp: Any) -> bool:
    """Whether depthwise `d` and pointwise `p` (with schedules `sd`, `sp`) fuse."""
    if d.op not in _CONVS or p.op != d.op or not (_blocked(sd) and _blocked(sp)):
        return False
    if sd.vl != sp.vl:
        return False
    out = d.outputs[0]
    if out in graph.outputs or [c.name for c in graph.consumers(out)] != [p.name] \
            or p.inputs[0] != out:
        return False
    ds, ps = _shape(d, graph), _shape(p, graph)
    if not (ds.depthwise and ds.og == 1) or ds.residual:
        return False
    if not (ps.groups == 1 and ps.kh == ps.kw == 1 and ps.sh == ps.sw == 1
            and ps.pt == ps.pb == ps.pl == ps.pr == 0 and keeps_rows(ps, sp)):
        return False
    elem = 1 if ds.int8 else 4
    image = -(-ds.o // sd.vl) * sd.vl * ds.ho * ds.wo * elem
    return image >= MIN_BYTES and ps.o * ps.c * elem <= MAX_WEIGHT_BYTES


def fusions(graph: Graph, nodes: Sequence[Node], schedules: Mapping[str, Any], isa: Isa,
            threads: int) -> dict[str, Fusion]:
    """pointwise node name -> its `Fusion` with the depthwise node before it, for every
    pair of `nodes` that fuses with the `schedules` their kernels were made with, on a
    team of `threads`."""
    found = {}
    names = {n.name for n in nodes}
    for d in nodes:
        consumers = graph.consumers(d.outputs[0]) if d.outputs else []
        if len(consumers) != 1 or consumers[0].name not in names:
            continue
        p = consumers[0]
        sd, sp = schedules.get(d.name), schedules.get(p.name)
        if sd is None or sp is None or not _pair(graph, d, p, sd, sp):
            continue
        found[p.name] = Fusion(d.name, fused_kernel(graph, d, p, sd, sp, isa, threads))
    return found


def fused_kernel(graph: Graph, d: Node, p: Node, sd: Any, sp: Any, isa: Isa,
                 threads: int) -> Kernel:
    """The kernel running depthwise `d` and pointwise `p` band by band (see the module
    docstring) on a team of `threads`: it reads `d`'s input (and `p`'s residual) and
    writes `p`'s output; the depthwise output goes to the workspace, whole, so each
    band's rows stay where the unfused kernels would put them."""
    ds, ps = _shape(d, graph), _shape(p, graph)
    vl = sd.vl
    first, second = (node_kernel(node, graph, isa, schedule=s, band=True)[0]
                     for node, s in ((d, sd), (p, sp)))
    elem = 1 if ds.int8 else 4
    el = "int8_t" if ds.int8 else "float"          # the input's and the buffer's
    out_t = "int8_t" if ps.int8 else "float"
    plane = -(-ds.o // vl) * vl * ds.ho * ds.wo          # the depthwise output, an image
    # Bands of about BAND_BYTES, as many as a multiple of the team, so that every
    # thread gets as many (with 19 bands, one of two threads ran 10).
    share = -(-ds.ho * (plane // ds.ho * elem) // (threads * BAND_BYTES))
    rows = -(-ds.ho // (threads * max(1, share)))
    bands = -(-ds.ho // rows)
    offset = align(first.params.size)
    res = f"(const {out_t} *)in[1]" if ps.residual else "NULL"
    body = (first.body.replace("NAME", "NAME_dw") + second.body.replace("NAME", "NAME_pw")
            + f"""
/* {ds.dtype} depthwise {ds.describe()} then pointwise {ps.describe()}, fused in bands
   of {rows} rows (NCHW{vl}c) */
void NAME{SIGNATURE} {{
    const {el} *restrict x = (const {el} *)in[0];
    const {out_t} *restrict res = {res};
    {out_t} *restrict y = ({out_t} *)out_;
    {el} *restrict mid = ({el} *)ws;
    #pragma omp parallel
    for (int b = 0; b < {ds.n}; b++) {{
        #pragma omp for schedule(static)
        for (int band = 0; band < {bands}; band++) {{
            const int oy0 = band * {rows}, oy1 = vdla_min(oy0 + {rows}, {ds.ho});
            NAME_dw((const void *)x, NULL, (void *)mid, params, b, oy0, oy1);
            NAME_pw((const void *)mid, res, y, params + {offset}, b, oy0, oy1);
        }}
    }}
}}
""")
    blob = np.zeros(offset + second.params.size, np.uint8)
    blob[:first.params.size] = first.params
    blob[offset:] = second.params
    return Kernel(body, blob, (d.inputs[0],) + second.inputs[1:], ds.n * plane * elem, 0,
                  first.macs + second.macs, in_blocks=(first.in_block(0),)
                  + tuple(second.in_blocks[1:]), out_block=second.out_block, items=bands)
