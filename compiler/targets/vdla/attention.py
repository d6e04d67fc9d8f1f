"""Attention on the accelerator, head by head: a fused ``qattention`` split into the
products the GEMM core runs and the softmax between them.

The integer attention is two products around a softmax (its definition,
`vdla.compiler.reference.integer_transformer`), so for each head h::

    s_h  = qmatmul(q_h, k_h, transpose_b)       # the scores, (S, T)
    p_h  = qsoftmax(s_h, mask, causal)          # the host, for now
    vt_h = qmatmul(I, v_h, transpose_b)         # v_h^T, (dh, T): an identity a
    o_h  = qmatmul(p_h, vt_h, transpose_b)      # p_h @ v_h, (S, dh)

and the heads' outputs concatenated along their features are the (S, D) the output
projection reads. On a config with the ALU's lookup table and divide (TAB and DIV)
the softmax runs on the accelerator too, down the rows of the scores' transpose
(`vdla.compiler.targets.vdla.softmax`)::

    st_h = qmatmul(k_h, q_h, transpose_b)       # the scores' transpose, (T, S)
    pt_h = qsoftmax(st_h, mask_t, causal, axis=-2)   # keys down the rows
    p_h  = qmatmul(I, pt_h, transpose_b)        # p_h, (S, T): an identity a

and the rest as above. A mask becomes, on the host, the int8 (T, S) the ALU reads
(``where(mask^T, -128, 127)``: one tensor for all heads).

q_h, k_h and v_h are slices of whole channel blocks of the sequences the importer split
into heads with reshape and transpose (the merged Q/K/V projection's output), so they
are views of its buffer; the concat is a view too; and every product
reads its b where the op before stored it (`conv_layer.matmul_problem`): nothing moves
between the projection and the output projection but the softmax's operands. The
result is bit for bit the fused op's, whose definition this is.

`split_attention` rewrites the attentions of a graph that the accelerator can run so:
the importer's head split (``(S, D)`` -> reshape ``(1, S, H, dh)`` -> transpose
``(1, H, S, dh)``) and merge (the reverse) around it, a mask that is the same for every
head, and sizes the products take (block_in = block_out, dh and T whole blocks). Any
other attention is left whole, and runs on the host.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.common import activation_block
from vdla.compiler.targets.vdla.sequence import pixel_rows
from vdla.config import AluOp, HardwareConfig

__all__ = ["SPLIT_FROM", "split_attention", "splittable", "tensor_readers"]

#: The `Graph.metadata` key of {node added by the split: the qattention it came from}.
SPLIT_FROM = "vdla.split_from"

_HEADS_PERM = (0, 2, 1, 3)


@dataclasses.dataclass(frozen=True)
class _Heads:
    """A qattention the accelerator can run head by head: the (S, D) sequences q, k and
    v are features of (`sources`), `heads` of `width` features each, its mask (bool,
    the same for every head) or "", and what the merge writes: the tensor and shape of
    its last node, and the nodes it removes."""

    sources: tuple[str, str, str]
    heads: int
    width: int
    mask: str
    merged: str
    merged_shape: tuple[int, ...]
    removed: tuple[str, ...]


def _split_source(graph: Graph, name: str) -> tuple[str, tuple[str, ...]] | None:
    """(the (S, H * dh) sequence, the transpose and reshape nodes) when tensor `name` is
    the importer's head split of one, else None."""
    t = graph.producer(name)
    if t is None or t.op != "transpose" or tuple(t.attrs.get("perm", ())) != _HEADS_PERM:
        return None
    r = graph.producer(t.inputs[0])
    if r is None or r.op != "reshape":
        return None
    src = graph.tensors[r.inputs[0]].shape
    split = graph.tensors[r.outputs[0]].shape
    if len(src) != 2 or len(split) != 4 or split[0] != 1 or split[1] != src[0] \
            or split[2] * split[3] != src[1]:
        return None
    return r.inputs[0], (t.name, r.name)


def tensor_readers(graph: Graph) -> dict[str, list[Node]]:
    """tensor -> the nodes that read it, in no order (`Graph.consumers` sorts the whole
    graph each call, once per tensor asked about: seconds on BERT-base)."""
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes_unordered():
        for t in dict.fromkeys(n.inputs):
            if t:
                readers.setdefault(t, []).append(n)
    return readers


