"""The accelerator's tunable tasks: one convolution (or dense) workload on one config.

A `ConvTask` holds a self-contained one-node graph (the ``qconv2d``/``qdense`` node, its
weights and bias as constants, its activation and residual as graph inputs), so a worker
process can lower and run it with nothing else. `conv_tasks(graph, target)` makes one per
distinct workload of a quantized model, among the nodes the target runs.

The task's *key* is `conv2d_workload` as canonical JSON: the layer's sizes, pads,
strides, block counts and the ALU passes of its epilogue. Two nodes with the same key
have the same schedule space and the same cycles per schedule (the data does not change
the timing), which is why records are keyed on it and why ResNet-18's 21
convolution/dense nodes are 16 tasks.

Measurement backends:

* ``verilator``: cycles of the cycle-accurate model and the hardware counters;
* ``functional``: the fast mode: the program runs on the functional simulator (so it is
  checked bit-exactly) and the cycles are the analytical timing model's.

Either way the output is compared with the reference bit-exactly; a wrong output, a
simulator error or a run past its cycle budget is a result, not an exception.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from typing import Any, Callable

import numpy as np

import vdla.runtime
from vdla.compiler.ir.graph import Graph
from vdla.compiler.reference import run_reference
from vdla.compiler.targets.vdla.common import ceil_div
from vdla.compiler.targets.vdla.conv import lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import (Conv2dEstimate, Conv2dLayer, Conv2dSchedule,
                                                   alu_passes, choose_conv2d, conv2d_workload,
                                                   estimate_conv2d, schedule_space)
from vdla.compiler.tuner.measure import MeasureResult, one_line
from vdla.compiler.tuner.records import OK
from vdla.compiler.tuner.task import TuneTask, one_node_graph
from vdla.config import HardwareConfig
from vdla.sim.errors import WatchdogError
from vdla.sim.verilator.build import build_model

__all__ = ["BACKENDS", "THREADS", "ConvTask", "conv_tasks", "cycle_budget"]

#: How a schedule can be measured: on a device of each backend, the cycle-accurate one
#: first (the default).
BACKENDS = ("verilator",) + tuple(b for b in vdla.runtime.BACKENDS if b != "verilator")

#: Virtual-thread settings (oc_nthread, h_nthread) in the space.
THREADS = ((1, 1), (2, 1), (1, 2))

#: The ops the tuner searches schedules for (pools keep the default chooser: their
#: timing model is within 1% of Verilator).
TUNABLE_OPS = ("qconv2d", "qdense")


def _canonical(workload: dict) -> str:
    """A workload as the records' key: compact, sorted JSON."""
    return json.dumps(workload, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, eq=False)
