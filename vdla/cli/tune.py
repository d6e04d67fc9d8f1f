"""``vdla tune``: search the schedules of a model's tunable ops (or of single workloads)
on a target, keeping every measurement in a records file that ``vdla run --records``
compiles with."""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

from vdla.cli.common import (CliError, add_calibration_option, add_ray_option,
                             add_records_output_option, check_model_options, log,
                             on_interrupt, output_file, table, write_json)
from vdla.cli.target_args import (DEFAULT_TARGET, add_precision_option, add_target_options,
                                  make_target)
from vdla.compiler import pipeline, targets
from vdla.compiler.tuner import ExecutorRunner, LocalRunner, Records, tune_tasks
from vdla.compiler.tuner.scheduler import SPLITS, total_cost
from vdla.compiler.tuner.search import TUNERS
from vdla.compiler.tuner.tune import CONFIRM, CONFIRM_ROUNDS
from vdla.compiler.tuner.workload_tasks import tasks_from_workload

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    tune = sub.add_parser(
        "tune", help="search the tile sizes and virtual threads of a model's tunable ops "
                     "against the simulated accelerator (or another target); records go to "
                     "an SQLite file",
        description="Tune the schedule of every distinct tunable op of MODEL (or of the "
                    "--layer workloads) on a target: for the accelerator, measure schedules "
                    "on the cycle-accurate Verilator model (or the fast functional mode), "
                    "guided by a learned cost model. Every measurement is appended to "
                    "--records; a second run resumes where the first stopped, and `vdla run "
                    "--records` compiles with the best schedules found.")
    tune.add_argument("model", metavar="MODEL", nargs="?",
                      help="zoo model name (resnet18, digits_cnn, ...) or an .onnx path")
    tune.add_argument("--layer", metavar="SPEC", action="append",
                      help="a single workload instead of a model: a ResNet-18 layer name "
                           "(C1..C11; its tasks are the model's own, epilogue included, "
                           "so `vdla run resnet18 --records` uses them), "
                           "H,W,Cin,Cout,k,pad,stride[,groups], dense:IN,OUT[,BATCH] or "
                           "matmul:M,K,N[,BATCH] (a batched product of two activations); "
                           "may be repeated")
    tune.add_argument("--target", default=DEFAULT_TARGET, metavar="NAME",
                      help=f"the target whose schedules are tuned: {', '.join(targets.names())}"
                           f" (default {DEFAULT_TARGET})")
    tune.add_argument("--trials", type=int, required=True, metavar="N",
                      help="measurements in all, for the whole model (or every --layer "
                           "workload), those already in the records included; --split "
                           "decides which workload each goes to")
    tune.add_argument("--split", choices=SPLITS, default="gradient",
                      help="gradient: each batch to the workload where the model's cost is "
                           "expected to fall most (default); equal: N / workloads each")
    add_records_output_option(tune)
    tune.add_argument("--jobs", type=int, default=1, metavar="J",
                      help="parallel measurement processes (default 1)")
    add_ray_option(tune, "measure on Ray actors instead of local processes",
                   "--timeout does not apply there: each measurement's cycle budget bounds it")
    tune.add_argument("--json", type=output_file,
                      metavar="PATH", help="also write the results as JSON here")
    tune.add_argument("--plot", type=output_file, metavar="PNG",
                      help="also plot the tuned ops' cost against this run's measurements "
                           "here (a workload not measured yet at its default's cost)")
    tune.add_argument("--measure", metavar="BACKEND",
                      help="how schedules are measured, one of the target's measurement "
                           "backends (the accelerator: verilator, cycle-accurate, the default; "
                           "functional, the fast mode: functional simulator + analytical "
                           "timing model)")
    tune.add_argument("--tuner", choices=tuple(TUNERS), default="pretrained",
                      help="pretrained: the target's pretrained cost model, learning from "
                           "each measurement (default; from scratch where the target ships "
                           "none); model: a cost model learned from scratch + simulated "
                           "annealing; random or grid: baselines")
    tune.add_argument("--batch", type=int, default=8, metavar="B",
                      help="schedules measured per round (default 8)")
    tune.add_argument("--seed", type=int, default=0, help="seeds the search (default 0)")
    tune.add_argument("--timeout", type=float, default=600.0, metavar="SEC",
                      help="wall-clock limit of one measurement (default 600)")
    add_calibration_option(tune)
    add_precision_option(tune)
    add_target_options(tune, "tune")
    tune.set_defaults(func=run)


def _check_args(args):
    for name in ("trials", "jobs", "batch"):
        value = getattr(args, name)
        if value < 1:
            raise CliError(f"--{name} must be a positive integer, not {value}")
    if not args.timeout > 0:
        raise CliError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    check_model_options(args)   # --seed and --calibration (--batch: checked above)
    if (args.model is None) == (not args.layer):
        raise CliError("vdla tune needs a MODEL or --layer SPEC (one or the other)")


