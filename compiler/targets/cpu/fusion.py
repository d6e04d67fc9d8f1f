"""Two layers fused into one kernel: a depthwise convolution and the pointwise one that
reads it, and a convolution and the max pool that reads it; and an attention that reads
and writes its heads in place, its slices and transposes left out (`head_views`).

MobileNet's pairs: a 3x3 depthwise layer writes a plane of channels that only the 1x1
layer after it reads. On the large planes (112x112x32 float32 is 1.6 MB) that plane
leaves the cores' L2 between the two layers, and the pointwise layer reads it back from
L3 or memory. The fused kernel cuts the output rows in bands and, per band, on one
thread, runs the depthwise layer's rows into a buffer and then the pointwise layer's
same rows from it, while they are in L2 (a 1x1 layer of stride 1 reads exactly its own
rows). Both parts are the blocked kernels' own C (`lower.node_kernel` with
``band=True``): the same tiles, epilogues and requantization, so the outputs are the
unfused kernels' to the bit.

A convolution and its max pool (ResNet's stem: 112x112x64 float32, 3.2 MB, then a 3x3
pool of stride 2) run the same way, with one difference: a pool's windows overlap, so
its band of rows reads a row or two of the convolution band before it. The bands go in
rounds of one per thread: each thread computes its band's convolution rows, the team
waits at a barrier, and each thread pools its band, the rows it reads from its
neighbour's band then written. Every convolution row is computed once.

    pairs = fusions(graph, nodes, schedules, isa, threads)  # second node -> Fusion

Fused where it saves a pass over memory and costs no other: the first layer's output
read by the second alone, an image of it at least `MIN_BYTES`; for a depthwise and a
pointwise layer, both blocked with one vector width and the pointwise weights at most
`MAX_WEIGHT_BYTES` (a band reads them all; tiles that do not fit in cache would trade
the saved pass for another); for a convolution and a max pool, the convolution blocked
(the pool then reads its layout).
The whole-graph runner calls the fused kernel in place of the two
(`program.plan_steps`); the session's op-by-op calls still run each layer alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.attention import attention_kernel
from vdla.compiler.targets.cpu.blocked import keeps_rows
from vdla.compiler.targets.cpu.head_views import head_views
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, align
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.pools import PoolShape, blocked_pool_kernel
from vdla.compiler.targets.cpu.shapes import ConvShape

__all__ = ["BAND_BYTES", "Fusion", "MAX_WEIGHT_BYTES", "MIN_BYTES", "fused_kernel",
           "fusions", "pooled_kernel"]

#: An image of the first layer's output from this size on leaves a core's share of L2
#: (1 MB on the EPYC, shared with the weights and the input rows). This and the two
#: sizes below are for a 1 MiB L2, scaled to the machine's (`MachineCosts.l2_bytes`).
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
    """A node's `kernel` in the whole-graph runner that also does the work of the nodes
    `absorbed`, whose own steps are left out: the node before it of a pair (a depthwise
    and a pointwise convolution, a convolution and a max pool: the kernel reads that
    node's input, and the pointwise residual if any), or an attention's slices and
    transposes (`head_views`). `output`: the tensor the kernel writes, when not its
    node's own (an absorbed node's after it; "" for its own)."""

    absorbed: tuple[str, ...]
    kernel: Kernel
    output: str = ""


def _shape(node: Node, graph: Graph) -> ConvShape:
    return ConvShape.from_node(node, graph)


def _blocked(schedule: Any) -> bool:
    return getattr(schedule, "layout", "plain") != "plain" and not schedule.wino


def _only_reader(graph: Graph, first: Node, second: Node) -> bool:
    """Whether `second` is the only reader of `first`'s output, which is no graph
    output, through its first input."""
    out = first.outputs[0]
    return (out not in graph.outputs and second.inputs[0] == out
            and [c.name for c in graph.consumers(out)] == [second.name])


def _image_bytes(shape: ConvShape, vl: int) -> int:
    """An image of convolution `shape`'s output, blocked by `vl`."""
    return -(-shape.o // vl) * vl * shape.ho * shape.wo * (1 if shape.int8 else 4)


def _conv_pool(graph: Graph, c: Node, p: Node, sc: Any, costs: MachineCosts) -> bool:
    """Whether convolution `c` (with schedule `sc`) and max pool `p` fuse."""
    if c.op not in _CONVS or p.op != "max_pool2d" or not _blocked(sc) \
            or not _only_reader(graph, c, p):
        return False
    shape = _shape(c, graph)
    return keeps_rows(shape, sc) and _image_bytes(shape, sc.vl) >= costs.l2_bytes(MIN_BYTES)


def _pair(graph: Graph, d: Node, p: Node, sd: Any, sp: Any, costs: MachineCosts) -> bool:
    """Whether depthwise `d` and pointwise `p` (with schedules `sd`, `sp`) fuse."""
    if d.op not in _CONVS or p.op != d.op or not (_blocked(sd) and _blocked(sp)):
        return False
    if sd.vl != sp.vl or not _only_reader(graph, d, p):
        return False
    ds, ps = _shape(d, graph), _shape(p, graph)
    if not (ds.depthwise and ds.og == 1) or ds.residual:
        return False
    if not (ps.groups == 1 and ps.kh == ps.kw == 1 and ps.sh == ps.sw == 1
            and ps.pt == ps.pb == ps.pl == ps.pr == 0 and keeps_rows(ps, sp)):
        return False
    elem = 1 if ds.int8 else 4
    return (_image_bytes(ds, sd.vl) >= costs.l2_bytes(MIN_BYTES)
            and ps.o * ps.c * elem <= costs.l2_bytes(MAX_WEIGHT_BYTES))


def fusions(graph: Graph, nodes: Sequence[Node], schedules: Mapping[str, Any], isa: Isa,
            threads: int, costs: MachineCosts = NOMINAL) -> dict[str, Fusion]:
    """node name -> its `Fusion`: the second node of every pair of `nodes` that fuses (a
    depthwise and a pointwise convolution, a convolution and a max pool) with the
    `schedules` their kernels were made with, on a team of `threads`, on the machine
    `costs` describes (its L2 sets the sizes: `MIN_BYTES`, `BAND_BYTES`); and every
    attention that reads or writes its heads in place (`head_views`)."""
    names = {n.name for n in nodes}
    found = _attentions(graph, nodes, names, isa)
    for d in nodes:
        consumers = graph.consumers(d.outputs[0]) if d.outputs else []
        if len(consumers) != 1 or consumers[0].name not in names:
            continue
        p = consumers[0]
        sd, sp = schedules.get(d.name), schedules.get(p.name)
        if sd is None:
            continue
        if sp is not None and _pair(graph, d, p, sd, sp, costs):
            found[p.name] = Fusion((d.name,), fused_kernel(graph, d, p, sd, sp, isa,
                                                           threads, costs))
        elif sp is None and _conv_pool(graph, d, p, sd, costs):
            found[p.name] = Fusion((d.name,), pooled_kernel(graph, d, p, sd, isa, threads,
                                                            costs))
    return found


def _attentions(graph: Graph, nodes: Sequence[Node], names: set[str],
                isa: Isa) -> dict[str, Fusion]:
    """The attention nodes of `nodes` whose heads `head_views` reads or writes in place,
    with the kernel that does."""
    found = {}
    for node in nodes:
        if node.op in ("attention", "qattention"):
            views, absorbed, output = head_views(graph, node, names)
            if absorbed:
                found[node.name] = Fusion(absorbed, attention_kernel(node, graph, isa, views),
                                          output)
    return found


def _bands(rows: int, image_bytes: int, threads: int, costs: MachineCosts
           ) -> tuple[int, int]:
    """(rows per band, bands) for `rows` output rows of an image of `image_bytes`: bands
    of about `BAND_BYTES` (scaled to the machine's L2), as many as a multiple of the
    team, so that every thread gets as many (with 19 bands, one of two threads ran
    10)."""
    share = -(-image_bytes // (threads * max(1, costs.l2_bytes(BAND_BYTES))))
    per = -(-rows // (threads * max(1, share)))
    return per, -(-rows // per)


def fused_kernel(graph: Graph, d: Node, p: Node, sd: Any, sp: Any, isa: Isa,
                 threads: int, costs: MachineCosts = NOMINAL) -> Kernel:
    """The kernel running depthwise `d` and pointwise `p` band by band (see the module
    docstring) on a team of `threads`, in bands sized for the L2 of the machine `costs`
    describes: it reads `d`'s input (and `p`'s residual) and
    writes `p`'s output; the depthwise output goes to the workspace, whole, so each
    band's rows stay where the unfused kernels would put them."""
    ds, ps = _shape(d, graph), _shape(p, graph)
    vl = sd.vl
    first, second = (node_kernel(node, graph, isa, schedule=s, band=True)[0]
                     for node, s in ((d, sd), (p, sp)))
    el = "int8_t" if ds.int8 else "float"          # the input's and the buffer's
    out_t = "int8_t" if ps.int8 else "float"
    image = _image_bytes(ds, vl)                   # the depthwise output's
    rows, bands = _bands(ds.ho, image, threads, costs)
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
    return Kernel(body, blob, (d.inputs[0],) + second.inputs[1:], ds.n * image, 0,
                  first.macs + second.macs, in_blocks=(first.in_block(0),)
                  + tuple(second.in_blocks[1:]), out_block=second.out_block, items=bands)


def pooled_kernel(graph: Graph, c: Node, p: Node, sc: Any, isa: Isa, threads: int,
                  costs: MachineCosts = NOMINAL) -> Kernel:
    """The kernel running convolution `c` and max pool `p` band by band on a team of
    `threads` (see the module docstring), in bands sized for the L2 of the machine
    `costs` describes: it reads `c`'s input (and residual) and writes
    `p`'s output; the convolution's output goes to the workspace, whole, each row where
    the unfused kernel would put it. Band k pools output rows ``k * rows`` on, after the
    convolution rows ``own[k]`` to ``own[k + 1]``: up to the last row its windows reach,
    so that a band reads only rows of its own and earlier bands."""
    cs = _shape(c, graph)
    vl = sc.vl
    conv = node_kernel(c, graph, isa, schedule=sc, band=True)[0]
    pool = blocked_pool_kernel(p, graph, vl, band=True)
    ps = PoolShape(p, graph)
    image = _image_bytes(cs, vl)
    rows, bands = _bands(ps.oh, image, threads, costs)
    own = [0]
    for k in range(1, bands):
        own.append(min(cs.ho, max(own[-1], (k * rows - 1) * ps.sh - ps.pt + ps.kh)))
    own.append(cs.ho)
    t = "int8_t" if cs.int8 else "float"           # the input's, the buffer's and the output's
    res = f"(const {t} *)in[1]" if cs.residual else "NULL"
    body = (conv.body.replace("NAME", "NAME_cv") + pool.body.replace("NAME", "NAME_pl")
            + f"""
static const int NAME_own[{bands + 1}] = {{{", ".join(map(str, own))}}};

/* {cs.dtype} conv {cs.describe()} then max pool to {ps.oh} rows, fused in bands of {rows}
   pooled rows (NCHW{vl}c), in rounds of {threads} */
void NAME{SIGNATURE} {{
    const {t} *restrict x = (const {t} *)in[0];
    const {t} *restrict res = {res};
    {t} *restrict y = ({t} *)out_;
    {t} *restrict mid = ({t} *)ws;
    (void)res;
    #pragma omp parallel
    for (int b = 0; b < {cs.n}; b++)
    for (int k0 = 0; k0 < {bands}; k0 += {threads}) {{
        const int k1 = vdla_min(k0 + {threads}, {bands});
        #pragma omp for schedule(static)
        for (int k = k0; k < k1; k++)
            NAME_cv((const void *)x, res, mid, params, b, NAME_own[k], NAME_own[k + 1]);
        /* the barrier above: every row up to own[k1] is written */
        #pragma omp for schedule(static) nowait
        for (int k = k0; k < k1; k++)
            NAME_pl(mid, y, b, k * {rows}, vdla_min((k + 1) * {rows}, {ps.oh}));
    }}
}}
""")
    return Kernel(body, conv.params, conv.inputs, image * cs.n, 0, conv.macs,
                  in_blocks=conv.in_blocks, out_block=vl, items=bands)
