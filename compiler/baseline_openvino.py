"""OpenVINO as a second reference column beside onnxruntime (`vdla.compiler.baseline`):
Intel's inference runtime, its CPU plugin, on the same ONNX files onnxruntime runs
(`vdla compare --reference openvino`, `bench/cpu.py`).

    compiled = compile_onnx("m.onnx", 2)               # f32, 2 threads, latency hint
    run = profile("m-u8.onnx", 2, [x], runs=20)        # a `baseline.ProfiledRun`
    run.total_seconds, run.group_seconds               # per op group, as onnxruntime's

* float32: the float ONNX model vdla exports, compiled with the inference precision hint
  set to f32. The CPU plugin's default precision is bf16 on machines with AMX or
  AVX-512 BF16, which would make a float32 column a bf16 one; `compile_onnx` sets the
  hint and refuses a compiled model that reports anything else.
* int8: the static QDQ model onnxruntime's quantizer writes (`baseline.quantize_qdq`,
  after ``quant_pre_process``): OpenVINO's documented int8 path for an ONNX model is a
  model with QuantizeLinear/DequantizeLinear pairs, which its low-precision
  transformations turn into int8 kernels. Its own post-training quantization (NNCF) is
  the path its documentation recommends for its own models; it is not used here, so that
  both runtimes run the same quantized file (and vdla needs no NNCF).

Both run at batch 1 on `threads` threads (``INFERENCE_NUM_THREADS``), one stream, with
the latency performance hint, and are timed as onnxruntime's are: two warm-up runs, then
`runs` runs, the median. The op groups come from its per-node performance counters.

OpenVINO is an optional dependency (``pip install 'vdla[openvino]'``, which brings
onnxruntime for the quantizer); `available` says whether it is installed. Like
onnxruntime's, its int8 outputs differ from vdla's integer reference: a speed reference,
never checked bit for bit.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import time
from typing import Callable

import numpy as np

from vdla.compiler.baseline import ProfiledRun, feed_for

__all__ = ["OP_GROUPS", "OpenVinoRun", "available", "compile_onnx", "inputs_of",
           "layer_precisions", "profile", "runner", "version"]

#: The CPU plugin's node types (after its transformations) -> `vdla compare`'s op groups.
#: ``Subgraph`` is a chain of elementwise ops it fuses and compiles as one kernel (its
#: snippets; an int8 model's input quantization is one); ``ReduceMean`` is what it makes
#: of a global average pool; ``Reorder`` its layout conversions.
OP_GROUPS = {
    **dict.fromkeys(("Convolution", "GroupConvolution", "Deconvolution"), "conv"),
    **dict.fromkeys(("FullyConnected", "FullyConnectedQuantizedLegacy",
                     "FullyConnectedQuantized", "FullyConnectedCompressed", "MatMul",
                     "Gemm"), "dense"),
    **dict.fromkeys(("MaxPool", "AvgPool", "Pooling", "ReduceMean", "AdaptivePooling"),
                    "pool"),
    **dict.fromkeys(("Eltwise", "Subgraph", "Add", "Multiply", "Relu", "Clamp", "Math"),
                    "elementwise"),
    **dict.fromkeys(("FakeQuantize",), "quantize"),
    # Convert is a type cast (a mask's int64 to float), as onnxruntime's Cast is.
    **dict.fromkeys(("Reorder", "Reshape", "Transpose", "Concatenation", "Concat", "Pad",
                     "Squeeze", "Unsqueeze", "Split", "StridedSlice", "Broadcast",
                     "ShapeOf", "Convert"), "layout"),
    **dict.fromkeys(("ScaledDotProductAttention", "Softmax", "SoftMax"), "attention"),
    **dict.fromkeys(("MVN", "RMS", "NormalizeL2"), "norm"),
    **dict.fromkeys(("Gather",), "embedding"),
}


def available() -> str | None:
    """None when OpenVINO (and onnxruntime, whose quantizer writes the int8 model) is
    installed, else what to install."""
    missing = [m for m in ("openvino", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                "installed (pip install 'vdla[openvino]')")
    return None


def version() -> str:
    """OpenVINO's release (``2026.4.1``), without its build suffix."""
    import openvino  # heavy, and optional
    return openvino.__version__.split("-")[0]


