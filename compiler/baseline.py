"""onnxruntime as a reference column: the runtime a user would pick instead of vdla's CPU
target, run on the same model (`vdla compare --onnxruntime`, `bench/cpu.py`).

    fp32 = save_onnx(model.graph, "m.onnx")            # vdla.compiler.frontend.onnx_export
    int8 = quantize_qdq(fp32, model, "m-u8.onnx")      # onnxruntime's own static QDQ int8
    run = profile(int8, 2, [x], runs=20)               # inputs in the model's order
    run.total_seconds, run.group_seconds               # per op group, as `vdla compare`'s

onnxruntime is an optional dependency (``pip install vdla[onnxruntime]``); `available`
says whether it is installed. Its int8 is its own quantization (static, QDQ, per-channel
weights, on the same calibration samples vdla quantizes with), so its outputs differ
from vdla's integer reference: the column is a speed reference, never checked bit for
bit.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["OP_GROUPS", "ProfiledRun", "available", "default_threads", "profile",
           "quantize_qdq", "session"]

#: onnxruntime's kernels (after its graph optimizations) -> `vdla compare`'s op groups.
#: ``ReorderInput``/``ReorderOutput`` are its NCHWc layout conversions.
OP_GROUPS = {
    **dict.fromkeys(("Conv", "FusedConv", "QLinearConv", "ConvInteger", "NchwcConv"), "conv"),
    **dict.fromkeys(("Gemm", "MatMul", "FusedMatMul", "QGemm", "QLinearMatMul",
                     "MatMulInteger", "DynamicQuantizeMatMul"), "dense"),
    **dict.fromkeys(("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                     "QLinearAveragePool", "QLinearGlobalAveragePool", "NchwcMaxPool",
                     "NchwcAveragePool", "NchwcGlobalAveragePool"), "pool"),
    **dict.fromkeys(("Add", "Mul", "Relu", "Clip", "QLinearAdd", "QLinearMul", "Sum"),
                    "elementwise"),
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"),
                    "quantize"),
    **dict.fromkeys(("Flatten", "Reshape", "Transpose", "Concat", "Pad", "ReorderInput",
                     "ReorderOutput", "Squeeze", "Unsqueeze"), "layout"),
}


def default_threads() -> int:
    """The cores this process may run on (onnxruntime's team when none is asked for)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def available() -> str | None:
    """None when onnxruntime is installed, else what to install."""
    if importlib.util.find_spec("onnxruntime") is None:
        return "onnxruntime is not installed (pip install 'vdla[onnxruntime]')"
    return None


def session(path: str | os.PathLike, threads: int, *, profile_to: str | None = None):
    """An onnxruntime CPU session of the model at `path` on `threads` threads, its graph
    optimizations all on (the NCHWc layout transformer included), run sequentially."""
    import onnxruntime as ort  # heavy, and optional
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"onnxruntime threads must be a positive integer, not {threads!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_to is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_to
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def quantize_qdq(fp32: str | os.PathLike, model, out: str | os.PathLike,
                 activations: str = "u8") -> Path:
    """onnxruntime's own static QDQ quantization of the float model at `fp32` on
    `model`'s calibration samples (`pipeline.Model.calibration`), after its recommended
    pre-processing (``quant_pre_process``): per-channel int8 weights, `activations`
    ``"u8"`` (the faster path of its x86 kernels) or ``"s8"``. Written to `out`."""
    # heavy, and optional: onnxruntime
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process  # heavy, as above
    if activations not in ("u8", "s8"):
        raise ValueError(f"activations must be 'u8' or 's8', not {activations!r}")
    out = Path(out)
    pre = out.with_name(out.stem + "-pre.onnx")
    quant_pre_process(str(fp32), str(pre))
    name = model.graph.inputs[0]
    samples = model.calibration[name]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter({name: s.astype(np.float32)} for s in samples)

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8 if activations == "u8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    pre.unlink(missing_ok=True)
    return out


@dataclasses.dataclass(frozen=True)
class ProfiledRun:
    """What `profile` measured: the outputs, the median wall time of a run, each op
    group's time per run (the profiler's kernel times), the kernels' count per run, and
    each kernel's time per run by onnxruntime's node name (its fused nodes take the name
    of the last node they absorbed, e.g. ``layer1.0.relu1_nchwc``) with its op type."""

    outputs: list
    total_seconds: float
    group_seconds: dict[str, float]
    kernels: int
    node_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    node_ops: dict[str, str] = dataclasses.field(default_factory=dict)


def profile(path: str | os.PathLike, threads: int, inputs, runs: int = 10) -> ProfiledRun:
    """Run the model at `path` on `inputs` (arrays in the order of its inputs) `runs`
    times, after two warm-up runs, in a profiling session: the median wall time, and
    the profiler's kernel times per op group (`OP_GROUPS`; other kernels are "other"),
    averaged over the runs."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, not {runs!r}")
    with tempfile.TemporaryDirectory(prefix="vdla-ort-") as tmp:
        s = session(path, threads, profile_to=str(Path(tmp) / "ort"))
        names = [i.name for i in s.get_inputs()]
        if len(inputs) != len(names):
            raise ValueError(f"the model at {path} takes {len(names)} inputs ({names}), "
                             f"not {len(inputs)}")
        feed = dict(zip(names, inputs))
        outputs = s.run(None, feed)
        s.run(None, feed)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            s.run(None, feed)
            walls.append(time.perf_counter() - t0)
        trace = json.loads(Path(s.end_profiling()).read_text())
    kernels = [e for e in trace if e.get("cat") == "Node"
               and e.get("name", "").endswith("_kernel_time")]
    groups: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, float] = collections.defaultdict(float)
    ops: dict[str, str] = {}
    for e in kernels:
        op = e.get("args", {}).get("op_name", "")
        groups[OP_GROUPS.get(op, "other")] += e["dur"]
        node = e["name"][:-len("_kernel_time")]
        nodes[node] += e["dur"]
        ops[node] = op
    total_runs = runs + 2                    # the profiler saw the warm-up runs too
    return ProfiledRun(outputs, float(np.median(walls)),
                       {g: us * 1e-6 / total_runs for g, us in groups.items()},
                       len(kernels) // total_runs,
                       {n: us * 1e-6 / total_runs for n, us in nodes.items()}, ops)
