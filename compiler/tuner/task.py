"""Tuning tasks: one conv2d workload on one hardware config, its schedule space, and
how a schedule of it is measured.

A `TuneTask` holds a self-contained one-node graph (the ``qconv2d``/``qdense`` node, its
weights and bias as constants, its activation and residual as graph inputs), so a worker
process can lower and run it with nothing else; `task_from_workload` makes one from a
ResNet-18 workload (``C5``) or ``H,W,Cin,Cout,k,pad,stride``, `tasks_from_graph` makes one
per distinct workload of a quantized model.

The task's *key* is `vdla.compiler.backend.conv2d_workload` as canonical JSON: the
layer's sizes, pads, strides, block counts and the ALU passes of its epilogue. Two nodes
with the same key have the same schedule space and the same cycles per schedule (the
data does not change the timing), which is why records are keyed on it and why
ResNet-18's 20 convolutions are 12 tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Iterator

import numpy as np

from vdla.compiler.backend.conv2d import Conv2dLayer, Conv2dSchedule, conv2d_workload
from vdla.compiler.backend.cost import (Conv2dEstimate, choose_conv2d, estimate_conv2d,
                                       schedule_space)
from vdla.compiler.graph import Graph, Node
from vdla.config import HardwareConfig

__all__ = ["TUNABLE_OPS", "TuneTask", "schedule_from_dict", "schedule_to_dict",
           "task_from_workload", "tasks_from_graph", "tunable_nodes", "workload_key"]

#: Ops the tuner searches schedules for (pools keep the default chooser: see the README).
TUNABLE_OPS = ("qconv2d", "qdense")

#: Virtual-thread settings (oc_nthread, h_nthread) in the space.
THREADS = ((1, 1), (2, 1), (1, 2))


def workload_key(node: Node, graph: Graph, config: HardwareConfig) -> str:
    """The records' key of `node`: `conv2d_workload` as compact, sorted JSON."""
    return json.dumps(conv2d_workload(node, graph, config), sort_keys=True,
                      separators=(",", ":"))


def schedule_to_dict(schedule: Conv2dSchedule) -> dict:
    return dataclasses.asdict(schedule)


def schedule_from_dict(data: dict) -> Conv2dSchedule:
    """The `Conv2dSchedule` of a record (ValueError naming what is wrong)."""
    fields = {f.name for f in dataclasses.fields(Conv2dSchedule)}
    if not isinstance(data, dict) or set(data) != fields:
        raise ValueError(f"a conv2d schedule record needs exactly the fields "
                         f"{sorted(fields)}, not {data!r}")
    return Conv2dSchedule(**data)


def _alu_passes(workload: dict) -> tuple[int, int]:
    """(passes with an immediate, passes with a vector operand) of the main epilogue,
    the clamp's MAX and MIN included (as `estimate_conv2d` counts them)."""
    steps = workload["epilogue"]
    vec = sum(s.endswith(":row") for s in steps)
    return len(steps) - vec + 2, vec


