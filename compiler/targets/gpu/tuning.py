"""The GPU target's tunable tasks: one convolution, dense layer or batched matmul's GEMM
schedule (tiles, warps, stages, split-K) timed on the GPU.

A `GpuTask` holds a one-node graph and measures a schedule by compiling the node with it,
checking one run against the reference (int8 bit-exact, float within its precision's
tolerance, `vdla.compiler.reference.tolerance`), then timing it: on ``cuda`` the median
of CUDA-event times over `RUNS` launches after a warm-up (which compiles the kernel); on
``interpreter`` one run's wall time under Triton's interpreter, which checks a
schedule's correctness but says nothing of its speed on a GPU (the tuner searches GEMM
schedules on a GPU; the interpreter backend is for trying the search without one).

The workload key is the node's geometry, epilogue and dtypes (canonical JSON); the
platform is the device's name, so records taken on one GPU are never used for another.
The key, seed, inputs, reference and check are `OneNodeTask`'s; a schedule is compiled
by the target that made the task (its class, kept on the task: `GpuTarget.compile_op`)
and run in one of its sessions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.targets.base import DeviceValue
from vdla.compiler.targets.gpu import runtime
from vdla.compiler.targets.gpu.lower import GEMM_OPS, MATMUL_OPS, refusal
from vdla.compiler.targets.gpu.schedule import GemmSchedule, choose, gemm_shape, space
from vdla.compiler.tuner.task import OneNodeTask, TaskData, merge_tasks, one_node_graph

__all__ = ["GpuTask", "RUNS", "gpu_tasks"]

#: CUDA-event timed launches per measurement (after one warm-up launch).
RUNS = 50
_KNOBS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k")


@dataclasses.dataclass(frozen=True, eq=False)
class GpuTask(OneNodeTask):
    """One convolution or dense workload on the GPU.

    name, graph, node, nodes : as in `OneNodeTask`
    make_target : the target's class (`GpuTarget`), called with ``device`` and
        ``float_dtype`` to compile and run a measurement
    float_dtype : how a float node is stored and multiplied (``float32``, ``float16``)
    """

    make_target: Callable[..., Any] = dataclasses.field(kw_only=True)
    float_dtype: str = dataclasses.field(kw_only=True, default="float32")

    target = "gpu"
    measure_backends = runtime.MODES
    unit = "ns"
    noisy = True

    @property
    def float_precision(self) -> str:
        return self.float_dtype

    @functools.cached_property
    def shape(self):
        node = self.graph.node(self.node)
        return gemm_shape(node, self.graph,
                          "int8" if node.op.startswith("q") else self.float_dtype)

    @property
    def platform(self) -> str:
        return runtime.device_name(runtime.resolve("auto"))

    @property
    def workload(self) -> dict:
        node = self.graph.node(self.node)
        return {"op": node.op, "dot": self.shape.dtype,
                "x": list(self.graph.tensors[node.inputs[0]].shape),
                "w": list(self.graph.tensors[node.inputs[1]].shape),
                "bias": bool(node.input(2)), "residual": bool(node.input(3)),
                **{k: v for k, v in sorted(node.attrs.items())
                   if k in ("strides", "pads", "dilations", "groups", "activation",
                            "transpose_b")
                   or (k == "multiplier" and v is not None)}}

    def describe(self) -> str:
        return self.shape.describe()

    # --- the space --------------------------------------------------------------------------

    @property
    def _split_k(self) -> bool:
        """Whether the kernel splits K (the batched matmul does not)."""
        return self.graph.node(self.node).op not in MATMUL_OPS

    def space(self) -> list:
        return space(self.shape, split_k=self._split_k)

    def default_schedule(self):
        return choose(self.shape, split_k=self._split_k)

    def knobs(self, s) -> tuple[int, ...]:
        return tuple(int(math.log2(getattr(s, k))) if k != "num_stages" else s.num_stages
                     for k in _KNOBS)

    def features(self, s, estimate: Any = None) -> list[float]:
        shape = self.shape
        tiles = math.ceil(shape.m / s.block_m) * math.ceil(shape.n / s.block_n) * shape.groups
        waste = (math.ceil(shape.m / s.block_m) * s.block_m / shape.m
                 * math.ceil(shape.n / s.block_n) * s.block_n / shape.n - 1.0)
        return [*(math.log2(getattr(s, k)) for k in _KNOBS if k != "num_stages"),
                float(s.num_stages), math.log2(tiles * s.split_k), waste,
                math.log2(max(1, math.ceil(shape.k / s.block_k / s.split_k)))]

    def schedule_to_dict(self, schedule) -> dict:
        return schedule.to_dict()

    def schedule_from_dict(self, data: dict):
        try:
            return GemmSchedule.from_dict(data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    # --- measuring: the target's compile_op, run in one of its sessions ----------------------

    def compile(self, schedule, backend: str) -> "_Compiled":
        target = self.make_target(device=backend, float_dtype=self.float_dtype)
        node = self.graph.node(self.node)
        op = target.compile_op(node, self.graph, schedule)
        return _Compiled(op, target.open_session(self.graph, [op]))

    def run(self, compiled: "_Compiled", context: Any, data: TaskData, backend: str):
        node = self.graph.node(self.node)
        ran = compiled.launch(node, data.feed)
        return compiled.session.fetch(self.graph.outputs[0]), ran

    def time(self, compiled: "_Compiled", ran, context: Any, data: TaskData, backend: str):
        """Nanoseconds of the op: CUDA-event times of `RUNS` more launches (the checked
        run was the warm-up, which compiled the kernel), or the checked run's time on the
        interpreter (a run there takes seconds, and its time says nothing of a GPU's)."""
        if backend == "interpreter":
            ns = np.array([ran.extra["interpreter_seconds"] * 1e9])
        else:
            node = self.graph.node(self.node)
            ns = np.asarray([compiled.launch(node, data.feed).extra["gpu_seconds"]
                             for _ in range(RUNS)]) * 1e9
        return int(round(float(np.median(ns)))), {"runs": int(ns.size),
                                                  "min_ns": int(ns.min())}


@dataclasses.dataclass
class _Compiled:
    """A measurement's compiled op and the target session it runs in."""

    op: Any
    session: Any
    written: bool = False

    def launch(self, node, feed: dict):
        """One launch of the op, its activations written to the device the first time."""
        args = []
        for name in node.inputs:
            if name and self.session.holds(name):
                if not self.written:
                    self.session.put(name, feed[name])
                args.append(DeviceValue(self.session, name))
            else:
                args.append(None if not name else feed.get(name))
        self.written = True
        return self.session.run(self.op, node, args)

    def close(self) -> None:
        self.session.close()


def gpu_tasks(graph: Graph, target) -> list[GpuTask]:
    """One `GpuTask` per distinct GEMM workload of `graph` that `target` runs (depthwise
    convolutions run a kernel without a GEMM schedule; batched matmuls, a transformer's
    attention products, have one without split-K), in the order of first use."""
    found = []
    for node in graph.nodes():
        if node.op not in GEMM_OPS + MATMUL_OPS or refusal(node, graph):
            continue
        if node.op.endswith("conv2d") and graph.tensors[node.inputs[1]].shape[1] == 1 \
                and node.attrs["groups"] > 1:
            continue
        found.append((GpuTask(node.name, one_node_graph(node, graph), node.name,
                              make_target=type(target), float_dtype=target.float_dtype),
                      node))
    return merge_tasks(found)
