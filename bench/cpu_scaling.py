"""The CPU target's thread scaling: measured from 1 to `--threads` threads on this
machine, and projected to a `--project`-core machine from each layer's work split.

Measured (batch 1), per model and precision, in `--rounds` interleaved rounds of `--runs`
runs: vdla's whole-graph runner with a target of 1 thread and one of `--threads`
threads (each with the default chooser's schedules for its thread count), and
onnxruntime (float32; int8: its static QDQ model with uint8 activations, as in
`bench/cpu.py`) at the same thread counts. Printed: the median time per run, the speedup
from 1 thread, and the layers that lose the most time to an imperfect split.

Projected: the default chooser's schedules for a `--project`-thread target (the same
code the target would generate there), each layer's work items (`Kernel.items`: what
OpenMP shares among the threads with a static schedule), the items per thread
(``ceil(items / threads)``) and the parallel efficiency that split allows,
``items / (threads * ceil(items / threads))``. The model's bound weighs each layer by
its measured 1-thread time: ``sum(t1) / sum(t1 / (threads * efficiency))``; then the
same with each op's thread-team start and join added (`--team-us`, 5 us by default),
which at 16 cores is a large share of a layer of some microseconds. A bound, not a
forecast: it assumes each core runs as fast as this one does alone, and leaves out
memory bandwidth shared by the cores and ops whose items are not counted (pools,
elementwise ops, conversions: taken as split perfectly, their share of the time is
printed).

    python bench/cpu_scaling.py [--models resnet18 resnet50 mobilenet_v1] [--threads 2]
                                [--project 16] [--rounds 5] [--runs 10] [--out bench-cpu]

Writes OUT/cpu_scaling.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

from vdla.compiler import baseline, pipeline, targets  # noqa: E402
from vdla.compiler.frontend.onnx_export import save_onnx  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402

import numpy as np  # noqa: E402


def log(message: str) -> None:
    print(f"[cpu scaling] {message}", file=sys.stderr, flush=True)


def efficiency(items: int, threads: int) -> float:
    """The parallel efficiency a static split of `items` equal items allows."""
    return items / (threads * math.ceil(items / threads))


def projection(graph, times1: dict[str, float], threads: int, team_us: float) -> dict:
    """Each op's work items under a `threads`-thread target's default schedules, and
    the bound on the model's speedup over 1 thread (module docstring)."""
    target = targets.get("cpu", threads=threads)
    kernels, used = target.kernels(graph, graph.nodes(), schedules={})
    layers, ideal, counted, uncounted = [], 0.0, 0.0, 0.0
    for name, kernel in kernels.items():
        t1 = times1.get(name, 0.0)
        if kernel.items is None:
            uncounted += t1
            ideal += t1 / threads
            continue
        eff = 1.0 / threads if kernel.items == 1 else efficiency(kernel.items, threads)
        counted += t1
        ideal += t1 / (threads * eff)
        layers.append({"layer": name, "items": kernel.items,
                       "per_thread": math.ceil(kernel.items / threads),
                       "efficiency": eff, "t1_us": t1 * 1e6,
                       "schedule": None if used[name] is None else used[name].to_dict()})
    total = counted + uncounted
    # One team per op that starts one: a serial kernel (one item) does not.
    started = sum(1 for k in kernels.values() if k.items != 1)
    teams = started * team_us * 1e-6
    return {"threads": threads, "layers": layers, "ops": started,
            "projected_ms": ideal * 1e3, "team_ms": teams * 1e3,
            "speedup_bound": total / ideal if ideal else float("nan"),
            "speedup_with_teams": total / (ideal + teams) if ideal else float("nan"),
            "uncounted_share": uncounted / total if total else 0.0}


def ort_model(name: str, model, precision: str, onnx_dir: Path) -> Path:
    fp32 = save_onnx(model.graph, onnx_dir / f"{name}.onnx")
    if precision == "float32":
        return fp32
    path = onnx_dir / f"{name}-u8.onnx"
    if not path.exists():
        log(f"{name}: onnxruntime's static QDQ quantization (uint8 activations) ...")
        baseline.quantize_qdq(fp32, model, path, "u8")
    return path


