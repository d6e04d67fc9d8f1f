"""Tuning tasks: what a target offers the tuner, and nothing more.

A `TuneTask` is one workload of one target on one platform (the accelerator's config, a
CPU): its schedule space, the default schedule, an optional estimate, features for the
learned cost model, a plain-dict form of each schedule for the records, and how to
measure one. The search, the records and the runners see only this interface, never a
target's schedule classes: a target's tasks (`Target.tasks(graph)`) are its own
subclasses.

A task is sent to worker processes (pickled), so it holds everything its measurement
needs: usually a one-node graph (`one_node_graph`) with the node's constants.

`tasks_from_workload(spec, target)` makes the tasks of one ResNet-18 workload (``C5``):
the target's own tasks of ResNet-18's layers of that shape, quantized as ``vdla run
resnet18`` quantizes them, so their records serve that model; or of
``H,W,Cin,Cout,k,pad,stride``: the task of a synthetic one-node graph
(`vdla.compiler.frontend.workloads`).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import Any, Callable, Hashable, Sequence

from vdla.compiler.frontend.workloads import (RESNET18, conv_matches, model_graph,
                                              parse_workload, workload_graph)
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.tuner.measure import MeasureResult

__all__ = ["RESIDUAL_SUFFIX", "TuneTask", "merge_tasks", "one_node_graph",
           "tasks_from_workload"]

#: Appended to a named workload's task whose nodes add a residual (``C8+residual``).
RESIDUAL_SUFFIX = "+residual"


class TuneTask(abc.ABC):
    """One workload to tune (see the module docstring).

    Attributes a subclass provides:

    target : the target's name (records are keyed by it)
    name : what users call the workload (``C5``, or the model's node names)
    key : the workload key (records): two tasks with the same key have the same space
        and the same cost per schedule
    platform : the hardware the costs are measured on (records' ``config`` column: the
        accelerator's config name)
    nodes : the names of the graph nodes this task's best schedule applies to
    measure_backends : how it can be measured (``verilator``, ``functional``, ...), the
        first being the default
    unit : what its costs count (``cycles``, ``ns``)
    noisy : whether measuring a schedule twice can give different costs (wall time); the
        tuner then confirms its best candidates by measuring them again
        (`vdla.compiler.tuner.tune.tune_task`)
    """

    target: str
    name: str
    key: str
    platform: str
    nodes: tuple[str, ...]
    measure_backends: tuple[str, ...]
    unit: str = "cycles"
    noisy: bool = False

    # --- the space ----------------------------------------------------------------------

    @abc.abstractmethod
    def space(self) -> list[Hashable]:
        """Every valid schedule, in a fixed order (the same in every process)."""

    @abc.abstractmethod
    def default_schedule(self) -> Hashable:
        """What the target compiles with when the records hold nothing."""

    def estimate(self, schedule) -> Any:
        """A model's prediction for `schedule`, an object with a ``cycles`` attribute in
        the task's unit (lower is better), or None when the target has no model."""
        return None

    @abc.abstractmethod
    def features(self, schedule, estimate: Any = None) -> list[float]:
        """Numbers describing `schedule` for the learned cost model; `estimate` is
        `estimate(schedule)` when the tuner uses the model's figures, else None. Every
        schedule of a task has the same number of features for the same `estimate`
        kind."""

    @abc.abstractmethod
    def knobs(self, schedule) -> tuple[int, ...]:
        """`schedule` as a point of the knob grid (one integer per knob, ordered within a
        knob): simulated annealing moves between neighbouring points."""

    @abc.abstractmethod
    def schedule_to_dict(self, schedule) -> dict:
        """`schedule` as a plain JSON dict (what the records keep)."""

    @abc.abstractmethod
    def schedule_from_dict(self, data: dict) -> Hashable:
        """The schedule of a records dict; ValueError naming what is wrong."""

    def describe(self) -> str:
        """The workload in a few words, for tables."""
        return self.key

    def with_name(self, name: str) -> "TuneTask":
        """A copy of this task named `name`."""
        clone = copy.copy(self)
        object.__setattr__(clone, "name", name)   # tasks may be frozen dataclasses
        return clone

    # --- measuring (in worker processes) -------------------------------------------------

    def prepare(self, backend: str, log: Callable[[str], None]) -> None:
        """Once per platform in the parent process, before workers start (the
        accelerator builds its Verilator model here, once rather than once per worker)."""

    def context_key(self, backend: str) -> Hashable:
        """Tasks with the same context key share one measurement context per worker."""
        return (self.target, self.platform, backend)

    def open_context(self, backend: str) -> Any:
        """What measurements on `backend` run on, opened once per worker (a device); it
        is closed with the worker when it has a ``close`` method."""
        return None

    def measure_data(self) -> Any:
        """What every measurement of this task reuses (inputs, the reference output),
        computed once per worker."""
        return None

    @abc.abstractmethod
    def measure(self, schedule, context: Any, *, data: Any, backend: str) -> MeasureResult:
        """Measure `schedule` on `context` and check its output against the reference.
        Any failure is a result with its status (error, wrong, timeout), not an
        exception."""

    @property
    def uid(self) -> tuple[str, str, str]:
        """What identifies the task across processes: (target, platform, key)."""
        return (self.target, self.platform, self.key)


def merge_tasks(found: Sequence[tuple[TuneTask, Node]]) -> list[TuneTask]:
    """One task per distinct workload (`TuneTask.key`) among `found`, a target's (task,
    node) pairs in graph order: the first node's task, applying to every node with that
    key and named after the first (``layer1.0.conv1 (+3)``), in the order of first use."""
    groups: dict[str, list] = {}
    for task, node in found:
        groups.setdefault(task.key, []).append((task, node))
    tasks = []
    for members in groups.values():
        task, first = members[0]
        names = tuple(n.name for _, n in members)
        name = first.name if len(names) == 1 else f"{first.name} (+{len(names) - 1})"
        tasks.append(dataclasses.replace(task, name=name, nodes=names))
    return tasks


def one_node_graph(node: Node, graph: Graph) -> Graph:
    """`node` of `graph` alone: its constants copied, every other input a graph input,
    its outputs the graph outputs. A task's measurement needs nothing else."""
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


def tasks_from_workload(spec: str, target) -> list:
    """The tasks (`TuneTask`) of a workload on `target` (a
    `vdla.compiler.targets.Target`), named after it.

    spec : a ResNet-18 workload name (``C5``, any case): the target's tasks of
        ResNet-18's own layers of that shape, epilogue included
        (`vdla.compiler.frontend.workloads.model_graph`, quantized for the target's first
        requantization mode, as ``vdla run`` does). One name may give several tasks: a
        task whose nodes all add a residual is named with `RESIDUAL_SUFFIX`
        (``C8+residual``), and a further task of the same name gets ``#2``, ``#3``.
        Or ``H,W,Cin,Cout,k,pad,stride``: the one task of the synthetic one-node graph
        `workload_graph` builds (bias, per-tensor requantization shift, ReLU clamp), named
        `spec`; its records serve only a model layer with that same epilogue.
    target : the target whose tasks these are
    Raises ValueError naming what is wrong, or when the target cannot tune the workload."""
    name, workload = parse_workload(spec)
    if name not in RESNET18:
        tasks = target.tasks(workload_graph(workload)[0])
        if len(tasks) != 1:
            raise ValueError(f"target {target.name!r} has no tunable task for workload "
                             f"{spec!r} ({workload}): it does not run that convolution")
        return [tasks[0].with_name(name)]
    graph = model_graph(target.requant_modes[0])
    found = []
    for task in target.tasks(graph):
        nodes = [graph.node(n) for n in task.nodes if conv_matches(graph.node(n), graph,
                                                                   workload)]
        if not nodes:
            continue
        # The suffix tells the epilogues apart, which is what makes these separate tasks.
        base = name + (RESIDUAL_SUFFIX if all(n.input(3) for n in nodes) else "")
        taken = sum(t.name == base or t.name.startswith(base + "#") for t in found)
        found.append(task.with_name(base if not taken else f"{base}#{taken + 1}"))
    if not found:
        raise ValueError(f"target {target.name!r} has no tunable task for workload {name} "
                         f"({workload}): it does not run that layer of ResNet-18")
    return found