class ConvTask(TuneTask):
    """One convolution workload on one config.

    name : what the user calls it (``C5``, or the model's node names)
    graph : a one-node graph: the node, its constant weights and bias, its activation
        (and residual) as graph inputs
    node : the node's name in `graph`
    config : the `HardwareConfig` the schedules are for
    nodes : the model's nodes that share this workload
    Derived: `key` (the records' workload key), `layer` (`Conv2dLayer`), `macs`.
    """

    name: str
    graph: Graph
    node: str
    config: HardwareConfig
    nodes: tuple[str, ...] = ()

    target = "vdla"
    measure_backends = BACKENDS
    unit = "cycles"

    @property
    def platform(self) -> str:
        return self.config.name

    @functools.cached_property
    def workload(self) -> dict:
        return conv2d_workload(self.graph.node(self.node), self.graph, self.config)

    @functools.cached_property
    def key(self) -> str:
        return _canonical(self.workload)

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

    # --- the space ----------------------------------------------------------------------

    def space(self) -> list[Conv2dSchedule]:
        """Every schedule that fits the config (`schedule_space` with every output-width
        tiling), in a fixed order."""
        return list(schedule_space(self.layer, self.config, threads=THREADS,
                                   width_tiles=None))

    def default_schedule(self) -> Conv2dSchedule:
        """What the target compiles with without records (the analytical chooser)."""
        return choose_conv2d(self.layer, self.config)

    def estimate(self, schedule: Conv2dSchedule) -> Conv2dEstimate:
        """The analytical timing model's figures for `schedule` (``.cycles`` and their
        split into GEMM, epilogue, load and store)."""
        return estimate_conv2d(self.layer, schedule, self.config,
                               alu_passes=alu_passes(self.workload))

    def knobs(self, s: Conv2dSchedule) -> tuple[int, ...]:
        return (THREADS.index((s.oc_nthread, s.h_nthread)), s.tile_h, s.tile_w, s.tile_ci,
                s.tile_co)

    def features(self, schedule: Conv2dSchedule,
                 estimate: Conv2dEstimate | None = None) -> list[float]:
        """The knobs, the tile counts and edge waste along each axis, the buffers' fill,
        and (with `estimate`) the timing model's log cycles and their split."""
        layer, config = self.layer, self.config
        s = schedule.clamped(layer)
        feats = [float(s.oc_nthread == 2), float(s.h_nthread == 2)]
        for tile, total in ((s.tile_h, layer.out_h), (s.tile_w, layer.out_w),
                            (s.tile_ci, layer.span_in), (s.tile_co, layer.span_out)):
            count = ceil_div(total, tile)
            feats += [math.log2(tile), math.log2(count), count * tile / total - 1.0]
        feats.append(math.log2(s.tile_h * s.tile_w * s.tile_co))      # acc entries a tile
        for need, depth in s.needs(layer, config).values():
            feats.append(need / depth)
        if estimate is not None:
            feats += [math.log(estimate.cycles)] + [
                part / estimate.cycles for part in
                (estimate.gemm, estimate.epilogue, estimate.load, estimate.store)]
        return feats

    def schedule_to_dict(self, schedule: Conv2dSchedule) -> dict:
        return dataclasses.asdict(schedule)

    def schedule_from_dict(self, data: dict) -> Conv2dSchedule:
        fields = {f.name for f in dataclasses.fields(Conv2dSchedule)}
        if not isinstance(data, dict) or set(data) != fields:
            raise ValueError(f"a conv2d schedule record needs exactly the fields "
                             f"{sorted(fields)}, not {data!r}")
        return Conv2dSchedule(**data)

    def describe(self) -> str:
        w = self.workload
        text = (f"{w['n']}x{w['c']}x{w['h']}x{w['w']} -> {w['o']}, "
                f"k{w['kernel_h']}x{w['kernel_w']} s{w['stride_h']}")
        return text + (" +residual" if w["has_residual"] else "")

    # --- measuring ----------------------------------------------------------------------

    def prepare(self, backend: str, log: Callable[[str], None]) -> None:
        if backend == "verilator":   # build once here, not once per worker
            build_model(self.config, log=log)

    def open_context(self, backend: str):
        options = {"log": lambda message: None} if backend == "verilator" else {}
        return vdla.runtime.open(self.config, backend=backend, **options)

    def feed(self) -> dict[str, np.ndarray]:
        """Seeded random int8 values for the graph's inputs (activation, residual)."""
        rng = np.random.default_rng(self.seed)
        return {name: rng.integers(-128, 128, self.graph.tensors[name].shape).astype(np.int8)
                for name in self.graph.inputs}

    def measure_data(self) -> "_TaskData":
        return _TaskData(self)

    def measure(self, schedule: Conv2dSchedule, context: Any, *, data: Any = None,
                backend: str | None = None, max_cycles: int | None = None) -> MeasureResult:
        """Lower `schedule`, run it on device `context`, compare the output with the
        reference bit-exactly. `max_cycles` is the Verilator watchdog's budget (default
        `cycle_budget`)."""
        device = context
        start = time.perf_counter()
        data = data or _TaskData(self)
        try:
            lowered = lower_conv2d(self.graph.node(self.node), self.graph, self.config,
                                   schedule)
            if device.backend == "verilator":
                device.max_cycles = max_cycles or cycle_budget(self, schedule)
            y, stats = run_conv2d(device, lowered, data.x, data.weights, data.bias,
                                  data.residual, return_stats=True)
        except WatchdogError as exc:
            # Past the cycle budget: a timeout; stalled with nothing moving: a deadlock.
            return MeasureResult("error" if exc.stalled else "timeout", error=one_line(exc),
                                 seconds=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - any failure is a result, not a stop
            return MeasureResult("error", error=one_line(exc),
                                 seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if not np.array_equal(y, data.want):
            bad = int(np.count_nonzero(y != data.want))
            return MeasureResult("wrong", error=f"{bad} of {y.size} output values differ from "
                                 "the reference", seconds=seconds)
        if device.backend == "verilator":
            counters = {k: int(v) for k, v in stats.items() if k != "wall_seconds"}
            return MeasureResult(OK, int(stats["cycles"]), counters, seconds=seconds)
        est = self.estimate(schedule)
        return MeasureResult(OK, est.cycles, {"gemm": est.gemm, "epilogue": est.epilogue,
                                              "load": est.load, "store": est.store},
                             seconds=seconds)


class _TaskData:
    """A task's inputs and reference output, computed once per worker."""

    def __init__(self, task: ConvTask):
        graph = task.graph
        node = graph.node(task.node)
        self.feed = task.feed()
        self.want = run_reference(graph, self.feed)[graph.outputs[0]]
        self.weights = graph.constant(node.inputs[1])
        self.bias = graph.constant(node.input(2)) if node.input(2) else None
        self.x = self.feed[node.inputs[0]]
        self.residual = self.feed[node.input(3)] if node.input(3) else None


def cycle_budget(task: ConvTask, schedule: Conv2dSchedule) -> int:
    """The watchdog's cycle budget: 10x the analytical estimate plus 100k cycles. The
    model is within a few percent of Verilator on every schedule measured so far, so a
    run past this is a hang, not a slow schedule."""
    return 10 * task.estimate(schedule).cycles + 100_000


def conv_tasks(graph: Graph, target) -> list[ConvTask]:
    """One `ConvTask` per distinct workload among the ``qconv2d``/``qdense`` nodes of
    quantized `graph` that `target` (a `VdlaTarget`) runs, in topological order of their
    first node; the name lists the nodes sharing it."""
    groups: dict[str, list] = {}
    for node in graph.nodes():
        if node.op in TUNABLE_OPS and target.supports(node, graph).ok:
            key = _canonical(conv2d_workload(node, graph, target.config))
            groups.setdefault(key, []).append(node)
    tasks = []
    for nodes in groups.values():
        name = nodes[0].name if len(nodes) == 1 else f"{nodes[0].name} (+{len(nodes) - 1})"
        tasks.append(ConvTask(name, one_node_graph(nodes[0], graph), nodes[0].name,
                              target.config, tuple(n.name for n in nodes)))
    return tasks
