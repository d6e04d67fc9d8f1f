"""The host target: every node on the numpy reference kernels.

It is the fallback of every other target (a node a target refuses runs here), and a
target of its own (``vdla run MODEL --target host``): the whole quantized model run by
`vdla.compiler.reference`, the integer semantics every back half is checked against, so
its outputs are the reference by construction. It runs every op that has a reference
kernel, float or integer, in either requantization mode; it counts no cycles.
"""

from __future__ import annotations

from typing import Any, Sequence

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.passes.partition import HOST
from vdla.compiler.reference import KERNELS
from vdla.compiler.targets.base import CompiledOp, OpRun, Support, Target, TargetSession

__all__ = ["HOST", "HostTarget"]


class HostTarget(Target):
    """The numpy reference kernels as a target (see the module docstring)."""

    name = HOST
    description = "the numpy reference kernels on the host CPU (the integer reference)"

    def supports(self, node: Node, graph: Graph) -> Support:
        if node.op in KERNELS:
            return Support(True, "numpy reference kernel on the host")
        return Support(False, f"no reference kernel for op {node.op!r}")

    def capabilities(self) -> list[tuple[str, str]]:
        return [("every op", f"with a numpy reference kernel, float or integer: "
                             f"{', '.join(sorted(KERNELS))}")]

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        if schedule is not None:
            raise TypeError(f"the host target has no schedules; node {node.name!r} got "
                            f"{schedule!r}")
        kernel = KERNELS.get(node.op)
        if kernel is None:
            raise ValueError(f"node {node.name!r}: no host kernel for op {node.op!r}")
        return CompiledOp(node.name, node.op, HOST, "", None, kernel)

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> TargetSession:
        return _HostSession(graph)


class _HostSession(TargetSession):
    def __init__(self, graph: Graph):
        self.graph = graph

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        # Kernels read shapes from the graph (flatten and reshape: the output shape).
        return OpRun(op.kernel(node, args, self.graph))