def _tasks(args, target):
    if args.layer:
        return ([task for spec in args.layer
                 for task in tasks_from_workload(spec, target)], ", ".join(args.layer))
    model = pipeline.load_model(args.model, calibration=args.calibration)
    tasks = target.tasks(pipeline.graph_for(model, target, precision=args.precision))
    if not tasks:
        raise CliError(f"{args.model} has no op that target {target.name!r} can tune: "
                       "nothing to tune")
    return tasks, args.model


class _SessionRecords(Records):
    """Records that count the rows this process added: what an interrupt reports kept
    (another tuner may be writing the same file)."""

    added = 0

    def add(self, *records) -> None:
        super().add(*records)
        self.added += len(records)


class _Progress:
    """Tuning progress on stderr, moving with every measurement: on a terminal one line,
    updated in place; otherwise (a log) a line at most every `interval` seconds and one
    when the budget is spent. It remembers how far tuning got, for the line an interrupt
    prints (`interrupted`).

    unit : what the costs count (the tasks' unit)
    workloads : how many workloads are tuned (the tuned ops' cost needs each measured)
    stream : where the lines go (default: stderr)
    interval : least seconds between two lines when `stream` is not a terminal
    clock : the time in seconds (default `time.monotonic`)
    """

    #: Default of `interval`: often enough to see a long run move, rare enough for a log.
    INTERVAL = 10.0

    def __init__(self, unit: str, workloads: int = 1, *, stream=None,
                 interval: float = INTERVAL, clock=time.monotonic):
        self.unit, self.workloads = unit, workloads
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval, self.clock = interval, clock
        self.task, self.done, self.total = None, 0, 0
        self.first: int | None = None   # trials the records held when tuning began
        self._last_line = clock()       # when the last log line was printed
        self._line_open = False         # a terminal line to end

    def __call__(self, task, done: int, total: int, cost: int | None,
                 measured: int = 0):
        """`done` of `total` trials spent, the last on `task`; `cost`: the tuned ops' (None
        until every workload has a measured cost; `measured` of them have one)."""
        if self.first is None:
            self.first = done
        self.task, self.done, self.total = task, done, total
        cost_text = self.cost_text(cost, measured)
        if self.tty:
            width = 20
            filled = width * done // max(total, 1)
            self._print(f"\r\x1b[Ktuning [{'#' * filled}{'.' * (width - filled)}] "
                        f"{done}/{total} trials, {task.name}, {cost_text}", end="")
            self._line_open = True
        elif done == total:
            self._print(f"vdla: tuned: {done} trials, {cost_text}")
        elif self.clock() - self._last_line >= self.interval:
            self._print(f"vdla: tuning: {done}/{total} trials ({task.name}), {cost_text}")
            self._last_line = self.clock()

    def cost_text(self, cost: int | None, measured: int) -> str:
        """The tuned ops' cost, or until each workload has one, how many have: a sum over
        some workloads would jump each time another joins it, and read as a regression."""
        if cost is not None:
            return f"tuned ops {cost:,} {self.unit}"
        return f"{measured} of {self.workloads} workload{'s' * (self.workloads > 1)} measured"

    def _print(self, text: str, end: str = "\n"):
        print(text, end=end, file=self.stream, flush=True)

    def end(self):
        """End the terminal's progress line (nothing in a log)."""
        if self._line_open:
            self._print("\r\x1b[K", end="")
            self._line_open = False

    def interrupted(self, kept: int, records: str) -> str:
        """What an interrupt leaves: `kept` measurements added to the `records` file."""
        if self.task is None or self.first is None:
            return f"vdla tune stopped before measuring; nothing added to {records}"
        return f"{kept} of {self.total - self.first} measurements kept in {records}"


def _runner(args, measure: str):
    """Local worker processes with a wall-clock limit per measurement (`LocalRunner`),
    or with --ray the executor a parallel run and a sweep use (`ExecutorRunner`),
    started now so that a missing cluster is an error before any tuning."""
    if not args.ray:
        return LocalRunner(measure, jobs=args.jobs, timeout=args.timeout)
    runner = ExecutorRunner(measure, jobs=args.jobs, ray=args.ray)
    try:
        runner.start()
    except ValueError as e:
        raise CliError(str(e)) from None
    return runner


