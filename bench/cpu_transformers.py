"""Transformers on the CPU target against onnxruntime: BERT-base (sequence 128) and
ViT-tiny, float32 and int8, batch 1, `--threads` threads (2 by default).

For each model and precision, in one process so that all compete on the same machine
state:

* vdla: the CPU target on the prepared float graph (float32) or on vdla's quantized
  graph (int8: integer-only softmax, LayerNorm and GELU). Nodes the CPU target does not
  run yet fall back to the host's reference kernels, as `vdla run` does; the report
  says how many nodes ran where, and why the host ones did. When every node runs on the
  CPU target the whole graph runs in one C call (`ModelSession.run_graph`), else op by
  op (`ModelSession.run`), host ops and the moves between them included. Its outputs are
  checked first: int8 bit-exact against the integer reference, float32 within the
  float tolerance (a mismatch is printed and makes the exit status 1).
* onnxruntime: every fast path it has for the model (`vdla.compiler.baseline.variants`:
  float32 as exported and after its transformer optimizer; int8 by its static QDQ
  quantization after ``quant_pre_process`` on the same calibration samples, and by its
  dynamic quantization of the optimized model); the faster of each precision is the
  one vdla is measured against.

The timing is `bench/cpu.py`'s (its `Config`): every configuration runs in blocks of
`--runs` runs, the blocks interleaved over `--rounds` rounds with a pause before each;
printed are the median time per run and the speed ratio (onnxruntime's faster time /
vdla's; >= 1.0 means vdla is as fast) as the median of each round's ratio.

    python bench/cpu_transformers.py [--models bert_base vit_tiny] [--threads 2]
                                     [--precisions float32 int8] [--ops] [--out bench-cpu-tf]

``--ops`` then prints, for each vdla run, its time by op type as the whole-graph runner
measures each op inside its one C call.

MODEL is a zoo name or an .onnx file (an ONNX file is run by onnxruntime as it is, its
exporter's graph). Writes OUT/cpu_transformers.json; onnxruntime's models are kept in
OUT/onnx/ (its quantization of BERT-base takes minutes), in a folder per float graph.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import (Config, cpu_target, model_name, model_spec,  # noqa: E402  (bench/cpu.py)
                 time_interleaved)

from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import baseline, pipeline, run_reference  # noqa: E402
from vdla.compiler.frontend.onnx_export import save_onnx  # noqa: E402
from vdla.compiler.passes import prepare  # noqa: E402
from vdla.compiler.targets.cpu import isa as cpu_isa  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402

MODELS = ("bert_base", "vit_tiny")
PRECISIONS = ("float32", "int8")


def log(message: str) -> None:
    print(f"[cpu transformers] {message}", file=sys.stderr, flush=True)


def ort_configs(spec: str, model, args, workdir: Path) -> tuple[list[Config], str | None]:
    """One `Config` per onnxruntime variant of `model` (`baseline.variants`), and the
    model's transformer kind."""
    name = model_name(spec)
    prepared = prepare(model.graph)
    kind = baseline.transformer_kind(prepared)
    heads, hidden = baseline.transformer_shape(prepared)
    # One folder per float graph: a model built again with other weights or shapes is
    # quantized again, not taken from an older run's files.
    folder = workdir / f"{name}-{model.graph.fingerprint()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    if spec.lower().endswith(".onnx"):
        fp32 = Path(spec)
    else:
        fp32 = folder / f"{name}.onnx"
        if not fp32.exists():
            # LayerNormalization needs opset 17.
            save_onnx(model.graph, fp32, **({} if kind is None else {"opset": 17}))
    log(f"{name}: onnxruntime's ways ({kind or 'not a transformer'}) ...")
    configs = []
    for v in baseline.variants(fp32, model, folder, kind=kind, heads=heads, hidden=hidden,
                               precisions=args.precisions, log=log):
        session = baseline.session(v.path, args.threads)
        feed = baseline.feed_for(baseline.session_inputs(session), model.feed)
        configs.append(Config(name, v.precision, f"ort-{v.key}",
                              lambda s=session, f=feed: s.run(None, f)))
    return configs, kind


