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
simulator error or a run past its cycle budget is a result, not an exception. The key,
seed, inputs, reference and check are `OneNodeTask`'s; a schedule is compiled by the
target's own lowering (`lower_conv2d`, as `VdlaTarget.compile_op`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Callable

import vdla.runtime
from vdla.compiler.ir.graph import Graph
from vdla.compiler.targets.vdla.common import ceil_div
from vdla.compiler.targets.vdla.conv import lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import (Conv2dLayer, alu_passes, choose_conv2d,
                                                   conv2d_workload, residual_passes,
                                                   schedule_space)
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.compiler.targets.vdla.timing import Conv2dEstimate, estimate_conv2d
from vdla.compiler.targets.vdla.features import CONV2D, conv2d_values
from vdla.compiler.targets.vdla.sequence import ROW_BATCHES, pixel_rows
from vdla.compiler.tuner.cost_model import shipped
from vdla.compiler.tuner.measure import MeasureResult, one_line
from vdla.compiler.tuner.task import OneNodeTask, TaskData, merge_tasks, one_node_graph
from vdla.config import HardwareConfig
from vdla.sim.errors import WatchdogError
from vdla.sim.verilator.build import build_model

__all__ = ["BACKENDS", "PRETRAINED", "THREADS", "ConvTask", "conv_tasks", "cycle_budget"]

#: The package-data folder of the pretrained cost models (`ConvTask.pretrained`):
#: scripts/train_cost_model.py writes them from a training set's records.
PRETRAINED = Path(__file__).resolve().parent / "models"

#: How a schedule can be measured: on a device of each backend, the cycle-accurate one
#: first (the default).
BACKENDS = ("verilator",) + tuple(b for b in vdla.runtime.BACKENDS if b != "verilator")

#: Virtual-thread settings (oc_nthread, h_nthread) in the space.
THREADS = ((1, 1), (2, 1), (1, 2))

#: The ops the tuner searches schedules for (pools keep the default chooser: their
#: timing model is within 1% of Verilator).
TUNABLE_OPS = ("qconv2d", "qdense", "qmatmul")


