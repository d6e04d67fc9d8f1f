"""Sequences padded to whole blocks, so that attention over them runs on the GEMM core.

Split head by head (`vdla.compiler.targets.vdla.attention`), an attention reads its keys
and its queries as weight operands, whose rows come a block at a time: T keys and S
queries must be whole blocks. A ViT's 197 tokens (196 patches and the class token) are
not. `pad_sequences` therefore pads such a sequence, with zero rows, to the next whole
block where it enters the ops that carry it, and runs those ops on the longer sequence:

* every op between the entry and the attentions treats rows on their own (a dense
  layer, LayerNorm and GELU over the features, an add, reshapes, transposes and slices
  of the features), so a padded row never reaches a real one there;
* an attention is the only op that mixes rows, and it is given a mask that leaves the
  padded keys out (its softmax gives them probability exactly 0, so they add nothing to
  ``p @ v``); a causal attention needs none, its padded keys come after every real query;
* where the sequence leaves those ops it is sliced back to its rows, except by a slice
  of rows (a ViT's class token): the IR's slice bounds lie within the rows it was made
  for, so it reads the padded sequence as it is.

The real rows' values are bit for bit the unpadded graph's; the padded rows cost their
share of the work (208 rows for 197: 5.6% more MACs in every dense layer), against the
attention staying whole on the host. Padding happens once, on the host, where the
sequence comes from the host's embedding ops.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import infer_node
from vdla.compiler.ir.tensor import Node, Tensor
from vdla.compiler.targets.vdla.attention import tensor_readers
from vdla.compiler.targets.vdla.common import activation_block
from vdla.config import HardwareConfig

__all__ = ["PADDED_ROWS", "pad_sequences"]

#: The `Graph.metadata` key of {padded tensor: [rows, padded rows]}.
PADDED_ROWS = "vdla.padded_rows"

#: Ops that work on each row of a sequence apart, whose last axis is features.
_ROW_UNARY = ("qgelu", "relu", "qlayer_norm")


def pad_sequences(graph: Graph, config: HardwareConfig) -> Graph:
    """`graph` with every sequence that a self-attention reads and whose length is not a
    whole number of `config`'s activation blocks padded to one (the module docstring);
    `graph` itself where there is none. On batch-1 configs whose blocks are square only:
    where attention is split at all."""
    if config.batch != 1 or config.block_in != config.block_out:
        return graph
    block = activation_block(config)
    g = graph
    for node in [n for n in graph.nodes() if n.op == "qattention"]:
        if node.name not in g.nx:
            continue
        q, k = (g.tensors[t].shape for t in node.inputs[:2])
        if len(q) != 4 or q[2] != k[2] or q[2] % block == 0:
            continue            # cross-attention, or whole blocks already
        found = _region(g, node)
        if found is not None:
            g = _pad(g, *found, q[2], -(-q[2] // block) * block)
    return g


# --- which tensors carry the sequence --------------------------------------------------------

def _region(g: Graph, start: Node) -> tuple[dict[str, int], set[str]] | None:
    """({tensor: its row axis}, {node}) of every tensor that carries `start`'s sequence
    through ops that keep rows apart, and of those ops, from the attention's inputs
    outwards; None where a tensor of the sequence is one of those ops' constant operands
    or their row axis is ambiguous."""
    rows = g.tensors[start.inputs[0]].shape[2]
    readers = tensor_readers(g)
    region: dict[str, int] = {}
    inside: set[str] = set()
    todo = [(t, 2) for t in start.inputs[:3]]
    while todo:
        tensor, axis = todo.pop()
        if tensor in region:
            if region[tensor] != axis:
                return None
            continue
        if g.tensors[tensor].shape[axis] != rows:
            return None
        region[tensor] = axis
        nodes = [g.producer(tensor)] + readers.get(tensor, [])
        for node in nodes:
            if node is None:
                continue
            axes = _carried(g, node, tensor, axis)
            if axes is None:
                continue                    # the sequence enters or leaves here
            inside.add(node.name)
            for other, other_axis in axes.items():
                if g.constant(other) is not None:
                    return None
                todo.append((other, other_axis))
    return region, inside


def _carried(g: Graph, node: Node, tensor: str, axis: int) -> dict[str, int] | None:
    """{tensor: row axis} of `node`'s sequence operands and results, given that `tensor`
    (one of them) has its rows along `axis`; None when `node` does not keep rows apart
    along that axis."""
    shape = g.tensors[tensor].shape
    x, out = node.inputs[0], node.outputs[0]
    if node.op == "qdense":
        seq = [t for t in (x, node.input(3)) if t]
        if tensor not in seq + [out] or axis != 0 or len(shape) != 2:
            return None
        return {t: 0 for t in seq + [out]}
    if node.op in _ROW_UNARY:
        return {x: axis, out: axis} if axis != len(shape) - 1 else None
    if node.op == "qadd":
        a, b = node.inputs[:2]
        same = g.tensors[a].shape == g.tensors[b].shape == g.tensors[out].shape
        return {a: axis, b: axis, out: axis} if same else None
    if node.op == "transpose":
        perm = tuple(node.attrs["perm"]) or tuple(reversed(range(len(shape))))
        return {x: axis, out: perm.index(axis)} if tensor == x else {x: perm[axis], out: axis}
    if node.op == "reshape":
        return _reshaped(g, node, tensor, axis)
    if node.op == "slice":
        axes = [a % len(g.tensors[x].shape) for a in node.attrs["axes"]] \
            or list(range(len(node.attrs["starts"])))
        return None if axis in axes else {x: axis, out: axis}
    if node.op == "qattention":
        if tensor not in node.inputs[:3] + [out] or axis != 2:
            return None
        return {t: 2 for t in node.inputs[:3] + [out]}
    return None


def _reshaped(g: Graph, node: Node, tensor: str, axis: int) -> dict[str, int] | None:
    """The row axes across a reshape that keeps the rows an axis of their own: the axis
    of the other side with the same number of elements before it and the same length;
    None when there is none, or the reshape's shape names the rows' length by a 0."""
    x, out = node.inputs[0], node.outputs[0]
    src, dst = g.tensors[x].shape, g.tensors[out].shape
    here, there = (src, dst) if tensor == x else (dst, src)
    before = math.prod(here[:axis])
    match = [j for j in range(len(there))
             if math.prod(there[:j]) == before and there[j] == here[axis]]
    if len(match) != 1:
        return None
    out_axis = match[0] if tensor == x else axis
    if node.attrs["shape"][out_axis] not in (dst[out_axis], -1):
        return None
    return {x: axis, out: out_axis} if tensor == x else {x: match[0], out: axis}


# --- the rewrite ----------------------------------------------------------------------------

def _pad(graph: Graph, region: dict[str, int], inside: set[str], rows: int,
         padded: int) -> Graph:
    """`graph` with the sequence `region` carried by the nodes `inside` (`_region`)
    `padded` rows long: padded where it enters, masked where attention reads it, sliced
    back where it leaves."""
    g = graph.copy()
    for name in inside:
        node = g.node(name)
        if node.op == "reshape":
            out = node.outputs[0]
            shape = list(node.attrs["shape"])
            if shape[region[out]] != -1:
                shape[region[out]] = padded
            node.attrs["shape"] = tuple(shape)
        elif node.op == "qattention":
            _mask_padding(g, node, rows, padded)
    for tensor, axis in region.items():
        producer = g.producer(tensor)
        if producer is None or producer.name not in inside:       # the sequence enters
            pads = [0] * (2 * len(g.tensors[tensor].shape))
            pads[len(pads) // 2 + axis] = padded - rows
            entry = g.add_node("pad", [tensor], name=g.unique_name(f"{tensor}.rows"),
                               pads=tuple(pads), value=0.0)
            _redirect(g, tensor, entry, inside)
        readers = [n for n in g.nodes_unordered() if tensor in n.inputs
                   and n.name not in inside and not _takes_real_rows(g, n, axis)]
        if readers or tensor in g.outputs:                          # and leaves
            _leave(g, tensor, axis, rows, inside, readers)
    for node in g.nodes():
        infer_node(g, node)
    g.metadata[PADDED_ROWS] = {**g.metadata.get(PADDED_ROWS, {}),
                               **{t: [rows, padded] for t in region}}
    return g.validate()


def _redirect(g: Graph, old: str, new: str, inside: set[str]) -> None:
    """Make the nodes named in `inside` that read tensor `old` read `new`."""
    for name in inside:
        node = g.node(name)
        if old in node.inputs:
            g.replace_node(Node(node.name, node.op, [new if t == old else t
                                                     for t in node.inputs],
                                list(node.outputs), node.attrs))


def _takes_real_rows(g: Graph, node: Node, axis: int) -> bool:
    """Whether `node` is a slice along `axis`, so it reads the padded sequence as it is:
    the IR's slice bounds lie within the axis it was made for, the real rows."""
    if node.op != "slice":
        return False
    rank = len(g.tensors[node.inputs[0]].shape)
    return axis in ([x % rank for x in node.attrs["axes"]]
                    or list(range(len(node.attrs["starts"]))))


