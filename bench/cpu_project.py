"""The CPU target's stand-alone C project against the in-process runner: the same
outputs and the same speed.

For each model of `--models` and each precision (float32, int8), the model is compiled
for the CPU target in this process, and the project `vdla compile` would write is
written from that same compiled program (`CpuTarget.export`) into
OUT/projects/MODEL-PRECISION and built with `make`. Then, over `--rounds` rounds, two
blocks of `--runs` runs each, a pause (`--pause`) before each block, the first block
alternating from round to round:

* the C program: ``run_model model.params IN OUT RUNS``, a fresh process that reads its
  input file, runs the model once untimed, then RUNS times, each timed in C
  (``CLOCK_MONOTONIC``), and prints the median; the process's start, the params and
  the files are outside the timing;
* in process: ``session.run_graph(feed)`` RUNS times (the whole graph in one C call
  through ctypes), each timed with ``time.perf_counter`` after three warm-up runs.

Printed per model and precision: the median over the rounds of each block's median
time per run, and the ratio (the C program's time / the in-process time) as the median
over the rounds of each round's ratio: this machine's speed drifts by tens of percent
from minute to minute, and the two blocks of a round run seconds apart. Beside them the
fastest round's median of each and their ratio: a busy neighbour only ever slows a
block, so the fastest blocks are the ones it touched least. The outputs:
every block's output file of the C program against the in-process output, int8 byte for
byte (the int8 graph's output is its dequantized float32 logits, compared by bytes);
float32 as the largest relative error (max |c - p| / max |p|) over the rounds, and
whether the bytes are identical.

Both run `--threads` OpenMP threads (default 2): the in-process target sets them with
``vdla_set_threads`` (``omp_set_num_threads``), and ``run_model`` loads the model with
0 threads, OpenMP's default, so it gets ``OMP_NUM_THREADS``, which this script sets to
the same count for itself and the program.

    python3 bench/cpu_project.py [--models resnet18 mobilenet_v1] [--threads 2]
                                 [--runs 10] [--rounds 15] [--out bench-cpu]

Writes OUT/cpu_project.json (and keeps the built projects under OUT/projects/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

import numpy as np  # noqa: E402

from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline, targets  # noqa: E402
from vdla.compiler.ir.graph import DTYPES  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402

MODELS = ("resnet18", "mobilenet_v1")
PRECISIONS = ("float32", "int8")
#: run_model's last line: "1.234 ms per run (median of 10 runs; min 1.200, mean 1.300)"
TIME_LINE = re.compile(r"^([0-9.]+) ms per run \(median of (\d+) run")


def log(message: str) -> None:
    print(f"[cpu project bench] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Case:
    """One model at one precision: its in-process session and its built project.

    model, precision : what it runs; graph : the graph compiled
    feed : the inputs; expected : the in-process outputs (tensor name -> array)
    run : one in-process run of the whole graph
    project : the built project's folder; build_seconds : make's wall time
    """

    model: str
    precision: str
    graph: object
    feed: dict
    expected: dict
    run: object
    project: Path
    build_seconds: float
    c_ms: list = dataclasses.field(default_factory=list)        # each round's median
    local_ms: list = dataclasses.field(default_factory=list)    # each round's median
    identical: bool = True
    max_error: float = 0.0

    @property
    def outputs(self) -> list[Path]:
        return [self.project / f"output{i}.bin" for i in range(len(self.graph.outputs))]


def prepare(name: str, precision: str, args, env: dict) -> Case:
    """Compile `name` at `precision`, open its in-process session, write and make its
    project, and write the model's input files into it.

    name : a zoo model; precision : "float32" or "int8"
    args : the command line (threads, calibration, out); env : make's environment
    """
    target = targets.get("cpu", threads=args.threads)
    model = pipeline.load_model(name, calibration=args.calibration, note=None)
    graph = pipeline.graph_for(model, target, precision=precision)
    compiled = compile_model(graph, target)
    session = compiled.session()
    first = session.run_graph(model.feed)
    if first is None:
        raise SystemExit(f"{name} {precision}: not every op runs on the CPU target")
    folder = Path(args.out) / "projects" / f"{name}-{precision}"
    # The same compiled program the session runs, so any difference is the project's.
    project = Path(target.export(compiled, folder, exact=precision == "int8"))
    for i, tensor in enumerate(graph.inputs):
        dtype = np.dtype(DTYPES[graph.tensors[tensor].dtype]).newbyteorder("<")
        (project / f"input{i}.bin").write_bytes(
            np.ascontiguousarray(model.feed[tensor], dtype).tobytes())
    log(f"{name} {precision}: make in {project} ...")
    start = time.perf_counter()
    proc = subprocess.run([args.make, f"-j{args.threads}"], cwd=project, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"make failed in {project}:\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    built = time.perf_counter() - start
    return Case(name, precision, graph, model.feed, first.outputs,
                lambda s=session, f=model.feed: s.run_graph(f), project, built)


def run_c(case: Case, runs: int, env: dict) -> float:
    """One block of the C program (a fresh process, `runs` timed runs): its median
    time per run in ms. Checks its output files against the in-process outputs.

    case : the model and its project; runs : the repeat count; env : its environment
    """
    inputs = [f"input{i}.bin" for i in range(len(case.graph.inputs))]
    proc = subprocess.run(["./run_model", "model.params", *inputs,
                           *(p.name for p in case.outputs), str(runs)],
                          cwd=case.project, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{case.project}/run_model failed ({proc.returncode}): "
                         f"{proc.stderr.strip()}")
    match = TIME_LINE.match(proc.stdout.strip().splitlines()[-1])
    if match is None or int(match[2]) != runs:
        raise SystemExit(f"run_model printed no time for {runs} runs: {proc.stdout!r}")
    for path, tensor in zip(case.outputs, case.graph.outputs):
        t = case.graph.tensors[tensor]
        dtype = np.dtype(DTYPES[t.dtype]).newbyteorder("<")
        expected = np.ascontiguousarray(case.expected[tensor], dtype)
        data = path.read_bytes()
        case.identical &= data == expected.tobytes()
        got = np.frombuffer(data, dtype).reshape(t.shape)
        case.max_error = max(case.max_error, pipeline.relative_error(got, expected))
    return float(match[1])


def run_local(case: Case, runs: int) -> float:
    """One block of the in-process runner: its median time per run in ms.

    case : the model and its session; runs : how many runs
    """
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        case.run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(cases: list[Case], args, env: dict) -> None:
    """`args.rounds` rounds over every case, each a C block and an in-process block
    (which goes first alternates by round, so that neither always runs right after the
    other), `args.pause` seconds before each block; each case gets three untimed
    in-process runs first (the C program makes its own untimed run).

    cases : the prepared cases; args : runs, rounds, pause; env : the program's environment
    """
    for case in cases:
        for _ in range(3):
            case.run()
    for r in range(args.rounds):
        log(f"round {r + 1}/{args.rounds} ...")
        for case in cases:
            order = ("c", "local") if r % 2 == 0 else ("local", "c")
            for who in order:
                # a pause: no OpenMP worker still spins from the block before
                time.sleep(args.pause)
                if who == "c":
                    case.c_ms.append(run_c(case, args.runs, env))
                else:
                    case.local_ms.append(run_local(case, args.runs))


def row_of(case: Case) -> dict:
    """`case`'s report: medians over the rounds, each round's figures, the outputs."""
    ratios = [c / p for c, p in zip(case.c_ms, case.local_ms)]
    return {"model": case.model, "precision": case.precision,
            "c_ms": statistics.median(case.c_ms),
            "in_process_ms": statistics.median(case.local_ms),
            "ratio": statistics.median(ratios), "ratio_rounds": ratios,
            "c_best_ms": min(case.c_ms), "in_process_best_ms": min(case.local_ms),
            "c_rounds_ms": case.c_ms, "in_process_rounds_ms": case.local_ms,
            "identical": case.identical, "max_error": case.max_error,
            "build_seconds": case.build_seconds, "project": str(case.project)}


def print_table(rows: list[dict], args) -> None:
    """The table of `rows` (`row_of`); args : threads, runs and rounds, for its title."""
    print(f"\nThe C project's run_model against the in-process runner ({args.threads} "
          f"threads, batch 1; ms per run)\nmedian: over {args.rounds} rounds of each "
          f"block's median of {args.runs} runs; ratio: C / in-process, the median of the "
          "rounds' ratios\nbest: the fastest round's median, which the machine's slow "
          "spells touch least; rounds: the range of the rounds' ratios")
    print(f"{'':23}{'--------- median ---------':>29}{'---------- best ----------':>29}")
    print(f"{'model':14}{'prec':9}{'in-process':>11}{'run_model':>11}{'ratio':>7}"
          f"{'in-process':>11}{'run_model':>11}{'ratio':>7}{'rounds':>12}  "
          f"{'output vs in-process':24}{'make':>6}")
    for r in rows:
        low, high = min(r["ratio_rounds"]), max(r["ratio_rounds"])
        if r["identical"]:
            same = "identical bytes"
        else:
            same = f"max rel. error {r['max_error']:.2g}"
        best = r["c_best_ms"] / r["in_process_best_ms"]
        print(f"{r['model']:14}{r['precision']:9}{r['in_process_ms']:>11.3f}"
              f"{r['c_ms']:>11.3f}{r['ratio']:>7.3f}{r['in_process_best_ms']:>11.3f}"
              f"{r['c_best_ms']:>11.3f}{best:>7.3f}{f'{low:.2f}-{high:.2f}':>12}  "
              f"{same:24}{r['build_seconds']:>5.1f}s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"zoo models (default: {' '.join(MODELS)})")
    p.add_argument("--threads", type=int, default=2, help="OpenMP threads (default 2)")
    p.add_argument("--calibration", type=int, default=4)
    p.add_argument("--runs", type=int, default=10, help="runs per block (default 10)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--pause", type=float, default=0.3,
                   help="seconds before each block (default 0.3)")
    p.add_argument("--out", default="bench-cpu", help="output folder (default bench-cpu)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.runs < 1 or args.rounds < 1:
        raise SystemExit("--threads, --runs and --rounds must be positive")
    args.make = shutil.which("make")
    if args.make is None:
        raise SystemExit("needs make (apt install make)")
    # Before any library starts OpenMP: this process's default team is the program's.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    env = dict(os.environ)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"threads": args.threads, "runs": args.runs, "rounds": args.rounds,
              "models": args.models, "cpu": cpu_name(), "cores": os.cpu_count()}
    cases = []
    for name in args.models:
        for precision in PRECISIONS:
            log(f"{name} {precision}: compiling ...")
            cases.append(prepare(name, precision, args, env))
    report["isa"] = targets.get("cpu", threads=args.threads).isa.name
    print(f"machine: {report['cpu']}, {report['cores']} cores, {report['isa']}")
    measure(cases, args, env)
    report["rows"] = [row_of(case) for case in cases]
    print_table(report["rows"], args)
    (out / "cpu_project.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {out / 'cpu_project.json'}")
    bad = [r for r in report["rows"] if r["precision"] == "int8" and not r["identical"]
           or r["max_error"] > pipeline.FLOAT_TOLERANCE]
    if bad:
        raise SystemExit(f"outputs differ from the in-process runner's: "
                         f"{[(r['model'], r['precision']) for r in bad]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
