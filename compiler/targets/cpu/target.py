"""The host CPU as a target: the quantized graph's integer GEMM ops compiled to C.

    target = CpuTarget(threads=2)                        # or get("cpu", threads=2)
    compiled = compile_model(quantized, target)          # one C library for the model
    with compiled.session() as session:
        result = session.run({"input": x})

`compile_nodes` writes one C function per node it runs (`vdla.compiler.targets.cpu.codegen`)
into one source file, builds it once with the system C compiler (`build_library`: gcc
``-O3 -march=native``, OpenMP; cached by content hash) and loads it with ctypes. The
other nodes fall back to the host target (`compile_model`'s rule). Every run is checked
bit-exactly by the pipeline against the integer reference, whose arithmetic the C code
reproduces step for step.

Runs today: ``qconv2d`` (any kernel, stride, padding, dilation and groups, depthwise
included; plain layouts) and ``qdense``, in either requantization mode, with bias,
residual and clamp; the int8 pools (max, average, global average), ``qadd`` and int8
``relu``. Concat, quantize/dequantize and the float graph come next (issue 21), with
the schedule space the tuner searches.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import time
from typing import Any, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.base import CompiledOp, OpRun, Progress, Support, Target, TargetSession
from vdla.compiler.targets.cpu.build import build_library
from vdla.compiler.targets.cpu.codegen import (PRELUDE, conv2d_source, dense_source, max_terms,
                                               pool2d_source, qadd_source, relu_source)

__all__ = ["CpuTarget"]

_GEMM = ("qconv2d", "qdense")
_POOLS = ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d")
_SOURCES = {"qconv2d": conv2d_source, "qdense": dense_source,
            **{op: pool2d_source for op in _POOLS}, "qadd": qadd_source, "relu": relu_source}


@dataclasses.dataclass(frozen=True, eq=False)
class CpuKernel:
    """A compiled op: its C function's name in the model's library, and a GEMM op's
    constant weights and bias (contiguous, as the function reads them; None otherwise)."""

    function: str
    library: Any            # the model's `CBuild`
    weights: np.ndarray | None
    bias: np.ndarray | None


class CpuTarget(Target):
    """The host CPU, through generated C.

    threads : OpenMP threads a session uses (None: OpenMP's default, the cores)
    log : receives build progress (default: nothing)
    """

    name = "cpu"
    description = "the host CPU: generated C, built with the system C compiler (OpenMP)"

    def __init__(self, *, threads: int | None = None, log=None):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"CpuTarget: threads must be a positive integer, not {threads!r}")
        self.threads, self._log = threads, log

    def options(self) -> dict:
        return {"threads": self.threads}

    def capabilities(self) -> list[tuple[str, str]]:
        return [("qconv2d", "any kernel, stride, padding, dilation and groups (depthwise "
                            "too); bias, requantization, residual, clamp"),
                ("qdense", "with bias, requantization, residual and clamp"),
                ("max_pool2d", "int8, any window, stride, padding, ceil mode"),
                ("qavg_pool2d", "int8 window sums, requantized"),
                ("qglobal_avg_pool2d", "int8 sums over the image, requantized"),
                ("qadd", "two int8 tensors of one shape, each requantized"),
                ("relu", "int8")]

    def supports(self, node: Node, graph: Graph) -> Support:
        if node.op not in _SOURCES:
            return Support(False, f"the CPU target does not run {node.op!r} yet")
        if node.op not in _GEMM:
            return self._supports_plain(node, graph)
        a = node.attrs
        layouts = ("data_layout", "kernel_layout", "out_layout")
        plain = {"qconv2d": ("NCHW", "OIHW", "NCHW"), "qdense": ("NC", "OI", "NC")}[node.op]
        for key, want in zip(layouts, plain):
            if a[key] != want:
                return Support(False, f"{node.op} with {key} {a[key]!r}: the CPU target takes "
                                      f"plain layouts ({want})")
        if graph.constant(node.inputs[1]) is None:
            return Support(False, f"{node.op} with computed weights: the CPU target needs "
                                  "constant weights")
        if node.input(2) and graph.constant(node.input(2)) is None:
            return Support(False, f"{node.op} with a computed bias: the CPU target needs a "
                                  "constant bias")
        w = graph.tensors[node.inputs[1]].shape
        terms = int(np.prod(w[1:]))
        if terms > max_terms():
            return Support(False, f"{node.op} sums {terms} products per output, more than an "
                                  f"int32 accumulator holds exactly ({max_terms()})")
        return Support(True, "generated C on the host CPU")

    def _supports_plain(self, node: Node, graph: Graph) -> Support:
        """Pools, qadd and relu: int8 in plain NCHW (qadd and relu: any shape)."""
        tensors = [graph.tensors[t] for t in node.inputs if t]
        if any(t.dtype != "int8" for t in tensors):
            return Support(False, f"{node.op} on {tensors[0].dtype} data: the CPU target runs "
                                  "the int8 graph's ops so far")
        if any(t.layout for t in tensors):
            return Support(False, f"{node.op} on a packed layout: the CPU target takes plain "
                                  "NCHW")
        if node.op in _POOLS and len(tensors[0].shape) != 4:
            return Support(False, f"{node.op} on a {len(tensors[0].shape)}-D tensor; NCHW only")
        if node.op == "qadd" and tensors[0].shape != tensors[1].shape:
            return Support(False, f"qadd of shapes {tensors[0].shape} and {tensors[1].shape}: "
                                  "the CPU target adds equal shapes, without broadcasting")
        return Support(True, "generated C on the host CPU")

    # --- compiling -----------------------------------------------------------------------

    def compile_nodes(self, graph: Graph, nodes: Sequence[Node], *,
                      schedules: Mapping[str, Any], progress: Progress | None = None,
                      start: int = 0, total: int | None = None) -> list[CompiledOp]:
        if any(s is not None for s in schedules.values()):
            raise TypeError("the CPU target has no schedules yet; got "
                            f"{sorted(k for k, s in schedules.items() if s is not None)}")
        total = len(nodes) if total is None else total
        t0 = time.perf_counter()
        functions, parts = {}, [PRELUDE]
        for i, node in enumerate(nodes):
            if progress is not None:
                progress(start + i, total, node.name)
            fn = f"op_{i}_" + hashlib.sha256(node.name.encode()).hexdigest()[:8]
            parts.append(_SOURCES[node.op](fn, node, graph))
            functions[node.name] = fn
        library = build_library({"model.c": "".join(parts)}, name="vdla_cpu", log=self._log)
        seconds = (time.perf_counter() - t0) / max(1, len(nodes))
        ops = []
        for node in nodes:
            w = bias = None
            if node.op in _GEMM:
                w = np.ascontiguousarray(graph.constant(node.inputs[1]), dtype=np.int8)
                bias = graph.constant(node.input(2)) if node.input(2) else None
                bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.int32)
            ops.append(CompiledOp(node.name, node.op, self.name, "", None,
                                  CpuKernel(functions[node.name], library, w, bias),
                                  compile_seconds=seconds))
        return ops

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        return self.compile_nodes(graph, [node], schedules={node.name: schedule})[0]

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> "CpuSession":
        if device is not None:
            raise ValueError("the CPU target runs on the host; it takes no device")
        return CpuSession(self, graph, ops)


def _pointer(array: np.ndarray | None):
    return None if array is None else array.ctypes.data_as(ctypes.c_void_p)


class CpuSession(TargetSession):
    """The model's library loaded, its functions looked up once."""

    def __init__(self, target: CpuTarget, graph: Graph, ops: Sequence[CompiledOp]):
        self.graph = graph
        self._functions = {}
        libraries = {}
        for op in ops:
            build = op.kernel.library
            if build.key not in libraries:
                lib = build.load()
                lib.vdla_set_threads.argtypes = [ctypes.c_int]
                lib.vdla_set_threads(target.threads or 0)
                libraries[build.key] = lib
            fn = getattr(libraries[build.key], op.kernel.function)
            fn.argtypes = [ctypes.c_void_p] * 5
            fn.restype = None
            self._functions[op.name] = fn
        self._libraries = libraries

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        x = np.ascontiguousarray(args[0], dtype=np.int8)
        shape = self.graph.tensors[node.outputs[0]].shape
        y = np.empty(shape, dtype=np.int8)
        k = op.kernel
        if k.weights is None:            # pools, qadd (its second operand), relu
            x2 = np.ascontiguousarray(args[1], dtype=np.int8) if len(args) > 1 else None
            self._functions[op.name](_pointer(x), _pointer(x2), None, None, _pointer(y))
            return OpRun([y])
        residual = args[3] if len(args) > 3 and args[3] is not None else None
        residual = None if residual is None else np.ascontiguousarray(residual, dtype=np.int8)
        self._functions[op.name](_pointer(x), _pointer(k.weights), _pointer(k.bias),
                                 _pointer(residual), _pointer(y))
        macs = int(np.prod(shape)) * int(np.prod(k.weights.shape[1:]))
        return OpRun([y], macs=macs)

    def close(self) -> None:
        self._functions, self._libraries = {}, {}
