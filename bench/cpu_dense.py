"""The CPU target's dense layers with and without the prefetch of the next weight
panel (`compiler/targets/cpu/dense.py`, ``_prefetch_share``), in whole-graph runs.

A transformer's dense layer of many rows runs output tile by output tile; the first row
block over a tile's panel of weights reads it from wherever it is, the others from L2.
A model whose weights outgrow the last-level cache (BERT-base float32: 340 MB) reads
each panel from memory; every row block's call prefetches its share of the next panel.

For each model and precision: the graph compiled twice, prefetch on (the default) and
off (``dense.PREFETCH_NEXT_PANEL = False`` while compiling), both sessions open in one
process and run alternately over `--rounds` rounds of `--runs` runs, so that the
machine's drift falls on both alike. Printed: each way's median time for the model and
for its dense layers (the whole-graph runner's own op times), and the median of the
rounds' ratios with their quartiles. The two ways must give the same bytes.

    python bench/cpu_dense.py [--models bert_base vit_tiny] [--precisions float32]
                              [--threads 2] [--rounds 15] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import model_spec  # noqa: E402  (bench/cpu.py)

from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline, targets  # noqa: E402
from vdla.compiler.targets.cpu import dense  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402

_DENSE = ("dense", "qdense")


def log(message: str) -> None:
    print(f"[cpu dense] {message}", file=sys.stderr, flush=True)


def compiled(graph, target, prefetch: bool):
    dense.PREFETCH_NEXT_PANEL = prefetch
    try:
        return compile_model(graph, target)
    finally:
        dense.PREFETCH_NEXT_PANEL = True


def measure(model_name: str, precision: str, args) -> str:
    target = targets.get("cpu", threads=args.threads)
    model = pipeline.load_model(model_name, calibration=2, note=None)
    graph = pipeline.graph_for(model, target, precision=precision)
    dense_nodes = {n.name for n in graph.nodes() if n.op in _DENSE}
    log(f"{model_name} {precision}: compiling twice ...")
    ways = {"on": compiled(graph, target, True), "off": compiled(graph, target, False)}
    sessions = {who: c.session() for who, c in ways.items()}
    feed = dict(model.feed)
    first = {who: s.run_graph(feed).outputs for who, s in sessions.items()}
    for name in graph.outputs:
        if not np.array_equal(first["on"][name], first["off"][name]):
            raise SystemExit(f"{model_name} {precision}: output {name!r} differs with the "
                             "prefetch on and off")
    total = {who: [] for who in sessions}
    layers = {who: [] for who in sessions}
    log(f"{model_name} {precision}: {args.rounds} rounds of {args.runs} runs each way ...")
    for _ in range(args.rounds):
        for who, session in sessions.items():
            t, d = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                run = session.run_graph(feed)
                t.append(time.perf_counter() - start)
                d.append(sum(s for n, s in run.op_seconds.items() if n in dense_nodes))
            total[who].append(statistics.median(t))
            layers[who].append(statistics.median(d))
    ratios = [off / on for on, off in zip(total["on"], total["off"])]
    dense_ratios = [off / on for on, off in zip(layers["on"], layers["off"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    ms = {who: 1e3 * statistics.median(v) for who, v in total.items()}
    dms = {who: 1e3 * statistics.median(v) for who, v in layers.items()}
    return (f"{model_name:10} {precision:8} off {ms['off']:8.2f} ms  on {ms['on']:8.2f} ms  "
            f"speed {statistics.median(ratios):.3f}x (quartiles {q1:.3f}-{q3:.3f});  "
            f"{len(dense_nodes)} dense layers: off {dms['off']:.2f} ms, on {dms['on']:.2f} "
            f"ms, {statistics.median(dense_ratios):.3f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["bert_base", "vit_tiny"], type=model_spec)
    p.add_argument("--precisions", nargs="+", default=["float32"],
                   choices=["float32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 (the ratios' quartiles), not {args.rounds}")
    for name in ("threads", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    isa = targets.get("cpu").isa.name
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; vdla's code for {isa}; "
          f"{args.threads} threads; {args.rounds} interleaved rounds of {args.runs} runs; "
          "speed = off's time / on's")
    for name in args.models:
        for precision in args.precisions:
            print(measure(name, precision, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