@dataclasses.dataclass(frozen=True, eq=False)
class TuneTask:
    """One workload to tune.

    name : what the user calls it (``C5``, or the model's node names)
    graph : a one-node graph: the node, its constant weights and bias, its activation
        (and residual) as graph inputs
    node : the node's name in `graph`
    config : the `HardwareConfig` the schedules are for
    Derived: `key` (the records' workload key), `layer` (`Conv2dLayer`), `macs`.
    """

    name: str
    graph: Graph
    node: str
    config: HardwareConfig

    @functools.cached_property
    def workload(self) -> dict:
        return conv2d_workload(self.graph.node(self.node), self.graph, self.config)

    @functools.cached_property
    def key(self) -> str:
        return json.dumps(self.workload, sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def layer(self) -> Conv2dLayer:
        return Conv2dLayer.from_node(self.graph.node(self.node), self.graph, self.config)

    @property
    def macs(self) -> int:
        return self.layer.macs

    @functools.cached_property
    def seed(self) -> int:
        """A seed derived from the key: the task's random inputs are the same in every
        process and every run."""
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "little")

    def space(self) -> list[Conv2dSchedule]:
        """Every schedule that fits the config (`vdla.compiler.backend.cost.schedule_space`
        with every output-width tiling), in a fixed order."""
        return list(schedule_space(self.layer, self.config, threads=THREADS, width_tiles=None))

    def default_schedule(self) -> Conv2dSchedule:
        """What `compile_model` picks without records (the analytical chooser)."""
        return choose_conv2d(self.layer, self.config)

    def estimate(self, schedule: Conv2dSchedule) -> Conv2dEstimate:
        """The analytical timing model's figures for `schedule` (``.cycles`` and their
        split into GEMM, epilogue, load and store)."""
        return estimate_conv2d(self.layer, schedule, self.config,
                               alu_passes=_alu_passes(self.workload))

    def feed(self) -> dict[str, np.ndarray]:
        """Seeded random int8 values for the graph's inputs (activation, residual)."""
        rng = np.random.default_rng(self.seed)
        return {name: rng.integers(-128, 128, self.graph.tensors[name].shape).astype(np.int8)
                for name in self.graph.inputs}

    def describe(self) -> str:
        w = self.workload
        text = (f"{w['n']}x{w['c']}x{w['h']}x{w['w']} -> {w['o']}, "
                f"k{w['kernel_h']}x{w['kernel_w']} s{w['stride_h']}")
        return text + (" +residual" if w["has_residual"] else "")


def _one_node_graph(node: Node, graph: Graph) -> Graph:
    """`node` alone: constants copied, every other input a graph input."""
    g = Graph(f"{graph.name}.{node.name}")
    for name in node.inputs:
        if not name or name in g.tensors:
            continue
        t = graph.tensors[name]
        if t.is_constant:
            g.add_tensor(dataclasses.replace(t))
        else:
            g.add_input(name, t.shape, t.dtype)
    out = g.add_node(node.op, node.inputs, list(node.outputs), name=node.name,
                     **dict(node.attrs))
    g.set_outputs([out] if isinstance(out, str) else out)
    return g


def tunable_nodes(graph: Graph, config: HardwareConfig) -> Iterator[tuple[Node, str]]:
    """(node, workload key) of each ``qconv2d``/``qdense`` node of `graph` the back half
    lowers, in topological order; nodes it cannot lower (they run on the host) are
    skipped."""
    for node in graph.nodes():
        if node.op in TUNABLE_OPS:
            try:
                yield node, workload_key(node, graph, config)
            except ValueError:
                continue


def tasks_from_graph(graph: Graph, config: HardwareConfig) -> list[TuneTask]:
    """One `TuneTask` per distinct workload among the graph's ``qconv2d``/``qdense`` nodes
    (in topological order of their first node; the name lists the nodes sharing it).
    Nodes the back half cannot lower (they run on the host) are skipped."""
    groups: dict[str, list[Node]] = {}
    for node, key in tunable_nodes(graph, config):
        groups.setdefault(key, []).append(node)
    tasks = []
    for nodes in groups.values():
        names = nodes[0].name if len(nodes) == 1 else f"{nodes[0].name} (+{len(nodes) - 1})"
        tasks.append(TuneTask(names, _one_node_graph(nodes[0], graph), nodes[0].name, config))
    return tasks


def task_from_workload(spec: str, config: HardwareConfig) -> TuneTask:
    """The task of a ResNet-18 workload name (``C5``) or ``H,W,Cin,Cout,k,pad,stride``
    (ValueError naming what is wrong), as `vdla.compiler.workloads.workload_graph` builds
    it: bias, requantization shift, ReLU clamp."""
    from vdla.compiler.workloads import parse_workload, workload_graph

    name, workload = parse_workload(spec)
    graph, _ = workload_graph(workload)
    return TuneTask(name, graph, "conv", config)
