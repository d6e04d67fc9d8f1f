"""The CPU target's fused pairs (`compiler/targets/cpu/fusion.py`: a depthwise and a
pointwise convolution, a convolution and its max pool) and its attentions that read
and write their heads in place (`head_views.py`: ``--models vit_tiny bert_base``)
against the same layers unfused, in whole-graph runs.

For each model and precision: the graph compiled twice, with fusion (the default) and
without (``CpuTarget(fuse=False)``), both sessions open in one process and run in
alternating blocks of `--runs` runs over `--rounds` rounds, so the machine's drift
falls on both alike. Printed: the model's median time each way and the median of the
rounds' ratios; and per fused pair, its time inside the fused run against the sum of
its two layers' times unfused (each the median over every run). Outputs are compared:
fused and unfused must be the same bytes.

    python bench/cpu_fusion.py [--models mobilenet_v1 resnet18] [--precisions float32 int8]
                               [--threads 2] [--rounds 15] [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

import numpy as np  # noqa: E402

from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline, targets  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402


def log(message: str) -> None:
    print(f"[cpu fusion] {message}", file=sys.stderr, flush=True)


def block(session, feed, runs: int, times: list, ops: dict) -> None:
    for _ in range(runs):
        start = time.perf_counter()
        run = session.run_graph(feed)
        times.append(time.perf_counter() - start)
        for name, seconds in run.op_seconds.items():
            ops.setdefault(name, []).append(seconds)


def measure(model_name: str, precision: str, args) -> None:
    model = pipeline.load_model(model_name, note=None)
    fused_t = targets.get("cpu", threads=args.threads)
    plain_t = targets.get("cpu", threads=args.threads, fuse=False)
    graph = pipeline.graph_for(model, fused_t, precision=precision)
    log(f"{model_name} {precision}: compiling twice ...")
    fused_c, plain_c = compile_model(graph, fused_t), compile_model(graph, plain_t)
    pairs = [(s.fused, s.name) for s in fused_c.ops[0].kernel.program.steps if s.fused]
    if not pairs:
        print(f"\n{model_name} {precision}: no pair fuses (fusion.MIN_BYTES, "
              f"MAX_WEIGHT_BYTES) and no attention reads its heads in place")
        return
    with fused_c.session() as fused, plain_c.session() as plain:
        a, b = fused.run_graph(model.feed), plain.run_graph(model.feed)
        same = all(np.array_equal(a.outputs[k], b.outputs[k]) for k in a.outputs)
        times = {"fused": [], "unfused": []}
        ops = {"fused": {}, "unfused": {}}
        ratios = []
        for _ in range(args.rounds):
            medians = {}
            for label, session in (("fused", fused), ("unfused", plain)):
                time.sleep(args.pause)
                mine: list = []
                block(session, model.feed, args.runs, mine, ops[label])
                times[label] += mine
                medians[label] = statistics.median(mine)
            ratios.append(medians["unfused"] / medians["fused"])
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"\n{model_name} {precision} ({args.threads} threads, {args.rounds} rounds of "
          f"{args.runs} runs each way): fused {med['fused']:.3f} ms, unfused "
          f"{med['unfused']:.3f} ms, speed {statistics.median(ratios):.3f}x "
          f"(median of the rounds' ratios); outputs {'identical' if same else 'DIFFER'}")
    print(f"  {'pair':44}{'unfused us':>12}{'fused us':>10}{'speed':>8}")
    for absorbed, node in pairs:
        before = sum(statistics.median(ops["unfused"][n]) for n in absorbed + (node,)) * 1e6
        after = statistics.median(ops["fused"][node]) * 1e6
        what = (f"{absorbed[0]} + {node}" if len(absorbed) == 1 else
                f"{node} + {len(absorbed)} slices/transposes")
        print(f"  {what:44}{before:>12.1f}{after:>10.1f}{before / after:>7.2f}x")
    if not same:
        raise SystemExit("fused and unfused outputs differ")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["mobilenet_v1", "resnet18"])
    p.add_argument("--precisions", nargs="+", default=["float32", "int8"],
                   choices=["float32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--pause", type=float, default=0.1, help="seconds before each block")
    args = p.parse_args(argv)
    for name in ("threads", "rounds", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    for spec in args.models:
        try:
            pipeline.check_model_spec(spec)
        except ValueError as e:
            p.error(str(e))
    isa = targets.get("cpu").isa.name
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; vdla's code for {isa}")
    for model in args.models:
        for precision in args.precisions:
            measure(model, precision, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