def _merge(graph: Graph, node: Node,
           readers: dict[str, list[Node]]) -> tuple[str, tuple[int, ...], tuple[str, ...]] | None:
    """(the merged tensor, its shape, the nodes of the merge) when qattention `node`'s
    output is only read by the importer's head merge, else None."""
    first = readers.get(node.outputs[0], [])
    if len(first) != 1 or node.outputs[0] in graph.outputs:
        return None
    t = first[0]
    if t.op != "transpose" or tuple(t.attrs.get("perm", ())) != _HEADS_PERM:
        return None
    second = readers.get(t.outputs[0], [])
    if len(second) != 1 or second[0].op != "reshape" or t.outputs[0] in graph.outputs:
        return None
    r = second[0]
    shape = tuple(graph.tensors[r.outputs[0]].shape)
    _, h, s, dh = graph.tensors[node.outputs[0]].shape
    if shape not in ((s, h * dh), (1, s, h * dh)):
        return None
    return r.outputs[0], shape, (t.name, r.name)


def splittable(node: Node, graph: Graph, config: HardwareConfig,
               readers: dict[str, list[Node]] | None = None) -> _Heads | None:
    """How qattention `node` splits into heads on `config` (`split_attention`), or None;
    `readers` is `graph`'s tensor -> readers, where the caller has it."""
    if node.op != "qattention" or config.block_in != config.block_out or config.batch != 1:
        return None
    readers = tensor_readers(graph) if readers is None else readers
    found = [_split_source(graph, name) for name in node.inputs[:3]]
    merge = _merge(graph, node, readers)
    if None in found or merge is None:
        return None
    _, heads, s, dh = graph.tensors[node.inputs[0]].shape
    t = graph.tensors[node.inputs[1]].shape[2]
    block = activation_block(config)
    if dh % block or t % block or graph.tensors[node.inputs[2]].shape[3] != dh:
        return None
    sources = tuple(src for src, _ in found)
    if any(graph.tensors[x].dtype != "int8" or not pixel_rows(graph, x, config)
           for x in sources):
        return None
    mask = node.input(3)
    if mask:
        shape = graph.tensors[mask].shape
        if len(shape) != 4 or shape[:2] != (1, 1) or shape[2] not in (1, s) \
                or shape[3] != t or graph.tensors[mask].dtype != "bool":
            return None
    removed = tuple(n for _, nodes in found for n in nodes) + merge[2] + (node.name,)
    # The head splits go with the attention only where nothing else reads them (the
    # merge's last tensor is written again, by the heads' concat).
    for name in removed:
        for out in graph.node(name).outputs:
            if out != merge[0] and (out in graph.outputs or any(
                    r.name not in removed for r in readers.get(out, ()))):
                return None
    return _Heads(sources, heads, dh, mask, merge[0], merge[1], removed)


def split_attention(graph: Graph, config: HardwareConfig) -> Graph:
    """`graph` with every attention the accelerator can run head by head split so (the
    module docstring), naming in its metadata (`SPLIT_FROM`) the attention each new node
    came from; `graph` itself when there is none."""
    attentions = [n for n in graph.nodes() if n.op == "qattention"]
    readers = tensor_readers(graph) if attentions else {}
    plans = [(node, plan) for node in attentions
             for plan in [splittable(node, graph, config, readers)] if plan is not None]
    if not plans:
        return graph
    g = graph.copy()
    origins = dict(g.metadata.get(SPLIT_FROM, {}))
    for node, plan in plans:
        before = set(g.nx)
        _split(g, node, plan, config)
        origins.update((name, node.name) for name in g.nx if name not in before)
    g.metadata[SPLIT_FROM] = origins
    g.prune()
    return g.validate()


