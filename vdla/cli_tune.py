"""``vdla tune``: search the schedules of a model's convolutions (or of single workloads)
against the simulated accelerator, keeping every measurement in a records file that
``vdla run --records`` compiles with."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vdla._fileio import atomic_write

__all__ = ["add_parser", "best_schedules_for_run"]

TUNERS = ("model", "random", "grid")
MEASURE_BACKENDS = ("verilator", "functional")


def add_parser(sub, config_help: str):
    tune = sub.add_parser(
        "tune", help="search the convolutions' tile sizes and virtual threads against the "
                     "simulated accelerator; records go to an SQLite file",
        description="Tune the schedule of every distinct convolution of MODEL (or of the "
                    "--layer workloads): measure schedules on the cycle-accurate Verilator "
                    "model (or the fast functional mode), guided by a learned cost model. "
                    "Every measurement is appended to --records; a second run resumes "
                    "where the first stopped, and `vdla run --records` compiles with the "
                    "best schedules found.")
    tune.add_argument("model", metavar="MODEL", nargs="?",
                      help="zoo model name (resnet18, digits_cnn, ...) or an .onnx path")
    tune.add_argument("--layer", metavar="SPEC", action="append",
                      help="a single conv workload instead of a model: a ResNet-18 name "
                           "(C1..C11) or H,W,Cin,Cout,k,pad,stride; may be repeated")
    tune.add_argument("--trials", type=int, required=True, metavar="N",
                      help="measurements per workload, those already in the records included")
    tune.add_argument("--records", required=True, metavar="DB",
                      help="SQLite records file (created if missing)")
    tune.add_argument("--jobs", type=int, default=1, metavar="J",
                      help="parallel measurement processes (default 1)")
    tune.add_argument("--config", metavar="FILE", help=config_help)
    tune.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    tune.add_argument("--measure", choices=MEASURE_BACKENDS, default="verilator",
                      help="verilator: cycle-accurate (default); functional: the fast mode "
                           "(functional simulator + analytical timing model)")
    tune.add_argument("--tuner", choices=TUNERS, default="model",
                      help="model: learned cost model + simulated annealing (default); "
                           "random or grid: baselines")
    tune.add_argument("--batch", type=int, default=8, metavar="B",
                      help="schedules measured per round (default 8)")
    tune.add_argument("--seed", type=int, default=0, help="seeds the search (default 0)")
    tune.add_argument("--timeout", type=float, default=600.0, metavar="SEC",
                      help="wall-clock limit of one measurement (default 600)")
    tune.add_argument("--calibration", type=int, default=4, metavar="N",
                      help="calibration samples for quantizing MODEL (default 4)")
    tune.set_defaults(func=run)


def _tasks(args, config):
    from vdla.cli import CliError, _load_model
    from vdla.compiler import passes, quantize
    from vdla.compiler.tuner import task_from_workload, tasks_from_graph

    if (args.model is None) == (not args.layer):
        raise CliError("vdla tune needs a MODEL or --layer SPEC (one or the other)")
    if args.layer:
        return [task_from_workload(spec, config) for spec in args.layer], ", ".join(args.layer)
    graph, calibration, _, _ = _load_model(args.model, 0, args.calibration)
    quantized = quantize(passes.prepare(graph), calibration, config)
    tasks = tasks_from_graph(quantized, config)
    if not tasks:
        raise CliError(f"{args.model} has no convolution or dense layer the accelerator runs: "
                       "nothing to tune")
    return tasks, args.model


class _Progress:
    """One updating line on a terminal's stderr; a line per finished workload otherwise."""

    def __init__(self, count: int):
        self.count, self.index, self.tty = count, 0, sys.stderr.isatty()

    def __call__(self, task, done, total, best):
        best_text = "-" if best is None else f"{best:,}"
        if self.tty:
            width = 20
            filled = width * done // max(total, 1)
            print(f"\r\x1b[Ktuning [{self.index + 1}/{self.count}] {task.name} "
                  f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} trials, best "
                  f"{best_text} cycles", end="", file=sys.stderr, flush=True)
        elif done == total:
            print(f"vdla: tuned [{self.index + 1}/{self.count}] {task.name}: {done} trials, "
                  f"best {best_text} cycles", file=sys.stderr, flush=True)

    def next(self):
        self.index += 1
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def _check_args(args):
    from vdla.cli import CliError

    for name in ("trials", "jobs", "batch"):
        value = getattr(args, name)
        if value < 1:
            raise CliError(f"--{name} must be a positive integer, not {value}")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.seed < 0:
        raise CliError(f"--seed must be a non-negative integer, not {args.seed}")
    if args.calibration < 1:
        raise CliError(f"--calibration must be a positive integer, not {args.calibration}")


