"""Measuring schedules: the runner interface, local worker processes, an executor (Ray),
and a replay runner.

A runner has one method that matters, ``measure(inputs) -> results``: a list of
`MeasureInput` (task, schedule) in, one `MeasureResult` per input out, in the same order,
whatever order they finished in. The search (`vdla.compiler.tuner.search`) only ever
calls that, so another engine plugs in as another class with the same method and a
``backend`` attribute, without touching the search: `ExecutorRunner` measures on the
executors of `vdla.execute` (local processes, or a Ray cluster: ``vdla tune --ray``).
A runner may also take ``measure(inputs, on_result=callback)`` and call ``callback(index, result)``
as each measurement finishes (in any order), so progress moves per measurement; the
tuning loop passes it only to runners whose ``measure`` has that parameter, and reports
a batch's results one by one after the batch otherwise. A runner whose ``measure`` is
interrupted (Ctrl-C: KeyboardInterrupt) or raises must stay usable: `LocalRunner` kills
the workers that were measuring, so no stale result answers a later input.

`LocalRunner(backend, jobs)` measures in `jobs` worker processes: the local pool of
`vdla.execute.LocalExecutor`, which sweeps and parallel runs use too, with a wall-clock
limit per measurement. Each worker keeps one
measurement context per platform open for its whole life (`TuneTask.open_context`: the
accelerator's device; its Verilator model is built once, in the parent, by
`TuneTask.prepare`, before any worker starts) and each task's data (inputs and reference
output, `TuneTask.measure_data`). A measurement that raises, produces a wrong output,
runs past its budget, runs past the wall-clock limit (the worker is killed) or kills its
worker (the worker is restarted) comes back as a result with that status: the search
goes on. What a measurement does is the task's own (`TuneTask.measure`); the runner
never looks inside a task or a schedule. Workers are started by `vdla._workers`: forked
by a fork server (never from this process, which may have run a multi-threaded model),
they die with the process that started them (even a SIGKILLed one) and ignore SIGINT,
which the parent handles.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, Iterable, Sequence

from vdla.compiler.tuner.measure import MeasureInput, MeasureResult, one_line
from vdla.compiler.tuner.records import Records
from vdla.execute import EvaluationError, LocalExecutor, Outcome, make_executor

__all__ = ["ExecutorRunner", "InProcessRunner", "LocalRunner", "MeasureInput",
           "MeasureResult", "OnResult", "ReplayRunner", "measure_task", "prepare_tasks"]

#: Wall-clock limit of one measurement (seconds) unless the runner is given another: a
#: backstop for a measurement that hangs outside its own budget.
DEFAULT_TIMEOUT = 600.0

#: ``on_result(index, result)``: the measurement of ``inputs[index]`` finished.
OnResult = Callable[[int, MeasureResult], None]


def measure_task(task, schedule, context, *, data, backend: str) -> MeasureResult:
    """What a worker does for one input by default: `TuneTask.measure`."""
    return task.measure(schedule, context, data=data, backend=backend)


Measure = Callable[..., MeasureResult]


def prepare_tasks(tasks: Iterable, backend: str, prepared: set,
                  log: Callable[[str], None]) -> None:
    """Check that every task measures on `backend`, and prepare each platform once in
    this process (`TuneTask.prepare`: a Verilator model is built here, not once per
    worker at the same time); `prepared` holds the context keys done and is updated.
    ValueError naming the task for a backend it does not measure on."""
    for task in tasks:
        if backend not in task.measure_backends:
            raise ValueError(f"unknown measurement backend {backend!r} for task "
                             f"{task.name} of target {task.target!r}; available: "
                             f"{', '.join(task.measure_backends)}")
        key = task.context_key(backend)
        if key not in prepared:
            task.prepare(backend, log)
            prepared.add(key)


def _prepare(inputs: Sequence[MeasureInput], backend: str, prepared: set,
             log: Callable[[str], None]):
    """`prepare_tasks` for the inputs' tasks."""
    prepare_tasks((inp.task for inp in inputs), backend, prepared, log)


class _Measurer:
    """One process's measuring: the contexts it keeps open (one per platform) and each
    task's data, then `TuneTask.measure`. A failure is a result with status error."""

    def __init__(self, backend: str, measure: Measure):
        self.backend, self.measure = backend, measure
        self.contexts, self.tasks, self.data = {}, {}, {}

    def __call__(self, task, schedule) -> MeasureResult:
        # Each input brings its task pickled: the first of each uid is kept (its data
        # and context are built once).
        task = self.tasks.setdefault(task.uid, task)
        try:
            if task.uid not in self.data:
                self.data[task.uid] = task.measure_data()
            key = task.context_key(self.backend)
            if key not in self.contexts:
                self.contexts[key] = task.open_context(self.backend)
            return self.measure(task, schedule, self.contexts[key], data=self.data[task.uid],
                                backend=self.backend)
        except Exception as exc:  # noqa: BLE001
            return MeasureResult("error", error=one_line(exc))

    def close(self):
        contexts, self.contexts = self.contexts, {}
        for context in contexts.values():
            if hasattr(context, "close"):
                context.close()


