"""The CPU target's convolutions layer by layer against onnxruntime's profiler, with the
plain layouts (before) and the blocked ones (after), and the layout conversions per model.

Per model and precision (batch 1, `--threads` threads), in `--rounds` interleaved rounds:

* onnxruntime: its profiler's kernel time per node (`baseline.profile`), on the ONNX
  model `vdla export` writes (float32) and on onnxruntime's own static QDQ int8 of it
  with uint8 activations (its faster int8 variant on x86, as in `bench/cpu.py`);
* vdla before: every convolution with the plain layout's default schedule
  (`choose_conv(..., blocked=False)`): each one repacks its input into padded scratch
  planes inside its kernel, and depthwise layers repack each channel's rows;
* vdla after: the default chooser (blocked layouts kept from op to op, a conversion only
  where a layout changes).

vdla's layer times are the whole-graph runner's own per-op times (`GraphRun.op_seconds`,
one C call per run), with every layer its own kernel (``fuse=False``); each layer's
figure is the median over the rounds of each round's median. onnxruntime fuses a
convolution with its batch norm, activation and residual add and names the fused kernel
after the last node it absorbed; each of its kernels is
matched to the convolution that starts that chain in the exported graph.

Printed: a table of the depthwise and pointwise layers (and, with `--all`, every
convolution), each kind's total, and the conversions: before, none outside the kernels
(every convolution repacks inside its own time); after, their count and time.

    python bench/cpu_layers.py [--models mobilenet_v1 resnet50] [--rounds 5] [--runs 10]
                               [--threads 2] [--all] [--out bench-cpu]

Writes OUT/cpu_layers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

import numpy as np  # noqa: E402

from vdla.compiler import Graph, baseline, pipeline, targets  # noqa: E402
from vdla.compiler.frontend.onnx_export import save_onnx  # noqa: E402
from vdla.compiler.targets.cpu.schedule import choose_conv  # noqa: E402
from vdla.compiler.targets.cpu import isa as cpu_isa  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402

#: Ops onnxruntime folds into the convolution before them (its fused kernel takes the
#: name of the last one).
_FUSED = {"batch_norm", "relu", "relu6", "clip", "add"}
#: The suffixes onnxruntime appends to a node's name when it rewrites it: its blocked
#: layout (`_nchwc`) and the QDQ transformer's (`_1_token_7`).
_SUFFIX = re.compile(r"(_nchwc|_token_\d+|_\d+)$")


def log(message: str) -> None:
    print(f"[cpu layers] {message}", file=sys.stderr, flush=True)


def chains(graph: Graph) -> dict[str, str]:
    """Every node name of `graph` -> the convolution whose chain (the conv, then ops
    onnxruntime fuses into it while each feeds only the next) it belongs to."""
    owner = {}
    for node in graph.nodes():
        if node.op != "conv2d":
            continue
        owner[node.name] = node.name
        current = node
        while len(current.outputs) == 1:
            users = graph.consumers(current.outputs[0])
            if len(users) != 1 or users[0].op not in _FUSED:
                break
            current = users[0]
            owner.setdefault(current.name, node.name)
    return owner


def ort_layers(run: baseline.ProfiledRun, owner: dict[str, str]) -> dict[str, float]:
    """onnxruntime's kernel seconds per convolution of the exported graph."""
    out: dict[str, float] = {}
    for node, seconds in run.node_seconds.items():
        if baseline.OP_GROUPS.get(run.node_ops[node]) != "conv":
            continue
        name = node
        while name not in owner and _SUFFIX.search(name):
            name = _SUFFIX.sub("", name)
        if name in owner:
            out[owner[name]] = out.get(owner[name], 0.0) + seconds
    return out


def plain_schedules(graph: Graph, target) -> dict:
    """The plain layout's default schedule for every convolution of `graph`."""
    schedules = {}
    for task in target.tasks(graph):
        if task.conv:
            schedule = choose_conv(task.shape, target.isa, target.team, blocked=False,
                                   costs=target.costs)
            schedules.update((n, schedule) for n in task.nodes)
    return schedules


def layer_info(graph: Graph, target) -> dict[str, dict]:
    """Each convolution's kind (depthwise; pointwise: 1x1, one group, any stride;
    other) and shape."""
    info = {}
    for task in target.tasks(graph):
        if not task.conv:
            continue
        shape = task.shape
        kind = ("depthwise" if shape.depthwise else "pointwise"
                if shape.kh == shape.kw == 1 and shape.groups == 1 else "other")
        for n in task.nodes:
            info[n] = {"kind": kind, "shape": task.describe()}
    return info


