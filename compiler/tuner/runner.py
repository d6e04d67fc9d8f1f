"""Measuring schedules: the runner interface, local worker processes, and a replay runner.

A runner has one method that matters, ``measure(inputs) -> results``: a list of
`MeasureInput` (task, schedule) in, one `MeasureResult` per input out, in the same order,
whatever order they finished in. The search (`vdla.compiler.tuner.search`) only ever
calls that, so a distributed engine (a Ray actor pool, say) plugs in as another class
with the same method and a ``backend`` attribute, without touching the search.

`LocalRunner(jobs)` measures in `jobs` worker processes. Each worker keeps one device
per config open for its whole life (the Verilator model is built once, in the parent,
before any worker starts; workers load it from the build cache) and keeps each task's
inputs and reference output. A measurement that raises, produces a wrong output, runs
past its cycle budget, runs past the wall-clock limit (the worker is killed) or kills its
worker (the worker is restarted) comes back as a result with that status: the search
goes on.

`measure_schedule` is what a worker does for one input: lower, run, compare with the
reference, read the counters. Backends:

* ``verilator`` (default): cycles of the cycle-accurate model, the hardware counters;
* ``functional``: the fast mode for pre-screening: the program runs on the functional
  simulator (so it is checked bit-exactly) and the cycles are the analytical model's
  (`vdla.compiler.backend.cost.estimate_conv2d`).
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import sys
import time
from typing import Callable, Sequence

import numpy as np

from vdla.compiler.backend.conv2d import Conv2dSchedule, lower_conv2d, run_conv2d
from vdla.compiler.tuner.records import OK, Record, Records
from vdla.compiler.tuner.task import TuneTask, schedule_from_dict, schedule_to_dict

__all__ = ["BACKENDS", "LocalRunner", "MeasureInput", "MeasureResult", "ReplayRunner",
           "cycle_budget", "measure_schedule"]

BACKENDS = ("verilator", "functional")

#: Wall-clock limit of one measurement (seconds) unless the runner is given another: a
#: backstop for a simulator that hangs outside its cycle budget.
DEFAULT_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class MeasureInput:
    task: TuneTask
    schedule: Conv2dSchedule


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """status : ``ok`` or why not (`vdla.compiler.tuner.records.STATUSES`)
    cycles : the run's cycles when ok
    counters : the hardware's counters (Verilator) or the estimate's parts (functional)
    error : what went wrong, one line
    seconds : wall time of the measurement"""

    status: str
    cycles: int | None = None
    counters: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def record(self, inp: MeasureInput, backend: str) -> Record:
        return Record(workload=inp.task.key, config=inp.task.config.name, backend=backend,
                      schedule=schedule_to_dict(inp.schedule), cycles=self.cycles,
                      status=self.status, counters=self.counters, error=self.error,
                      seconds=self.seconds)


def cycle_budget(task: TuneTask, schedule: Conv2dSchedule) -> int:
    """The watchdog's cycle budget: 10x the analytical estimate plus 100k cycles. The
    model is within a few percent of Verilator on every schedule measured so far, so a
    run past this is a hang, not a slow schedule."""
    return 10 * task.estimate(schedule).cycles + 100_000


class _TaskData:
    """A task's inputs and reference output, computed once per worker."""

    def __init__(self, task: TuneTask):
        from vdla.compiler import run_reference

        graph = task.graph
        node = graph.node(task.node)
        self.feed = task.feed()
        self.want = run_reference(graph, self.feed)[graph.outputs[0]]
        self.weights = graph.constant(node.inputs[1])
        self.bias = graph.constant(node.input(2)) if node.input(2) else None
        self.x = self.feed[node.inputs[0]]
        self.residual = self.feed[node.input(3)] if node.input(3) else None


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]


