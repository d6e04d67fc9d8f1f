"""Op-parallel simulation's scaling: a model's vdla ops simulated on the Verilator model by
1 and 2 local worker processes and by 1, 2 and 4 actors of a local Ray instance
(`vdla.compiler.targets.op_parallel`, `vdla run --jobs`, `--ray`), as simulated cycles per
second of wall time, with a projection to a larger cluster.

Every configuration runs the same tasks (each op fed from the reference) and must give
every op the same cycles; the figure is the whole model's cycles over the wall time of
the parallel phase, the workers' start (their sessions) included and the reference
excluded. The projection takes each op's wall time from the one-worker run and packs the
ops onto W workers longest first: no run can take less than its longest op, so past a
few workers that op bounds it, whatever the cluster. It assumes the ops' times stay what
they are on one worker of this machine and that sending an op's inputs costs nothing.

    python bench/sim_scaling.py [--model resnet18] [--out DIR] [--no-ray]

Writes DIR/sim_scaling.json and DIR/sim_scaling.png (default: a temporary folder).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import heapq  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import vdla  # noqa: E402
from vdla._fileio import atomic_write  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.targets import op_parallel  # noqa: E402
from vdla.compiler.targets.vdla.target import VdlaTarget  # noqa: E402
from vdla.execute import make_executor  # noqa: E402

#: (label, executor options) measured.
LOCAL = [("local, 1 process", dict(jobs=1)), ("local, 2 processes", dict(jobs=2))]
RAY = [(f"Ray local, {n} actor{'s' * (n > 1)}", dict(ray="local", jobs=n)) for n in (1, 2, 4)]
#: Worker counts the projection covers.
PROJECTED = (1, 2, 4, 8, 16, 32)


def makespan(seconds: list[float], workers: int) -> float:
    """The wall time of `seconds` (each op's) packed onto `workers` longest first."""
    loads = [0.0] * workers
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + s)
    return max(loads)


def measure(compiled, reference, options) -> tuple[float, dict]:
    """Wall time of all the model's ops on an executor made with `options` (one local
    job runs them in this process), and each op's (cycles, wall seconds in its
    worker)."""
    with make_executor(op_parallel.worker_factory(compiled), **options) as executor:
        start = time.perf_counter()
        done = op_parallel.run_ops(compiled, reference, executor)
        wall = time.perf_counter() - start
    return wall, {name: (ran.cycles, seconds) for name, (ran, seconds) in done.items()}


def plot(rows, projection, path: Path, model: str, cpu: str, cores: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ws = [w for w, _ in projection]
    ax.plot(ws, [r / 1e6 for _, r in projection], "--", color="grey",
            label="projection (ops packed longest first; the longest op bounds it)")
    for kind, marker in (("local", "o"), ("Ray", "s")):
        pts = [(r["workers"], r["cycles_per_second"] / 1e6) for r in rows
               if r["label"].startswith(kind)]
        if pts:
            ax.plot(*zip(*pts), marker, markersize=8, label=f"measured, {kind}")
    ax.axvline(cores, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"this machine's {cores} cores", (cores, 0.5), xycoords=("data", "axes fraction"),
                xytext=(4, 0), textcoords="offset points", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws)
    ax.set_xticklabels([str(w) for w in ws])
    ax.set_xlabel("workers")
    ax.set_ylabel("simulated cycles per second (millions)")
    ax.set_title(f"{model} on the Verilator model, ops in parallel ({cpu}, {cores} cores)",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--out", type=Path, help="folder for the JSON and the plot")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runs")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="vdla-sim-scaling-"))
    out.mkdir(parents=True, exist_ok=True)
    target = VdlaTarget(vdla.HardwareConfig(), backend="verilator")
    model = pipeline.load_model(args.model)
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, target), target)
    reference = pipeline.run_reference(compiled.graph, model.feed, keep=True)
    cpu = cpu_name()
    print(f"{args.model}: {len(op_parallel.op_tasks(compiled, reference))} ops simulated "
          f"apart, config {target.config.name}; machine: {cpu}, "
          f"{len(os.sched_getaffinity(0))} cores")
    rows, first = [], None
    for label, options in LOCAL + ([] if args.no_ray else RAY):
        wall, ops = measure(compiled, reference, options)
        cycles = sum(c for c, _ in ops.values())
        if first is None:
            first = ops
        elif {k: c for k, (c, _) in ops.items()} != {k: c for k, (c, _) in first.items()}:
            raise SystemExit(f"{label}: the ops' cycles differ from the first run's")
        rows.append({"label": label, "workers": options["jobs"], "wall_seconds": wall,
                     "cycles": cycles, "cycles_per_second": cycles / wall})
        print(f"  {label:<22} {wall:6.2f} s   {cycles / wall / 1e6:5.2f} M cycles/s")
    seconds = [s for _, s in first.values()]
    cycles = sum(c for c, _ in first.values())
    projection = [(w, cycles / makespan(seconds, w)) for w in PROJECTED]
    longest = max(first.items(), key=lambda kv: kv[1][1])
    print(f"projection from the one-worker op times (the longest op, {longest[0]}, takes "
          f"{longest[1][1]:.2f} s):")
    for w, rate in projection:
        print(f"  {w:>3} workers  {cycles / rate:6.2f} s   {rate / 1e6:5.2f} M cycles/s")
    report = {"model": args.model, "config": target.config.name, "cpu": cpu,
              "cores": len(os.sched_getaffinity(0)), "measured": rows,
              "projection": [{"workers": w, "cycles_per_second": r} for w, r in projection],
              "op_seconds": {k: s for k, (_, s) in first.items()},
              "longest_op": longest[0]}
    atomic_write(out / "sim_scaling.json", json.dumps(report, indent=2).encode())
    plot(rows, projection, out / "sim_scaling.png", args.model, cpu,
         len(os.sched_getaffinity(0)))
    print(f"wrote {out / 'sim_scaling.json'} and {out / 'sim_scaling.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
