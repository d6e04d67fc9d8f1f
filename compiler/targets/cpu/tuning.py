"""The CPU target's tunable tasks: one convolution, dense or batched matrix product
workload on this machine.

A `CpuTask` holds a one-node graph (the node with its constants, its activation and
residual as graph inputs) and measures a schedule by wall time: it builds the node's
kernel with the schedule (cached by content hash: a schedule's build is shared by every
model with that layer shape), checks one run against the reference (int8 bit-exact,
float within 1e-4 relative), then runs it `MIN_RUNS` times or for `MIN_SECONDS`,
whichever is longer (at most `MAX_RUNS`), each run with the layer's weights evicted
from the caches first (as inside a model), and reports the fastest run in nanoseconds,
with the median and the spread in the counters. Measure with one job (``vdla tune
--jobs 1``, the default), so that no other measurement shares the cores.

Why the fastest run and not the median: other work on the machine (a neighbour on a
shared host, the tuner's own compiler) only ever adds time, in windows longer than many
runs. Re-measuring ResNet-50's layers three times on a 2-core host moved a schedule's
median by up to 1.8x between rounds while its fastest run moved by under 1%, and a
training set taken with medians ranked a layer's schedules no better than the chooser's
rule (docs/tuner.md, "The CPU target's training set"). Records taken before this change
hold medians (their counters name ``min_ns`` instead of ``median_ns``).

The workload key is the layer's `ConvShape` / `DenseShape` (sizes, groups, epilogue,
whether the input is known non-negative) or `MatmulShape` (batches, sizes, how B is
given and shared) as canonical JSON; the platform is the CPU's name, the thread count
and the instruction set, so records taken on one machine or thread count are never
used for another. A convolution that runs as one GEMM (`patches.runs_as_gemm`: a patch
embedding, an int8 stem without VNNI) is no task: the convolution kernel a tuned
schedule would give a patch embedding is thousands of lines of C for its 16 x 16 taps,
and a stem's direct kernels are the ones the GEMM replaces.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vdla._platform import cpu_name
from vdla.compiler.ir.graph import Graph
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu import layout
from vdla.compiler.targets.cpu.dense import int8_path
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule, choose_dense, dense_blocks
from vdla.compiler.targets.cpu.features import (CONV2D, DENSE, MATMUL, conv2d_values,
                                                dense_values, matmul_values)
from vdla.compiler.targets.cpu.library import (aligned_empty, build_kernels, call, load,
                                               start_team, time_runs)
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.matmul_schedule import (MATMUL_PARALLEL, MatmulSchedule,
                                                       MatmulShape, choose_matmul,
                                                       estimate_matmul, matmul_blocks)
from vdla.compiler.targets.cpu.patches import runs_as_gemm
from vdla.compiler.targets.cpu.schedule import (LANES, LAYOUTS, ORDERS, PARALLEL, ConvSchedule,
                                                choose_conv, conv_blocks, estimate_conv)
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape, input_nonnegative
from vdla.compiler.tuner.cost_model import shipped
from vdla.compiler.tuner.space import Block, ProductSpace
from vdla.compiler.tuner.task import OneNodeTask, TaskData, merge_tasks, one_node_graph

__all__ = ["CpuTask", "MIN_RUNS", "MIN_SECONDS", "PRETRAINED", "cpu_tasks"]

#: A measurement runs the kernel at least this many times ...
MIN_RUNS = 7
#: ... and for at least this long, but at most `MAX_RUNS` times.
MIN_SECONDS = 0.15
MAX_RUNS = 400

#: The cost models this target ships, one per feature set (scripts/train_cost_model.py
#: writes them: the convolutions' from bench/datasets/make_cpu_v3.sh's set, the dense
#: layers' and the products' from make_cpu_gemm_v1.sh's).
PRETRAINED = Path(__file__).resolve().parent / "models"

#: The tunable ops by the kind of task they make.
_TUNABLE = {"conv2d": "conv", "qconv2d": "conv", "dense": "dense", "qdense": "dense",
            "matmul": "matmul", "qmatmul": "matmul"}

#: How the string knobs rank on the knob grid: as `CpuTask.knobs` numbers them.
CONV_RANKS = {"order": ORDERS.index, "parallel": PARALLEL.index, "lanes": LANES.index,
              "layout": LAYOUTS.index}
DENSE_RANKS = {"parallel": lambda value: value == "none"}
MATMUL_RANKS = {"parallel": MATMUL_PARALLEL.index}


@dataclasses.dataclass(frozen=True)
class _Estimate:
    cycles: float


@dataclasses.dataclass(frozen=True, eq=False)
class CpuTask(OneNodeTask):
    """One convolution, dense or batched matrix product workload on this machine.

    name, graph, node, nodes : as in `OneNodeTask`
    isa : the instruction set's name; threads : the thread count it is measured with
    nonnegative : whether the model's input to the node is known non-negative (int8)
    cpu : the name of the CPU whose records the task reads (its `platform`); None for
        this machine's (`cpu_name`). A task made again from a training set's manifest
        (`CpuTarget.from_platform`) names the CPU the set was measured on, and measures
        only on a machine of that name.
    costs : what the default schedule and the features read of that machine
        (`CpuTarget.costs`; `machine.NOMINAL` when not given)
    models : the folder of cost models `pretrained` reads (None: the shipped ones,
        `PRETRAINED`); a bench gives models trained without some rows here
    """

    isa: str = dataclasses.field(kw_only=True)
    threads: int = dataclasses.field(kw_only=True)
    nonnegative: bool = dataclasses.field(kw_only=True, default=False)
    cpu: str | None = dataclasses.field(kw_only=True, default=None)
    costs: MachineCosts = dataclasses.field(kw_only=True, default=NOMINAL)
    models: Path | None = dataclasses.field(kw_only=True, default=None)

    target = "cpu"
    measure_backends = ("wall",)
    unit = "ns"
    noisy = True
    cheap_space = True
    remembered_on_disk = True

    @functools.cached_property
    def _isa(self):
        return cpu_isa.get(self.isa)

    @property
    def kind(self) -> str:
        """``conv``, ``dense`` or ``matmul``: which kernel family the node is."""
        return _TUNABLE[self.graph.node(self.node).op]

    @property
    def conv(self) -> bool:
        return self.kind == "conv"

    @functools.cached_property
    def shape(self):
        node = self.graph.node(self.node)
        if self.kind == "matmul":
            return MatmulShape.from_node(node, self.graph)
        cls = ConvShape if self.conv else DenseShape
        return cls.from_node(node, self.graph, nonnegative=self.nonnegative)

    @functools.cached_property
    def int8_path(self) -> str:
        """A dense layer's int8 path as its kernel takes it (`dense.int8_path`: it reads
        the weights); "plain" for float32."""
        node = self.graph.node(self.node)
        return int8_path(self.shape, self._isa, self.graph.constant(node.inputs[1]))

    @property
    def on_cpu(self) -> str:
        """The CPU the task's records name: its own `cpu`, else this machine's."""
        return self.cpu if self.cpu is not None else cpu_name()

    @property
    def platform(self) -> str:
        return f"{self.on_cpu}, {self.threads} threads, {self.isa}"

    @property
    def workload(self) -> dict:
        op = {"conv": "conv2d", "dense": "dense", "matmul": "matmul"}[self.kind]
        return {"op": op, **dataclasses.asdict(self.shape)}

    def describe(self) -> str:
        return f"{self.shape.dtype} {self.shape.describe()}"

    # --- the space --------------------------------------------------------------------------

    def space(self) -> ProductSpace:
        """The layer's schedules as products (`conv_blocks`), never listed: a MobileNet-v1
        pointwise layer has 218,880 of them, the model 1.4 million."""
        if self.conv:
            return ProductSpace(ConvSchedule, [Block(f, a) for f, a in
                                               conv_blocks(self.shape, self._isa)],
                                ranks=CONV_RANKS)
        if self.kind == "matmul":
            return ProductSpace(MatmulSchedule, [Block(f, a) for f, a in
                                                 matmul_blocks(self.shape, self._isa)],
                                ranks=MATMUL_RANKS)
        return ProductSpace(DenseSchedule, [Block(f, a) for f, a in
                                            dense_blocks(self.shape, self._isa)],
                            ranks=DENSE_RANKS)

    def strata(self, space: ProductSpace) -> list | None:
        """A convolution's space in three parts, drawn from in turn by the random tuner
        (training sets): the plain layout, the blocked layout, and Winograd. The blocked
        schedules are 4 to 28% of a layer's space and Winograd's 1%, so a uniform draw of
        12 would rarely show how either runs."""
        if not self.conv:
            return None
        return space.strata(lambda fixed: (fixed["layout"], fixed["wino"] > 0))

    def default_schedule(self):
        if self.conv:
            return choose_conv(self.shape, self._isa, self.threads, costs=self.costs)
        if self.kind == "matmul":
            return choose_matmul(self.shape, self._isa, self.costs)
        return choose_dense(self.shape, self._isa, self.costs)

    def estimate(self, schedule) -> _Estimate:
        """The chooser's cost model (relative: padded multiply-adds, extra input vectors,
        idle threads), on the scale of nanoseconds at a nominal rate; a product's
        `estimate_matmul` (about cycles)."""
        if self.conv:
            return _Estimate(estimate_conv(self.shape, schedule, self.threads, self.costs))
        if self.kind == "matmul":
            return _Estimate(estimate_matmul(self.shape, schedule, self._isa, self.threads))
        return _Estimate(float(self.shape.macs) / 8 / schedule.ov ** 0.25)

    def knobs(self, s) -> tuple[int, ...]:
        if self.conv:
            return (s.vl, s.mr, s.nv, s.tile_co, s.tile_h, s.tile_ci, ORDERS.index(s.order),
                    s.unroll, PARALLEL.index(s.parallel), LANES.index(s.lanes),
                    LAYOUTS.index(s.layout), s.wino)
        if self.kind == "matmul":
            return (s.vl, s.mr, s.nv, s.unroll, MATMUL_PARALLEL.index(s.parallel), s.wide)
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
                     math.log2(max(1, grid)), float(LAYOUTS.index(s.layout)),
                     float(s.wino)]
        elif self.kind == "matmul":
            blocks = math.ceil(shape.m / s.mr)
            feats = [float(s.vl), float(s.mr), float(s.nv), math.log2(s.mr * s.nv),
                     float(s.unroll), float(MATMUL_PARALLEL.index(s.parallel)), float(s.wide),
                     blocks * s.mr / shape.m - 1.0,
                     shape.n % (s.nv * s.vl) / shape.n]
        else:
            feats = [float(s.vl), float(s.ov), float(s.unroll), float(s.parallel == "none"),
                     math.ceil(shape.o / (s.vl * s.ov)) * s.vl * s.ov / shape.o - 1.0]
        if estimate is not None:
            feats.append(math.log(max(estimate.cycles, 1e-9)))
        return feats

    @property
    def feature_set(self):
        """`CONV2D`, `DENSE` or `MATMUL` (`vdla.compiler.targets.cpu.features`)."""
        return {"conv": CONV2D, "dense": DENSE, "matmul": MATMUL}[self.kind]

    def pretrained(self):
        """The model of this task's feature set in `models` (default the shipped ones,
        `PRETRAINED`), if any."""
        return shipped(PRETRAINED if self.models is None else self.models, self.feature_set)

    def transfer_features(self, schedule) -> dict[str, float]:
        if self.conv:
            return conv2d_values(self.shape, schedule, self._isa, self.threads, self.costs)
        if self.kind == "matmul":
            return matmul_values(self.shape, schedule, self._isa, self.threads, self.costs)
        return dense_values(self.shape, schedule, self._isa, self.threads,
                            self.estimate(schedule).cycles, self.int8_path, self.costs)

    def platform_key(self) -> dict:
        """The platform as memos key it: the CPU, threads and ISA, and the machine's
        costs (the default schedule and the features read them)."""
        return {"cpu": self.on_cpu, "threads": self.threads, "isa": self.isa,
                "machine": self.costs.key()}

    def schedule_to_dict(self, schedule) -> dict:
        return schedule.to_dict()

    def schedule_from_dict(self, data: dict):
        cls = {"conv": ConvSchedule, "dense": DenseSchedule, "matmul": MatmulSchedule}
        return cls[self.kind].from_dict(data)

    # --- measuring: the target's kernel, built and timed in C -----------------------------

    def open_context(self, backend: str):
        return None

    def kernel(self, schedule):
        """The node's kernel with `schedule` (as the target lowers it)."""
        return node_kernel(self.graph.node(self.node), self.graph, self._isa,
                           schedule=schedule, threads=self.threads,
                           nonnegative=self.nonnegative, costs=self.costs)[0]

    def compile(self, schedule, backend: str):
        """The kernel built into a library (cached by content hash: a schedule's build is
        shared by every model with that layer shape), its team started, its parameters
        and workspace aligned. ValueError for a task of another machine's CPU: what it
        measured here would be filed under that machine's name."""
        if self.on_cpu != cpu_name():
            raise ValueError(f"{self.name}: a task of the CPU {self.on_cpu!r} (a training "
                             f"set's platform) is not measured on this one, {cpu_name()!r}")
        kernel = self.kernel(schedule)
        lib = load(build_kernels([kernel], self._isa))
        start_team(lib, self.threads)
        ws = aligned_empty(max(kernel.workspace(self.threads), 64))
        params = aligned_empty(max(kernel.params.size, 64))
        params[:kernel.params.size] = kernel.params
        return lib, dataclasses.replace(kernel, params=params), ws

    def run(self, compiled, context: Any, data: TaskData, backend: str):
        lib, kernel, ws = compiled
        # In the kernel's layouts (a blocked schedule reads and writes NCHW{vl}c).
        inputs = layout.kernel_inputs(kernel, [data.feed[t] for t in kernel.inputs])
        raw, plain = layout.kernel_output(kernel, data.want.shape, data.want.dtype)
        call(lib, kernel, inputs, raw, workspace=ws, threads=self.threads)
        return plain(raw), (inputs, raw)

    def side_by_side(self, schedules, rounds: int = 15, *, backend: str | None = None,
                     slot_seconds: float = 0.004) -> np.ndarray:
        """`TuneTask.side_by_side`, finer: `rounds` rounds, each giving every schedule
        one slot of about `slot_seconds` (at least three runs) in order, a slot's figure
        its fastest run in nanoseconds (wall time, the one `backend`).

        Why slots and not whole measurements: on a shared host, other machines' memory
        traffic slows a kernel that reads its weights from DRAM by up to 2x, for windows
        longer than one `time` measurement, so two schedules measured seconds apart can
        differ by that much whatever they are (a MobileNet-v1 layer's default schedule
        took 535 and 1,272 us in two passes a minute apart, each the fastest of 280
        runs). Slots milliseconds apart share the machine's state (on this AMD EPYC
        host, a loop over 4 MB ran 1.65x slower while the other core streamed 64 MB; a
        loop in registers did not slow at all). Each schedule is built as `compile`
        builds it and checked once against the reference."""
        if rounds < 1 or slot_seconds <= 0:
            raise ValueError(f"side_by_side: rounds must be >= 1 and slot_seconds > 0, "
                             f"not {rounds} and {slot_seconds}")
        data = self.measure_data()
        slots = []
        for schedule in schedules:
            compiled = self.compile(schedule, "wall")
            out, (inputs, raw) = self.run(compiled, None, data, "wall")
            bad = self.check(out, data.want)
            if bad:
                raise ValueError(f"{self.name}: schedule {schedule} is wrong: {bad}")
            lib, kernel, ws = compiled
            runs = functools.partial(time_runs, lib, kernel, inputs, raw, ws)
            once = float(np.min(runs(3)))          # warm, and how long one run takes
            slots.append((runs, max(3, int(slot_seconds / max(once, 1e-7)))))
        times = np.empty((rounds, len(slots)))
        for r in range(rounds):
            for k, (runs, n) in enumerate(slots):
                times[r, k] = np.min(runs(n)) * 1e9
        return times

    def time(self, compiled, ran, context: Any, data: TaskData, backend: str):
        """The fastest of repeated runs in nanoseconds (module docstring), with the
        median and the spread."""
        (lib, kernel, ws), (inputs, out) = compiled, ran
        ns = _time(lambda runs: time_runs(lib, kernel, inputs, out, ws, runs)) * 1e9
        return int(ns.min()), {
            "runs": int(ns.size), "median_ns": int(round(float(np.median(ns)))),
            "p25_ns": int(np.percentile(ns, 25)), "p75_ns": int(np.percentile(ns, 75))}


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


def cpu_tasks(graph: Graph, target) -> list[CpuTask]:
    """One `CpuTask` per distinct conv/dense/matmul workload of `graph` that `target` (a
    `CpuTarget`) runs, in the order of their first node; convolutions that run as one GEMM
    are left out (module docstring)."""
    found = []
    for node in graph.nodes():
        if node.op not in _TUNABLE or not target.supports(node, graph).ok:
            continue
        if _TUNABLE[node.op] == "conv" and runs_as_gemm(ConvShape.from_node(node, graph),
                                                        target.isa):
            continue
        if target.bf16 and amx.runs_bf16(node):
            continue        # bfloat16 on tiles (`lower.node_kernel`): no schedule to tune
        # A product's kernel takes its operands as they come (no offset to drop).
        nonneg = (node.op in ("qconv2d", "qdense")
                  and input_nonnegative(graph, node.inputs[0]))
        found.append((CpuTask(node.name, one_node_graph(node, graph), node.name,
                              isa=target.isa.name, threads=target.team, nonnegative=nonneg,
                              cpu=target.cpu, costs=target.costs),
                      node))
    return merge_tasks(found)
