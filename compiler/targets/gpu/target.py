"""A GPU as a target: the front half's graph, int8 or float, as Triton kernels.

    target = GpuTarget()                                 # or get("gpu", device="auto")
    compiled = compile_model(graph, target)              # kernels launched per node
    with compiled.session() as session:
        result = session.run({"input": x})               # per-op stats, activations on the GPU

`compile_nodes` lowers every node it runs (`lower`: which kernel, its grid, its
constants; GEMMs with the caller's schedule, e.g. the tuner's records, or `choose`'s);
`open_session` uploads the constants once and keeps every activation in the device's
memory from the op that writes it to the ops that read it (`TargetSession.holds`): the
host reads one back only for a host op or a model output.

Where it runs (`device`): ``cuda`` (a CUDA GPU: Triton compiles the kernels, CUDA events
time each op), ``interpreter`` (Triton's interpreter on the CPU: the same kernels, bit
for bit, at interpreter speed: its times are no GPU's), or ``auto`` (the GPU when one is
present). ``gpu`` names a GPU of `vdla.compiler.targets.gpu.gpus` whose roofline estimate
each op reports beside its measured time (`OpRun.extra`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.ops_sequence import check_gather_indices
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.base import (CompiledOp, DeviceValue, GraphRun, OpRun, Support,
                                        Target, TargetSession)
from vdla.compiler.targets.gpu import gpus, roofline, runtime
from vdla.compiler.targets.options import EstimateColumn, ExtraColumn, TargetOption
from vdla.compiler.targets.gpu.lower import (FLOAT_DTYPES, GpuKernel, Ref, lower,
                                             refusal)
from vdla.compiler.targets.gpu.schedule import GemmSchedule
from vdla.compiler.targets.gpu.tuning import gpu_tasks

__all__ = ["DEFAULT_GPU", "GpuSession", "GpuTarget"]

#: The GPU of ``vdla compare``'s roofline column without ``--gpu``.
DEFAULT_GPU = "h100-sxm"

#: The fields of a GEMM schedule (`GemmSchedule.to_dict`) `describe_schedule` shows.
_SCHEDULE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k")

_CAPABILITIES = [
    ("conv2d, qconv2d", "float32/float16 or int8 implicit GEMM (any kernel, stride, padding, "
                        "dilation, groups; depthwise tap by tap) with a fused epilogue: bias, "
                        "requantization, residual, ReLU/clip or clamp; tuned schedules "
                        "(tiles, warps, stages, split-K)"),
    ("dense, qdense", "the same GEMM kernel (a 1x1 convolution), same epilogues"),
    ("max_pool2d, avg_pool2d, qavg_pool2d", "any window, stride, padding, ceil mode"),
    ("global_avg_pool2d, qglobal_avg_pool2d", "float means, int8 sums requantized"),
    ("qadd, add, mul", "int8 (requantized per tensor or channel, clamped) or float32, any "
                       "numpy broadcast up to 4-D; add and mul also up to 6-D and on "
                       "int32/int64"),
    ("relu, clip, quantize, dequantize", "elementwise (quantize/dequantize in float64, as "
                                         "the reference)"),
    ("concat, flatten, reshape", "concat copies each part into its slice; flatten and "
                                 "reshape are views"),
    ("matmul, qmatmul", "batched over any broadcast batch axes, both operands computed or "
                        "constant; int8 summed in int32 and requantized per tensor "
                        "(transpose_b: a stride swap)"),
    ("attention", "float32 or float16 in one pass over the keys (FlashAttention's online "
                  "softmax): scale, additive mask, causal; the scores stay on chip"),
    ("qattention", "int8, bit for bit: the scores requantized into a device buffer, the "
                   "integer softmax of its rows (mask and causal keys left out), times v"),
    ("qsoftmax, qlayer_norm, qgelu", "int8, bit for bit with the integer definitions "
                                     "(exponentials and GELU as the reference's tables)"),
    ("softmax, layer_norm, reduce_mean/sum/max", "float32 rows of the last axis (a reduction "
                                                 "over other axes permutes them last first)"),
    ("gelu, sqrt, erf, tanh, exp, neg, sub, div, pow, equal, less, greater, where, cast",
     "elementwise over numpy broadcasts up to 6-D; dense may end in a GELU"),
    ("gather", "any axis, int32/int64 indices checked on the device: one outside [-n, n) is "
               "the reference's error, never read"),
    ("transpose, slice, expand", "strided copies up to 6-D, any dtype"),
]


class GpuTarget(Target):
    """A GPU through Triton (see the module docstring).

    device : ``auto``, ``cuda`` or ``interpreter`` (`runtime.DEVICES`)
    float_dtype : how the float graph is stored and multiplied: ``float32`` (ieee dots,
        no TF32) or ``float16`` (float32 sums)
    gpu : a GPU name of `vdla.compiler.targets.gpu.gpus` for per-op roofline estimates,
        or None
    """

    name = "gpu"
    description = ("a GPU: Triton kernels (implicit-GEMM int8/float convolutions with fused "
                   "epilogues; transformers' attention, softmax, LayerNorm and GELU, int8 "
                   "bit for bit) on CUDA, or on Triton's interpreter without one")
    measure_backends = runtime.MODES
    cli_options = (
        TargetOption("--device", f"where the kernels run: {', '.join(runtime.DEVICES)} (auto, "
                                 "the default: a CUDA GPU when one is present, else Triton's "
                                 "interpreter on the CPU)",
                     metavar="NAME", commands=("run",)),
        TargetOption("--gpu", "also estimate each op on this GPU by its roofline (see `vdla "
                              f"roofline`; vdla compare's estimate column: default {DEFAULT_GPU})",
                     metavar="NAME", commands=("run", "compare"),
                     defaults={"compare": DEFAULT_GPU}),
    )
    extra_columns = {"gpu_seconds": ExtraColumn("GPU ms", 1e3),
                     "roofline_seconds": ExtraColumn("roofline us (est.)", 1e6),
                     # the wall time column shows it
                     "interpreter_seconds": ExtraColumn("", hidden=True)}

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            runtime.require()
        except ValueError as e:
            return str(e)
        return None

    @classmethod
    def left_out_by_default(cls) -> str | None:
        """Left out of a default comparison without a CUDA GPU: the interpreter runs the
        same kernels bit for bit, but takes minutes for a ResNet and times no GPU."""
        missing = cls.unavailable()
        if missing is not None or runtime.auto_mode() == "cuda":
            return missing
        return ("no CUDA GPU here; Triton's interpreter would run its kernels on the CPU, "
                "bit-exact but slow (over a minute for ResNet-18) and timing no GPU: name "
                "gpu in --targets to add it")

    @classmethod
    def from_cli(cls, options, *, precision: str = "int8", log=None) -> "GpuTarget":
        """``--device`` and ``--gpu``, floats stored as the precision says (float16 or
        float32); a missing extra, an unknown GPU or ``--device cuda`` without a GPU is
        an error now, before any model is loaded."""
        if options.get("gpu") is not None:
            try:
                gpus.get(options["gpu"])
            except ValueError as e:
                raise ValueError(f"--gpu: {e}") from None
        runtime.require()
        target = cls(device=options.get("device") or "auto",
                     float_dtype="float16" if precision == "float16" else "float32",
                     gpu=options.get("gpu"))
        target.mode          # no CUDA GPU for --device cuda, ...: a clear error now
        return target

    @property
    def precisions(self) -> tuple[str, ...]:
        """int8, and the float graph in its `float_dtype`."""
        return ("int8", self.float_dtype)

    def describe_schedule(self, schedule) -> str:
        """A GEMM tile ``128x64x32 w4 s3`` (BLOCK_M x BLOCK_N x BLOCK_K, warps, stages;
        ``k4`` for split-K 4)."""
        if not set(_SCHEDULE_KEYS) <= set(schedule):
            return super().describe_schedule(schedule)
        return (f"{schedule['block_m']}x{schedule['block_n']}x{schedule['block_k']} "
                f"w{schedule['num_warps']} s{schedule['num_stages']}"
                + (f" k{schedule['split_k']}" if schedule["split_k"] > 1 else ""))

    def check_measure(self, backend: str) -> None:
        super().check_measure(backend)
        if backend == "cuda" and self.mode != "cuda":
            raise ValueError("the gpu target's schedules are timed on a CUDA GPU, and there "
                             "is none here; --measure interpreter runs the search on "
                             "Triton's interpreter (each schedule checked, but its times are "
                             "no GPU's)")

    def column_label(self, summary) -> str:
        return f"{self.name} ({summary['mode']})"

    def time_note(self, summary) -> str:
        if summary["mode"] == "cuda":
            return f"CUDA-event time per kernel on {summary['device']} + host wall time"
        return (f"wall time on the {summary['device']}: the interpreter's, not GPU times; "
                "checks the kernels bit for bit")

    def report_lines(self, summary) -> list[str]:
        """Where the kernels ran and what their times are; the roofline estimate on the
        GPU ``--gpu`` named."""
        if summary["mode"] == "cuda":
            lines = [f"gpu: {summary['device']}, {summary['float_dtype']} floats: "
                     f"{summary['gpu_seconds'] * 1e3:.3f} ms of kernels (CUDA events per op)"]
        else:
            lines = [f"gpu: no CUDA GPU here; the kernels ran on the {summary['device']} "
                     f"({summary['interpreter_seconds']:.2f} s): these times are the "
                     "interpreter's, not GPU times"
                     + ("" if summary.get("roofline_seconds") is not None
                        else " (--gpu NAME adds a roofline estimate)")]
        if summary.get("roofline_seconds") is not None:
            lines.append(f"roofline estimate on {summary['roofline_gpu']}: "
                         f"{summary['roofline_seconds'] * 1e6:.2f} us of kernels, "
                         f"{summary['roofline_with_launch_seconds'] * 1e6:.2f} us with a "
                         "launch each (datasheet peaks, not a measurement; `vdla roofline` "
                         "for the bounds)")
        return lines

    def estimate_column(self) -> EstimateColumn | None:
        """Each op's roofline bound on `gpu` plus a launch (a view: nothing); the host's
        ops at their wall time."""
        if self.gpu is None:
            return None

        def seconds(stats) -> float:
            if stats.target != self.name:
                return stats.wall_seconds
            if stats.extra.get("view"):
                return 0.0
            return stats.extra["roofline_seconds"] + roofline.LAUNCH_SECONDS

        return EstimateColumn(f"{self.name} est. ({self.gpu.name})",
                              f"ESTIMATE: roofline on {self.gpu.title} (datasheet peaks, a "
                              "launch per kernel; not a measurement) + host wall time",
                              seconds)

    def __init__(self, *, device: str = "auto", float_dtype: str = "float32",
                 gpu: str | None = None):
        if device not in runtime.DEVICES:
            raise ValueError(f"GpuTarget: device must be one of {', '.join(runtime.DEVICES)}, "
                             f"not {device!r}")
        if float_dtype not in FLOAT_DTYPES:
            raise ValueError(f"GpuTarget: float_dtype must be one of "
                             f"{', '.join(FLOAT_DTYPES)}, not {float_dtype!r}")
        self.gpu = None if gpu is None else gpus.get(gpu)
        self.device, self.float_dtype = device, float_dtype
        self._mode: str | None = None

    @property
    def mode(self) -> str:
        """``cuda`` or ``interpreter`` (resolved once; ValueError without the gpu extra)."""
        if self._mode is None:
            self._mode = runtime.resolve(self.device)
        return self._mode

    @property
    def simulated(self) -> bool:
        """On the interpreter, an op's wall time is no GPU's."""
        return self.mode == "interpreter"

    def options(self) -> dict:
        mode = self._mode
        if mode is None and runtime.available():
            try:
                mode = self.mode
            except ValueError:
                mode = None
        return {"device": self.device, "mode": mode, "float_dtype": self.float_dtype,
                "gpu": None if self.gpu is None else self.gpu.name}

    def capabilities(self) -> list[tuple[str, str]]:
        return list(_CAPABILITIES)

    def supports(self, node: Node, graph: Graph) -> Support:
        problem = refusal(node, graph)
        if problem:
            return Support(False, problem)
        return Support(True, "Triton kernels on the GPU")

    def check_graph(self, graph: Graph) -> None:
        """The gpu extra is needed to compile at all (ValueError saying how to install
        it), and the device must exist."""
        self.mode

    # --- compiling ----------------------------------------------------------------------------

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        if isinstance(schedule, dict):
            schedule = GemmSchedule.from_dict(schedule)
        kernel, used = lower(node, graph, schedule, float_dtype=self.float_dtype)
        if self.gpu is not None:
            estimate = roofline.estimate(graph, self.gpu, self._precision(graph, node),
                                         nodes=[node.name])
            # The bound alone; the session's summary adds a launch per kernel.
            kernel = dataclasses.replace(kernel, roofline_seconds=estimate.seconds)
        return CompiledOp(node.name, node.op, self.name, "",
                          None if used is None else used.to_dict(), kernel)

    def _precision(self, graph: Graph, node: Node) -> str:
        dtypes = {graph.tensors[t].dtype for t in node.inputs if t}
        if "float32" in dtypes and not node.op == "quantize":
            return self.float_dtype
        return "int8"

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> "GpuSession":
        if device is not None:
            raise ValueError("the gpu target opens its own device; it takes none")
        return GpuSession(self, graph, ops)

    def tasks(self, graph: Graph) -> list:
        return gpu_tasks(graph, self)


class GpuSession(TargetSession):
    """The ops' constants on the device, every activation of its ops kept there."""

    def __init__(self, target: GpuTarget, graph: Graph, ops: Sequence[CompiledOp]):
        import torch  # heavy (the gpu extra; check_graph has required it)

        self._torch, self.graph, self.target = torch, graph, target
        self.mode = target.mode
        self._dev = runtime.torch_device(self.mode)
        self._kernels: dict[str, GpuKernel] = {op.name: op.kernel for op in ops}
        self._consts = {name: {key: self._upload(arr) for key, arr in k.consts.items()}
                        for name, k in self._kernels.items()}
        self._scratch = {name: torch.empty(k.scratch[0], dtype=getattr(torch, k.scratch[1]),
                                           device=self._dev)
                         for name, k in self._kernels.items() if k.scratch is not None}
        self._buffers = {name: {key: torch.empty(shape, dtype=getattr(torch, dtype),
                                                 device=self._dev)
                                for key, (shape, dtype) in k.buffers.items()}
                         for name, k in self._kernels.items() if k.buffers}
        self._dummies: dict[str, Any] = {}
        self._held = {t for op in ops for node in [graph.node(op.name)]
                      for t in (*node.inputs, *node.outputs)
                      if t and not graph.tensors[t].is_constant}
        self._values: dict[str, Any] = {}

    # --- memory -------------------------------------------------------------------------------

    def _upload(self, array: np.ndarray):
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self._dev)

    def _storage(self, tensor: str):
        dtype = self.graph.tensors[tensor].dtype
        if dtype == "float32":
            dtype = self.target.float_dtype
        return getattr(self._torch, dtype)

    def _dummy(self, dtype: str):
        if dtype not in self._dummies:
            self._dummies[dtype] = self._torch.zeros(1, dtype=getattr(self._torch, dtype),
                                                     device=self._dev)
        return self._dummies[dtype]

    def holds(self, tensor: str) -> bool:
        return tensor in self._held

    def put(self, tensor: str, value: np.ndarray) -> int:
        if not self.holds(tensor):
            raise ValueError(f"gpu session: tensor {tensor!r} is not one of its ops' "
                             "activations")
        t = self.graph.tensors[tensor]
        value = np.asarray(value)
        if value.shape != tuple(t.shape) or value.dtype != DTYPES[t.dtype]:
            raise ValueError(f"gpu session: {tensor!r} must be {t.dtype} of shape "
                             f"{tuple(t.shape)}, not {value.dtype} of shape {value.shape}")
        self._values[tensor] = self._upload(value).to(self._storage(tensor))
        return int(self._values[tensor].numel() * self._values[tensor].element_size())

    def fetch(self, tensor: str) -> np.ndarray:
        if tensor not in self._values:
            raise ValueError(f"gpu session: tensor {tensor!r} is not in the device's memory")
        dtype = DTYPES[self.graph.tensors[tensor].dtype]
        return self._values[tensor].cpu().numpy().astype(dtype, copy=False)

    # --- running ------------------------------------------------------------------------------

    def _bind(self, ref, name: str, inputs: list, out):
        if not isinstance(ref, Ref):
            return ref
        if ref.kind == "in":
            return inputs[ref.key]
        if ref.kind == "out":
            return out
        if ref.kind == "const":
            return self._consts[name][ref.key]
        if ref.kind == "scratch":
            return self._scratch[name]
        if ref.kind == "buf":
            return self._buffers[name][ref.key]
        return self._dummy(ref.key)

    def _launch(self, op_name: str, node: Node, inputs: list):
        """Launch `node`'s kernels on its inputs (device tensors); returns its output."""
        kernel = self._kernels[op_name]
        shape = tuple(self.graph.tensors[node.outputs[0]].shape)
        if kernel.view:
            return inputs[0].reshape(shape)
        out = self._torch.empty(shape, dtype=self._storage(node.outputs[0]), device=self._dev)
        for key in kernel.zeroed:
            self._buffers[op_name][key].zero_()
        for launch in kernel.launches:
            fn = runtime.kernel(launch.kernel)
            fn[launch.grid](*(self._bind(a, op_name, inputs, out) for a in launch.args),
                            **launch.meta)
        for check in kernel.checks:
            self._check_indices(op_name, node, inputs, check)
        return out

    def _check_indices(self, op_name: str, node: Node, inputs: list, check) -> None:
        """A gather's bounds check (`IndexCheck`): the reference's ValueError, naming the
        tensor, the index and the range, when the kernel found an index out of range."""
        if int(self._buffers[op_name][check.buffer].item()) == 0:
            return
        name = node.inputs[check.indices]
        t = self.graph.tensors[name]
        indices = (t.data if t.is_constant
                   else inputs[check.indices].cpu().numpy())
        check_gather_indices(node, node.inputs[0], name, check.n, indices)
        raise ValueError(f"node {node.name!r} (gather): the GPU kernel found an index of "
                         f"{name!r} outside [{-check.n}, {check.n})")

    def _inputs(self, node: Node, args) -> list:
        inputs = []
        for name, arg in zip(node.inputs, args):
            if isinstance(arg, DeviceValue):
                inputs.append(self._values[name])
            else:
                inputs.append(None)    # constants: the kernel reads its uploaded copy
        return inputs

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        inputs = self._inputs(node, args)
        if self.mode == "cuda":
            torch = self._torch
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            begin.record()
            out = self._launch(op.name, node, inputs)
            end.record()
            end.synchronize()
            extra = {"gpu_seconds": begin.elapsed_time(end) / 1e3}
        else:
            t0 = time.perf_counter()
            out = self._launch(op.name, node, inputs)
            extra = {"interpreter_seconds": time.perf_counter() - t0}
        kernel = self._kernels[op.name]
        if kernel.roofline_seconds is not None:
            extra["roofline_seconds"] = kernel.roofline_seconds
        if kernel.view:
            extra["view"] = True
        self._values[node.outputs[0]] = out
        if self.mode == "cuda":
            device = (extra["gpu_seconds"], "CUDA events")
        else:
            device = (extra["interpreter_seconds"], "wall time on Triton's interpreter")
        return OpRun([DeviceValue(self, node.outputs[0])], macs=kernel.macs or None,
                     extra=extra, device_seconds=device[0], device_time=device[1])

    def run_graph(self, feed: Mapping[str, np.ndarray]) -> GraphRun | None:
        """Every op back to back (no synchronization between them), timed by CUDA events
        between the ops, when this session runs the whole graph on a CUDA GPU; None
        otherwise (on the interpreter `run` is the measure)."""
        graph = self.graph
        if self.mode != "cuda" or set(self._kernels) != {n.name for n in graph.nodes()}:
            return None
        torch = self._torch
        for name in graph.inputs:
            self.put(name, feed[name])
        nodes = graph.nodes()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(nodes) + 1)]
        events[0].record()
        for node, event in zip(nodes, events[1:]):
            self._values[node.outputs[0]] = self._launch(
                node.name, node, [self._values.get(t) for t in node.inputs])
            event.record()
        events[-1].synchronize()
        seconds = {n.name: a.elapsed_time(b) / 1e3 for n, a, b in zip(nodes, events, events[1:])}
        return GraphRun({name: self.fetch(name) for name in graph.outputs}, seconds)

    def summary(self, stats) -> dict:
        key = "gpu_seconds" if self.mode == "cuda" else "interpreter_seconds"
        estimates = [s.extra.get("roofline_seconds") for s in stats]
        bound = None if self.target.gpu is None or None in estimates else sum(estimates)
        launches = sum(not s.extra.get("view") for s in stats)
        return {"mode": self.mode, "device": runtime.device_name(self.mode),
                "float_dtype": self.target.float_dtype,
                key: sum(s.extra.get(key, 0.0) for s in stats),
                "roofline_gpu": None if self.target.gpu is None else self.target.gpu.name,
                # the kernels' roofline bounds, and with `roofline.LAUNCH_SECONDS` each
                "roofline_seconds": bound,
                "roofline_with_launch_seconds": (None if bound is None else
                                                 bound + launches * roofline.LAUNCH_SECONDS),
                "macs": sum(s.macs or 0 for s in stats)}

    def close(self) -> None:
        self._values, self._consts, self._scratch, self._buffers = {}, {}, {}, {}
