"""Partitioning: which target runs each node of a graph, and why.

`partition(graph, target)` asks the target about every node (``target.supports(node,
graph)`` -> (ok, reason)) and returns a `Partition`: per node the target that runs it
(the target's name, or ``"host"`` for a node it refuses) and the reason. The target's
answer is the one decision: `vdla.compiler.targets.model.compile_model` compiles exactly
what the partition gives the target and runs the rest on the host. The front half knows
nothing about any target beyond that question.

The result lives in `Partition.targets` and in the graph copy's
``metadata["partition"]`` (node attributes stay untouched: they are the op's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node

__all__ = ["HOST", "Partition", "Supporter", "partition"]

#: Where the nodes a target refuses run: the numpy reference kernels.
HOST = "host"


class Supporter(Protocol):
    """What partitioning asks of a target (`vdla.compiler.targets.base.Target` is one)."""

    name: str

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]: ...


@dataclass
class Partition:
    """The result of `partition`: `graph` (a copy of the input with
    ``metadata["partition"]``), `target` (the name of the target asked), and `targets`:
    node name -> (target name, reason) in topological order."""

    graph: Graph
    target: str
    targets: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _entry(self, node: str) -> tuple[str, str]:
        try:
            return self.targets[node]
        except KeyError:
            raise KeyError(f"partition of graph {self.graph.name!r} has no node {node!r}") \
                from None

    def target_of(self, node: str) -> str:
        """The name of the target that runs the node named `node`."""
        return self._entry(node)[0]

    def reason(self, node: str) -> str:
        """Why the node named `node` runs where it does."""
        return self._entry(node)[1]

    def nodes_on(self, target: str) -> list[str]:
        """Names of the nodes assigned to `target`, in topological order."""
        return [n for n, (t, _) in self.targets.items() if t == target]

    def summary(self) -> dict[str, int]:
        """Node counts per target (the target asked and the host always present)."""
        counts = {self.target: 0, HOST: 0}
        for target, _ in self.targets.values():
            counts[target] = counts.get(target, 0) + 1
        return counts

    def to_dict(self) -> dict:
        """A JSON-ready description: graph name, target, per-node op, target and reason,
        and the summary."""
        return {"graph": self.graph.name, "target": self.target,
                "nodes": [{"node": n, "op": self.graph.node(n).op, "target": t, "reason": r}
                          for n, (t, r) in self.targets.items()],
                "summary": self.summary()}

    def report(self) -> str:
        """A table for humans: node, op, target, reason; then the counts."""
        rows = [(n, self.graph.node(n).op, t, r) for n, (t, r) in self.targets.items()]
        header = ("node", "op", "target", "reason")
        widths = [max([len(header[i])] + [len(row[i]) for row in rows]) for i in range(3)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  reason"]
        lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
        counts = self.summary()
        lines.append(", ".join(f"{t}: {c} node{'s' if c != 1 else ''}"
                               for t, c in counts.items()))
        return "\n".join(lines)


def partition(graph: Graph, target: Supporter) -> Partition:
    """Assign every node of `graph` to `target` (when ``target.supports(node, graph)``
    says yes) or to the host. Returns a `Partition` whose graph is a copy of `graph` with
    ``metadata["partition"]`` = {node: {"target", "reason"}}. Raises TypeError when
    `supports` does not answer (bool, reason string)."""
    g = graph.copy()
    targets: dict[str, tuple[str, str]] = {}
    for node in g.nodes():
        answer = target.supports(node, g)
        if not (isinstance(answer, tuple) and len(answer) == 2
                and isinstance(answer[1], str)):
            raise TypeError(f"{target.name}.supports({node.name!r}) must return (bool, reason "
                            f"string), not {answer!r}")
        ok, reason = answer
        targets[node.name] = (target.name if ok else HOST, reason)
    g.metadata["partition"] = {n: {"target": t, "reason": r} for n, (t, r) in targets.items()}
    return Partition(g, target.name, targets)