def measure(name: str, precision: str, args, onnx_dir: Path) -> dict:
    model = pipeline.load_model(name, calibration=args.calibration, note=None)
    x = np.asarray(model.feed[model.graph.inputs[0]], np.float32)
    path = ort_model(name, model, precision, onnx_dir)
    counts = sorted({1, args.threads})
    runners, graph = {}, None
    for threads in counts:
        target = targets.get("cpu", threads=threads)
        graph = pipeline.graph_for(model, target, precision=precision)
        session = compile_model(graph, target).session()
        if session.run_graph(model.feed) is None:
            raise SystemExit(f"{name}: not every op runs on the CPU target")
        runners[("vdla", threads)] = session
        ort = baseline.session(path, threads)
        feed = {ort.get_inputs()[0].name: x}
        runners[("ort", threads)] = (ort, feed)
    walls = {key: [] for key in runners}
    ops1: list[dict[str, float]] = []
    for r in range(args.rounds):
        log(f"{name} {precision}: round {r + 1}/{args.rounds}")
        for (who, threads), runner in runners.items():
            time.sleep(args.pause)
            block = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                if who == "vdla":
                    run = runner.run_graph(model.feed)
                    if threads == 1:
                        ops1.append(run.op_seconds)
                else:
                    runner[0].run(None, runner[1])
                block.append(time.perf_counter() - t0)
            walls[who, threads].append(statistics.median(block))
    for (who, _), runner in runners.items():
        if who == "vdla":
            runner.close()
    times1 = {op: statistics.median(o[op] for o in ops1) for op in ops1[0]}
    measured = {f"{who}@{threads}": statistics.median(w) * 1e3
                for (who, threads), w in walls.items()}
    return {"model": name, "precision": precision, "ms": measured,
            "projection": projection(graph, times1, args.project, args.team_us)}


def print_result(r: dict, threads: int, top: int) -> None:
    ms = r["ms"]
    cells = []
    for who in ("vdla", "ort"):
        one, many = ms[f"{who}@1"], ms[f"{who}@{threads}"]
        cells.append(f"{who} {one:.2f} -> {many:.2f} ms ({one / many:.2f}x)")
    p = r["projection"]
    print(f"{r['model']:13}{r['precision']:8} 1 -> {threads} threads: {'; '.join(cells)}; "
          f"{p['threads']} cores: bound {p['speedup_bound']:.1f}x, {p['projected_ms']:.2f} ms "
          f"(uncounted ops {p['uncounted_share']:.0%} of the time); with {p['ops']} team "
          f"starts ({p['team_ms']:.2f} ms) {p['speedup_with_teams']:.1f}x")
    uneven = [x for x in p["layers"] if x["efficiency"] < 1]
    if not uneven:
        print(f"    every counted layer splits evenly over {p['threads']} threads")
    worst = sorted(uneven, key=lambda x: -x["t1_us"] * (1 - x["efficiency"]))[:top]
    for x in worst:
        print(f"    {x['layer'][:28]:28} {x['items']:5} items, {x['per_thread']:3} per thread,"
              f" efficiency {x['efficiency']:.2f}, {x['t1_us']:8.1f} us on 1 thread")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v1"])
    p.add_argument("--precisions", nargs="+", default=["float32", "int8"],
                   choices=["float32", "int8"])
    p.add_argument("--threads", type=int, default=2, help="the measured thread count")
    p.add_argument("--project", type=int, default=16, help="the projected core count")
    p.add_argument("--calibration", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("--top", type=int, default=3, help="worst-split layers printed per model")
    p.add_argument("--team-us", type=float, default=5.0,
                   help="an OpenMP team's start and join per op, us (default 5: about "
                        "15,000 cycles, the default chooser's own figure)")
    p.add_argument("--out", default="bench-cpu")
    args = p.parse_args(argv)
    for spec in args.models:
        try:
            pipeline.check_model_spec(spec)
        except ValueError as e:
            p.error(str(e))
    if args.threads < 1 or args.project < 1:
        p.error(f"--threads and --project must be positive, not {args.threads} and "
                f"{args.project}")
    out = Path(args.out)
    onnx_dir = out / "onnx"          # shared with bench/cpu.py: quantizing takes minutes
    onnx_dir.mkdir(parents=True, exist_ok=True)
    isa = targets.get("cpu").isa.name
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; vdla's code for {isa}")
    results = []
    for name in args.models:
        for precision in args.precisions:
            results.append(measure(name, precision, args, onnx_dir))
            print_result(results[-1], args.threads, args.top)
    report = {"cpu": cpu_name(), "isa": isa, "threads": args.threads,
              "project": args.project, "results": results}
    (out / "cpu_scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out / 'cpu_scaling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
