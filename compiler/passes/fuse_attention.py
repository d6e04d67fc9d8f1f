"""Fusion of the attention core into the ``attention`` op (part of `fuse_transformer`;
see its docstring for the pattern)::

    s = matmul(q [* c1], k_t [* c2])  [* c | / c]  [+ mask]  [where(causal, s, fill)]
    y = matmul(softmax(s, last axis), v)
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.passes.pattern_view import PatternView

__all__ = ["EXCLUDED", "fuse_attentions"]

#: A constant at or below this excludes a key from a softmax (an additive mask's
#: "minus infinity"; BERT writes -10000, torch's masked_fill -inf or the float minimum).
EXCLUDED = -1e4


def _causal(shape: tuple[int, ...]) -> np.ndarray:
    """The causal exclusion of scores of `shape` (..., S, T): key t > query s + (T - S)."""
    s, t = shape[-2:]
    return np.broadcast_to(np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s), shape)


def _broadcasts(shape, to) -> bool:
    try:
        return tuple(np.broadcast_shapes(tuple(shape), tuple(to))) == tuple(to)
    except ValueError:
        return False


class _Core:
    """What the matcher collected walking up from a softmax."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.mask: str | None = None
        self.excluded: np.ndarray | None = None     # a constant where's exclusion
        self.fill = 0.0
        self.scale = 1.0

    def but(self, node: Node, **changes) -> "_Core":
        """A copy with `node` collected and `changes` made (a branch of the walk)."""
        other = _Core()
        other.__dict__.update(self.__dict__, nodes=self.nodes + [node], **changes)
        return other


def _walk_scores(v: PatternView, t: str, core: _Core, depth: int) -> Node | None:
    """Walk up from the softmax input `t` through an optional ``where`` exclusion and an
    optional ``add`` of a mask (either order), an optional scale, to the score matmul."""
    node = v.g.producer(t)
    if node is None:
        return None
    if depth < 2 and node.op == "where" and core.excluded is None:
        cond = v.g.constant(node.inputs[0])
        if cond is not None:
            for keep, fill, flip in ((2, 1, False), (1, 2, True)):
                value = v.scalar(node.inputs[fill])
                if value is not None and value <= EXCLUDED:
                    sub = core.but(node, excluded=~cond if flip else cond, fill=value)
                    found = _walk_scores(v, node.inputs[keep], sub, depth + 1)
                    if found is not None:
                        core.__dict__.update(sub.__dict__)
                        return found
        return None
    if depth < 2 and node.op == "add" and core.mask is None:
        for k in (0, 1):
            sub = core.but(node, mask=node.inputs[1 - k])
            found = _walk_scores(v, node.inputs[k], sub, depth + 1)
            if found is not None:
                core.__dict__.update(sub.__dict__)
                return found
        return None
    scale = 1.0
    if node.op in ("div", "mul"):
        value = v.scalar(node.inputs[1])
        if node.op == "div" and value:
            scale, t = 1.0 / value, node.inputs[0]
        elif node.op == "mul" and value is not None:
            scale, t = value, node.inputs[0]
        elif node.op == "mul" and v.scalar(node.inputs[0]) is not None:
            scale, t = v.scalar(node.inputs[0]), node.inputs[1]
        else:
            return None
        mm = v.op(t, "matmul")
        if mm is None:
            return None
        core.nodes.append(node)
    else:
        mm = node if node.op == "matmul" else None
    if mm is not None:
        core.scale *= scale
        core.nodes.append(mm)
    return mm


def _operand(v: PatternView, mm: Node, i: int, core: _Core) -> str:
    """Input `i` of the score matmul, with a scalar ``mul`` before it folded into the
    scale."""
    t = mm.inputs[i]
    mul = v.op(t, "mul")
    if mul is None or v.only(t, "matmul") is not mm:
        return t
    for k in (0, 1):
        value = v.scalar(mul.inputs[1 - k])
        if value is not None and v.g.constant(mul.inputs[k]) is None:
            core.scale *= value
            core.nodes.append(mul)
            return mul.inputs[k]
    return t


