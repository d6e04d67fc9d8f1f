"""onnxruntime as a reference column: the runtime a user would pick instead of vdla's CPU
target, run on the same model (`vdla compare --onnxruntime`, `bench/cpu.py`,
`bench/cpu_transformers.py`).

    fp32 = save_onnx(model.graph, "m.onnx")            # vdla.compiler.frontend.onnx_export
    int8 = quantize_qdq(fp32, model, "m-u8.onnx")      # onnxruntime's own static QDQ int8
    run = profile(int8, 2, [x], runs=20)               # inputs in the model's order (or
    run.total_seconds, run.group_seconds               # by name); per op group, as
                                                       # `vdla compare`'s

Transformers (`transformer_kind` says which of onnxruntime's model types a graph is:
``bert`` for encoders, ``gpt2`` for causal decoders, ``vit`` for image transformers)
have more than one fast path in onnxruntime, and `variants` builds them all:

* float32: the model as exported, and the model after onnxruntime's transformer
  optimizer (`optimize_transformer`: ``onnxruntime.transformers.optimizer.optimize_model``,
  which fuses attention, LayerNorm with the residual add, GELU with its bias into its
  contrib operators), given the model in the forms torch's exporters write, which its
  fusions match (`exporter_form`: vdla's exporter writes linear layers on 2-D views);
* int8: its static QDQ quantization after ``quant_pre_process`` (`quantize_qdq`, as for
  CNNs), and its dynamic quantization (`quantize_dynamic_int8`:
  ``onnxruntime.quantization.quantize_dynamic``, int8 weights, activations quantized at
  run time, the usual path for BERT) of the optimized model.

`fastest` times them side by side and names the faster of each precision. Inputs may be
integers (token ids and attention masks, int64) as well as floats: `feed_for` casts each
to the type the ONNX model declares.

onnxruntime is an optional dependency (``pip install vdla[onnxruntime]``); `available`
says whether it is installed. Its int8 is its own quantization (static on the same
calibration samples vdla quantizes with, or dynamic), so its outputs differ from vdla's
integer reference: the column is a speed reference, never checked bit for bit.
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
from typing import Mapping, Sequence

import numpy as np

from vdla.compiler.baseline_forms import exporter_form

__all__ = ["OP_GROUPS", "TRANSFORMER_KINDS", "ProfiledRun", "Variant", "available",
           "default_threads", "exporter_form", "fastest", "feed_for", "onnx_input_types",
           "optimize_transformer", "profile", "quantize_dynamic_int8", "quantize_qdq",
           "session", "session_inputs", "transformer_kind", "transformer_shape", "variants"]

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
    # Transformers: the contrib operators of its transformer optimizer and of its
    # quantizers, and the plain operators of an unfused export.
    **dict.fromkeys(("Attention", "MultiHeadAttention", "QAttention", "Softmax",
                     "QLinearSoftmax", "GroupQueryAttention",
                     "ReduceSum"), "attention"),     # ReduceSum: the mask's lengths
    **dict.fromkeys(("LayerNormalization", "SkipLayerNormalization",
                     "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                     "ReduceMean"), "norm"),
    **dict.fromkeys(("Gather", "EmbedLayerNormalization"), "embedding"),
    **dict.fromkeys(("MatMulIntegerToFloat", "MatMulNBits", "FusedGemm"), "dense"),
    **dict.fromkeys(("Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Tanh", "Sub",
                     "Div", "Pow", "Sqrt", "Exp", "Neg", "Where", "BiasAdd"), "elementwise"),
    **dict.fromkeys(("Slice", "Expand", "Cast", "Split", "Shape", "QLinearConcat"), "layout"),
}
#: onnxruntime's transformer model types (``optimize_model``'s ``model_type``) that
#: `transformer_kind` names: encoders, causal decoders, image transformers.
TRANSFORMER_KINDS = ("bert", "gpt2", "vit")
#: vdla ops that make a graph a transformer (`transformer_kind`).
_TRANSFORMER_OPS = frozenset(("layer_norm", "attention", "gelu", "qlayer_norm",
                              "qattention", "qgelu", "qsoftmax", "qmatmul"))


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


def transformer_kind(graph) -> str | None:
    """Which of onnxruntime's transformer model types (`TRANSFORMER_KINDS`) the vdla
    `graph` is, or None for a graph that is no transformer (no LayerNorm, attention or
    GELU). A causal ``attention`` node (the fused form, after `prepare`) makes it
    ``gpt2``; else integer inputs (token ids) make it ``bert``, and float inputs (pixels)
    ``vit``. Pass the prepared graph where the attention is fused."""
    nodes = graph.nodes()
    ops = {n.op for n in nodes}
    if not ops & _TRANSFORMER_OPS:
        return None
    if any(n.op in ("attention", "qattention") and n.attrs.get("causal") for n in nodes):
        return "gpt2"
    ints = [n for n in graph.inputs if graph.tensors[n].dtype.startswith(("int", "uint"))]
    return "bert" if ints else "vit"


def transformer_shape(graph) -> tuple[int, int]:
    """(heads, hidden size) of the first fused ``attention`` node of `graph` (its q is
    (B, H, S, D)), or (0, 0) when it has none: onnxruntime's optimizer then reads them
    from the graph's reshapes itself."""
    for n in graph.nodes():
        if n.op in ("attention", "qattention"):
            shape = graph.tensors[n.inputs[0]].shape
            if len(shape) == 4:
                return int(shape[1]), int(shape[1] * shape[3])
    return 0, 0


