"""The timing model over a whole graph: the cycles every op the accelerator runs would
take, without lowering anything.

    ops = estimate_graph(quantized, config)             # [OpEstimate], in graph order
    total = sum(op.cycles for op in ops)

This is what a design-space sweep evaluates per design point (`vdla.dse`): it decides
which nodes run on the accelerator the way `VdlaTarget.supports` does, picks each one's
schedule as compilation would (the given schedule, else the default chooser) and asks
each op family's timing model (`timing` for the convolutions, `pool`, `elementwise`) for
its cycles, with the epilogue's ALU passes the tuner's tasks count
(`conv_layer.alu_passes`). No program is emitted, so a ResNet-18 takes well under a
second per config once the chooser has ranked its layers' tilings for the config's
block shape and ALU (`conv_layer.choose_conv2d`: configs that differ only in their
buffers share that ranking) or its on-disk cache answers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.attention import SPLIT_FROM
from vdla.compiler.targets.vdla.conv_layer import (Conv2dLayer, alu_passes, choose_conv2d,
                                                   conv2d_workload, residual_passes)
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.compiler.targets.vdla.elementwise import (ELEMENTWISE_OPS, choose_elementwise,
                                                    elementwise_layer, estimate_elementwise)
from vdla.compiler.targets.vdla.placement import VIEW_OPS
from vdla.compiler.targets.vdla.softmax import (choose_softmax, estimate_softmax,
                                                softmax_layer)
from vdla.compiler.targets.vdla.pool import (POOL_OPS, choose_pool2d, estimate_pool2d,
                                             pool2d_layer)
from vdla.config import HardwareConfig

__all__ = ["OpEstimate", "estimate_graph", "estimate_node"]


@dataclasses.dataclass(frozen=True)
class OpEstimate:
    """One node's estimate.

    name, op : the node
    target : ``"vdla"`` or ``"host"`` (host ops have no cycles)
    reason : why the node runs where it does (the target's own words)
    cycles : the timing model's cycles on the accelerator (None on the host)
    macs : the useful multiply-accumulates of a GEMM op (0 for pools and elementwise ops,
        None on the host)
    schedule : the schedule estimated, as a dict (None on the host and for views: concat,
        flatten, which take no cycles)
    origin : the node of the graph given that this one is part of, where the target
        rewrote it (an attention split into its heads' products, `attention.SPLIT_FROM`),
        else the node's own name
    """

    name: str
    op: str
    target: str
    reason: str
    cycles: int | None
    macs: int | None
    schedule: dict | None
    origin: str = ""

    def __post_init__(self):
        if not self.origin:
            object.__setattr__(self, "origin", self.name)


def estimate_graph(graph: Graph, target, *, schedules: Mapping[str, Any] | None = None,
                   bytes_per_cycle: float | None = None) -> list[OpEstimate]:
    """Estimate every node of `graph` (quantized, plain layouts) on `target` (a
    `VdlaTarget`; its config and its DRAM model's bandwidth and read latency, if it has
    one).

    schedules : node name -> schedule to estimate instead of the default chooser's
    bytes_per_cycle : the DRAM bandwidth per direction; default: the target's DRAM model
        (``device_options["dram"]``), else the config's `dram_bytes_per_cycle`
    """
    bytes_per_cycle = _bandwidth(target, bytes_per_cycle)
    schedules = dict(schedules or {})
    origins = graph.metadata.get(SPLIT_FROM, {})
    out = []
    for node in graph.nodes():
        ok, reason = target.supports(node, graph)
        if not ok:
            e = OpEstimate(node.name, node.op, "host", reason, None, None, None)
        else:
            e = estimate_node(node, graph, target, schedules.get(node.name),
                              bytes_per_cycle=bytes_per_cycle, reason=reason)
        out.append(dataclasses.replace(e, origin=origins.get(node.name, node.name)))
    return out


def estimate_node(node: Node, graph: Graph, target, schedule: Any = None, *,
                  bytes_per_cycle: float | None = None, reason: str = "") -> OpEstimate:
    """The estimate of one node `target` supports, with `schedule` (default: the default
    chooser's); `bytes_per_cycle` as in `estimate_graph`."""
    config: HardwareConfig = target.config
    bytes_per_cycle = _bandwidth(target, bytes_per_cycle)
    latency = _read_latency(target)
    if node.op in VIEW_OPS:    # no program: its producers write where readers look
        return OpEstimate(node.name, node.op, "vdla", reason, 0, 0, None)
    if node.op in POOL_OPS:
        layer, _, _ = pool2d_layer(node, graph, config)
        schedule = schedule or choose_pool2d(layer, config)
        cycles = estimate_pool2d(layer, schedule, config, bytes_per_cycle=bytes_per_cycle,
                                 read_latency=latency)
        macs = 0
    elif node.op in ELEMENTWISE_OPS:
        layer, _ = elementwise_layer(node, graph, config)
        schedule = schedule or choose_elementwise(layer, config)
        cycles = estimate_elementwise(layer, schedule, config, bytes_per_cycle=bytes_per_cycle,
                                      read_latency=latency)
        macs = 0
    elif node.op == "qsoftmax":
        layer, _ = softmax_layer(node, graph, config)
        schedule = schedule or choose_softmax(layer, config)
        cycles = estimate_softmax(layer, schedule, config, bytes_per_cycle=bytes_per_cycle,
                                  read_latency=latency)
        macs = 0
    else:
        workload = conv2d_workload(node, graph, config)
        layer = Conv2dLayer.from_node(node, graph, config)
        schedule = schedule or choose_conv2d(layer, config)
        cycles = estimate_conv2d(layer, schedule, config, alu_passes=alu_passes(workload),
                                 residual_passes=residual_passes(workload),
                                 bytes_per_cycle=bytes_per_cycle, read_latency=latency).cycles
        macs = layer.macs
    return OpEstimate(node.name, node.op, "vdla", reason, int(cycles), macs,
                      dataclasses.asdict(schedule))


def _bandwidth(target, bytes_per_cycle: float | None) -> float:
    """`bytes_per_cycle`, else the target's DRAM model's, else its config's."""
    if bytes_per_cycle is not None:
        return bytes_per_cycle
    dram = target.device_options.get("dram")
    return target.config.dram_bytes_per_cycle if dram is None else float(dram.bytes_per_cycle)


def _read_latency(target) -> int | None:
    """The read latency of the target's DRAM model, in cycles; None (the simulated
    DRAM's default, `common.READ_LATENCY`) without one."""
    dram = target.device_options.get("dram")
    return None if dram is None else int(dram.read_latency)