def _leave(g: Graph, tensor: str, axis: int, rows: int, inside: set[str],
           readers: list[Node]) -> None:
    """Slice `tensor` back to its `rows` for the `readers` outside the padded ops, and
    for the graph's outputs, which keep their names (the producer writes a padded one)."""
    rank = len(g.tensors[tensor].shape)
    cut = dict(starts=(0,), ends=(rows,), axes=(axis % rank,), steps=(1,))
    if tensor in g.outputs:
        producer = g.producer(tensor)
        longer = g.unique_name(f"{tensor}.padded")
        g.add_tensor(_renamed(g.tensors[tensor], longer))
        g.replace_node(Node(producer.name, producer.op, list(producer.inputs),
                            [longer if t == tensor else t for t in producer.outputs],
                            producer.attrs))
        _redirect(g, tensor, longer, inside)
        g.add_node("slice", [longer], [tensor], name=g.unique_name(f"{tensor}.real_rows"),
                   infer=False, **cut)
        return
    real = g.add_node("slice", [tensor], name=g.unique_name(f"{tensor}.real_rows"),
                      infer=False, **cut)
    g.tensors[real] = _renamed(g.tensors[tensor], real)
    for node in readers:
        g.replace_node(Node(node.name, node.op, [real if t == tensor else t
                                                 for t in node.inputs],
                            list(node.outputs), node.attrs))


def _mask_padding(g: Graph, node: Node, rows: int, padded: int) -> None:
    """Give attention `node` a mask that leaves the padded keys out: its own mask padded
    with exclusions, or a constant one; none for a causal attention without a mask (every
    padded key comes after every real query)."""
    mask = node.input(3)
    if not mask and node.attrs["causal"]:
        return
    if not mask:
        data = np.zeros((1, 1, 1, padded), bool)
        data[..., rows:] = True
        new = g.add_constant(f"{node.name}.padded_keys", data)
    else:
        shape = g.tensors[mask].shape
        pads = [0] * 8
        pads[7] = padded - rows                 # keys
        if shape[2] == rows:
            pads[6] = padded - rows             # queries
        new = g.add_node("pad", [mask], name=g.unique_name(f"{mask}.rows"),
                         pads=tuple(pads), value=1.0)
    inputs = list(node.inputs) + [""] * (4 - len(node.inputs))
    inputs[3] = new
    g.replace_node(Node(node.name, node.op, inputs, list(node.outputs), node.attrs))


def _renamed(tensor: Tensor, name: str) -> Tensor:
    """A copy of `tensor` (no data) under `name`."""
    return dataclasses.replace(tensor, name=name, data=None)
