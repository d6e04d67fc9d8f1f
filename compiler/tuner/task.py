"""Tuning tasks: what a target offers the tuner, and nothing more.

A `TuneTask` is one workload of one target on one platform (the accelerator's config, a
CPU): its schedule space, the default schedule, an optional estimate, features for the
learned cost model, a plain-dict form of each schedule for the records, and how to
measure one. The search, the records and the runners see only this interface, never a
target's schedule classes: a target's tasks (`Target.tasks(graph)`) are its own
subclasses.

A task is sent to worker processes (pickled), so it holds everything its measurement
needs: usually a one-node graph (`one_node_graph`) with the node's constants.

`OneNodeTask` is that usual task, written once: the key (a workload dict as canonical
JSON), the seed derived from it, seeded inputs, the reference output, the check (int
outputs exactly, float ones within the precision's tolerance,
`vdla.compiler.reference.tolerance`), merging the nodes that share a workload
(`merge_tasks`) and the measurement's steps: compile the schedule through the target's
own compile path, run it once and check it, then time it. A target's task keeps only its
space, default, features, how it compiles and how it times (its measurement backend).

The tasks of a named workload (``C5``, ``H,W,Cin,Cout,k,pad,stride``) come from
`vdla.compiler.tuner.workload_tasks.tasks_from_workload`, which builds its graph in
the front half.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import functools
import hashlib
import json
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference import run_reference
from vdla.compiler.reference.tolerance import TOLERANCES, mismatch
from vdla.compiler.tuner.measure import MeasureResult, one_line
from vdla.compiler.tuner.records import OK

__all__ = ["OneNodeTask", "TaskData", "TuneTask", "canonical", "merge_tasks",
           "one_node_graph"]


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
    cheap_space : whether `space()` is quicker to make than to read back from disk (a
        `vdla.compiler.tuner.space.ProductSpace`, never listed: the CPU's; then
        `vdla.compiler.tuner.candidates.remembered_space` does not remember it)
    remembered_on_disk : whether what is derived from the task's space (its features,
        a pretrained model's predictions and choice: `vdla.compiler.tuner.candidates`)
        is remembered on disk, keyed on the task and on the code of its class (its
        module and every project module it imports, `vdla._keys`: the space, the
        timing model, the features); False for a task whose answers are quick or not
        the same in every process
    """

    target: str
    name: str
    key: str
    platform: str
    nodes: tuple[str, ...]
    measure_backends: tuple[str, ...]
    unit: str = "cycles"
    noisy: bool = False
    cheap_space: bool = False
    remembered_on_disk: bool = False

    # --- the space ----------------------------------------------------------------------

    @abc.abstractmethod
    def space(self) -> Sequence[Hashable]:
        """Every valid schedule, in a fixed order (the same in every process): a list,
        or a `vdla.compiler.tuner.space.ProductSpace` for a space too large to list."""

    @abc.abstractmethod
    def default_schedule(self) -> Hashable:
        """What the target compiles with when the records hold nothing."""

    def strata(self, space) -> list | None:
        """Parts of `space` (arrays of its indices) that the random tuner draws from in
        turn, each in its own random order, so that a small part that runs differently
        (the CPU's blocked layouts and Winograd, a tenth of a layer's space) is sampled
        as often as the rest; None (the default): the space as one."""
        return None

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

    #: The features of `transfer_features` (`vdla.compiler.tuner.features.FeatureSet`),
    #: or None for a task that has none: a cost model that spans tasks, configs and
    #: platforms cannot learn it.
    feature_set: Any = None

    def transfer_features(self, schedule) -> dict[str, float]:
        """`schedule`'s values of `feature_set`, meaning the same on every workload and
        platform of the target (unlike `features`, which serve one task's search).
        ValueError for a task without a feature set."""
        raise ValueError(f"task {self.name} ({self.target}) has no features that span "
                         "tasks and platforms")

    def pretrained(self) -> Any:
        """The cost model of `feature_set` this target ships, trained on other tasks and
        platforms (`vdla.compiler.tuner.cost_model.CostModel`, predicting log2 cost from
        `transfer_features`), or None when it ships none: the pretrained tuner then
        starts from scratch and the pretrained chooser keeps the default."""
        return None

    def platform_key(self) -> Any:
        """Everything about the platform that the space, the features and the costs
        depend on, as JSON data, for keys of what is remembered on disk (default: the
        platform's name)."""
        return self.platform

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

    def side_by_side(self, schedules: Sequence, rounds: int = 3, *,
                     backend: str | None = None) -> np.ndarray:
        """The costs of `schedules` measured in turn, `rounds` times over, in this
        process, on `backend` (default the first of `measure_backends`): a (rounds,
        len(schedules)) array, for comparing schedules of a `noisy` task under the same
        state of the machine (the ratios of a row). This measures each whole (`measure`
        with no context: a target measured by wall time); a target that can time its
        kernels run by run interleaves them finer. ValueError naming a schedule that
        fails."""
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"side_by_side: rounds must be an integer >= 1, not {rounds!r}")
        data = self.measure_data()
        costs = np.empty((rounds, len(schedules)))
        for r in range(rounds):
            for k, schedule in enumerate(schedules):
                got = self.measure(schedule, None, data=data,
                                   backend=backend or self.measure_backends[0])
                if not got.ok:
                    raise ValueError(f"{self.name}: schedule {schedule}: {got.status}: "
                                     f"{got.error}")
                costs[r, k] = got.cycles
        return costs

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


