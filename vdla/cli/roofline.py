"""``vdla roofline MODEL``: a roofline ESTIMATE of a model's kernels on GPUs, from
datasheet peaks (no GPU needed): a per-kernel table, totals per GPU, a side-by-side
summary, JSON and a log-log roofline chart."""

from __future__ import annotations

import io
import math

from vdla._fileio import atomic_write
from vdla.cli.common import (CliError, add_batch_option, add_calibration_option,
                             add_seed_option, check_model_options, output_file, table,
                             write_json)
from vdla.compiler import pipeline
from vdla.compiler.passes.prepare import prepare
from vdla.compiler.targets import gpu as gpu_target

gpus, roofline = gpu_target.gpus, gpu_target.roofline

__all__ = ["DEFAULT_GPUS", "add_parser", "run"]

#: The GPUs estimated by default.
DEFAULT_GPUS = ("h100-sxm", "a100-sxm")
#: The first line of the report: what the figures are, and what they are not.
NOTE = ("ESTIMATE: roofline bounds from datasheet peaks, not measurements (each kernel "
        "takes max(ops / peak, bytes / DRAM bandwidth); caches, occupancy and fusion "
        "ignored)")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "roofline", help="estimate a model's kernels on GPUs from datasheet peaks "
                         "(roofline model; no GPU needed)",
        description="Estimate each kernel of MODEL (one per graph node; flatten and "
                    "reshape are free views) on each GPU with the roofline model: the "
                    "larger of its operations at the GPU's peak (tensor cores for "
                    "conv/dense at --precision, FP32 CUDA cores for the rest) and its "
                    "minimum DRAM traffic at the GPU's bandwidth. Prints a per-kernel "
                    "table and totals per GPU, with and without a fixed kernel-launch "
                    f"cost ({roofline.LAUNCH_SECONDS * 1e6:g} us each). An estimate, "
                    "not a measurement: a lower bound real kernels approach.")
    p.add_argument("model", metavar="MODEL", help="zoo model name or an .onnx path")
    p.add_argument("--gpu", metavar="A,B,...", default=",".join(DEFAULT_GPUS),
                   help=f"GPUs to estimate: {', '.join(gpus.names())} (default "
                        f"{','.join(DEFAULT_GPUS)})")
    # Not target_args' --precision: this one names the GPU's units the graph runs on.
    p.add_argument("--precision", choices=gpus.PRECISIONS, default="int8",
                   help="int8: the quantized graph on the INT8 tensor cores (default); "
                        "float16: the float graph held in fp16 on the FP16 tensor cores; "
                        "float32: the float graph on the FP32 CUDA cores")
    p.add_argument("--top", type=int, metavar="N",
                   help="list only the N most expensive kernels per GPU (default: all, "
                        "in graph order)")
    add_seed_option(p)
    add_calibration_option(p)
    add_batch_option(p)
    p.add_argument("--json", type=output_file,
                   metavar="PATH", help="also write the estimates as JSON here")
    p.add_argument("--plot", type=output_file,
                   metavar="PNG", help="also draw the roofline chart here")
    p.set_defaults(func=run)


def _gpus(text: str) -> list[gpus.Gpu]:
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in gpus.GPUS]
    if unknown or not names:
        raise CliError(f"--gpu: unknown GPU(s) {', '.join(unknown) or '(none)'}; known "
                       f"GPUs: {', '.join(gpus.names())}")
    return [gpus.get(n) for n in names]


def run(args) -> int:
    chosen = _gpus(args.gpu)
    check_model_options(args)
    if args.top is not None and args.top < 1:
        raise CliError(f"--top must be a positive integer, not {args.top}")
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                batch=args.batch)
    if args.precision == "int8":
        graph = pipeline.quantize_for(model, [], mode="multiply")
        what = "the quantized graph"
    else:
        graph = prepare(model.graph)
        what = "the float graph (BN folded, ops fused)"
    estimates = [roofline.estimate(graph, gpu, args.precision) for gpu in chosen]
    # The files before the report: a closed stdout (`| head`) ends the command.
    if args.json:
        write_json(args.json, {"model": args.model, "batch": model.batch,
                               "precision": args.precision, "note": NOTE,
                               "launch_seconds_per_kernel": roofline.LAUNCH_SECONDS,
                               "gpus": {e.gpu.name: e.to_dict() for e in estimates}})
    if args.plot:
        _plot(args.plot, args.model, estimates)
    print(NOTE)
    kernels = len(estimates[0].kernels)
    print(f"{args.model}, batch {model.batch}, {args.precision}: {what}, {kernels} kernels "
          f"(views are free), {_figure(estimates[0].macs / 1e9)} GMACs")
    for est in estimates:
        _print_gpu(est, args.top)
    if len(estimates) > 1:
        _print_summary(estimates)
    written = [p for p in (args.json, args.plot) if p]
    if written:
        print(f"wrote {', '.join(written)}")
    return 0


def _peaks(gpu: gpus.Gpu) -> str:
    return (f"INT8 {gpu.int8_tops:,g} TOPS, FP16 {gpu.fp16_tflops:,g} TFLOPS (dense tensor "
            f"cores), FP32 {gpu.fp32_tflops:,g} TFLOPS (CUDA cores), DRAM "
            f"{gpu.bandwidth_gbs:,g} GB/s")


