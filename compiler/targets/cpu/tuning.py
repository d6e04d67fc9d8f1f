"""The CPU target's tunable tasks: one convolution or dense workload on this machine.

A `CpuTask` holds a one-node graph (the node with its constants, its activation and
residual as graph inputs) and measures a schedule by wall time: it builds the node's
kernel with the schedule (cached by content hash: a schedule's build is shared by every
model with that layer shape), checks one run against the reference (int8 bit-exact,
float within 1e-4 relative), then runs it `MIN_RUNS` times or for `MIN_SECONDS`,
whichever is longer (at most `MAX_RUNS`), each run with the layer's weights evicted
from the caches first (as inside a model), and reports the median in nanoseconds, with
the spread in the counters. The median of many runs on an idle machine is what makes a
wall-time tuner usable: measure with one job (``vdla tune --jobs 1``, the default), so
that no other measurement shares the cores.

The workload key is the layer's `ConvShape` / `DenseShape` (sizes, groups, epilogue,
whether the input is known non-negative) as canonical JSON; the platform is the CPU's
name, the thread count and the instruction set, so records taken on one machine or
thread count are never used for another.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import platform
import time
from typing import Any, Callable

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.reference import run_reference
from vdla.compiler.reference.tolerance import mismatch
from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu.library import (aligned_empty, build_kernels, call, load,
                                               start_team, time_runs)
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.schedule import (ORDERS, PARALLEL, ConvSchedule, DenseSchedule,
                                                ScheduleError, choose_conv, choose_dense,
                                                conv_space, dense_space, estimate_conv)
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape, input_nonnegative
from vdla.compiler.tuner.measure import MeasureResult, one_line
from vdla.compiler.tuner.records import OK
from vdla.compiler.tuner.task import TuneTask, merge_tasks, one_node_graph

__all__ = ["CpuTask", "MIN_RUNS", "MIN_SECONDS", "cpu_name", "cpu_tasks"]

#: A measurement runs the kernel at least this many times ...
MIN_RUNS = 7
#: ... and for at least this long, but at most `MAX_RUNS` times.
MIN_SECONDS = 0.15
MAX_RUNS = 400

_TUNABLE = ("conv2d", "qconv2d", "dense", "qdense")


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@dataclasses.dataclass(frozen=True)
class _Estimate:
    cycles: float


@dataclasses.dataclass(frozen=True, eq=False)
class CpuTask(TuneTask):
    """One convolution or dense workload on this machine.

    name : what users call it; graph : a one-node graph; node : the node's name
    isa : the instruction set's name; threads : the thread count it is measured with
    nonnegative : whether the model's input to the node is known non-negative (int8)
    nodes : the model's nodes that share this workload
    """

    name: str
    graph: Graph
    node: str
    isa: str
    threads: int
    nonnegative: bool
    nodes: tuple[str, ...] = ()

    target = "cpu"
    measure_backends = ("wall",)
    unit = "ns"
    noisy = True

    @functools.cached_property
    def _isa(self):
        return cpu_isa.get(self.isa)

    @property
    def conv(self) -> bool:
        return self.graph.node(self.node).op.endswith("conv2d")

    @functools.cached_property
    def shape(self):
        node = self.graph.node(self.node)
        cls = ConvShape if self.conv else DenseShape
        return cls.from_node(node, self.graph, nonnegative=self.nonnegative)

    @property
    def platform(self) -> str:
        return f"{cpu_name()}, {self.threads} threads, {self.isa}"

    @functools.cached_property
    def key(self) -> str:
        workload = {"op": "conv2d" if self.conv else "dense", **dataclasses.asdict(self.shape)}
        return json.dumps(workload, sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "little")

    def describe(self) -> str:
        return f"{self.shape.dtype} {self.shape.describe()}"

    # --- the space --------------------------------------------------------------------------

    def space(self) -> list:
        if self.conv:
            return list(conv_space(self.shape, self._isa))
        return list(dense_space(self.shape, self._isa))

    def default_schedule(self):
        if self.conv:
            return choose_conv(self.shape, self._isa, self.threads)
        return choose_dense(self.shape, self._isa)

    def estimate(self, schedule) -> _Estimate:
        """The chooser's cost model (relative: padded multiply-adds, extra input vectors,
        idle threads), on the scale of nanoseconds at a nominal rate."""
        if self.conv:
            return _Estimate(estimate_conv(self.shape, schedule, self.threads))
        return _Estimate(float(self.shape.macs) / 8 / schedule.ov ** 0.25)

    def knobs(self, s) -> tuple[int, ...]:
        if self.conv:
            return (s.vl, s.mr, s.nv, s.tile_co, s.tile_h, s.tile_ci, ORDERS.index(s.order),
                    s.unroll, PARALLEL.index(s.parallel))
        return (s.vl, s.ov, s.unroll, int(s.parallel == "none"))

    def features(self, s, estimate: Any = None) -> list[float]:
        shape = self.shape
        if self.conv:
            grid = shape.ho * shape.grid_pitch
            tiles = math.ceil(shape.og_padded(s.mr) / s.tile_co)
            rows = math.ceil(shape.ho / s.tile_h)
            items = shape.groups * tiles * rows
            feats = [float(s.vl), float(s.mr), float(s.nv), math.log2(s.mr * s.nv),
                     math.log2(s.tile_co / s.mr), math.log2(s.tile_h),
                     s.tile_ci / shape.cg_padded, float(ORDERS.index(s.order)),
                     float(s.unroll), float(PARALLEL.index(s.parallel)),
                     shape.og_padded(s.mr) / shape.og - 1.0,
                     math.ceil(s.tile_h * shape.grid_pitch / (s.nv * s.vl)) * s.nv * s.vl
                     / (s.tile_h * shape.grid_pitch) - 1.0,
                     math.ceil(items / self.threads) * self.threads / items - 1.0,
                     math.log2(max(1, grid))]
        else:
            feats = [float(s.vl), float(s.ov), float(s.unroll), float(s.parallel == "none"),
                     math.ceil(shape.o / (s.vl * s.ov)) * s.vl * s.ov / shape.o - 1.0]
        if estimate is not None:
            feats.append(math.log(max(estimate.cycles, 1e-9)))
        return feats

    def schedule_to_dict(self, schedule) -> dict:
        return schedule.to_dict()

    def schedule_from_dict(self, data: dict):
        return (ConvSchedule if self.conv else DenseSchedule).from_dict(data)

    # --- measuring -----------------------------------------------------------------------

    def feed(self) -> dict[str, np.ndarray]:
        """Seeded random values for the graph's inputs (int8 non-negative where the
        model's are)."""
        rng = np.random.default_rng(self.seed)
        node = self.graph.node(self.node)
        out = {}
        for name in self.graph.inputs:
            t = self.graph.tensors[name]
            if t.dtype == "int8":
                low = 0 if (self.nonnegative and name == node.inputs[0]) else -128
                out[name] = rng.integers(low, 128, t.shape).astype(np.int8)
            else:
                out[name] = rng.standard_normal(t.shape).astype(DTYPES[t.dtype])
        return out

    def measure_data(self) -> "_TaskData":
        return _TaskData(self)

    def open_context(self, backend: str):
        return None

    def kernel(self, schedule):
        """The node's kernel with `schedule` (as the target lowers it)."""
        return node_kernel(self.graph.node(self.node), self.graph, self._isa,
                           schedule=schedule, threads=self.threads,
                           nonnegative=self.nonnegative)[0]

    def measure(self, schedule, context: Any = None, *, data: Any = None,
                backend: str = "wall", log: Callable[[str], None] | None = None
                ) -> MeasureResult:
        """Build the kernel with `schedule`, check one run against the reference, then
        time it (see the module docstring). Failures are results, not exceptions."""
        start = time.perf_counter()
        data = data or _TaskData(self)
        try:
            kernel = self.kernel(schedule)
            lib = load(build_kernels([kernel], self._isa, log=log))
            start_team(lib, self.threads)
            ws = aligned_empty(max(kernel.workspace(self.threads), 64))
            params = aligned_empty(max(kernel.params.size, 64))
            params[:kernel.params.size] = kernel.params
            kernel = dataclasses.replace(kernel, params=params)
            inputs = [data.feed[t] for t in kernel.inputs]
            out = np.empty_like(data.want)
            call(lib, kernel, inputs, out, workspace=ws, threads=self.threads)
        except ScheduleError as exc:
            return MeasureResult("error", error=one_line(exc),
                                 seconds=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a failed build is a result
            return MeasureResult("error", error=one_line(exc),
                                 seconds=time.perf_counter() - start)
        bad = mismatch(out, data.want)
        if bad:
            return MeasureResult("wrong", error=bad, seconds=time.perf_counter() - start)
        ns = _time(lambda runs: time_runs(lib, kernel, inputs, out, ws, runs)) * 1e9
        return MeasureResult(OK, int(round(float(np.median(ns)))), {
            "runs": int(ns.size), "min_ns": int(ns.min()),
            "p25_ns": int(np.percentile(ns, 25)), "p75_ns": int(np.percentile(ns, 75))},
            seconds=time.perf_counter() - start)


def _time(runs: Callable[[int], np.ndarray]) -> np.ndarray:
    """Wall times (seconds) of repeated runs after two warm-up runs, timed in C by
    `runs(n)`, in batches until `MIN_RUNS` runs and `MIN_SECONDS` (at most `MAX_RUNS`)."""
    runs(2)
    times = runs(MIN_RUNS)
    while times.size < MAX_RUNS and times.sum() < MIN_SECONDS:
        mean = max(float(times.mean()), 1e-7)
        more = int(min(MAX_RUNS - times.size, max(1, (MIN_SECONDS - times.sum()) / mean)))
        times = np.concatenate([times, runs(more)])
    return times


class _TaskData:
    """A task's inputs and reference output, computed once per worker."""

    def __init__(self, task: CpuTask):
        self.feed = task.feed()
        self.want = np.asarray(run_reference(task.graph, self.feed)[task.graph.outputs[0]])


def cpu_tasks(graph: Graph, target) -> list[CpuTask]:
    """One `CpuTask` per distinct conv/dense workload of `graph` that `target` (a
    `CpuTarget`) runs, in the order of their first node."""
    found = []
    for node in graph.nodes():
        if node.op not in _TUNABLE or not target.supports(node, graph).ok:
            continue
        nonneg = node.op.startswith("q") and input_nonnegative(graph, node.inputs[0])
        found.append((CpuTask(node.name, one_node_graph(node, graph), node.name,
                              target.isa.name, target.team, nonneg), node))
    return merge_tasks(found)
