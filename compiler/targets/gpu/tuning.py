"""The GPU target's tunable tasks: one convolution or dense layer's GEMM schedule (tiles,
warps, stages, split-K) timed on the GPU.

A `GpuTask` holds a one-node graph and measures a schedule by compiling the node with it,
checking one run against the reference (int8 bit-exact, float within its precision's
tolerance, `vdla.compiler.reference.tolerance`), then timing it: on ``cuda`` the median
of CUDA-event times over `RUNS` launches after a warm-up (which compiles the kernel); on
``interpreter`` one run's wall time under Triton's interpreter, which checks a
schedule's correctness but says nothing of its speed on a GPU (the tuner searches GEMM
schedules on a GPU; the interpreter backend is for trying the search without one).

The workload key is the node's geometry, epilogue and dtypes (canonical JSON); the
platform is the device's name, so records taken on one GPU are never used for another.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from typing import Any

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.reference import run_reference
from vdla.compiler.reference.tolerance import TOLERANCES, mismatch
from vdla.compiler.targets import registry
from vdla.compiler.targets.gpu import runtime
from vdla.compiler.targets.gpu.lower import GEMM_OPS, refusal
from vdla.compiler.targets.gpu.schedule import GemmSchedule, choose, gemm_shape, space
from vdla.compiler.targets.model import compile_model
from vdla.compiler.tuner.measure import MeasureResult, one_line
from vdla.compiler.tuner.records import OK
from vdla.compiler.tuner.task import TuneTask, merge_tasks, one_node_graph

__all__ = ["GpuTask", "RUNS", "gpu_tasks"]

#: CUDA-event timed launches per measurement (after one warm-up launch).
RUNS = 50
_KNOBS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k")


@dataclasses.dataclass(frozen=True, eq=False)
class GpuTask(TuneTask):
    """One convolution or dense workload on the GPU.

    name : what users call it; graph : a one-node graph; node : the node's name
    float_dtype : how a float node is stored and multiplied (``float32``, ``float16``)
    nodes : the model's nodes that share this workload
    """

    name: str
    graph: Graph
    node: str
    float_dtype: str = "float32"
    nodes: tuple[str, ...] = ()

    target = "gpu"
    measure_backends = runtime.MODES
    unit = "ns"
    noisy = True

    @functools.cached_property
    def shape(self):
        node = self.graph.node(self.node)
        return gemm_shape(node, self.graph,
                          "int8" if node.op.startswith("q") else self.float_dtype)

    @property
    def platform(self) -> str:
        return runtime.device_name(runtime.resolve("auto"))

    @functools.cached_property
    def key(self) -> str:
        node = self.graph.node(self.node)
        workload = {"op": node.op, "dot": self.shape.dtype,
                    "x": list(self.graph.tensors[node.inputs[0]].shape),
                    "w": list(self.graph.tensors[node.inputs[1]].shape),
                    "bias": bool(node.input(2)), "residual": bool(node.input(3)),
                    **{k: v for k, v in sorted(node.attrs.items())
                       if k in ("strides", "pads", "dilations", "groups", "activation")
                       or (k == "multiplier" and v is not None)}}
        return json.dumps(workload, sort_keys=True, separators=(",", ":"), default=list)

    @functools.cached_property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "little")

    def describe(self) -> str:
        return self.shape.describe()

    # --- the space --------------------------------------------------------------------------

    def space(self) -> list:
        return space(self.shape)

    def default_schedule(self):
        return choose(self.shape)

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

    # --- measuring ----------------------------------------------------------------------------

    def feed(self) -> dict[str, np.ndarray]:
        """Seeded random values for the graph's inputs."""
        rng = np.random.default_rng(self.seed)
        out = {}
        for name in self.graph.inputs:
            t = self.graph.tensors[name]
            out[name] = (rng.integers(-128, 128, t.shape).astype(np.int8) if t.dtype == "int8"
                         else rng.standard_normal(t.shape).astype(DTYPES[t.dtype]))
        return out

    def measure_data(self):
        feed = self.feed()
        return feed, np.asarray(run_reference(self.graph, feed)[self.graph.outputs[0]])

    def measure(self, schedule, context: Any = None, *, data: Any = None,
                backend: str = "cuda") -> MeasureResult:
        """Compile the node with `schedule`, check one run, time it (module docstring).
        Failures are results, not exceptions."""
        start = time.perf_counter()
        feed, want = data or self.measure_data()
        try:
            target = registry.get("gpu", device=backend, float_dtype=self.float_dtype)
            compiled = compile_model(self.graph, target, schedules={self.node: schedule})
            with compiled.session() as session:
                checked = session.run(feed)
                bad = mismatch(checked.outputs[self.graph.outputs[0]], want,
                               TOLERANCES[self.float_dtype])
                if bad:
                    return MeasureResult("wrong", error=bad, seconds=time.perf_counter() - start)
                ns = _times(session, checked, feed, backend)
        except Exception as exc:  # noqa: BLE001 - a bad schedule, compile or launch is a result
            return MeasureResult("error", error=one_line(exc), seconds=time.perf_counter() - start)
        return MeasureResult(OK, int(round(float(np.median(ns)))), {
            "runs": int(ns.size), "min_ns": int(ns.min())}, seconds=time.perf_counter() - start)


def _times(session, checked, feed, backend: str) -> np.ndarray:
    """Nanoseconds of the op: CUDA-event times of `RUNS` more launches (the checked run was
    the warm-up, which compiled the kernel), or the checked run's time on the interpreter
    (a run there takes seconds, and its time says nothing of a GPU's)."""
    if backend == "interpreter":
        return np.array([checked.ops[0].extra["interpreter_seconds"] * 1e9])
    times = [session.run(feed).ops[0].extra["gpu_seconds"] for _ in range(RUNS)]
    return np.asarray(times) * 1e9


def gpu_tasks(graph: Graph, target) -> list[GpuTask]:
    """One `GpuTask` per distinct GEMM workload of `graph` that `target` runs (depthwise
    convolutions run a kernel without a GEMM schedule), in the order of first use."""
    found = []
    for node in graph.nodes():
        if node.op not in GEMM_OPS or refusal(node, graph):
            continue
        if node.op.endswith("conv2d") and graph.tensors[node.inputs[1]].shape[1] == 1 \
                and node.attrs["groups"] > 1:
            continue
        found.append((GpuTask(node.name, one_node_graph(node, graph), node.name,
                              target.float_dtype), node))
    return merge_tasks(found)