class _PairMeasurer(_Measurer):
    """An executor worker's evaluator (`LocalRunner`, `ExecutorRunner`): a `_Measurer`
    called with a (task, schedule) pair; the executor's worker closes it on its way
    out."""

    def __call__(self, pair) -> MeasureResult:
        return super().__call__(*pair)


class LocalRunner:
    """Measure in `jobs` local worker processes: the pool of `vdla.execute.LocalExecutor`
    (the one a sweep uses), with a wall-clock limit per measurement.

    backend : how the tasks are measured (one of each task's ``measure_backends``: for
        the accelerator ``verilator`` or ``functional``, the fast mode)
    jobs : worker processes (each runs one measurement at a time)
    timeout : wall-clock seconds one measurement may take before its worker is killed
    measure : the function a worker calls, ``measure(task, schedule, context, data=...,
        backend=...)`` (default `measure_task`); it must be importable by name (a
        module-level function): workers get it pickled (`vdla._workers`)
    log : receives progress lines of a task's preparation, such as a Verilator build
        (default: printed to stderr)
    Workers start on the first `measure` and live until `close` (or the ``with`` block
    ends); a dead or killed worker is replaced. They are started from the thread that
    calls `measure` (`vdla._workers`): use a runner from one thread.
    """

    def __init__(self, backend: str, jobs: int = 1, *,
                 timeout: float = DEFAULT_TIMEOUT, measure: Measure = measure_task,
                 log: Callable[[str], None] | None = None):
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"backend must be a measurement backend's name, not {backend!r}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.backend, self.jobs, self.timeout, self._measure = backend, jobs, timeout, measure
        self._log = log or (lambda message: print(f"vdla: {message}", file=sys.stderr,
                                                  flush=True))
        self._pool = LocalExecutor(functools.partial(_PairMeasurer, backend, measure), jobs,
                                   timeout=timeout, processes=True)
        self._prepared: set = set()

    def measure(self, inputs: Sequence[MeasureInput], on_result: OnResult | None = None
                ) -> list[MeasureResult]:
        """One result per input, in the order of `inputs`.

        inputs : the (task, schedule) pairs to measure
        on_result : called as ``on_result(index, result)`` in this thread as each
            measurement finishes (in the order they finish)
        If this raises or is interrupted (KeyboardInterrupt), the workers that were
        measuring are killed at once, not waited for; the runner stays usable.
        """
        inputs = list(inputs)
        if not inputs:
            return []
        _prepare(inputs, self.backend, self._prepared, self._log)
        results: list[MeasureResult | None] = [None] * len(inputs)
        outcomes = self._pool.outcomes([(inp.task, inp.schedule) for inp in inputs])
        try:
            for outcome in outcomes:
                results[outcome.index] = result = _result(outcome)
                if on_result is not None:
                    on_result(outcome.index, result)
        finally:
            # Left early (an exception, Ctrl-C): the busy workers are killed, so none
            # answers a later input with this batch's result.
            outcomes.close()
        return results

    def close(self):
        """Stop the workers: idle ones are asked to exit, all at once (each closes its
        contexts), and killed if they have not after `vdla.execute.STOP_WAIT` seconds;
        busy ones (a `measure` interrupted in a way it could not clean up) are killed."""
        self._pool.close()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc):
        self.close()


def _result(outcome: Outcome) -> MeasureResult:
    """A measurement's result from the pool's outcome for it: the measurer returns a
    task's own failures as results, so the rest is the worker's (its death, a timeout, a
    result that could not be sent back)."""
    if outcome.status == "ok":
        return outcome.value
    if outcome.status == "died":
        return MeasureResult("crash", error=f"the worker process died ({outcome.value}) "
                             "while measuring", seconds=outcome.seconds)
    if outcome.status == "timeout":
        return MeasureResult("timeout", error=outcome.value, seconds=outcome.seconds)
    return MeasureResult("error", error=outcome.value.strip().splitlines()[-1],
                         seconds=outcome.seconds)