def measure_schedule(task: TuneTask, schedule: Conv2dSchedule, device, *,
                     data: _TaskData | None = None,
                     max_cycles: int | None = None) -> MeasureResult:
    """Measure `schedule` of `task` on `device` (a `vdla.runtime` device of the task's
    config): lower it, run it, compare the output with the reference bit-exactly.
    `max_cycles` is the Verilator watchdog's budget (default `cycle_budget`)."""
    from vdla.sim.errors import WatchdogError

    start = time.perf_counter()
    data = data or _TaskData(task)
    try:
        lowered = lower_conv2d(task.graph.node(task.node), task.graph, task.config, schedule)
        if device.backend == "verilator":
            device.max_cycles = max_cycles or cycle_budget(task, schedule)
        y, stats = run_conv2d(device, lowered, data.x, data.weights, data.bias,
                              data.residual, return_stats=True)
    except WatchdogError as exc:
        # Past the cycle budget: a timeout; stalled with nothing moving: a deadlock.
        return MeasureResult("error" if exc.stalled else "timeout", error=_one_line(exc),
                             seconds=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - any failure is a result, not a stop
        return MeasureResult("error", error=_one_line(exc), seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if not np.array_equal(y, data.want):
        bad = int(np.count_nonzero(y != data.want))
        return MeasureResult("wrong", error=f"{bad} of {y.size} output values differ from "
                             "the reference", seconds=seconds)
    if device.backend == "verilator":
        counters = {k: int(v) for k, v in stats.items() if k != "wall_seconds"}
        return MeasureResult(OK, int(stats["cycles"]), counters, seconds=seconds)
    est = task.estimate(schedule)
    return MeasureResult(OK, est.cycles, {"gemm": est.gemm, "epilogue": est.epilogue,
                                          "load": est.load, "store": est.store},
                         seconds=seconds)


Measure = Callable[..., MeasureResult]


def _worker(conn, backend: str, measure: Measure):
    """A worker process: receive (task or task key, schedule), send a MeasureResult."""
    import vdla.runtime

    devices, tasks, inputs = {}, {}, {}
    try:
        while True:
            message = conn.recv()
            if message is None:
                break
            task, schedule = message
            task = tasks.setdefault(task if isinstance(task, str) else task.key, task)
            try:
                if task.key not in inputs:
                    inputs[task.key] = _TaskData(task)
                data = inputs[task.key]
                name = task.config.name
                if name not in devices:
                    options = {"log": lambda m: None} if backend == "verilator" else {}
                    devices[name] = vdla.runtime.open(task.config, backend=backend,
                                                      **options)
                result = measure(task, schedule, devices[name], data=data)
            except Exception as exc:  # noqa: BLE001
                result = MeasureResult("error", error=_one_line(exc))
            conn.send(result)
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        for dev in devices.values():
            dev.close()


class _Worker:
    def __init__(self, context, backend: str, measure: Measure):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, backend, measure),
                                       daemon=True)
        self.process.start()
        child.close()
        self.known: set[str] = set()      # task keys the worker holds
        self.job: tuple[int, float] | None = None   # (input index, start time)

    def send(self, index: int, inp: MeasureInput):
        key = inp.task.key
        self.conn.send((key if key in self.known else inp.task, inp.schedule))
        self.known.add(key)
        self.job = (index, time.monotonic())

    def stop(self, *, kill: bool = False):
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class LocalRunner:
    """Measure in `jobs` local worker processes.

    backend : ``verilator`` or ``functional`` (the fast mode)
    jobs : worker processes (each runs one measurement at a time)
    timeout : wall-clock seconds one measurement may take before its worker is killed
    measure : the function a worker calls, ``measure(task, schedule, device, data=...)``
        (default `measure_schedule`); it must be importable by name (a module-level
        function), since workers may be started with ``spawn``
    log : receives progress lines of a Verilator build (default: printed to stderr)
    Workers start on the first `measure` and live until `close` (or the ``with`` block
    ends); a dead or killed worker is replaced.
    """

    def __init__(self, backend: str = "verilator", jobs: int = 1, *,
                 timeout: float = DEFAULT_TIMEOUT, measure: Measure = measure_schedule,
                 log: Callable[[str], None] | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown measurement backend {backend!r}; available: "
                             f"{', '.join(BACKENDS)}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.backend, self.jobs, self.timeout, self._measure = backend, jobs, timeout, measure
        self._log = log or (lambda message: print(f"vdla: {message}", file=sys.stderr,
                                                  flush=True))
        # fork starts a worker in milliseconds; spawn (the default off Linux) re-imports.
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        self._context = multiprocessing.get_context(method)
        self._workers: list[_Worker] = []
        self._built: set[str] = set()

    def _prepare(self, inputs: Sequence[MeasureInput]):
        if self.backend == "verilator":
            from vdla.sim.verilator.build import build_model
            for inp in inputs:
                name = inp.task.config.name
                if name not in self._built:   # build once here, not once per worker
                    build_model(inp.task.config, log=self._log)
                    self._built.add(name)
        while len(self._workers) < self.jobs:
            self._workers.append(_Worker(self._context, self.backend, self._measure))

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        inputs = list(inputs)
        if not inputs:
            return []
        self._prepare(inputs)
        results: list[MeasureResult | None] = [None] * len(inputs)
        pending = collections.deque(enumerate(inputs))
        while pending or any(w.job for w in self._workers):
            for i, w in enumerate(self._workers):
                if w.job is None and pending:
                    if not w.process.is_alive():      # died while idle: replace it
                        w.stop(kill=True)
                        w = self._workers[i] = _Worker(self._context, self.backend,
                                                       self._measure)
                    w.send(*pending.popleft())
            busy = [w for w in self._workers if w.job]
            now = time.monotonic()
            wait = min(max(0.0, w.job[1] + self.timeout - now) for w in busy)
            multiprocessing.connection.wait(
                [w.conn for w in busy] + [w.process.sentinel for w in busy],
                timeout=wait + 0.01)
            for i, w in enumerate(self._workers):
                if w.job is None:
                    continue
                index, started = w.job
                result = None
                try:
                    if w.conn.poll():
                        result = w.conn.recv()
                except (EOFError, OSError):
                    pass
                if result is None and not w.process.is_alive():
                    code = w.process.exitcode
                    result = MeasureResult("crash", error=f"the worker process died "
                                           f"(exit code {code}) while measuring",
                                           seconds=time.monotonic() - started)
                elif result is None and time.monotonic() - started > self.timeout:
                    result = MeasureResult("timeout", error=f"no result after "
                                           f"{self.timeout:g} s of wall time; the worker "
                                           "was killed", seconds=time.monotonic() - started)
                    w.process.kill()
                if result is None:
                    continue
                results[index] = result
                w.job = None
                if not w.process.is_alive() or result.status in ("crash", "timeout"):
                    w.stop(kill=True)
                    self._workers[i] = _Worker(self._context, self.backend, self._measure)
        return results

    def close(self):
        workers, self._workers = self._workers, []
        for w in workers:
            w.stop()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc):
        self.close()


class ReplayRunner:
    """Answer measurements from records instead of running them: the record of each
    (task, schedule) with the same config and `backend`. For studying a search against
    a space measured once (`bench/tuner.py`): the simulators are deterministic, so a
    replayed result is what measuring again would give. A schedule without a record
    comes back as an error."""

    def __init__(self, records: Records, backend: str = "verilator"):
        self.backend = backend
        self._records = records
        self._tables: dict[tuple[str, str], dict[Conv2dSchedule, Record]] = {}

    def _table(self, task: TuneTask) -> dict[Conv2dSchedule, Record]:
        key = (task.key, task.config.name)
        if key not in self._tables:
            table = {}
            for r in self._records.query(task.key, task.config.name, self.backend):
                table.setdefault(schedule_from_dict(r.schedule), r)
            self._tables[key] = table
        return self._tables[key]

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        out = []
        for inp in inputs:
            r = self._table(inp.task).get(inp.schedule)
            out.append(MeasureResult("error", error=f"schedule {inp.schedule} has no record")
                       if r is None else MeasureResult(r.status, r.cycles, r.counters,
                                                       r.error, r.seconds))
        return out

    def close(self):
        pass