def _match_attention(v: PatternView, sm: Node):
    g = v.g
    s = sm.inputs[0]
    shape = g.tensors[s].shape
    if len(shape) < 3 or int(sm.attrs["axis"]) % len(shape) != len(shape) - 1 \
            or not v.float32(s):
        return None
    pv = v.only(sm.outputs[0], "matmul")
    if pv is None or pv.inputs[0] != sm.outputs[0]:
        return None
    core = _Core()
    core.nodes.append(sm)
    mm = _walk_scores(v, s, core, 0)
    if mm is None:
        return None
    q, kt, val = _operand(v, mm, 0, core), _operand(v, mm, 1, core), pv.inputs[1]
    qs, ks, vs = (g.tensors[t].shape for t in (q, kt, val))
    if not (len(qs) == len(ks) == len(vs) == len(shape) and qs[:-2] == ks[:-2] == vs[:-2]
            == shape[:-2] and qs[-1] == ks[-2] and ks[-1] == vs[-2]
            and all(v.float32(t) for t in (q, kt, val))):
        return None
    nodes = core.nodes + [pv]
    if not v.private(nodes, pv.outputs[0]) or not math.isfinite(core.scale):
        return None
    mask, causal = core.mask, False
    if mask is not None:
        if not v.float32(mask) or not _broadcasts(g.tensors[mask].shape, shape):
            return None
        source = g.producer(mask)
        if source is not None and nx.has_path(g.nx, mm.name, source.name):
            return None             # a "mask" computed from the scores themselves
        data = g.constant(mask)
        if data is not None:
            excluded = np.broadcast_to(data <= EXCLUDED, shape)
            if np.all((data == 0) | (data <= EXCLUDED)) and np.array_equal(excluded,
                                                                             _causal(shape)):
                mask, causal = None, True
    if causal and shape[-1] < shape[-2]:
        return None                 # fewer keys than queries: rows with no key at all
    if core.excluded is not None:
        if not _broadcasts(core.excluded.shape, shape):
            return None
        excluded = np.broadcast_to(core.excluded, shape)
        if np.array_equal(excluded, _causal(shape)) and shape[-1] >= shape[-2]:
            causal = True
        elif mask is None and (~excluded).any(axis=-1).all():
            mask = g.add_constant(f"{sm.name}_mask", np.where(core.excluded, core.fill, 0.0)
                                  .astype(np.float32))
        else:
            return None
    return nodes, q, kt, val, mask, causal, core.scale, pv.outputs[0]


def _untransposed(g: Graph, kt: str, name: str) -> str:
    """k from `kt` = k transposed on its last two axes: the input of a transpose before
    `kt` with its permutation composed, else a new transpose."""
    rank = len(g.tensors[kt].shape)
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    node = g.producer(kt)
    src, perm = kt, swap
    if node is not None and node.op == "transpose":
        before = tuple(node.attrs["perm"]) or tuple(reversed(range(rank)))
        src, perm = node.inputs[0], tuple(before[p] for p in swap)
    if perm == tuple(range(rank)):
        return src
    return g.add_node("transpose", [src], name=g.unique_name(name), perm=perm)


def fuse_attentions(g: Graph, record: list):
    for name in [n.name for n in g.nodes() if n.op == "softmax"]:
        if name not in g.nx:
            continue
        found = _match_attention(PatternView(g), g.node(name))
        if found is None:
            continue
        nodes, q, kt, val, mask, causal, scale, out = found
        for n in nodes:
            g.remove_node(n.name)
        k = _untransposed(g, kt, f"{name}_k")
        node = g.add_node("attention", [q, k, val] + ([mask] if mask else []), [out],
                          name=g.unique_name(f"{name}_attention"), scale=float(scale),
                          causal=causal)
        record.append({"pattern": "attention", "node": g.producer(node).name,
                       "replaced": [n.name for n in nodes], "causal": causal,
                       "mask": mask is not None, "scale": float(scale)})