def measure(model_name: str, precision: str, args, onnx_dir: Path) -> dict:
    # Each layer's own kernel: a fused depthwise and pointwise pair has one time for the
    # two (bench/cpu_fusion.py measures those).
    target = targets.get("cpu", threads=args.threads, fuse=False, isa=args.isa)
    model = pipeline.load_model(model_name, calibration=args.calibration, note=None)
    fp32 = save_onnx(model.graph, onnx_dir / f"{model_name}.onnx")
    path = fp32
    if precision == "int8":
        path = onnx_dir / f"{model_name}-u8.onnx"
        if not path.exists():
            log(f"{model_name}: onnxruntime's static QDQ quantization (uint8 activations) ...")
            baseline.quantize_qdq(fp32, model, path, "u8")
    x = np.asarray(model.feed[model.graph.inputs[0]], np.float32)
    graph = pipeline.graph_for(model, target, precision=precision)
    sessions = {}
    reference = pipeline.reference_of(graph, model.feed)
    for who, schedules in (("before", plain_schedules(graph, target)), ("after", {})):
        compiled = compile_model(graph, target, schedules=schedules)
        session = compiled.session()
        first = session.run_graph(model.feed)
        if first is None:
            raise SystemExit(f"{model_name}: not every op runs on the CPU target")
        error = max(pipeline.relative_error(first.outputs[o], reference[o])
                    for o in graph.outputs)
        if precision == "int8" and error != 0.0 or error > pipeline.FLOAT_TOLERANCE:
            raise SystemExit(f"{model_name} {precision} {who}: output differs from the "
                             f"reference by {error:.3g}")
        sessions[who] = session
    owner = chains(model.graph)
    rounds: dict[str, list[dict[str, float]]] = {"ort": [], "before": [], "after": []}
    walls: dict[str, list[float]] = {"before": [], "after": []}
    conversions: list[tuple[int, float]] = []
    for r in range(args.rounds):
        log(f"{model_name} {precision}: round {r + 1}/{args.rounds}")
        time.sleep(args.pause)
        rounds["ort"].append(ort_layers(baseline.profile(path, args.threads, [x], args.runs),
                                        owner))
        for who, session in sessions.items():
            time.sleep(args.pause)
            runs, wall = [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                runs.append(session.run_graph(model.feed))
                wall.append(time.perf_counter() - t0)
            walls[who].append(statistics.median(wall))
            rounds[who].append({op: statistics.median(g.op_seconds[op] for g in runs)
                                for op in runs[0].op_seconds})
            if who == "after":
                conversions.append((len(runs[0].layout_seconds), statistics.median(
                    sum(g.layout_seconds.values()) for g in runs)))
    for session in sessions.values():
        session.close()

    def median(who: str, op: str) -> float | None:
        values = [r[op] for r in rounds[who] if op in r]
        return statistics.median(values) if values else None

    info = layer_info(graph, target)
    layers = []
    for op, kind in info.items():
        row = {"layer": op, **kind,
               **{f"{who}_us": (median(who, op) or 0) * 1e6 for who in rounds}}
        layers.append(row)
    return {"model": model_name, "precision": precision, "layers": layers,
            "convs": len(info),
            "before_ms": statistics.median(walls["before"]) * 1e3,
            "after_ms": statistics.median(walls["after"]) * 1e3,
            "conversions": conversions[0][0] if conversions else 0,
            "conversion_ms": statistics.median(c[1] for c in conversions) * 1e3}


def totals(result: dict) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in result["layers"]:
        t = out.setdefault(row["kind"], {"count": 0, "ort_us": 0.0, "before_us": 0.0,
                                         "after_us": 0.0})
        t["count"] += 1
        for k in ("ort_us", "before_us", "after_us"):
            t[k] += row[k]
    return out


def ratio(ort: float, mine: float) -> str:
    return f"{ort / mine:.2f}x" if ort and mine else "-"


def print_result(result: dict, every: bool) -> None:
    print(f"\n{result['model']} {result['precision']}: per layer, us (onnxruntime's profiler; "
          "vdla's runner; speed = onnxruntime's time / vdla's)")
    print(f"{'layer':26}{'kind':10}{'shape':44}{'ort':>9}{'before':>9}{'after':>9}"
          f"{'before':>8}{'after':>8}")
    for row in result["layers"]:
        if not every and row["kind"] == "other":
            continue
        print(f"{row['layer'][:25]:26}{row['kind']:10}{row['shape'][:43]:44}"
              f"{row['ort_us']:>9.1f}{row['before_us']:>9.1f}{row['after_us']:>9.1f}"
              f"{ratio(row['ort_us'], row['before_us']):>8}"
              f"{ratio(row['ort_us'], row['after_us']):>8}")
    for kind, t in totals(result).items():
        print(f"  {kind:10} {t['count']:3} layers: onnxruntime {t['ort_us'] / 1e3:.2f} ms, "
              f"before {t['before_us'] / 1e3:.2f} ms ({ratio(t['ort_us'], t['before_us'])}), "
              f"after {t['after_us'] / 1e3:.2f} ms ({ratio(t['ort_us'], t['after_us'])})")
    print(f"  whole graph: before {result['before_ms']:.2f} ms, after "
          f"{result['after_ms']:.2f} ms")
    print(f"  layout conversions: before none outside the kernels ({result['convs']} "
          f"convolutions each repack their input inside their own time); after "
          f"{result['conversions']} in {result['conversion_ms']:.3f} ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["mobilenet_v1", "resnet50"])
    p.add_argument("--precisions", nargs="+", default=["float32", "int8"],
                   choices=["float32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default=None, choices=list(cpu_isa.ISAS),
                   help="vdla's instruction set (default: the best this machine runs; on "
                        "AMX tiles an int8 convolution of one group is a tile GEMM, "
                        "without the knobs of a blocked layer)")
    p.add_argument("--calibration", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("--all", action="store_true", help="print every convolution")
    p.add_argument("--out", default="bench-cpu")
    args = p.parse_args(argv)
    for spec in args.models:
        try:
            pipeline.check_model_spec(spec)
        except ValueError as e:
            p.error(str(e))
    out = Path(args.out)
    onnx_dir = out / "onnx"          # shared with bench/cpu.py: quantizing takes minutes
    onnx_dir.mkdir(parents=True, exist_ok=True)
    isa = targets.get("cpu", isa=args.isa).isa.name
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; vdla's code for {isa}; "
          f"{args.threads} threads")
    results = []
    for name in args.models:
        for precision in args.precisions:
            results.append(measure(name, precision, args, onnx_dir))
            print_result(results[-1], args.all)
    report = {"cpu": cpu_name(), "isa": isa, "threads": args.threads, "results": results}
    (out / "cpu_layers.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out / 'cpu_layers.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