def _print_gpu(est: roofline.ModelEstimate, top: int | None) -> None:
    gpu = est.gpu
    ridge = gpu.peak(est.precision) / gpu.bandwidth
    print()
    print(f"{gpu.name}: {gpu.title}: {_peaks(gpu)}; {est.precision} ridge at "
          f"{ridge:,.0f} ops/B")
    print(f"  source: {gpu.source}")
    kernels = list(est.kernels)
    if top is not None:
        kernels = sorted(kernels, key=lambda k: -k.seconds)[:top]
    rows = [[k.name, k.op, _cell(k.macs / 1e6) if k.macs else "-",
             _cell(k.bytes / 1e6), _cell(k.intensity), _us(k.compute_seconds),
             _us(k.memory_seconds), k.bound, _us(k.seconds)] for k in kernels]
    header = ["kernel", "op", "MMACs", "MB", "ops/B", "compute us", "memory us", "bound",
              "estimate us"]
    for line in table(header, rows, right={2, 3, 4, 5, 6, 8}):
        print("  " + line)
    if len(kernels) < len(est.kernels):
        print(f"  ... {len(est.kernels) - len(kernels)} more")
    n = len(est.kernels)
    print(f"  total: roofline {_ms(est.seconds)} ms, with launches {_ms(est.seconds_with_launch)}"
          f" ms ({n} x {roofline.LAUNCH_SECONDS * 1e6:g} us); {est.compute_bound} compute-"
          f"bound, {n - est.compute_bound} memory-bound kernels")


def _print_summary(estimates: list[roofline.ModelEstimate]) -> None:
    print()
    rows = [[e.gpu.name, _ms(e.seconds), _ms(e.seconds_with_launch),
             f"{e.compute_bound}/{len(e.kernels)}"] for e in estimates]
    for line in table(["GPU", "roofline ms", "with launches ms", "compute-bound"], rows,
                      right={1, 2, 3}):
        print(line)


def _figure(value: float, most: int | None = None) -> str:
    """`value` to 3 significant digits without an exponent (0.00567, 12.3, 1,235), so
    the figures of small and large models alike stay readable; at most `most` decimals
    (a smaller value is shown as ``<0.001``)."""
    digits = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    if most is not None and digits > most:
        digits = most
        if abs(value) < 10 ** -most:
            return f"<{10 ** -most:.{most}f}"
    return f"{value:,.{digits}f}"


def _cell(value: float) -> str:
    """A table cell: 3 significant digits, no more than 3 decimals."""
    return _figure(value, 3)


def _us(seconds: float) -> str:
    return _cell(seconds * 1e6)


def _ms(seconds: float) -> str:
    return _figure(seconds * 1e3)


def _plot(path: str, model: str, estimates: list[roofline.ModelEstimate]) -> None:
    """Log-log roofline: each GPU's roofs (its tensor-core peak for the precision, and
    the FP32 CUDA-core peak the other kernels run at), each kernel as a point on the roof
    it meets (intensity, ops / estimated time)."""
    # matplotlib is imported here: heavy (a second to load), and only the chart needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy, as above
    from matplotlib.lines import Line2D  # heavy, as above

    precision = estimates[0].precision
    intensities = [k.intensity for e in estimates for k in e.kernels]
    ridges = [e.gpu.peak(precision) / e.gpu.bandwidth for e in estimates]
    lo, hi = min(intensities) / 2, max(max(intensities), max(ridges)) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = Figure(figsize=(9, 5.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
              "tab:pink"]
    unit = "TOPS" if precision == "int8" else "TFLOPS"
    for i, est in enumerate(estimates):
        gpu, color = est.gpu, colors[i % len(colors)]
        peak, bw = gpu.peak(precision), gpu.bandwidth
        ax.plot(xs, [min(peak, x * bw) / 1e12 for x in xs], color=color, lw=2,
                label=f"{gpu.name}: {precision} roof ({peak / 1e12:,g} {unit}, "
                      f"{gpu.bandwidth_gbs:,g} GB/s)")
        if precision != "float32":
            fp32 = gpu.peak("float32")
            ax.plot(xs, [min(fp32, x * bw) / 1e12 for x in xs], color=color, lw=1,
                    ls="--", label=f"{gpu.name}: FP32 CUDA-core roof "
                                   f"({gpu.fp32_tflops:,g} TFLOPS)")
        for gemm, marker in ((True, "o"), (False, "^")):
            points = [k for k in est.kernels if (k.op in roofline.GEMM_OPS) == gemm]
            ax.scatter([k.intensity for k in points],
                       [k.ops / k.seconds / 1e12 for k in points], marker=marker, s=28,
                       color=color, edgecolors="black", linewidths=0.4, alpha=0.85,
                       zorder=3)
    # The slowest kernels on the first GPU, named; those on one spot share one label.
    spots: dict[tuple[float, float], list[str]] = {}
    for k in sorted(estimates[0].kernels, key=lambda k: -k.seconds)[:3]:
        point = (k.intensity, k.ops / k.seconds / 1e12)
        spot = next((s for s in spots if all(abs(math.log(a / b)) < 0.1
                                             for a, b in zip(s, point))), point)
        spots.setdefault(spot, []).append(k.name)
    for (x, y), labels in spots.items():
        # Up and left of a point is above the roof, where nothing else is drawn.
        ax.annotate(", ".join(labels), (x, y), fontsize="x-small", xytext=(-6, 6),
                    textcoords="offset points", ha="right",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray"})
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], ls="", marker="o", color="gray", label="GEMM kernels "
                       "(tensor cores)"),
                Line2D([], [], ls="", marker="^", color="gray", label="other kernels "
                       "(CUDA cores)")]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (operations per DRAM byte, log scale)")
    ax.set_ylabel(f"attainable {unit} (log scale)")
    ax.set_title(f"{model}, {precision}: roofline ESTIMATE from datasheet peaks "
                 f"(the 3 slowest kernels on {estimates[0].gpu.name} named)",
                 fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(handles=handles, fontsize="small", loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    atomic_write(path, buffer.getvalue())