class ExecutorRunner:
    """Measure on a `vdla.execute` executor: the local worker processes or the Ray
    cluster that a parallel ``vdla run`` and a design sweep use (``vdla tune --ray``).
    Each worker builds one `_Measurer` (a context per platform, each task's data) and
    measures the (task, schedule) pairs it is handed, idle workers first.

    backend, measure, log : as `LocalRunner`'s (`measure` must be importable by name)
    jobs, ray : as `vdla.execute.make_executor`'s (``ray``: ``auto``, ``local`` or a
        cluster address; None for local worker processes)
    The executor starts on the first `measure` (a Ray instance takes seconds), or at
    `start`, and stops at `close`. A measurement whose worker dies comes back as a
    ``crash`` result and the others go on. Unlike `LocalRunner` there is no wall-clock
    limit (an actor on a cluster cannot be killed from here): the task's cycle budget
    bounds a measurement.
    """

    def __init__(self, backend: str, *, jobs: int = 1, ray: str | None = None,
                 measure: Measure = measure_task, log: Callable[[str], None] | None = None):
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"backend must be a measurement backend's name, not {backend!r}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
        self.backend, self.jobs, self.ray, self._measure = backend, jobs, ray, measure
        self._log = log or (lambda message: print(f"vdla: {message}", file=sys.stderr,
                                                  flush=True))
        self._prepared: set = set()
        self._executor = None

    def start(self) -> None:
        """Start the executor now, not at the first `measure` (ValueError from
        `make_executor`: Ray missing, no cluster at the address)."""
        if self._executor is None:
            self._executor = make_executor(
                functools.partial(_PairMeasurer, self.backend, self._measure),
                jobs=self.jobs, ray=self.ray)

    def describe(self) -> str:
        """Where measurements run (``2 local processes``, ``4 Ray actors on ...``)."""
        if self._executor is None:
            return f"Ray ({self.ray})" if self.ray else f"{self.jobs} local processes"
        return self._executor.describe()

    def measure(self, inputs: Sequence[MeasureInput], on_result: OnResult | None = None
                ) -> list[MeasureResult]:
        """One result per input, in the order of `inputs`; `on_result` as
        `LocalRunner.measure`'s."""
        inputs = list(inputs)
        if not inputs:
            return []
        _prepare(inputs, self.backend, self._prepared, self._log)
        self.start()
        results: list[MeasureResult | None] = [None] * len(inputs)
        todo = list(range(len(inputs)))

        def done(index: int, result: MeasureResult):
            results[index] = result
            if on_result is not None:
                on_result(index, result)

        while todo:
            pairs = [(inputs[i].task, inputs[i].schedule) for i in todo]
            try:
                for j, result in self._executor.map_unordered(pairs):
                    done(todo[j], result)
            except EvaluationError as exc:
                # The measurer returns a task's own failures as results: this is its
                # worker dying. The rest are measured again (the executor replaces it).
                if exc.index is None:
                    raise
                done(todo[exc.index], MeasureResult("crash", error=one_line(exc)))
            todo = [i for i in todo if results[i] is None]
        return results

    def close(self):
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    def __enter__(self) -> "ExecutorRunner":
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessRunner:
    """Measure in this process, one input after another: for callers that are worker
    processes themselves (a design sweep's workers tune each point's schedules; a
    daemon process may not start children). No wall-clock limit: the task's own cycle
    budget bounds a measurement.

    backend : as `LocalRunner`'s
    log : receives a task's preparation progress (default: nothing)
    """

    def __init__(self, backend: str, *, measure: Measure = measure_task,
                 log: Callable[[str], None] | None = None):
        self.backend = backend
        self._measurer = _Measurer(backend, measure)
        self._log = log or (lambda message: None)
        self._prepared: set = set()

    def measure(self, inputs: Sequence[MeasureInput], on_result: OnResult | None = None
                ) -> list[MeasureResult]:
        out = []
        for index, inp in enumerate(inputs):
            _prepare([inp], self.backend, self._prepared, self._log)
            out.append(self._measurer(inp.task, inp.schedule))
            if on_result is not None:
                on_result(index, out[-1])
        return out

    def close(self):
        self._measurer.close()

    def __enter__(self) -> "InProcessRunner":
        return self

    def __exit__(self, *exc):
        self.close()


class ReplayRunner:
    """Answer measurements from records instead of running them: the record of each
    (task, schedule) of the same target and platform, measured on `backend`. For
    studying a search against a space measured once (`bench/tuner.py`): the simulators
    are deterministic, so a replayed result is what measuring again would give. A
    schedule without a record comes back as an error."""

    def __init__(self, records: Records, backend: str):
        self.backend = backend
        self._records = records
        self._tables: dict[tuple, dict] = {}

    def _table(self, task) -> dict:
        if task.uid not in self._tables:
            table = {}
            for r in self._records.query(task.key, task.platform, self.backend,
                                         target=task.target):
                table.setdefault(task.schedule_from_dict(r.schedule), r)
            self._tables[task.uid] = table
        return self._tables[task.uid]

    def measure(self, inputs: Sequence[MeasureInput], on_result: OnResult | None = None
                ) -> list[MeasureResult]:
        """One result per input, in order; `on_result` as `LocalRunner.measure`'s."""
        out = []
        for index, inp in enumerate(inputs):
            r = self._table(inp.task).get(inp.schedule)
            out.append(MeasureResult("error", error=f"schedule {inp.schedule} has no record")
                       if r is None else MeasureResult(r.status, r.cycles, r.counters,
                                                       r.error, r.seconds))
            if on_result is not None:
                on_result(index, out[-1])
        return out

    def close(self):
        pass