def canonical(workload: Mapping[str, Any]) -> str:
    """A workload as the records' key: compact, sorted JSON (tuples as lists)."""
    return json.dumps(workload, sort_keys=True, separators=(",", ":"), default=list)


@dataclasses.dataclass(frozen=True)
class TaskData:
    """What every measurement of a task reuses, computed once per worker: the seeded
    inputs (graph input -> array) and the reference output."""

    feed: dict[str, np.ndarray]
    want: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class OneNodeTask(TuneTask):
    """A task of one node of a model, measured on a one-node graph (see the module
    docstring).

    name : what users call it; graph : the one-node graph (`one_node_graph`); node : the
    node's name in it; nodes : the model's nodes that share this workload (set by
    `merge_tasks`)

    A subclass provides `workload` (what its cost depends on: the key), the space,
    default, features and knobs of `TuneTask`, and the measurement's two target-specific
    steps: `compile` (the schedule through the target's own compile path), `run` (once,
    checked) and `time` (its measurement backend). `failure` turns an exception into a
    result.
    """

    name: str
    graph: Graph
    node: str
    nodes: tuple[str, ...] = ()

    #: The precision a float node is checked at (`vdla.compiler.reference.tolerance`).
    float_precision = "float32"

    # --- what it is ---------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def workload(self) -> dict:
        """What the cost of a schedule depends on, as JSON values (sizes, epilogue,
        dtypes): two nodes with equal workloads share records."""

    @functools.cached_property
    def key(self) -> str:
        return canonical(self.workload)

    @functools.cached_property
    def seed(self) -> int:
        """A seed derived from the key: the task's inputs are the same in every process
        and every run."""
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "little")

    @property
    def nonnegative(self) -> bool:
        """Whether the node's int8 input (its first) is known non-negative in the model
        (then its seeded values are too, as the kernels may rely on it)."""
        return False

    # --- inputs, reference, check ---------------------------------------------------------

    def feed(self) -> dict[str, np.ndarray]:
        """Seeded values for the graph's inputs: int8 uniform (non-negative for the first
        input where `nonnegative`), floats standard normal."""
        rng = np.random.default_rng(self.seed)
        first = self.graph.node(self.node).inputs[0]
        out = {}
        for name in self.graph.inputs:
            t = self.graph.tensors[name]
            if t.dtype == "int8":
                low = 0 if self.nonnegative and name == first else -128
                out[name] = rng.integers(low, 128, t.shape).astype(np.int8)
            else:
                out[name] = rng.standard_normal(t.shape).astype(DTYPES[t.dtype])
        return out

    def measure_data(self) -> TaskData:
        feed = self.feed()
        return TaskData(feed, np.asarray(run_reference(self.graph, feed)[self.graph.outputs[0]]))

    def check(self, got: np.ndarray, want: np.ndarray) -> str:
        """'' when `got` is the reference output `want` (int exactly, float within
        `float_precision`'s tolerance), else what differs."""
        return mismatch(np.asarray(got), want, TOLERANCES[self.float_precision])

    # --- measuring ----------------------------------------------------------------------

    @abc.abstractmethod
    def compile(self, schedule, backend: str) -> Any:
        """`schedule` compiled for the node through the target's own compile path (what
        `run` and `time` take; closed after the measurement when it has ``close``: a
        target session). ValueError for one that does not fit."""

    @abc.abstractmethod
    def run(self, compiled, context: Any, data: TaskData, backend: str
            ) -> tuple[np.ndarray, Any]:
        """One run of `compiled` on the task's inputs: (the output, what `time` needs)."""

    @abc.abstractmethod
    def time(self, compiled, ran: Any, context: Any, data: TaskData, backend: str
             ) -> tuple[int, dict]:
        """The cost of `compiled` in the task's unit, and counters (JSON values), on
        `backend`; `ran` is what the checked run returned."""

    def failure(self, exc: BaseException, seconds: float) -> MeasureResult:
        """The result of a measurement that raised `exc` (an error, by default)."""
        return MeasureResult("error", error=one_line(exc), seconds=seconds)

    def measure(self, schedule, context: Any = None, *, data: TaskData | None = None,
                backend: str | None = None) -> MeasureResult:
        """Compile `schedule`, run it once and check the output against the reference,
        then time it. Any failure is a result (error, wrong, timeout), not an
        exception."""
        backend = backend or self.measure_backends[0]
        start = time.perf_counter()
        data = data or self.measure_data()
        compiled = None
        try:
            compiled = self.compile(schedule, backend)
            out, ran = self.run(compiled, context, data, backend)
            bad = self.check(out, data.want)
            if bad:
                return MeasureResult("wrong", error=bad, seconds=time.perf_counter() - start)
            cost, counters = self.time(compiled, ran, context, data, backend)
        except Exception as exc:  # noqa: BLE001 - a bad schedule, build or run is a result
            return self.failure(exc, time.perf_counter() - start)
        finally:
            if hasattr(compiled, "close"):    # a session the measurement opened
                compiled.close()
        return MeasureResult(OK, int(cost), counters, seconds=time.perf_counter() - start)