def vdla_config(spec: str, model, precision: str, target) -> tuple[Config, dict]:
    """vdla's CPU target on `model` at `precision`, with host fallback: its `Config` and
    what the report says about it (nodes per target, the host nodes' reasons, the
    check against the reference)."""
    name = model_name(spec)
    log(f"{name} {precision}: compiling for the CPU target ...")
    graph = pipeline.graph_for(model, target, precision=precision)
    t0 = time.perf_counter()
    compiled = compile_model(graph, target)
    compile_seconds = time.perf_counter() - t0
    where = collections.Counter(op.target for op in compiled.ops)
    reasons = collections.defaultdict(list)
    for op in compiled.ops:
        if op.target != target.name:
            reasons[f"{op.op}: {op.reason or 'no reason given'}"].append(op.name)
    session = compiled.session()
    feed = dict(model.feed)
    whole = session.run_graph(feed)
    if whole is not None:
        outputs, how = whole.outputs, "the whole graph in one C call"
        run = lambda: session.run_graph(feed)       # noqa: E731
    else:
        outputs, how = session.run(feed).outputs, "op by op, host ops between"
        run = lambda: session.run(feed)             # noqa: E731
    reference = run_reference(graph, feed)
    error = max(pipeline.relative_error(outputs[o], reference[o]) for o in graph.outputs)
    ok = error == 0.0 if precision == "int8" else error <= pipeline.FLOAT_TOLERANCE
    info = {"nodes": len(compiled.ops), "where": dict(where), "how": how,
            "host_reasons": {r: len(n) for r, n in reasons.items()},
            "compile_seconds": compile_seconds, "max_error": error, "ok": bool(ok),
            "op_of": {n.name: n.op for n in graph.nodes()}}
    return Config(name, precision, "vdla", run), info