def run(args) -> int:
    _check_args(args)
    # How schedules are measured is the target's to define (its tasks open their own
    # devices), so --measure is checked against the target's measurement backends.
    target = make_target(args.target, args, "tune", precision=args.precision, log=log)
    if not target.measure_backends:
        raise CliError(f"target {target.name!r} has no tunable ops")
    measure = args.measure or target.measure_backends[0]
    try:
        target.check_measure(measure)
    except ValueError as e:
        raise CliError(str(e)) from None
    tasks, what = _tasks(args, target)
    if args.tuner == "pretrained":
        log(_pretrained_note(tasks))
    start = time.perf_counter()
    progress = _Progress(tasks[0].unit, len(tasks))
    runner = _runner(args, measure)     # first: a missing Ray cluster writes no records
    with runner:
        records = _SessionRecords(args.records)
        # Ctrl-C: the runner kills its busy workers, tune_tasks keeps what finished.
        on_interrupt(args, lambda: progress.interrupted(records.added, args.records))
        try:
            with records:
                tuning = tune_tasks(tasks, runner, trials=args.trials, records=records,
                                    tuner=args.tuner, batch=args.batch, seed=args.seed,
                                    split=args.split, progress=progress)
        finally:
            progress.end()
        where = runner.describe() if args.ray else ""
    wall = time.perf_counter() - start
    # The JSON and the plot before the summary: a closed stdout (`| head`) ends the command.
    if args.json:
        write_json(args.json, _document(args, target, tasks, measure, tuning, what, wall))
    if args.plot:
        _plot(args, args.plot, tuning, what, target, tasks[0])
    _summary(args, target, tasks, measure, tuning, what, wall, where)
    return 0


def _pretrained_note(tasks) -> str:
    """Which pretrained model the tuner starts from, or that it starts from scratch."""
    if _untrained(tasks):
        return (f"no pretrained cost model for target {tasks[0].target}'s tasks: tuning "
                "from scratch (the model tuner)")
    # One model a feature set (the CPU's convolutions, dense layers and products).
    models = {m.digest: m for m in (t.pretrained() for t in tasks) if m is not None}
    described = []
    for model in models.values():
        meta = model.meta
        seen = tasks[0].platform in meta.get("platforms", ())
        described.append(f"{meta['features']} v{meta['version']} ({meta['rows']:,} measured "
                         f"schedules on {len(meta.get('platforms', ()))} platforms; "
                         f"{tasks[0].platform} is {'one' if seen else 'not one'} of them)")
    note = (f"starting from the pretrained cost model{'s' if len(described) > 1 else ''} "
            + ", ".join(described))
    if any(t.pretrained() is None for t in tasks):
        others = sorted({t.feature_set.name for t in tasks if t.pretrained() is None
                         and t.feature_set is not None})
        note += (f"; the tasks with no model ({', '.join(others) or 'no features'}) are "
                 "tuned from scratch")
    return note


def _untrained(tasks) -> bool:
    """Whether no task has a pretrained model (the pretrained tuner then runs the model
    tuner on each)."""
    return all(t.pretrained() is None for t in tasks)


def _tuner_ran(args, tasks) -> str:
    """The tuner as it ran: the pretrained one is the model tuner where no task has a
    model (`_pretrained_note` says so before the run)."""
    if args.tuner == "pretrained" and _untrained(tasks):
        return "model (no pretrained model)"
    return args.tuner


def _document(args, target, tasks, measure, tuning, what, wall) -> dict:
    results = tuning.results
    return {
        "what": what, "target": target.name, "options": target.options(),
        "platform": tasks[0].platform, "measure": measure, "tuner": args.tuner,
        "split": args.split, "trials": args.trials, "seed": args.seed,
        "records": str(args.records), "wall_seconds": wall,
        "cost": _cost_document(tuning.results, args.trials, tasks[0].unit),
        # After each measurement of this run, a workload not measured yet at its default.
        "curve": {"first_trial": tuning.resumed + 1, "cost": tuning.default_curve()},
        "workloads": [{
            "name": r.task.name, "key": r.task.key, "nodes": list(r.task.nodes),
            "space": r.space_size, "trials": r.trials, "resumed": r.resumed,
            "failures": r.failures, "confirmations": r.confirmations,
            "unit": r.task.unit,
            "default": {"schedule": r.task.schedule_to_dict(r.default),
                        "cycles": r.default_cycles},
            "best": {"schedule": None if r.best is None else r.task.schedule_to_dict(r.best),
                     "cycles": r.best_cycles},
            "speedup": r.speedup} for r in results]}


class _Totals(NamedTuple):
    """The tuned ops' cost (each workload's cost times its nodes) with the default
    schedules and with the best found, over the workloads where both are measured
    (`counted`, their names), and (name, why) of each workload left out."""

    default: int
    best: int
    counted: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...]


