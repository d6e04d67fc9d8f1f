"""The compiler's graph IR: operators as nodes of a networkx graph, tensors as its edges.

A `Graph` holds

* `tensors`: every named value, a `Tensor` with shape, dtype, and after quantization a
  scale (``real = scale * integer``); constants (weights, biases) carry their `data`;
* operator `Node` s (``op`` from `vdla.compiler.ir.ops`, typed ``attrs``, input and output
  tensor names), kept in ``graph.nx``, a `networkx.MultiDiGraph` whose edges run from
  the producer of a tensor to each consumer, keyed by the tensor's name;
* `inputs` and `outputs`: the names of the graph's input and output tensors.

Optional operator inputs are written as ``""`` (ONNX's convention), so positions keep
their meaning (``conv2d(x, w, "", residual)``).

The IR is backend-neutral: the accelerator, CPU and GPU back halves all start from it.
`Graph.validate` finds dangling inputs, cycles, missing producers and shape mismatches
and names the node and tensor at fault.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from typing import Any, Iterable

import networkx as nx
import numpy as np

from vdla.compiler.ir.ops import get_op, infer_node
from vdla.compiler.ir.tensor import DTYPES, GraphError, Node, Tensor

__all__ = ["DTYPES", "Graph", "GraphError", "Node", "Tensor"]

class Graph:
    """A dataflow graph of operators over named tensors (see the module docstring)."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.nx = nx.MultiDiGraph()
        self._producer: dict[str, str] = {}     # tensor name -> node name
        self._counter = itertools.count()
        self.metadata: dict[str, Any] = {}

    # --- building ----------------------------------------------------------------------

    def unique_name(self, base: str) -> str:
        """A tensor/node name starting with `base` that is not used yet."""
        if base not in self.tensors and base not in self.nx:
            return base
        while True:
            name = f"{base}_{next(self._counter)}"
            if name not in self.tensors and name not in self.nx:
                return name

    def add_tensor(self, tensor: Tensor) -> str:
        if tensor.name in self.tensors:
            raise GraphError(f"tensor {tensor.name!r} is defined twice")
        if not tensor.name:
            raise GraphError("a tensor needs a non-empty name")
        self.tensors[tensor.name] = tensor
        return tensor.name

    def add_input(self, name: str, shape: Iterable[int], dtype: str = "float32") -> str:
        """Declare a graph input of the given shape; returns its name."""
        self.add_tensor(Tensor(name, tuple(shape), dtype))
        self.inputs.append(name)
        return name

    def add_constant(self, name: str, data, dtype: str | None = None, *,
                     scale=None) -> str:
        """A constant tensor (weights, bias, shape). `name` is made unique; returns it."""
        data = np.asarray(data)
        if dtype is None:
            dtype = "float32" if data.dtype.kind == "f" else str(data.dtype)
        name = self.unique_name(name)
        self.add_tensor(Tensor(name, tuple(data.shape), dtype, data=data, scale=scale))
        return name

    def add_node(self, op: str, inputs: Iterable[str], outputs: int | Iterable[str] = 1, *,
                 name: str | None = None, infer: bool = True, **attrs) -> Any:
        """Add an operator node. `outputs` is a count (names are made up) or a list of
        names. Output tensors are created (float32, shape inferred when every input's
        shape is known and `infer`). Returns the output name, or a list of names when
        the op has several outputs."""
        opdef = get_op(op)
        name = self.unique_name(name or op)
        if isinstance(outputs, int):
            outputs = [self.unique_name(f"{name}_out" if outputs == 1 else f"{name}_out{i}")
                       for i in range(outputs)]
        node = Node(name, op, list(inputs), list(outputs), opdef.normalize_attrs(attrs, name))
        created = [out for out in node.outputs if out not in self.tensors]
        for out in created:
            self.add_tensor(Tensor(out))
        self._insert(node)
        if infer:
            if all(not i or (i in self.tensors and self.tensors[i].shape is not None)
                   for i in node.inputs):
                try:
                    infer_node(self, node)
                except GraphError:
                    # A node that does not fit its inputs is not added at all.
                    self.remove_node(node.name)
                    for out in created:
                        del self.tensors[out]
                    raise
        return node.outputs[0] if len(node.outputs) == 1 else list(node.outputs)

    def _insert(self, node: Node):
        if node.name in self.nx:
            raise GraphError(f"node {node.name!r} is defined twice")
        for out in node.outputs:
            if out in self._producer:
                raise GraphError(f"tensor {out!r} is produced by both node "
                                 f"{self._producer[out]!r} and node {node.name!r}")
            if out in self.inputs or (out in self.tensors and self.tensors[out].is_constant):
                raise GraphError(f"node {node.name!r} writes {out!r}, which is a graph "
                                 "input or a constant")
        self.nx.add_node(node.name, node=node)
        for out in node.outputs:
            self._producer[out] = node.name
            # Consumers that were added before this producer.
            for other in self.nodes_unordered():
                if out in other.inputs and other is not node:
                    self.nx.add_edge(node.name, other.name, key=out)
        for tensor in node.inputs:
            if tensor and tensor in self._producer:
                self.nx.add_edge(self._producer[tensor], node.name, key=tensor)

    def set_outputs(self, names: Iterable[str]):
        self.outputs = list(names)

    # --- queries -------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        try:
            return self.nx.nodes[name]["node"]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no node {name!r}") from None

    def nodes_unordered(self) -> list[Node]:
        return [data["node"] for _, data in self.nx.nodes(data=True)]

    def nodes(self) -> list[Node]:
        """The nodes in a topological order (stable: insertion order breaks ties)."""
        order = {n: i for i, n in enumerate(self.nx.nodes)}
        try:
            names = nx.lexicographical_topological_sort(self.nx, key=order.__getitem__)
            return [self.node(n) for n in names]
        except nx.NetworkXUnfeasible:
            cycle = nx.find_cycle(self.nx)
            raise GraphError("the graph has a cycle: "
                             + " -> ".join(f"{u} ({k})" for u, _, k in cycle)) from None

    def producer(self, tensor: str) -> Node | None:
        name = self._producer.get(tensor)
        return self.node(name) if name is not None else None

    def consumers(self, tensor: str) -> list[Node]:
        """The nodes that read `tensor`, in topological order."""
        return [n for n in self.nodes() if tensor in n.inputs]

    def constant(self, tensor: str) -> np.ndarray | None:
        """The data of `tensor` if it is a constant, else None."""
        t = self.tensors.get(tensor)
        return None if t is None else t.data

    def count_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes():
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    # --- editing -------------------------------------------------------------------------

    def remove_node(self, name: str):
        node = self.node(name)
        self.nx.remove_node(name)
        for out in node.outputs:
            self._producer.pop(out, None)

    def replace_node(self, node: Node):
        """Put `node` in place of the node of the same name (new inputs, outputs or
        attributes; the networkx edges are recomputed). The output tensors must exist."""
        self.remove_node(node.name)
        self._insert(node)

    def replace_uses(self, old: str, new: str):
        """Make every consumer of tensor `old` (and the graph outputs) read `new`."""
        for node in self.nodes_unordered():
            if old in node.inputs:
                node.inputs = [new if i == old else i for i in node.inputs]
                for u, v, k in list(self.nx.in_edges(node.name, keys=True)):
                    if k == old:
                        self.nx.remove_edge(u, v, key=k)
                if new in self._producer:
                    self.nx.add_edge(self._producer[new], node.name, key=new)
        self.outputs = [new if o == old else o for o in self.outputs]

    def prune(self):
        """Remove nodes whose outputs nobody reads and unused constants."""
        changed = True
        while changed:
            changed = False
            needed = set(self.outputs)
            for node in self.nodes_unordered():
                needed.update(i for i in node.inputs if i)
            for node in self.nodes_unordered():
                if not any(o in needed for o in node.outputs):
                    self.remove_node(node.name)
                    changed = True
        used = set(self.outputs) | set(self.inputs)
        for node in self.nodes_unordered():
            used.update(node.inputs)
            used.update(node.outputs)
        for name in [n for n in self.tensors if n not in used]:
            del self.tensors[name]

    def copy(self) -> "Graph":
        """A deep copy (constants' arrays are shared: passes replace them, never mutate)."""
        out = Graph(self.name)
        out.tensors = {n: copy.copy(t) for n, t in self.tensors.items()}
        out.inputs, out.outputs = list(self.inputs), list(self.outputs)
        out.metadata = copy.deepcopy(self.metadata)
        for node in self.nodes():
            out._insert(Node(node.name, node.op, list(node.inputs), list(node.outputs),
                             copy.deepcopy(node.attrs)))
        out._counter = itertools.count(next(copy.copy(self._counter)))
        return out

    def fingerprint(self) -> str:
        """SHA-256 of everything the graph holds: its inputs and outputs, every tensor
        (name, shape, dtype, scale, layout, and a constant's bytes) and every node in
        order (name, op, inputs, outputs, attributes). Equal graphs give equal
        fingerprints (a cache key: `vdla.compiler.pipeline.quantize_for`)."""
        digest = hashlib.sha256()

        def add(value):
            if isinstance(value, np.ndarray):
                digest.update(f"array {value.dtype} {value.shape}".encode())
                digest.update(np.ascontiguousarray(value).tobytes())
            elif isinstance(value, dict):
                for k in sorted(value, key=str):
                    add(("key", k))
                    add(value[k])
            elif isinstance(value, (list, tuple)):
                digest.update(f"seq {len(value)}".encode())
                for item in value:
                    add(item)
            else:
                digest.update(repr(value).encode())
            digest.update(b"\0")

        add([self.name, self.inputs, self.outputs])
        for name in sorted(self.tensors):
            t = self.tensors[name]
            add([t.name, t.shape, t.dtype, t.scale, t.layout, t.data])
        for node in self.nodes():
            add([node.name, node.op, node.inputs, node.outputs, node.attrs])
        return digest.hexdigest()

    # --- checks --------------------------------------------------------------------------

    def validate(self) -> "Graph":
        """Check the graph is well formed; raise `GraphError` naming what is wrong.

        Checks: no cycles; every node input is a graph input, a constant or produced by
        a node; every output is defined; op arity and attributes; inferred shapes agree
        with recorded ones. Returns the graph, so calls chain."""
        order = self.nodes()                    # raises on a cycle
        for name in self.inputs:
            if name not in self.tensors or self.tensors[name].shape is None:
                raise GraphError(f"graph input {name!r} has no shape")
        for node in order:
            opdef = get_op(node.op)
            opdef.check_arity(node)
            for i, tensor in enumerate(node.inputs):
                if not tensor:
                    continue
                if tensor not in self.tensors:
                    raise GraphError(f"node {node.name!r} ({node.op}) reads {tensor!r}, which "
                                     "is not a tensor of the graph")
                t = self.tensors[tensor]
                if not (t.is_constant or tensor in self.inputs or tensor in self._producer):
                    raise GraphError(f"node {node.name!r} ({node.op}) reads {tensor!r}, which is "
                                     "dangling: no node produces it and it is neither a graph "
                                     "input nor a constant")
            recorded = [self.tensors[o].shape for o in node.outputs]
            infer_node(self, node)
            for out, shape in zip(node.outputs, recorded):
                if shape is not None and self.tensors[out].shape != shape:
                    raise GraphError(f"node {node.name!r} ({node.op}): output {out!r} is recorded "
                                     f"with shape {shape} but its inputs give "
                                     f"{self.tensors[out].shape}")
        for out in self.outputs:
            if out not in self.tensors or not (out in self._producer or out in self.inputs
                                               or self.tensors[out].is_constant):
                raise GraphError(f"graph output {out!r} is not produced by any node")
        return self

    def __repr__(self) -> str:
        return (f"<Graph {self.name!r}: {len(self.nx)} nodes, inputs "
                f"{[(i, self.tensors[i].shape) for i in self.inputs]}, outputs {self.outputs}>")

    def summary(self) -> str:
        """One line per node: name, op, input and output shapes (for humans)."""
        lines = [repr(self)]
        for node in self.nodes():
            ins = ", ".join(f"{i}{list(self.tensors[i].shape or ())}" if i else "-"
                            for i in node.inputs)
            outs = ", ".join(f"{o}{list(self.tensors[o].shape or ())}:{self.tensors[o].dtype}"
                             for o in node.outputs)
            lines.append(f"  {node.name:24s} {node.op:18s} {ins} -> {outs}")
        return "\n".join(lines)