def op_profile(config: Config, op_of: dict, runs: int) -> list[dict] | None:
    """Where a whole-graph run's time goes, by op type: each node's time as the runner
    measures it inside the C call (`GraphRun.op_seconds`), summed over the op type's
    nodes, the median of `runs` runs; None for a model run op by op."""
    totals = collections.defaultdict(list)
    for _ in range(runs):
        ran = config.run()
        if not hasattr(ran, "op_seconds"):
            return None
        by_op = collections.Counter()
        for node, seconds in ran.op_seconds.items():
            by_op[op_of[node]] += seconds
        for op, seconds in by_op.items():
            totals[op].append(seconds)
    count = collections.Counter(op_of.values())
    rows = [{"op": op, "nodes": count[op], "ms": statistics.median(t) * 1e3}
            for op, t in totals.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def print_profile(name: str, precision: str, rows: list[dict] | None) -> None:
    if rows is None:
        print(f"\n{name} {precision}: run op by op, no profile inside the runner")
        return
    total = sum(r["ms"] for r in rows)
    print(f"\n{name} {precision}: vdla's time by op type, inside the whole-graph runner "
          f"(median of the runs; {total:.2f} ms in all)")
    for r in rows:
        if r["ms"] >= 0.005 * total:
            print(f"  {r['op']:16}{r['nodes']:5} nodes{r['ms']:10.2f} ms{100 * r['ms'] / total:7.1f}%")


def rows_of(configs: list[Config], infos: dict) -> list[dict]:
    """Per model and precision: onnxruntime's variants and its fastest, vdla's median
    and its speed ratio (the median over the rounds of onnxruntime's fastest / vdla's)."""
    rows = []
    for (name, precision), info in infos.items():
        mine = [c for c in configs if (c.model, c.precision) == (name, precision)]
        ort = {c.who[4:]: c for c in mine if c.who.startswith("ort-")}
        base = min(ort.values(), key=lambda c: c.median)
        vdla = next(c for c in mine if c.who == "vdla")
        ratios = [o / v for o, v in zip(base.rounds, vdla.rounds)]
        rows.append({"model": name, "precision": precision,
                     "ort": {k: c.median * 1e3 for k, c in ort.items()},
                     "ort_best": base.who[4:], "ort_ms": base.median * 1e3,
                     "vdla_ms": vdla.median * 1e3, "speed": statistics.median(ratios),
                     "speed_rounds": ratios, "runs": len(vdla.times), **info})
    return rows


def print_rows(rows: list[dict], threads: int) -> None:
    print(f"\nSpeed against onnxruntime ({threads} threads, batch 1; median ms per run; "
          "speed = onnxruntime's faster way's time / vdla's)")
    print(f"{'model':12}{'prec':9}{'onnxruntime':>28}{'vdla cpu':>12}{'speed':>8}  exact")
    for r in rows:
        ort = f"{r['ort_ms']:.2f} ({r['ort_best']})"
        exact = "yes" if r["ok"] else f"NO ({r['max_error']:.2g})"
        print(f"{r['model']:12}{r['precision']:9}{ort:>28}{r['vdla_ms']:>12.2f}"
              f"{r['speed']:>7.2f}x  {exact}")
        print(f"{'':21}onnxruntime: " + ", ".join(f"{k} {ms:.2f} ms"
                                                   for k, ms in r["ort"].items()))
        where = ", ".join(f"{n} on {t}" for t, n in r["where"].items())
        print(f"{'':21}vdla: {r['nodes']} nodes: {where}; run {r['how']}")
        for reason, n in sorted(r["host_reasons"].items(), key=lambda kv: -kv[1]):
            print(f"{'':23}{n:4} x {reason}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--models", nargs="+", default=list(MODELS), type=model_spec,
                   help=f"zoo names or .onnx files (default: {' '.join(MODELS)})")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default=None, choices=list(cpu_isa.ISAS),
                   help="vdla's instruction set (default: the best this machine runs)")
    p.add_argument("--calibration", type=int, default=2,
                   help="calibration samples, vdla's and onnxruntime's static int8 (default 2)")
    p.add_argument("--runs", type=int, default=5, help="runs per block (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--pause", type=float, default=0.3,
                   help="seconds between blocks (default 0.3)")
    p.add_argument("--ops", action="store_true",
                   help="then print where vdla's time goes by op type, as the whole-graph "
                        "runner measures each op")
    p.add_argument("--out", default="bench-cpu-transformers",
                   help="output folder (default bench-cpu-transformers)")
    args = p.parse_args(argv)
    for what in ("threads", "calibration", "runs", "rounds"):
        if getattr(args, what) < 1:
            p.error(f"--{what} must be a positive integer, not {getattr(args, what)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        target = cpu_target(args)
    except ValueError as e:             # an ISA this machine or its compiler lacks
        raise SystemExit(f"--isa {args.isa}: {e}")
    import onnxruntime
    report = {"threads": args.threads, "models": args.models, "cpu": cpu_name(),
              "cores": os.cpu_count(), "isa": target.isa.name,
              "machine_isa": cpu_isa.detect().name, "onnxruntime": onnxruntime.__version__}
    print(f"machine: {report['cpu']}, {report['cores']} cores, {report['machine_isa']}; "
          f"vdla's code for {report['isa']}; onnxruntime {report['onnxruntime']} (its "
          f"kernels for the machine's own features)")
    configs, infos = [], {}
    for spec in args.models:
        model = pipeline.load_model(spec, calibration=args.calibration, note=None)
        found, kind = ort_configs(spec, model, args, out / "onnx")
        configs += found
        for precision in args.precisions:
            config, info = vdla_config(spec, model, precision, target)
            configs.append(config)
            infos[model_name(spec), precision] = {**info, "kind": kind}
            if not info["ok"]:
                log(f"{model_name(spec)} {precision}: vdla's output differs from the "
                    f"reference by {info['max_error']:.3g}")
    log(f"timing {len(configs)} configurations: {args.rounds} rounds of {args.runs} runs ...")
    time_interleaved(configs, args)
    op_of = {key: info.pop("op_of") for key, info in infos.items()}
    report["speed"] = rows_of(configs, infos)
    print_rows(report["speed"], args.threads)
    if args.ops:
        report["ops"] = {}
        for config in configs:
            if config.who == "vdla":
                rows = op_profile(config, op_of[config.model, config.precision], args.runs)
                report["ops"][f"{config.model} {config.precision}"] = rows
                print_profile(config.model, config.precision, rows)
    path = out / "cpu_transformers.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
    return 0 if all(r["ok"] for r in report["speed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