def _totals(results, trials: int) -> _Totals:
    """The totals over the workloads whose default and best costs were measured. A
    workload without them is left out and named, never counted at a guess: an untuned
    workload costs its default schedule's cost, and that is what was not measured (on
    the accelerator the timing model's estimate of it is not what Verilator measures)."""
    counted, left_out = [], []
    for r in results:
        name = r.task.name
        if r.default_cycles is not None and r.best_cycles is not None:
            counted.append(r)
        elif r.trials == 0:
            left_out.append((name, f"no trials: --trials {trials} ran out before them"))
        elif r.best_cycles is None:
            left_out.append((name, "every measurement failed"))
        elif any(s == r.default and not m.ok for s, m in r.history):
            left_out.append((name, "the default schedule's measurement failed"))
        else:
            left_out.append((name, "the default schedule not measured"))
    return _Totals(total_cost(counted, "default"), total_cost(counted, "best"),
                   tuple(r.task.name for r in counted), tuple(left_out))


def _total_line(totals: _Totals, unit: str) -> str:
    """The summary's line of the tuned ops' total before and after tuning: over every
    workload, or over those measured, naming the others by why they are left out."""
    why: dict[str, list[str]] = {}
    for name, reason in totals.left_out:
        why.setdefault(reason, []).append(name)
    left = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in why.items())
    if not totals.counted:
        return f"tuned ops: no total before and after tuning, no workload measured: {left}"
    every = len(totals.counted) + len(totals.left_out)
    over = f", over the {len(totals.counted)} of {every} workloads measured" if left else ""
    line = (f"tuned ops (each workload's cost times its nodes){over}: {totals.default:,} "
            f"{unit} with the default schedules, {totals.best:,} with the best found"
            + (f" ({totals.default / totals.best:.3f}x)" if totals.best else ""))
    return line + (f"; left out: {left}" if left else "")


def _cost_document(results, trials: int, unit: str) -> dict:
    """The JSON's ``cost``: the totals the summary prints, with what they count."""
    totals = _totals(results, trials)
    return {"default": totals.default if totals.counted else None,
            "best": totals.best if totals.counted else None, "unit": unit,
            "workloads": list(totals.counted),
            "left_out": [{"name": name, "why": why} for name, why in totals.left_out]}


def _plot(args, path, tuning, what, target, task) -> None:
    """The tuned ops' cost after each measurement of this run (a PNG at `path`)."""
    # heavy: matplotlib, only for --plot
    from vdla.compiler.tuner.plot import tuning_curves

    try:
        tuning_curves({f"{tuning.results[0].task.name if len(tuning.results) == 1 else what}"
                       f" ({args.tuner}, {args.split} split)":
                       (tuning.resumed + 1, tuning.default_curve())}, path,
                      title=f"vdla tune {what} on {target.name} ({task.platform})",
                      unit=task.unit)
    except ValueError as e:
        log(f"--plot {path}: not written: {e}")


def _summary(args, target, tasks, measure, tuning, what, wall, where) -> None:
    results = tuning.results

    def sched(task, s):
        return "-" if s is None else target.describe_schedule(task.schedule_to_dict(s))

    print(f"tuned {what}: {len(tasks)} workload(s), target {target.name}, platform "
          f"{tasks[0].platform}, "
          f"{measure} measurements, {_tuner_ran(args, tasks)} tuner, {args.split} split, seed "
          f"{args.seed}; records {args.records}")
    unit = tasks[0].unit
    header = ("workload", "shape", "nodes", "space", "trials", "default", unit, "best found",
              unit, "speedup")
    rows = [(r.task.name, r.task.describe(), str(len(r.task.nodes) or 1), str(r.space_size),
             f"{r.trials}" + (f" ({r.resumed} resumed)" if r.resumed else ""),
             sched(r.task, r.default),
             "-" if r.default_cycles is None else f"{r.default_cycles:,}",
             sched(r.task, r.best), "-" if r.best_cycles is None else f"{r.best_cycles:,}",
             "-" if r.speedup is None else f"{r.speedup:.3f}x") for r in results]
    for line in table(header, rows, right={2, 3, 4, 6, 8, 9}):
        print("  " + line)
    print(_total_line(_totals(results, args.trials), unit))
    failures = sum(r.failures for r in results)
    measured = sum(len(r.history) for r in results)
    confirmed = sum(r.confirmations for r in results)
    print(f"{measured} measurements in {wall:.1f} s ("
          + (where if args.ray else f"{args.jobs} job(s)") + ")"
          + (f"; {failures} failed (kept in the records with their error)" if failures else ""))
    if confirmed:
        print(f"wall time varies from run to run: each workload's {CONFIRM} fastest schedules "
              f"and its default were measured {CONFIRM_ROUNDS} more times, interleaved "
              f"({confirmed} measurements); the table gives the median of each one's "
              "measurements.")