def _softmax_down(g: Graph, node: Node, p: _Heads, config: HardwareConfig) -> bool:
    """Whether the heads' softmax runs on the accelerator, down the rows of the scores'
    transpose: a config with TAB and DIV, queries in whole blocks and (causal) at least
    as many keys as queries."""
    s = g.tensors[node.inputs[0]].shape[2]
    t = g.tensors[node.inputs[1]].shape[2]
    return ({AluOp.TAB, AluOp.DIV} <= config.alu_ops
            and s % activation_block(config) == 0 and (t >= s or not node.attrs["causal"]))


def _split(g: Graph, node: Node, p: _Heads, config: HardwareConfig) -> None:
    a, name, dh = node.attrs, node.name, p.width
    for removed in p.removed:
        g.remove_node(removed)
    mask = ""
    fixed = g.constant(p.mask) if p.mask else None
    if fixed is not None:     # a constant mask (padded keys): its final form, made here
        mask = g.add_constant(f"{name}.mask", fixed.reshape(fixed.shape[2:]))
    elif p.mask:        # (1, 1, S or 1, T) -> (S or 1, T): the same for every head
        shape = g.tensors[p.mask].shape
        mask = g.add_node("reshape", [p.mask], name=f"{name}.mask", shape=shape[2:])
    eye = g.add_constant(g.unique_name(f"{name}.identity"), np.eye(dh, dtype=np.int8))
    down = _softmax_down(g, node, p, config)
    if down:
        queries = g.tensors[node.inputs[0]].shape[2]
        eye_q = g.add_constant(g.unique_name(f"{name}.query_identity"),
                               np.eye(queries, dtype=np.int8))
        if fixed is not None:
            rows = np.broadcast_to(g.constant(mask), (queries, fixed.shape[3])).T
            mask = g.add_constant(f"{name}.mask_rows", np.where(rows, -128, 127)
                                  .astype(np.int8))
        elif mask:   # (S or 1, T) bool -> the int8 (T, S) the ALU reads: -128 excluded
            fill = [g.add_constant(g.unique_name(f"{name}.mask_{what}"),
                                   np.full((1, queries), value, np.int8))
                    for what, value in (("excluded", -128), ("kept", 127))]
            mask = g.add_node("where", [g.add_node("transpose", [mask],
                                                   name=f"{name}.mask_t", perm=(1, 0))]
                              + fill, name=f"{name}.mask_rows")
    outs = []
    for h in range(p.heads):
        q, k, v = (g.add_node("slice", [src], name=f"{name}.{what}{h}",
                              starts=(h * dh,), ends=((h + 1) * dh,), axes=(1,),
                              steps=(1,))
                   for what, src in zip("qkv", p.sources))
        qk = dict(transpose_b=True, multiplier=a["qk_multiplier"], shift=a["qk_shift"],
                  out_min=a["qk_out_min"], out_max=a["qk_out_max"])
        if down:
            scores = g.add_node("qmatmul", [k, q], name=f"{name}.scores{h}t", **qk)
            probs = g.add_node("qsoftmax", [scores] + ([mask] if mask else []),
                               name=f"{name}.softmax{h}t", axis=-2,
                               params=a["softmax_params"], causal=bool(a["causal"]))
            probs = g.add_node("qmatmul", [eye_q, probs], name=f"{name}.probs{h}",
                               transpose_b=True, shift=0)
        else:
            scores = g.add_node("qmatmul", [q, k], name=f"{name}.scores{h}", **qk)
            probs = g.add_node("qsoftmax", [scores] + ([mask] if mask else []),
                               name=f"{name}.softmax{h}", params=a["softmax_params"],
                               causal=bool(a["causal"]))
        vt = g.add_node("qmatmul", [eye, v], name=f"{name}.v{h}t", transpose_b=True,
                        shift=0)
        outs.append(g.add_node("qmatmul", [probs, vt], name=f"{name}.out{h}",
                               transpose_b=True, multiplier=a["pv_multiplier"],
                               shift=a["pv_shift"], out_min=a["pv_out_min"],
                               out_max=a["pv_out_max"]))
    if len(p.merged_shape) == 2:
        g.add_node("concat", outs, [p.merged], name=f"{name}.heads", axis=1)
    else:
        merged = g.add_node("concat", outs, name=f"{name}.heads", axis=1)
        g.add_node("reshape", [merged], [p.merged], name=f"{name}.merged",
                   shape=p.merged_shape)
