"""What the transformer fusions (`fuse_transformer`, `fuse_attention`) read of a graph
while matching a pattern, and how they rewrite it: `PatternView` (producers, readers,
constants of a graph), `last_axis_vector`, `replace_nodes`, `rebuild`."""

from __future__ import annotations

import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node

__all__ = ["PatternView", "last_axis_vector", "rebuild", "replace_nodes"]

#: Relative tolerance of a matched constant (an exporter's float32 of sqrt(2), 0.044715).
RTOL = 1e-5


class PatternView:
    """What the matchers read of a graph: producers, readers, constants."""

    def __init__(self, g: Graph):
        self.g = g
        self.readers: dict[str, list[Node]] = {}
        for node in g.nodes_unordered():
            for t in set(i for i in node.inputs if i):
                self.readers.setdefault(t, []).append(node)

    def op(self, tensor: str, *ops: str) -> Node | None:
        """The producer of `tensor` when its op is one of `ops`."""
        node = self.g.producer(tensor)
        return node if node is not None and node.op in ops else None

    def only(self, tensor: str, *ops: str) -> Node | None:
        """The one reader of `tensor` when there is exactly one, its op is one of `ops`
        and `tensor` is no graph output."""
        names = self.readers.get(tensor, [])
        if len(names) != 1 or tensor in self.g.outputs or names[0].op not in ops:
            return None
        return names[0]

    def scalar(self, tensor: str) -> float | None:
        """The value of a one-element float constant."""
        t = self.g.tensors.get(tensor)
        if t is None or t.data is None or t.data.size != 1 or t.data.dtype.kind != "f":
            return None
        return float(t.data.reshape(()))

    def is_value(self, tensor: str, want: float) -> bool:
        value = self.scalar(tensor)
        return value is not None and math.isclose(value, want, rel_tol=RTOL)

    def other(self, node: Node, tensor: str) -> str | None:
        """The other input of binary `node`, one of whose inputs is `tensor`."""
        if len(node.inputs) != 2:
            return None
        a, b = node.inputs
        return b if a == tensor else a if b == tensor else None

    def private(self, nodes: list[Node], out: str) -> bool:
        """Whether every tensor `nodes` make, except `out`, is read only by `nodes`."""
        names = {n.name for n in nodes}
        for n in nodes:
            for t in n.outputs:
                if t == out:
                    continue
                if t in self.g.outputs or any(r.name not in names
                                              for r in self.readers.get(t, [])):
                    return False
        return True

    def float32(self, tensor: str) -> bool:
        return self.g.tensors[tensor].dtype == "float32"


def last_axis_vector(g: Graph, tensor: str, size: int) -> np.ndarray | None:
    """A constant that broadcasts along the last axis only (a scalar, or (..., 1, size))
    as `size` float64 values; None otherwise."""
    data = g.constant(tensor)
    if data is None or data.dtype.kind != "f":
        return None
    if data.size == 1:
        return np.full(size, float(data.reshape(())), dtype=np.float64)
    if data.shape[-1] == size and data.size == size:
        return data.reshape(size).astype(np.float64)
    return None


def replace_nodes(g: Graph, gone: list[Node], op: str, inputs: list[str], out: str,
             name: str, **attrs) -> str:
    """Remove the nodes `gone` and add one `op` node writing their output `out`."""
    for n in gone:
        g.remove_node(n.name)
    name = g.unique_name(name)
    g.add_node(op, inputs, [out], name=name, **attrs)
    return name


def rebuild(g: Graph, node: Node, *, inputs=None, outputs=None, attrs=None) -> Node:
    new = Node(node.name, node.op, list(node.inputs if inputs is None else inputs),
               list(node.outputs if outputs is None else outputs),
               dict(node.attrs if attrs is None else attrs))
    g.replace_node(new)
    return new