def run(args) -> int:
    from vdla.cli import _format_schedule, _load_config
    from vdla.compiler.tuner import LocalRunner, Records, tune_task
    from vdla.compiler.tuner.task import schedule_to_dict

    _check_args(args)
    config = _load_config(args.config)
    tasks, what = _tasks(args, config)
    start = time.perf_counter()
    results = []
    progress = _Progress(len(tasks))
    with Records(args.records) as records, \
            LocalRunner(args.measure, jobs=args.jobs, timeout=args.timeout) as runner:
        for task in tasks:
            results.append(tune_task(task, runner, trials=args.trials, records=records,
                                     tuner=args.tuner, batch=args.batch, seed=args.seed,
                                     progress=progress))
            progress.next()
    wall = time.perf_counter() - start

    def sched(s):
        return _format_schedule(None if s is None else schedule_to_dict(s))

    print(f"tuned {what}: {len(tasks)} workload(s), config {config.name}, {args.measure} "
          f"measurements, {args.tuner} tuner, seed {args.seed}; records {args.records}")
    header = ("workload", "shape", "space", "trials", "default", "cycles", "best found",
              "cycles", "speedup")
    rows = []
    for r in results:
        rows.append((r.task.name, r.task.describe(), str(r.space_size),
                     f"{r.trials}" + (f" ({r.resumed} resumed)" if r.resumed else ""),
                     sched(r.default),
                     "-" if r.default_cycles is None else f"{r.default_cycles:,}",
                     sched(r.best), "-" if r.best_cycles is None else f"{r.best_cycles:,}",
                     "-" if r.speedup is None else f"{r.speedup:.3f}x"))
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    right = {2, 3, 5, 7, 8}
    for row in [header] + rows:
        print("  " + "  ".join(f"{v:>{w}}" if i in right else f"{v:<{w}}"
                               for i, (v, w) in enumerate(zip(row, widths))).rstrip())
    failures = sum(r.failures for r in results)
    measured = sum(len(r.history) for r in results)
    print(f"{measured} measurements in {wall:.1f} s ({args.jobs} job(s))"
          + (f"; {failures} failed (kept in the records with their error)" if failures else ""))
    if args.json:
        report = {
            "what": what, "config": config.name, "measure": args.measure,
            "tuner": args.tuner, "seed": args.seed, "records": str(args.records),
            "wall_seconds": wall,
            "workloads": [{
                "name": r.task.name, "workload": r.task.workload, "space": r.space_size,
                "trials": r.trials, "resumed": r.resumed, "failures": r.failures,
                "default": {"schedule": schedule_to_dict(r.default),
                             "cycles": r.default_cycles},
                "best": {"schedule": None if r.best is None else schedule_to_dict(r.best),
                         "cycles": r.best_cycles},
                "speedup": r.speedup} for r in results]}
        atomic_write(Path(args.json), (json.dumps(report, indent=2) + "\n").encode())
    return 0


def best_schedules_for_run(path: str, graph, config) -> dict:
    """node name -> schedule from records file `path` for `vdla run --records`
    (CliError when the file does not exist: a run never creates one)."""
    from vdla.cli import CliError
    from vdla.compiler.tuner import Records, best_schedules

    if not Path(path).is_file():
        raise CliError(f"records file {path!r} does not exist (vdla tune --records {path} "
                       "writes one)")
    with Records(path) as records:
        return {name: s for name, (s, _) in best_schedules(records, graph, config).items()}