def onnx_input_types(path: str | os.PathLike) -> dict[str, np.dtype]:
    """The inputs of the ONNX model at `path`, in order: name -> numpy dtype."""
    import onnx  # heavy, and optional
    from onnx import helper  # heavy, as above
    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: np.dtype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
            for i in model.graph.input if i.name not in initializers}


def feed_for(types: Mapping[str, np.dtype], inputs) -> dict[str, np.ndarray]:
    """A feed for a model whose inputs are `types` (name -> dtype, in order:
    `onnx_input_types`, or a session's): `inputs` as arrays in that order or as a
    mapping by name, each cast to its declared type (token ids and masks to int64,
    pixels to float32). ValueError naming the inputs when they do not match."""
    names = list(types)
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"the model's inputs are {names}; the feed lacks {missing} "
                             f"(it has {sorted(inputs)})")
        arrays = [inputs[n] for n in names]
    else:
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise ValueError(f"the model takes {len(names)} inputs ({names}), not "
                             f"{len(arrays)}")
    return {n: np.ascontiguousarray(np.asarray(a).astype(types[n], copy=False))
            for n, a in zip(names, arrays)}


def quantize_qdq(fp32: str | os.PathLike, model, out: str | os.PathLike,
                 activations: str = "u8") -> Path:
    """onnxruntime's own static QDQ quantization of the float model at `fp32` on
    `model`'s calibration samples (`pipeline.Model.calibration`: input name -> samples
    stacked on a leading axis; every input the ONNX model takes, token ids included,
    each cast to its declared type), after its recommended pre-processing
    (``quant_pre_process``): per-channel int8 weights, `activations` ``"u8"`` (the
    faster path of its x86 kernels) or ``"s8"``; nodes that read an infinity (a causal
    mask) stay float. Written to `out`."""
    # heavy, and optional: onnxruntime
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process  # heavy, as above
    if activations not in ("u8", "s8"):
        raise ValueError(f"activations must be 'u8' or 's8', not {activations!r}")
    out = Path(out)
    pre = out.with_name(out.stem + "-pre.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self, samples):
            self.items = iter(samples)

        def get_next(self):
            return next(self.items, None)

    try:
        quant_pre_process(str(fp32), str(pre))
        types = onnx_input_types(pre)
        calibration = model.calibration
        count = min(len(calibration[n]) for n in calibration)
        samples = [feed_for(types, {n: calibration[n][i] for n in calibration})
                   for i in range(count)]
        excluded = _reading_infinities(pre)
        # It still computes int8 parameters for the excluded nodes' infinite ranges (and
        # warns of their NaN), then leaves them unused.
        with np.errstate(invalid="ignore" if excluded else "warn"):
            quantize_static(str(pre), str(out), Reader(samples),
                            quant_format=QuantFormat.QDQ,
                            activation_type=(QuantType.QUInt8 if activations == "u8"
                                             else QuantType.QInt8),
                            weight_type=QuantType.QInt8, per_channel=True,
                            nodes_to_exclude=excluded)
    finally:
        pre.unlink(missing_ok=True)
    return out


def _reading_infinities(path: Path) -> list[str]:
    """The nodes of the ONNX model at `path` that read a constant holding an infinity (a
    causal mask's -inf) and the nodes that read what those write: left in float by
    `quantize_qdq`, whose int8 of an infinite range is NaN."""
    import onnx  # heavy, and optional
    from onnx import numpy_helper  # heavy, as above
    graph = onnx.load(str(path)).graph
    infinite = {t.name for t in graph.initializer
                if np.issubdtype(numpy_helper.to_array(t).dtype, np.floating)
                and not np.isfinite(numpy_helper.to_array(t)).all()}
    adds = [n for n in graph.node if infinite & set(n.input)]
    # What they write holds the infinities too (masked scores): their readers (the
    # softmax) stay float as well.
    written = {o for n in adds for o in n.output}
    return [n.name for n in adds] + [n.name for n in graph.node if written & set(n.input)]


def optimize_transformer(fp32: str | os.PathLike, out: str | os.PathLike, kind: str, *,
                         heads: int = 0, hidden: int = 0) -> dict[str, int]:
    """onnxruntime's transformer optimizer (``optimize_model``) on the float model at
    `fp32`, for the CPU, written to `out`: its graph optimizations, then its fusions of
    attention, LayerNorm (with the residual: SkipLayerNormalization), GELU (with its
    bias) and embeddings into its contrib operators. `kind` is its model type (one of
    `TRANSFORMER_KINDS`); `heads` and `hidden` the attention's (0: read from the graph).
    Returns the fused operators' counts (``get_fused_operator_statistics``)."""
    from onnxruntime.transformers.optimizer import optimize_model  # heavy, and optional
    if kind not in TRANSFORMER_KINDS:
        raise ValueError(f"kind must be one of {', '.join(TRANSFORMER_KINDS)}, not {kind!r}")
    for what, value in (("heads", heads), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{what} must be a non-negative integer, not {value!r}")
    optimized = optimize_model(str(fp32), model_type=kind, num_heads=heads,
                               hidden_size=hidden, use_gpu=False)
    optimized.save_model_to_file(str(out))
    counts = optimized.get_fused_operator_statistics()
    return {op: int(n) for op, n in counts.items() if n}


def quantize_dynamic_int8(fp32: str | os.PathLike, out: str | os.PathLike) -> Path:
    """onnxruntime's dynamic quantization (``quantize_dynamic``) of the float model at
    `fp32` (best the optimizer's output: its fused Attention becomes QAttention): int8
    weights, activations quantized at run time (DynamicQuantizeLinear, MatMulInteger).
    Written to `out`."""
    import onnx  # heavy, and optional
    from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy, as above
    # The optimizer's contrib operators (SkipLayerNormalization, BiasGelu, ...) have no
    # ONNX shape inference, so the tensors they write have no type: they are float.
    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return Path(out)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One of onnxruntime's ways of running a model (`variants`): its ``key`` (e.g.
    ``fp32-opt``), precision (``float32`` or ``int8``), ONNX file, and what it is."""

    key: str
    precision: str
    path: Path
    what: str


def variants(fp32: str | os.PathLike, model, workdir: str | os.PathLike, *,
             kind: str | None = None, heads: int = 0, hidden: int = 0,
             precisions: Sequence[str] = ("float32", "int8"), log=None) -> list[Variant]:
    """onnxruntime's fast paths for the float model at `fp32` (`model` gives the
    calibration samples, see `quantize_qdq`), their files in `workdir` (one already
    there is reused: onnxruntime's quantization of a large model takes minutes).

    Always: ``fp32`` (the model as it is) and ``int8-qdq-u8`` (static QDQ, uint8
    activations, after ``quant_pre_process``). For a transformer (`kind`, one of
    `TRANSFORMER_KINDS`; None for other models): ``fp32-opt`` (`optimize_transformer`,
    after `exporter_form`; for ``gpt2``, its bert fusions where its gpt2 ones write a
    model its runtime refuses) and ``int8-dynamic`` (`quantize_dynamic_int8` of the
    optimized model). A path that onnxruntime's own tools fail to build, or build into
    a model its runtime refuses (each new one runs once on the first calibration
    sample), is left out, with the reason passed to `log`. Only the variants of `precisions` are listed (and built:
    ``fp32-opt`` also for int8 alone, where ``int8-dynamic`` starts from it)."""
    unknown = sorted(set(precisions) - {"float32", "int8"})
    if unknown:
        raise ValueError(f"precisions must be float32 and/or int8, not {unknown}")
    fp32, workdir = Path(fp32), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stem = fp32.stem
    found = ([Variant("fp32", "float32", fp32, "float32, as exported")]
             if "float32" in precisions else [])

    first = {n: samples[0] for n, samples in model.calibration.items()}

    def build(key, precision, what, make):
        path = workdir / f"{stem}-{key}.onnx"
        if precision not in precisions and not (key == "fp32-opt" and "int8" in precisions):
            return None
        if not path.exists():
            if log is not None:
                log(f"onnxruntime: {what} ...")
            # Written under another name and renamed once it runs: a run stopped halfway
            # leaves no file that a later one would take as built.
            partial = path.with_name(f".{path.stem}-{os.getpid()}.partial.onnx")
            try:
                make(partial)
                # onnxruntime's tools can write a model its runtime refuses (its gpt2
                # optimizer on some exports): run it once before it counts.
                s = session(partial, 1)
                s.run(None, feed_for(session_inputs(s), first))
                os.replace(partial, path)
            except Exception as exc:   # onnxruntime's tools: a path it cannot build
                if log is not None:
                    log(f"onnxruntime: no {key} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})")
                return None
            finally:
                partial.unlink(missing_ok=True)
        if precision in precisions:
            found.append(Variant(key, precision, path, what))
        return path

    def optimize(path):
        # vdla's exporter writes linear layers and the mask in forms the optimizer's
        # attention fusion does not know: the exporters' forms first (`exporter_form`).
        source = workdir / f"{stem}-exporter-form.onnx"
        try:
            rewrites = exporter_form(fp32, source)
            given = source if any(rewrites.values()) else fp32
            fused = optimize_transformer(given, path, kind, heads=heads, hidden=hidden)
            if kind == "gpt2":
                # Its gpt2 fusions write a model its runtime refuses on some exports
                # (a Transpose of the wrong rank): then its bert fusions, which still
                # fuse the LayerNorms and GELUs.
                try:
                    session(path, 1)
                except Exception as exc:   # onnxruntime's loader: the model's fault
                    if log is not None:
                        log(f"onnxruntime: its gpt2 optimizer's model does not load "
                            f"({type(exc).__name__}); its bert optimizer instead")
                    fused = optimize_transformer(given, path, "bert", heads=heads,
                                                 hidden=hidden)
        finally:
            source.unlink(missing_ok=True)
        if log is not None:
            log(f"onnxruntime: its optimizer fused {fused or 'nothing'} (after rewriting "
                f"{rewrites} into the exporters' forms)")

    optimized = None
    if kind is not None:
        optimized = build("fp32-opt", "float32", f"float32 after its {kind} transformer "
                          "optimizer", optimize)
    build("int8-qdq-u8", "int8", "int8, its static QDQ (uint8 activations)",
          lambda p: quantize_qdq(fp32, model, p, "u8"))
    if kind is not None:
        source = optimized or fp32
        build("int8-dynamic", "int8", "int8, its dynamic quantization"
              + (" of the optimized model" if optimized else ""),
              lambda p: quantize_dynamic_int8(source, p))
    return found


def fastest(found: Sequence[Variant], threads: int, inputs, *, runs: int = 5,
            rounds: int = 3) -> dict[str, tuple[Variant, dict[str, float]]]:
    """The fastest of `found` (`variants`) at each precision: precision -> (the
    variant, every variant's median seconds per run by key). Each variant runs
    `runs` times in each of `rounds` rounds, the variants interleaved so that a
    drift of the machine's speed hits them all alike; `inputs` as `feed_for` takes
    them."""
    for what, value in (("runs", runs), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive integer, not {value!r}")
    sessions = {}
    for v in found:
        s = session(v.path, threads)
        feed = feed_for(session_inputs(s), inputs)
        s.run(None, feed)
        sessions[v.key] = (s, feed)
    times: dict[str, list[float]] = {v.key: [] for v in found}
    for _ in range(rounds):
        for key, (s, feed) in sessions.items():
            for _ in range(runs):
                t0 = time.perf_counter()
                s.run(None, feed)
                times[key].append(time.perf_counter() - t0)
    medians = {k: float(np.median(t)) for k, t in times.items()}
    best = {}
    for v in found:
        if v.precision not in best or medians[v.key] < medians[best[v.precision].key]:
            best[v.precision] = v
    return {p: (v, {k: medians[k] for k in medians
                    if next(f for f in found if f.key == k).precision == p})
            for p, v in best.items()}


#: onnxruntime's input type names -> numpy dtypes.
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
              "tensor(bool)": np.bool_}


def session_inputs(s) -> dict[str, np.dtype]:
    """The inputs of the onnxruntime session `s`, in order: name -> numpy dtype (what
    `feed_for` takes). ValueError for an input type vdla does not feed."""
    types = {}
    for i in s.get_inputs():
        if i.type not in _ORT_TYPES:
            raise ValueError(f"input {i.name!r} has onnxruntime type {i.type!r}, not one "
                             f"vdla feeds ({', '.join(_ORT_TYPES)})")
        types[i.name] = np.dtype(_ORT_TYPES[i.type])
    return types


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
    """Run the model at `path` on `inputs` (arrays in the order of its inputs, or a
    mapping by name; each cast to its declared type, `feed_for`) `runs` times, after
    two warm-up runs, in a profiling session: the median wall time, and the profiler's
    kernel times per op group (`OP_GROUPS`; other kernels are "other"), averaged over
    the runs."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, not {runs!r}")
    with tempfile.TemporaryDirectory(prefix="vdla-ort-") as tmp:
        s = session(path, threads, profile_to=str(Path(tmp) / "ort"))
        try:
            feed = feed_for(session_inputs(s), inputs)
        except ValueError as exc:
            raise ValueError(f"the model at {path}: {exc}") from None
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