def compile_onnx(path: str | os.PathLike, threads: int, *, profiling: bool = False):
    """The ONNX model at `path` compiled by OpenVINO's CPU plugin: inference precision
    f32 (never its bf16 default on machines with AMX or AVX-512 BF16), `threads`
    threads, one stream, the latency hint; `profiling` turns its per-node performance
    counters on. RuntimeError when the compiled model reports another precision or
    thread count than asked for."""
    import openvino as ov  # heavy, and optional
    from openvino import properties  # heavy, as above
    from openvino.properties import hint  # heavy, as above
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"openvino threads must be a positive integer, not {threads!r}")
    config = {hint.inference_precision: ov.Type.f32,
              hint.performance_mode: hint.PerformanceMode.LATENCY,
              properties.inference_num_threads: threads,
              properties.num_streams: 1,
              properties.enable_profiling: profiling}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    precision = compiled.get_property(hint.inference_precision())
    team = compiled.get_property(properties.inference_num_threads())
    if precision != ov.Type.f32 or team != threads:
        raise RuntimeError(f"OpenVINO compiled {path} at precision {precision} on {team} "
                           f"threads, not f32 on {threads}")
    return compiled


def inputs_of(compiled) -> dict[str, np.dtype]:
    """The inputs of an OpenVINO compiled model, in order: name -> numpy dtype (what
    `baseline.feed_for` takes)."""
    return {i.any_name: np.dtype(i.element_type.to_dtype()) for i in compiled.inputs}


def layer_precisions(compiled) -> dict[str, str]:
    """The precision each convolution and dense layer of an OpenVINO compiled model runs
    at (its runtime model's ``runtimePrecision``: ``f32``, ``bf16``, ``u8``, ``i8``), by
    layer name: what its transformations made of the model, int8 layers included."""
    found = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str)
        if OP_GROUPS.get(kind) in ("conv", "dense"):
            found[op.get_friendly_name()] = info["runtimePrecision"].astype(str)
    return found


@dataclasses.dataclass(frozen=True)
class OpenVinoRun(ProfiledRun):
    """What `profile` measured (`baseline.ProfiledRun`'s fields), and the precision each
    convolution and dense layer ran at (`layer_precisions`)."""

    precisions: dict[str, str] = dataclasses.field(default_factory=dict)


def runner(path: str | os.PathLike, threads: int, inputs) -> Callable[[], list]:
    """One inference of the model at `path` (`compile_onnx`) on `inputs` (arrays in the
    order of its inputs, or a mapping by name; each cast to its declared type) per call,
    returning the outputs: what a bench times."""
    compiled = compile_onnx(path, threads)
    request = compiled.create_infer_request()
    feed = feed_for(inputs_of(compiled), inputs)
    outputs = compiled.outputs

    def run() -> list:
        # The inputs are read in place (contiguous arrays of the declared type, as
        # onnxruntime reads them); the outputs are copied out, as onnxruntime returns them.
        result = request.infer(feed, share_inputs=True)
        return [np.array(result[o]) for o in outputs]

    return run


def profile(path: str | os.PathLike, threads: int, inputs, runs: int = 10) -> OpenVinoRun:
    """Run the model at `path` on `inputs` (as `runner` takes them) `runs` times after two
    warm-up runs, with OpenVINO's performance counters on: the outputs, the median wall
    time, the executed nodes' times per op group (`OP_GROUPS`; other node types are
    "other") and per node, per timed run, and its layers' precisions."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, not {runs!r}")
    compiled = compile_onnx(path, threads, profiling=True)
    request = compiled.create_infer_request()
    try:
        feed = feed_for(inputs_of(compiled), inputs)
    except ValueError as exc:
        raise ValueError(f"the model at {path}: {exc}") from None
    result = request.infer(feed, share_inputs=True)
    outputs = [np.array(result[o]) for o in compiled.outputs]
    request.infer(feed, share_inputs=True)
    warm = _node_totals(request, 2)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        request.infer(feed, share_inputs=True)
        walls.append(time.perf_counter() - t0)
    # Its counters hold each node's mean over every run of the request, the first (which
    # builds its kernels and takes up to tens of times longer) included: the timed runs'
    # share is what the totals gained after the warm-up. They count whole microseconds,
    # so a node's figure is good to about one microsecond: never below zero.
    totals = _node_totals(request, runs + 2)
    nodes = {n: max(0.0, (t - warm.get(n, 0.0)) / runs) for n, t in totals.items()}
    ops = {info.node_name: info.node_type for info in request.profiling_info}
    groups: dict[str, float] = collections.defaultdict(float)
    for node, seconds in nodes.items():
        groups[OP_GROUPS.get(ops[node], "other")] += seconds
    return OpenVinoRun(outputs, float(np.median(walls)), dict(groups), len(nodes), nodes,
                       {n: ops[n] for n in nodes}, layer_precisions(compiled))


def _node_totals(request, runs: int) -> dict[str, float]:
    """Each executed node's seconds over the `runs` runs `request` has made: its
    performance counters hold the mean per run."""
    return {info.node_name: info.real_time.total_seconds() * runs
            for info in request.profiling_info if info.status == info.Status.EXECUTED}
