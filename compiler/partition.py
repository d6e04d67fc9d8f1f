"""Which operators run on the accelerator and which on the host.

`partition(graph, config)` asks a `supports(node, graph, config) -> (bool, reason)`
function about every node and returns a `Partition`: per node a target (``"vdla"`` or
``"host"``) and the reason, kept in `Partition.targets` and in the graph copy's
``metadata["partition"]`` (node attributes stay untouched: they are the op's own).

`vdla_supports` describes the accelerator as the vdla back half
(`vdla.compiler.backend`) implements it, without compiling anything: integer GEMM
(qconv2d with groups 1, qdense) with bias, requantization, residual add and clamp
(ReLU) on the vector ALU (MIN, MAX, ADD, SHR; MUL when the config has it); int8 max
pooling (ALU MAX over the window); average pooling (window sums on the GEMM core, then
requantization on the ALU). A standalone ReLU or add (one `passes.fuse` could not fold
into a convolution's epilogue) runs on the host. Requantization shifts travel as ALU
immediates, so they must fit its signed field. `compile_model` makes the final decision:
it also falls back to the host when the lowering itself refuses a node (a pad as large as
the kernel, dilation, a schedule that does not fit), with the lowering's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vdla.compiler.graph import Graph, Node
from vdla.config import ISA_FIXED_WIDTHS, AluOp

__all__ = ["HOST", "Partition", "VDLA", "partition", "vdla_supports"]

VDLA = "vdla"
HOST = "host"

Supports = Callable[[Node, Graph, object], tuple[bool, str]]

# Ops with a clear host-side reason (anything not listed and not supported: generic).
_HOST_REASONS = {
    "quantize": "float -> int conversion runs on the host",
    "dequantize": "int -> float conversion runs on the host",
    "softmax": "softmax needs exp and division: no accelerator kernel",
    "lrn": "local response normalization needs powers and division: no accelerator kernel",
    "pad": "standalone padding: the host pads (the accelerator pads only inside DMA loads)",
    "flatten": "reshaping is data movement the host does",
    "reshape": "reshaping is data movement the host does",
    "transpose": "transposition is data movement the host does",
    "concat": "concatenation is data movement the host does",
    "layout_transform": "packing to and from blocked layouts is done by the runtime on the "
                        "host side of the DMA, not by an accelerator instruction",
}


# Elementwise ops the back half runs only inside a convolution's epilogue.
_UNFUSED = {
    "relu": ("standalone ReLU: the back half applies ReLU as the clamp of the convolution "
             "that produces it (passes.fuse folds it there); this one runs on the host"),
    "qadd": ("standalone add: the back half adds a residual in the epilogue of the "
             "convolution that produces the other operand (passes.fuse folds it there); "
             "this one runs on the host"),
}


def _imm_range(config) -> tuple[int, int]:
    """Signed range of the ALU immediate, its width taken from the config's ALU
    instruction layout (the ISA's fixed width for objects without one)."""
    bits = ISA_FIXED_WIDTHS["imm"]
    if hasattr(config, "insn_field_widths"):
        low, high = config.insn_field_widths()["ALU"]
        bits = dict(low + high).get("imm", bits)
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _requant_problems(node: Node, config, multipliers, shifts) -> str | None:
    """Why the requantization given by the attributes named in `multipliers` and `shifts`
    cannot run on the ALU of `config`, or None when it can."""
    has_mul = AluOp.MUL in config.alu_ops
    for key in multipliers:
        if node.attrs.get(key) is not None and not has_mul:
            return (f"{key} is set (fixed-point requantization) but this config's ALU has "
                    f"no MUL (alu_ops: {', '.join(sorted(op.name for op in config.alu_ops))})")
    lo, hi = _imm_range(config)
    # Multipliers and shifts both travel as the ALU instruction's immediate.
    for key in tuple(multipliers) + tuple(shifts):
        value = node.attrs.get(key)
        if value is None:
            continue
        values = np.atleast_1d(np.asarray(value, dtype=np.int64))
        if values.size and (values.min() < lo or values.max() > hi):
            shown = int(values[0]) if values.size == 1 else \
                f"{int(values.min())}..{int(values.max())}"
            return (f"{key} {shown} does not fit the ALU's signed immediate [{lo}, {hi}]")
    return None


def _int8_input(graph: Graph, node: Node) -> bool:
    return graph.tensors[node.inputs[0]].dtype == "int8"


def vdla_supports(node: Node, graph: Graph, config) -> tuple[bool, str]:
    """Whether the accelerator described by `config` (a `vdla.HardwareConfig`) runs
    `node` of `graph`, and why (or why not)."""
    op = node.op
    if op in ("qconv2d", "qdense"):
        if op == "qconv2d" and int(node.attrs["groups"]) != 1:
            return False, (f"grouped/depthwise convolution (groups={node.attrs['groups']}): "
                           "the GEMM core has no grouped mode")
        problem = _requant_problems(node, config, ("multiplier", "residual_multiplier"),
                                    ("shift", "residual_shift"))
        if problem:
            return False, problem
        what = "convolution" if op == "qconv2d" else "matrix product"
        extras = ["bias"] * bool(node.input(2)) + ["residual add"] * bool(node.input(3))
        return True, (f"int8 {what} on the GEMM core; "
                      + ", ".join(extras + ["requantization and clamp on the ALU"]))
    if op in _UNFUSED:
        return False, _UNFUSED[op]
    if op in ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d"):
        if not _int8_input(graph, node):
            return False, (f"{op} on {graph.tensors[node.inputs[0]].dtype}: the accelerator "
                           "pools int8 data only")
        block_in, block_out = getattr(config, "block_in", 1), getattr(config, "block_out", 1)
        if block_out % block_in:
            return False, (f"{op}: pooling needs block_out ({block_out}) to be a multiple of "
                           f"block_in ({block_in}): identity weights map whole input blocks "
                           "into an output block")
        if op == "max_pool2d":
            return True, "int8 max pooling: ALU MAX over the window"
        problem = _requant_problems(node, config, ("multiplier",), ("shift",))
        if problem:
            return False, problem
        return True, ("int8 average pooling: window sum on the GEMM core, requantization "
                      "on the ALU")
    if op in _HOST_REASONS:
        return False, _HOST_REASONS[op]
    dtypes = {graph.tensors[i].dtype for i in node.inputs if i}
    if "float32" in dtypes:
        return False, f"float {op}: the accelerator computes on int8 data only"
    return False, f"no accelerator kernel for {op}"


@dataclass
class Partition:
    """The result of `partition`: `graph` (a copy of the input with
    ``metadata["partition"]``), `config`, and `targets`: node name -> (target, reason)
    in topological order."""

    graph: Graph
    config: object
    targets: dict[str, tuple[str, str]] = field(default_factory=dict)

    def target(self, node: str) -> str:
        """The target ("vdla" or "host") of the node named `node`."""
        try:
            return self.targets[node][0]
        except KeyError:
            raise KeyError(f"partition of graph {self.graph.name!r} has no node {node!r}") \
                from None

    def nodes_on(self, target: str) -> list[str]:
        """Names of the nodes assigned to `target`, in topological order."""
        return [n for n, (t, _) in self.targets.items() if t == target]

    def summary(self) -> dict[str, int]:
        """Node counts per target (both targets always present)."""
        counts = {VDLA: 0, HOST: 0}
        for target, _ in self.targets.values():
            counts[target] = counts.get(target, 0) + 1
        return counts

    def to_dict(self) -> dict:
        """A JSON-ready description: graph name, config name, per-node op, target and
        reason, and the summary."""
        return {"graph": self.graph.name,
                "config": getattr(self.config, "name", str(self.config)),
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


def partition(graph: Graph, config, *, supports: Supports | None = None) -> Partition:
    """Assign every node of `graph` to the accelerator ("vdla") or the host ("host").

    `supports(node, graph, config) -> (bool, reason)` decides (default `vdla_supports`;
    a back half passes its own). Returns a `Partition` whose graph is a copy of `graph`
    with ``metadata["partition"]`` = {node: {"target", "reason"}}."""
    supports = supports or vdla_supports
    g = graph.copy()
    targets: dict[str, tuple[str, str]] = {}
    for node in g.nodes():
        answer = supports(node, g, config)
        if not (isinstance(answer, tuple) and len(answer) == 2
                and isinstance(answer[1], str)):
            raise TypeError(f"supports({node.name!r}) must return (bool, reason string), "
                            f"not {answer!r}")
        ok, reason = answer
        targets[node.name] = (VDLA if ok else HOST, reason)
    g.metadata["partition"] = {n: {"target": t, "reason": r} for n, (t, r) in targets.items()}
    return Partition(g, config, targets)
