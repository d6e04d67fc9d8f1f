"""ResNet-18 (and ResNet-50) cycle-accurate, end to end: `vdla run MODEL` timed as a user
runs it, warm, sequential and with its ops in parallel.

Each run is the command in a fresh process (`python -m vdla run MODEL --json ...`), so
the wall time counts what a user waits for: Python's start-up and imports, building and
quantizing the model, compiling it, simulating every accelerator op on the Verilator
model, checking it bit-exactly against the quantized reference, and the report. Warm:
a first, untimed run of each model fills the caches (the Verilator model, the
quantized graph, the default schedules), as any second run finds them.

For each model the sequential run (``--jobs 1``) and the parallel one (``--jobs N``,
default: the cores) run in turns and must agree on every op's cycles and be bit-exact;
the ratio of their simulating phases is the median over the pairs. The figures are
the best of `--repeat` runs (timeit's convention: noise only adds time), with the
medians next to them for how noisy the machine was, and the command's own
breakdown (prepare + quantize, compile, run; in the parallel run, the phase on the
workers, "simulating").

Targets (on two cores): ResNet-18 at most 5 s end to end with the simulation
itself at most 2.5 s; ResNet-50 at most 10 s.

    python bench/resnet18_e2e.py [--models resnet18 resnet50] [--repeat 3] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vdla._platform import cpu_name
from vdla._tools import python_module_argv

TARGETS = {"resnet18": (5.0, 2.5), "resnet50": (10.0, None)}


def run_once(model: str, jobs: int, out: Path) -> tuple[float, dict]:
    """Wall time of one `vdla run` and its JSON report."""
    command = python_module_argv("vdla", "run", model, "--jobs", str(jobs),
                                 "--json", str(out))
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return wall, json.loads(out.read_text())


def summary(runs: list[tuple[float, dict]]) -> tuple[float, dict, dict]:
    """The fastest of `runs` (wall, report) and the medians of the runs' wall and
    simulating seconds (``{"wall": ..., "simulate": ...}``), for how much noise there
    was."""
    medians = {"wall": statistics.median(wall for wall, _ in runs),
               "simulate": statistics.median(r["simulate_seconds"] for _, r in runs)}
    return (*min(runs, key=lambda r: r[0]), medians)


def op_cycles(report: dict) -> dict:
    return {op["name"]: op["cycles"] for op in report["ops"] if op["target"] == "vdla"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TARGETS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.repeat < 1:
        parser.error(f"--jobs must be at least 2 (it is compared with --jobs 1) and --repeat "
                     f"at least 1, not {args.jobs} and {args.repeat}")
    print(f"vdla run MODEL, warm, best of {args.repeat}; machine: {cpu_name()}, "
          f"{len(os.sched_getaffinity(0))} cores")
    ok = True
    with tempfile.TemporaryDirectory(prefix="vdla-e2e-") as folder:
        folder = Path(folder)
        for model in args.models:
            run_once(model, args.jobs, folder / "warm.json")   # fills the caches
            # Interleaved, sequential then parallel, so that each pair saw the same
            # machine: their ratio holds when the machine's speed moves.
            runs = {1: [], args.jobs: []}
            for i in range(args.repeat):
                for jobs in runs:
                    runs[jobs].append(run_once(model, jobs, folder / f"{model}-{jobs}-{i}.json"))
            (seq_s, seq, seq_m), (par_s, par, par_m) = (summary(runs[j]) for j in runs)
            ratio = statistics.median(p["simulate_seconds"] / s["simulate_seconds"]
                                      for (_, s), (_, p) in zip(runs[1], runs[args.jobs]))
            same = op_cycles(seq) == op_cycles(par)
            exact = seq["bit_exact"] and par["bit_exact"]
            print(f"{model}: {seq['cycles']:,} cycles; bit-exact: "
                  f"{'yes' if exact else 'NO'}; per-op cycles, sequential = parallel: "
                  f"{'yes' if same else 'NO'}")
            for label, wall, report, medians in (("--jobs 1", seq_s, seq, seq_m),
                                                 (f"--jobs {args.jobs}", par_s, par, par_m)):
                parts = [report[k] for k in ("quantize_seconds", "compile_seconds",
                                             "wall_seconds")]
                print(f"  {label:<9} {wall:6.2f} s end to end: prepare + quantize "
                      f"{parts[0]:.2f} s, compile {parts[1]:.2f} s, run {parts[2]:.2f} s "
                      f"(simulating {report['simulate_seconds']:.2f} s), start-up, loading "
                      f"and the report {wall - sum(parts):.2f} s; median of the runs "
                      f"{medians['wall']:.2f} s (simulating {medians['simulate']:.2f} s)")
            whole, sim = TARGETS.get(model, (None, None))
            verdicts = []
            if whole is not None:
                verdicts.append(f"end to end {par_s:.2f} s vs {whole:g} s: "
                                f"{'met' if par_s <= whole else 'MISSED'}")
            if sim is not None:
                verdicts.append(f"simulating {par['simulate_seconds']:.2f} s vs {sim:g} s: "
                                f"{'met' if par['simulate_seconds'] <= sim else 'MISSED'}")
            print(f"  simulating with --jobs {args.jobs} takes {ratio:.2f}x the sequential "
                  "time (median of the interleaved pairs)")
            if verdicts:
                print("  " + "; ".join(verdicts))
            ok &= same and exact
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
