"""The GPU target: roofline estimates, exactness on whatever runs its kernels, and, on a
CUDA GPU, its speed against PyTorch and onnxruntime.

Part 1, roofline (any machine): each model (batch 1) at int8 and float16 on each of
`--gpus`: the kernels' roofline bounds added up (datasheet peaks and DRAM bandwidth,
`vdla.compiler.targets.gpu.roofline`), and with a launch per kernel.

Part 2, exactness (any machine; `--skip-exactness` skips it): each model on the GPU
target in this process's mode (a CUDA GPU, or Triton's interpreter on the CPU: about
45 s per ResNet-18 run): int8 against the integer reference (must be bit-exact), float16
and float32 against the float reference (largest relative error).

Part 3, speed (only on a CUDA GPU): per model, the median over `--runs` runs (after a
warm-up) of

* vdla's GPU target, int8, float16 and float32: the whole graph launched back to back
  (`GpuSession.run_graph`), timed by CUDA events from the first kernel to the last;
* PyTorch on the same prepared float graph (BN folded; `torch.nn.functional`: cuDNN
  convolutions; for the transformers (vit_tiny, bert_tiny, bert_base, gpt_mini)
  `scaled_dot_product_attention`, `layer_norm`, `gelu`, embedding look-ups), float16 and
  float32 (TF32 off, as vdla's ieee float32 dots): the same weights and inputs (token
  ids and masks too), its outputs checked against the float reference first;
* onnxruntime's CUDA provider on the same float graph exported to ONNX (`to_onnx`), if
  the installed onnxruntime has that provider (the CPU wheel this project installs does
  not: `pip install onnxruntime-gpu` on a GPU machine).

PyTorch has no int8 CUDA convolution in eager mode, so the int8 figure is set against
the float ones and the roofline. `--baseline-device cpu` runs part 3's PyTorch baseline
on the CPU (outputs checked, times of no interest): a check that the baseline's code is
right on a machine without a GPU.

    python bench/gpu.py [--models resnet18 bert_tiny] [--gpus h100-sxm,a100-sxm] [--runs 50]
                        [--skip-exactness] [--baseline-device cpu] [--out bench-gpu]

Writes OUT/gpu.json and OUT/gpu.png (per model and precision: the roofline on each
named GPU and, where part 3 ran, the measured times).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from vdla._fileio import atomic_write
from vdla.compiler import pipeline, run_reference, targets
from vdla.compiler.passes import prepare
from vdla.compiler.reference.tolerance import relative_error
from vdla.compiler.targets.gpu import gpus, roofline, runtime
from vdla.compiler.targets.model import compile_model

#: The precisions of parts 1 and 2 (part 3 adds float32).
PRECISIONS = ("int8", "float16")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- part 1: roofline --------------------------------------------------------------------------

def roofline_part(models: dict, names: list[str]) -> dict:
    found = {}
    print("\nRoofline estimates (batch 1; datasheet peaks, not measurements)")
    print(f"{'model':12}{'precision':11}{'GPU':11}{'kernels':>8}{'GMACs':>8}{'MB':>8}"
          f"{'bound ms':>10}{'+launches ms':>14}{'compute-bound':>15}")
    for model_name, model in models.items():
        for precision in PRECISIONS:
            graph = pipeline.graph_for(model, _target(precision), precision=precision)
            for name in names:
                e = roofline.estimate(graph, name, precision)
                found[f"{model_name}/{precision}/{name}"] = e.to_dict()
                print(f"{model_name:12}{precision:11}{name:11}{len(e.kernels):>8}"
                      f"{e.macs / 1e9:>8.2f}{e.bytes / 1e6:>8.2f}{e.seconds * 1e3:>10.4f}"
                      f"{e.seconds_with_launch * 1e3:>14.4f}"
                      f"{f'{e.compute_bound}/{len(e.kernels)}':>15}")
    return found


def _target(precision: str, device: str = "auto"):
    """The GPU target that runs `precision` (float16: the float graph stored in fp16)."""
    return targets.get("gpu", device=device,
                       float_dtype="float16" if precision == "float16" else "float32")


# --- part 2: exactness -------------------------------------------------------------------------

def exactness_part(models: dict) -> dict:
    found = {}
    print(f"\nExactness on {runtime.device_name(runtime.resolve('auto'))}")
    for model_name, model in models.items():
        for precision in ("int8", "float16", "float32"):
            log(f"{model_name} {precision} on the GPU target ...")
            target = _target(precision)
            start = time.perf_counter()
            outcome = pipeline.run_model(model, target, precision=precision)
            seconds = time.perf_counter() - start
            found[f"{model_name}/{precision}"] = {
                "bit_exact" if precision == "int8" else "within_tolerance": outcome.bit_exact,
                "max_error": outcome.max_error, "seconds": seconds,
                "ops_on_gpu": len(outcome.compiled.ops_on("gpu")),
                "ops": len(outcome.compiled.ops)}
            verdict = (("bit-exact" if outcome.bit_exact else "NOT bit-exact")
                       if precision == "int8" else
                       f"max relative error {outcome.max_error:.2e} (tolerance "
                       f"{pipeline.TOLERANCES[precision]:g}: "
                       f"{'ok' if outcome.bit_exact else 'EXCEEDED'})")
            print(f"  {model_name:12} {precision:8} {verdict}; "
                  f"{len(outcome.compiled.ops_on('gpu'))}/{len(outcome.compiled.ops)} ops on "
                  f"the gpu target; {seconds:.1f} s")
    return found


# --- part 3: speed -----------------------------------------------------------------------------

def torch_forward(graph, dtype: str, device: str):
    """A function running the prepared float `graph` with `torch.nn.functional` on
    `device` in `dtype` ("float16" or "float32"): the PyTorch baseline."""
    import torch  # heavy (the gpu extra)
    import torch.nn.functional as F

    tdtype = getattr(torch, dtype)
    consts = {name: torch.from_numpy(np.ascontiguousarray(t.data)).to(
                  device, tdtype if t.dtype == "float32" else None)
              for name, t in graph.tensors.items() if t.is_constant}

    def act(node, y):
        kind = node.attrs.get("activation")
        if kind == "relu":
            return F.relu(y)
        if kind in ("gelu", "gelu_tanh"):
            return F.gelu(y, approximate="tanh" if kind == "gelu_tanh" else "none")
        if kind == "clip":
            lo, hi = node.attrs.get("clip_min"), node.attrs.get("clip_max")
            return torch.clamp(y, lo, hi)
        return y

    def conv2d(node, x, w, b=None, res=None):
        a = node.attrs
        top, left, bottom, right = a["pads"]
        if (top, left) != (bottom, right):
            x = F.pad(x, (left, right, top, bottom))
            top = left = 0
        y = F.conv2d(x, w, b, a["strides"], (top, left), a["dilations"], a["groups"])
        return act(node, y if res is None else y + res)

    def dense(node, x, w, b=None, res=None):
        y = F.linear(x, w, b)
        return act(node, y if res is None else y + res)

    def max_pool2d(node, x):
        a = node.attrs
        top, left, bottom, right = a["pads"]
        if (top, left) != (bottom, right):
            raise ValueError(f"{node.name}: asymmetric pool padding {a['pads']}")
        return F.max_pool2d(x, a["kernel"], a["strides"], (top, left),
                            ceil_mode=a["ceil_mode"])

    run = {"conv2d": conv2d, "dense": dense, "max_pool2d": max_pool2d,
           "global_avg_pool2d": lambda node, x: x.mean(dim=(2, 3), keepdim=True),
           "flatten": lambda node, x: torch.flatten(x, node.attrs.get("axis", 1)),
           "reshape": lambda node, x, *shape: x.reshape(graph.tensors[node.outputs[0]].shape),
           "add": lambda node, a, b: a + b, "mul": lambda node, a, b: a * b,
           "relu": lambda node, x: F.relu(x),
           **_torch_sequence_ops(graph, tdtype)}
    missing = sorted({n.op for n in graph.nodes()} - set(run))
    if missing:
        raise ValueError(f"the PyTorch baseline does not run {', '.join(missing)}")

    def forward(inputs: dict):
        values = dict(consts)
        values.update(inputs)
        for node in graph.nodes():
            args = [values[t] if t else None for t in node.inputs]
            values[node.outputs[0]] = run[node.op](node, *args)
        return values[graph.outputs[0]]

    return forward


def _torch_sequence_ops(graph, tdtype) -> dict:
    """The PyTorch baseline of the transformers' float ops (scaled_dot_product_attention,
    layer_norm, gelu, embedding gathers, the layout and elementwise ops), by op."""
    import torch  # heavy (the gpu extra)
    import torch.nn.functional as F

    def out_shape(node):
        return tuple(graph.tensors[node.outputs[0]].shape)

    def layer_norm(node, x, scale, bias=None):
        return F.layer_norm(x, (x.shape[-1],), scale, bias, node.attrs["epsilon"])

    def attention(node, q, k, v, mask=None):
        s, t = q.shape[-2], k.shape[-2]
        if node.attrs["causal"]:      # key t > query s + (T - S): excluded
            bias = torch.full((s, t), float("-inf"), dtype=q.dtype, device=q.device)
            bias = torch.triu(bias, diagonal=t - s + 1)
            mask = bias if mask is None else mask + bias
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              scale=node.attrs["scale"])

    def gather(node, data, idx):
        axis = node.attrs["axis"] % data.ndim
        n = data.shape[axis]
        idx = torch.where(idx < 0, idx + n, idx)
        return torch.index_select(data, axis, idx.reshape(-1)).reshape(out_shape(node))

    def slice_(node, x):
        a = node.attrs
        index = [slice(None)] * x.ndim
        axes = a["axes"] or range(len(a["starts"]))
        steps = a["steps"] or (1,) * len(a["starts"])
        for ax, b, e, st in zip(axes, a["starts"], a["ends"], steps):
            index[ax] = slice(int(b), int(e), int(st))
        return x[tuple(index)]

    def cast(node, x):
        want = node.attrs["dtype"]
        return x.to(tdtype if want == "float32" else getattr(torch, want))

    def reduce(fn):
        def run(node, x):
            axes = tuple(node.attrs["axes"]) or tuple(range(x.ndim))
            return fn(x, dim=axes, keepdim=bool(node.attrs["keepdims"]))
        return run

    return {"matmul": lambda node, a, b: torch.matmul(a, b),
            "softmax": lambda node, x: torch.softmax(x, node.attrs["axis"]),
            "layer_norm": layer_norm, "attention": attention, "gather": gather,
            "gelu": lambda node, x: F.gelu(x, approximate=node.attrs["approximate"]),
            "slice": slice_, "cast": cast,
            "transpose": lambda node, x: x.permute(*(node.attrs["perm"]
                                                     or reversed(range(x.ndim)))),
            "expand": lambda node, x: torch.broadcast_to(x, out_shape(node)),
            "concat": lambda node, *xs: torch.cat(xs, dim=node.attrs["axis"]),
            "where": lambda node, c, a, b: torch.where(c, a, b),
            "sub": lambda node, a, b: a - b, "div": lambda node, a, b: a / b,
            "pow": lambda node, a, b: torch.pow(a, b),
            "sqrt": lambda node, x: torch.sqrt(x), "erf": lambda node, x: torch.erf(x),
            "tanh": lambda node, x: torch.tanh(x), "exp": lambda node, x: torch.exp(x),
            "neg": lambda node, x: -x,
            "equal": lambda node, a, b: a == b, "less": lambda node, a, b: a < b,
            "greater": lambda node, a, b: a > b,
            "reduce_mean": reduce(torch.mean), "reduce_sum": reduce(torch.sum),
            "reduce_max": reduce(torch.amax)}


def _cuda_median(fn, runs: int) -> float:
    """Median seconds of `fn()` over `runs` runs, timed by CUDA events, after a warm-up."""
    import torch  # heavy (the gpu extra)

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _check(got: np.ndarray, want: np.ndarray, tolerance: float, what: str) -> float:
    err = relative_error(got, want)
    if not err < tolerance:
        raise SystemExit(f"{what}: relative error {err:.2e} exceeds {tolerance:g}")
    return err


def speed_part(models: dict, runs: int, baseline_device: str) -> dict:
    import torch  # heavy (the gpu extra)

    torch.backends.cudnn.allow_tf32 = False          # float32 as vdla's ieee dots
    torch.backends.cuda.matmul.allow_tf32 = False
    cuda = runtime.resolve("auto") == "cuda"
    found = {}
    for model_name, model in models.items():
        float_graph = prepare(model.graph)
        feed = model.feed
        want = run_reference(float_graph, feed)[float_graph.outputs[0]]
        row = found.setdefault(model_name, {})
        if cuda:
            for precision in ("int8", "float16", "float32"):
                log(f"{model_name} {precision}: vdla's GPU target ...")
                row[f"vdla {precision}"] = _vdla_seconds(model, precision, runs)
        device = baseline_device or ("cuda" if cuda else None)
        if device is None:
            continue
        for dtype in ("float16", "float32"):
            log(f"{model_name} {dtype}: PyTorch on {device} ...")
            forward = torch_forward(float_graph, dtype, device)
            xt = {name: torch.from_numpy(np.ascontiguousarray(x)).to(
                      device, getattr(torch, dtype) if x.dtype == np.float32 else None)
                  for name, x in feed.items()}
            with torch.inference_mode():
                got = forward(xt).float().cpu().numpy()
                err = _check(got, want, pipeline.TOLERANCES[dtype], f"PyTorch {dtype}")
                log(f"  PyTorch {dtype} output within {err:.2e} of the float reference")
                if device == "cuda":
                    row[f"pytorch {dtype}"] = _cuda_median(lambda: forward(xt), runs)
        if cuda:
            seconds = _ort_cuda_seconds(float_graph, feed, want, runs)
            if seconds is not None:
                row["onnxruntime-cuda float32"] = seconds
    return found


def _vdla_seconds(model, precision: str, runs: int) -> float:
    """Median CUDA-event time of the whole graph launched back to back."""
    target = _target(precision, device="cuda")
    graph = pipeline.graph_for(model, target, precision=precision)
    compiled = compile_model(graph, target)
    with compiled.session() as session:
        ran = session.run_graph(model.feed)
        if ran is None:
            raise SystemExit(f"{precision}: not every op of the graph runs on the gpu target")
        want = run_reference(graph, model.feed)[graph.outputs[0]]
        got = ran.outputs[graph.outputs[0]]
        if precision == "int8" and not np.array_equal(got, want):
            raise SystemExit("int8: the back-to-back run is not bit-exact")
        if precision != "int8":
            _check(got, want, pipeline.TOLERANCES[precision], f"vdla {precision}")
        totals = [sum(session.run_graph(model.feed).op_seconds.values())
                  for _ in range(runs)]
    return statistics.median(totals)


def _ort_cuda_seconds(graph, feed, want, runs: int) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        log("onnxruntime has no CUDA provider here (pip install onnxruntime-gpu): skipped")
        return None
    from vdla.compiler.frontend.onnx_export import to_onnx

    session = ort.InferenceSession(to_onnx(graph).SerializeToString(),
                                   providers=["CUDAExecutionProvider"])
    got = session.run(None, feed)[0]
    _check(got, want, pipeline.FLOAT_TOLERANCE, "onnxruntime-cuda float32")
    session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)                       # synchronous: copies the output back
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- report ------------------------------------------------------------------------------------

def print_speed(speed: dict, rooflines: dict, device: str) -> None:
    print(f"\nSpeed on {device} (batch 1, median of the runs, ms)")
    for model_name, row in speed.items():
        for what, seconds in row.items():
            print(f"  {model_name:12} {what:28} {seconds * 1e3:9.3f}")
        for key, e in rooflines.items():
            if key.startswith(f"{model_name}/"):
                print(f"  {model_name:12} {'roofline ' + key.split('/', 1)[1]:28} "
                      f"{e['seconds_with_launch'] * 1e3:9.3f}  (estimate, with launches)")


def plot(path: Path, rooflines: dict, speed: dict, device: str | None) -> None:
    """Per model and precision: the roofline (with launches) on each GPU, and the
    measured times where part 3 ran."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: only the plot
    from matplotlib.figure import Figure

    measured = device is not None and any(speed.values())
    bars = [(f"roofline {k.split('/', 2)[2]}\n{k.split('/', 2)[1]}", e["seconds_with_launch"],
             e["seconds"], True) for k, e in rooflines.items()]
    for model_name, row in speed.items():
        bars += [(f"{what}\n(measured)", seconds, None, False) for what, seconds in row.items()]
    fig = Figure(figsize=(max(7.0, 0.75 * len(bars) + 2), 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = range(len(bars))
    ax.bar(xs, [b[1] * 1e3 for b in bars], color=["#9ecae1" if b[3] else "#e6550d"
                                                  for b in bars],
           label="with a launch per kernel")
    ax.bar([x for x, b in zip(xs, bars) if b[2] is not None],
           [b[2] * 1e3 for b in bars if b[2] is not None], color="#3182bd", width=0.5,
           label="roofline bound of the kernels")
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize="small")
    ax.set_yscale("log")
    ax.set_ylabel("ms per inference (log scale)")
    models = ", ".join(sorted({k.split("/")[0] for k in rooflines}))
    ax.set_title(f"{models}, batch 1: roofline estimates (datasheet peaks)"
                 + (f" and measured times on {device}" if measured else "; no GPU measured"),
                 fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    atomic_write(path, buffer.getvalue())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18"])
    p.add_argument("--gpus", default="h100-sxm,a100-sxm",
                   help=f"GPUs of the roofline ({', '.join(gpus.names())})")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--skip-exactness", action="store_true")
    p.add_argument("--baseline-device", choices=("cpu", "cuda"),
                   help="run the PyTorch baseline here (default: cuda when present)")
    p.add_argument("--out", default="bench-gpu")
    args = p.parse_args()
    names = [n.strip() for n in args.gpus.split(",") if n.strip()]
    for name in names:
        gpus.get(name)                                 # unknown: lists the known ones
    runtime.require()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mode = runtime.resolve("auto")
    device = runtime.device_name(mode)
    log(f"kernels run on {device}")
    models = {name: pipeline.load_model(name, calibration=4, note=None)
              for name in args.models}
    rooflines = roofline_part(models, names)
    exact = {} if args.skip_exactness else exactness_part(models)
    speed = speed_part(models, args.runs, args.baseline_device)
    if mode == "cuda":
        print_speed(speed, rooflines, device)
    else:
        print(f"\nSpeed: no CUDA GPU here (kernels on the {device}): part 3 measures on a "
              "GPU only; the roofline above is the estimate")
    atomic_write(out / "gpu.json", json.dumps(
        {"device": device, "mode": mode, "roofline": rooflines, "exactness": exact,
         "speed_seconds": speed, "runs": args.runs}, indent=2).encode())
    plot(out / "gpu.png", rooflines, speed, device if mode == "cuda" else None)
    print(f"\nwrote {out / 'gpu.json'}, {out / 'gpu.png'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