@dataclasses.dataclass(frozen=True, eq=False)
class ConvTask(OneNodeTask):
    """One convolution workload on one config.

    name, graph, node, nodes : as in `OneNodeTask` (the node with its constant weights
        and bias, its activation and residual as graph inputs)
    config : the `HardwareConfig` the schedules are for
    max_cycles : the Verilator watchdog's budget (None: `cycle_budget`)
    Derived: `key` (the records' workload key, `conv2d_workload`), `layer`
    (`Conv2dLayer`), `macs`.
    """

    config: HardwareConfig = dataclasses.field(kw_only=True)
    #: The Verilator watchdog's budget of a measurement (None: `cycle_budget`).
    max_cycles: int | None = dataclasses.field(kw_only=True, default=None)

    target = "vdla"
    measure_backends = BACKENDS
    unit = "cycles"
    remembered_on_disk = True

    @property
    def platform(self) -> str:
        return self.config.name

    @functools.cached_property
    def workload(self) -> dict:
        return conv2d_workload(self.graph.node(self.node), self.graph, self.config)

    @functools.cached_property
    def layer(self) -> Conv2dLayer:
        return Conv2dLayer.from_node(self.graph.node(self.node), self.graph, self.config)

    @property
    def macs(self) -> int:
        return self.layer.macs

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
                               alu_passes=alu_passes(self.workload),
                               residual_passes=residual_passes(self.workload))

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

    feature_set = CONV2D

    def transfer_features(self, schedule: Conv2dSchedule) -> dict[str, float]:
        """`CONV2D`'s values (`conv2d_values`), with the timing model's estimate."""
        return conv2d_values(self.layer, schedule, self.config, self.estimate(schedule))

    def platform_key(self) -> dict:
        """The whole config: its name leaves out the DRAM's bandwidth and the clock,
        which the timing model (a feature) reads."""
        return self.config.to_dict()

    def pretrained(self):
        """`CONV2D`'s model shipped in `PRETRAINED` (scripts/train_cost_model.py)."""
        return shipped(PRETRAINED, CONV2D)

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

    # --- measuring: compiled by the target, run on a device of the backend ----------------

    def prepare(self, backend: str, log: Callable[[str], None]) -> None:
        if backend == "verilator":   # build once here, not once per worker
            build_model(self.config, log=log)

    def open_context(self, backend: str):
        options = {"log": lambda message: None} if backend == "verilator" else {}
        return vdla.runtime.open(self.config, backend=backend, **options)

    def compile(self, schedule: Conv2dSchedule, backend: str):
        """The node's program with `schedule`: `lower_conv2d`, what
        `VdlaTarget.compile_op` compiles every convolution with."""
        return lower_conv2d(self.graph.node(self.node), self.graph, self.config,
                            schedule), schedule

    def run(self, compiled, context: Any, data: TaskData, backend: str):
        """One run on device `context` (Verilator: within `cycle_budget`)."""
        lowered, schedule = compiled
        node, graph = self.graph.node(self.node), self.graph
        if context.backend == "verilator":
            context.max_cycles = self.max_cycles or cycle_budget(self, schedule)
        # A qmatmul's b is an input, and its a may be a constant (an identity).
        weights, x = graph.constant(node.inputs[1]), graph.constant(node.inputs[0])
        out, stats = run_conv2d(context, lowered,
                                data.feed[node.inputs[0]] if x is None else x,
                                data.feed[node.inputs[1]] if weights is None else weights,
                                graph.constant(node.input(2)) if node.input(2) else None,
                                data.feed[node.input(3)] if node.input(3) else None,
                                return_stats=True)
        # A sequence's rows come back as (rows, channels); a (1, S, D) node's output has
        # the same values under its leading 1.
        return out.reshape(graph.tensors[node.outputs[0]].shape), stats

    def time(self, compiled, stats, context: Any, data: TaskData, backend: str):
        """Verilator: the counted cycles and the hardware counters; functional: the
        timing model's cycles and their split."""
        if context.backend == "verilator":
            return int(stats["cycles"]), {k: int(v) for k, v in stats.items()
                                          if k != "wall_seconds"}
        est = self.estimate(compiled[1])
        return est.cycles, {"gemm": est.gemm, "epilogue": est.epilogue, "load": est.load,
                            "store": est.store}

    def failure(self, exc: BaseException, seconds: float) -> MeasureResult:
        # Past the cycle budget: a timeout; stalled with nothing moving: a deadlock.
        if isinstance(exc, WatchdogError):
            return MeasureResult("error" if exc.stalled else "timeout", error=one_line(exc),
                                 seconds=seconds)
        return super().failure(exc, seconds)


def cycle_budget(task: ConvTask, schedule: Conv2dSchedule) -> int:
    """The watchdog's cycle budget: 10x the analytical estimate plus 100k cycles. The
    model is within a few percent of Verilator on every schedule measured so far, so a
    run past this is a hang, not a slow schedule."""
    return 10 * task.estimate(schedule).cycles + 100_000


def conv_tasks(graph: Graph, target) -> list[ConvTask]:
    """One `ConvTask` per distinct workload among the ``qconv2d``/``qdense`` nodes of
    quantized `graph` that `target` (a `VdlaTarget`) runs, in topological order of their
    first node; the name lists the nodes sharing it."""
    return merge_tasks([(ConvTask(node.name, _task_graph(node, graph, target.config),
                                  node.name, config=target.config), node)
                        for node in graph.nodes()
                        if node.op in TUNABLE_OPS and target.supports(node, graph).ok])


def _task_graph(node, graph: Graph, config) -> Graph:
    """`one_node_graph` of `node`, naming the batches of rows among its tensors: alone,
    a dense layer's input has no producer to tell a CNN's flattened batch from a
    sequence (`sequence.pixel_rows`), and the task must measure the layer the model runs."""
    g = one_node_graph(node, graph)
    rows = frozenset(t for t in list(node.inputs) + list(node.outputs)
                     if t and len(graph.tensors[t].shape) == 2
                     and not pixel_rows(graph, t, config))
    if rows:
        g.metadata[ROW_BATCHES] = rows
    return g
