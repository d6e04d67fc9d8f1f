"""The tuning loop: propose a batch, measure it, record it, learn; resume from records.

    with Records("tune.db") as db, LocalRunner("verilator", jobs=2) as runner:
        result = tune_task(target.tasks(quantized)[0], runner, trials=64, records=db)
    result.best, result.best_cycles, result.default_cycles

The loop sees only the task interface (`vdla.compiler.tuner.task.TuneTask`), so it tunes
any target's tasks. `trials` is the task's measurement budget *including* what the
records already hold for it (same target, workload, platform and backend): a run
stopped after 20 of 64 trials and started again measures the other 44, and never a
schedule measured before. Results are written to the records after every batch; a batch
that is interrupted (Ctrl-C) or fails writes the measurements of it that finished before
the exception goes on, so an interrupted run loses only the measurements in flight.
Progress is reported after every measurement, as it finishes, when the runner's
``measure`` takes ``on_result`` (`vdla.compiler.tuner.runner`), else after each batch,
one measurement at a time.

A task whose measurements are noisy (`TuneTask.noisy`: wall time) gets a confirmation
after the search: its `CONFIRM` fastest schedules and the default are measured again,
interleaved, in `CONFIRM_ROUNDS` rounds (beyond the trial budget; kept in the records),
and each is judged by the median of all its measurements, as `Records.best` judges it.
A lucky first measurement then cannot crown a schedule, and the default and the best
are compared under the same conditions.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable, Iterable, Sequence

from vdla.compiler.tuner.candidates import remembered_space
from vdla.compiler.tuner.measure import MeasureInput, MeasureResult
from vdla.compiler.tuner.records import Records
from vdla.compiler.tuner.search import make_tuner
from vdla.compiler.tuner.task import TuneTask

__all__ = ["CONFIRM", "CONFIRM_ROUNDS", "Progress", "TaskTuning", "TuneResult",
           "UnreadableRecords", "best_schedules", "measure_recorded", "readable", "tune_task"]

#: A noisy task's fastest schedules measured again after the search ...
CONFIRM = 4
#: ... in this many interleaved rounds (with the default).
CONFIRM_ROUNDS = 3

#: Called with (task, trials done, trial budget, best cost or None) before the first
#: measurement and after each one.
Progress = Callable[[TuneTask, int, int, "int | None"], None]


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What tuning one task found.

    task : the `TuneTask`
    space_size : valid schedules in its space
    best, best_cycles : the fastest schedule measured (records included), or None
    default, default_cycles : the default chooser's schedule and, if measured, its cycles
    history : (schedule, MeasureResult) of every trial of this run, in order
    resumed : trials found in the records (not measured again)
    confirmations : measurements of the confirmation (noisy tasks; not trials)
    """

    task: TuneTask
    space_size: int
    best: Any
    best_cycles: int | None
    default: Any
    default_cycles: int | None
    history: tuple[tuple[Any, MeasureResult], ...]
    resumed: int
    confirmations: int = 0

    @property
    def trials(self) -> int:
        return self.resumed + len(self.history)

    @property
    def failures(self) -> int:
        return sum(not r.ok for _, r in self.history)

    @property
    def speedup(self) -> float | None:
        """default cycles / best cycles (None unless both were measured)."""
        if self.best_cycles and self.default_cycles:
            return self.default_cycles / self.best_cycles
        return None


class UnreadableRecords(UserWarning):
    """Records of a task whose schedule the task cannot read (another version's schedule
    fields, a hand-edited file): left out, and said so once per read."""


def readable(task: TuneTask, rows: Iterable) -> list[tuple[Any, Any]]:
    """(schedule, record) of each of the task's records `rows` whose schedule it reads;
    the others are left out with one `UnreadableRecords` warning giving their count and
    the first reason."""
    found, bad, first = [], 0, ""
    for r in rows:
        try:
            found.append((task.schedule_from_dict(r.schedule), r))
        except (TypeError, ValueError) as exc:
            bad, first = bad + 1, first or str(exc)
    if bad:
        warnings.warn(f"{bad} record(s) of task {task.name} ({task.target}, {task.platform}) "
                      f"have a schedule it cannot read and were left out; the first: {first}",
                      UnreadableRecords, stacklevel=2)
    return found


def _previous(records: Records | None, task: TuneTask, backend: str) -> dict:
    """schedule -> cost (None: failed) of the task's records on this backend."""
    if records is None:
        return {}
    found = {}
    rows = records.query(task.key, task.platform, backend, target=task.target)
    for s, r in readable(task, rows):
        if found.get(s) is None:      # an ok measurement wins over a failed one
            found[s] = r.cycles
    return found


class TaskTuning:
    """One task's tuning in progress: its tuner, what the records held for it, what this
    run measured. `tune_task` steps one until its budget is spent; the task scheduler
    (`vdla.compiler.tuner.scheduler`) steps several, choosing which each time. The
    arguments are `tune_task`'s; `budget` is the task's trials capped at its space (None:
    the whole space)."""

    def __init__(self, task: TuneTask, runner, *, trials: int | None,
                 records: Records | None = None,
                 tuner: str = "model", seed: int = 0, measure_default: bool = True,
                 progress: Progress | None = None, tuner_options: dict | None = None):
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)
                                   or trials < 0):
            raise ValueError(f"trials must be a non-negative integer, not {trials!r}")
        space = remembered_space(task)
        if not space:
            task.default_schedule()   # raises, naming why (the buffers the smallest tiles overflow)
            raise ValueError(f"task {task.name}: no schedule fits {task.platform}")
        self.task, self.runner, self.records = task, runner, records
        self.measure_default, self.progress = measure_default, progress
        self.search = make_tuner(tuner, task, space, seed=seed, **(tuner_options or {}))
        self.previous = {s: c for s, c in _previous(records, task, runner.backend).items()
                         if self.search.position(s) is not None}
        self.search.update(list(self.previous), list(self.previous.values()))
        self.default = task.default_schedule()
        self.budget = len(space) if trials is None else min(trials, len(space))
        self.history: list[tuple[Any, MeasureResult]] = []
        if progress is not None:
            progress(task, self.done, self.budget, self.best()[0])

    @property
    def done(self) -> int:
        """Trials so far, the records' included (at most the budget)."""
        return min(len(self.search.measured), self.budget)

    @property
    def left(self) -> int:
        """Trials the budget still allows."""
        return max(0, self.budget - len(self.search.measured))

    def best(self) -> tuple[int | None, Any]:
        """(cost, schedule) of the fastest measured, or (None, None)."""
        # Schedules are never measured twice, so the tuner's table is the whole record.
        ok = [(c, i) for i, c in self.search.measured.items() if c is not None]
        if not ok:
            return None, None
        cycles, index = min(ok)
        return cycles, self.search.space[index]

    def propose(self, n: int) -> list:
        """Up to `n` schedules to measure next (the default first, if it is to be
        measured and was not), within the budget; [] when it or the space is spent."""
        n = min(n, self.left)
        if n <= 0:
            return []
        search, default = self.search, self.default
        first = [default] if self.measure_default and \
            search.position(default) not in search.measured else []
        return (first + [s for s in search.propose(n) if s not in first])[:n]

    def absorb(self, proposal: Sequence, results: Sequence[MeasureResult]) -> None:
        """Teach the tuner what `proposal` (from `propose`) measured."""
        self.search.update(proposal, [r.cycles if r.ok else None for r in results])
        self.history += zip(proposal, results)

    def step(self, n: int) -> int:
        """Measure one batch of up to `n` schedules (`propose`), record it and teach the
        tuner; how many were measured (0: the budget or the space is spent)."""
        proposal = self.propose(n)
        if not proposal:
            return 0
        inputs = [MeasureInput(self.task, s) for s in proposal]
        finished: dict[int, MeasureResult] = {}
        best_before = self.best()[0]
        progress, measured = self.progress, len(self.search.measured)

        def on_result(index: int, result: MeasureResult):
            finished[index] = result
            if progress is not None:
                costs = [r.cycles for r in finished.values() if r.ok]
                costs += [] if best_before is None else [best_before]
                progress(self.task, measured + len(finished), self.budget,
                         min(costs, default=None))

        self.absorb(proposal, measure_recorded(self.runner, inputs, self.records, on_result,
                                                finished))
        return len(proposal)

    def result(self, confirm: int | None = None) -> TuneResult:
        """What was found; a noisy task first confirms its best (`confirm`, as in
        `tune_task`)."""
        task, search, default = self.task, self.search, self.default
        best_cycles, best_schedule = self.best()
        default_cycles = search.measured.get(search.position(default))
        confirm = (CONFIRM if task.noisy else 0) if confirm is None else confirm
        done = 0
        if confirm and best_schedule is not None:
            costs = _confirm(task, self.runner, search, default, confirm, self.records,
                             self.previous, self.history)
            done = sum(len(c) for c in costs.values()) - len(costs)
            medians = {s: sorted(c)[(len(c) - 1) // 2] for s, c in costs.items()}
            best_schedule = min(medians, key=lambda s: (medians[s], search.position(s)))
            best_cycles = medians[best_schedule]
            default_cycles = medians.get(default, default_cycles)
        return TuneResult(task, len(search.space), best_schedule, best_cycles, default,
                          default_cycles, tuple(self.history), len(self.previous), done)


def tune_task(task: TuneTask, runner, *, trials: int, records: Records | None = None,
              tuner: str = "model", batch: int = 8, seed: int = 0,
              measure_default: bool = True, progress: Progress | None = None,
              tuner_options: dict | None = None, confirm: int | None = None) -> TuneResult:
    """Tune `task`.

    runner : measures batches (`LocalRunner`, `ReplayRunner`, or anything with
        ``measure(inputs)`` and ``backend``; one whose ``measure`` also takes
        ``on_result`` reports each measurement as it finishes)
    trials : measurements in all, records included (capped at the space's size)
    records : a `Records` to resume from and write to (None: nothing is kept)
    tuner : ``pretrained`` (the target's pretrained cost model, learning online; from
        scratch where the target ships none), ``model`` (a cost model learned from
        scratch and simulated annealing), ``random`` or ``grid``
    batch : schedules measured per round (the runner measures a batch in parallel)
    seed : makes the search deterministic
    measure_default : measure the default chooser's schedule first, so the result can
        compare it with the best (the CLI's table does)
    progress : called before the first measurement and after every one (see `Progress`)
    confirm : how many of the fastest schedules a noisy task measures again (default
        `CONFIRM` for a noisy task, 0 otherwise; see the module docstring)
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, not {trials!r}")
    check_batch(batch)
    tuning = TaskTuning(task, runner, trials=trials, records=records, tuner=tuner, seed=seed,
                        measure_default=measure_default, progress=progress,
                        tuner_options=tuner_options)
    while tuning.step(batch):
        pass
    return tuning.result(confirm)


def check_batch(batch) -> None:
    """ValueError unless `batch` is a positive integer."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, not {batch!r}")


def _confirm(task: TuneTask, runner, search, default, count: int, records, previous,
             history) -> dict[Any, list[int]]:
    """Measure the `count` fastest schedules and the default again in `CONFIRM_ROUNDS`
    interleaved rounds; schedule -> all its ok costs (this run's and the records')."""
    ok = sorted((c, i) for i, c in search.measured.items() if c is not None)
    picks = [search.space[i] for _, i in ok[:count]]
    if search.measured.get(search.position(default)) is not None and default not in picks:
        picks.append(default)
    recorded = _all_costs(records, task, runner.backend)
    costs = {s: [c for s2, c in recorded if s2 == s] or [search.measured[search.position(s)]]
             for s in picks}
    for _ in range(CONFIRM_ROUNDS):
        inputs = [MeasureInput(task, s) for s in picks]
        finished: dict[int, MeasureResult] = {}
        results = measure_recorded(runner, inputs, records,
                                    lambda i, r: finished.__setitem__(i, r), finished)
        for s, r in zip(picks, results):
            if r.ok:
                costs[s].append(r.cycles)
    return costs


def measure_recorded(runner, inputs, records, on_result, finished) -> list:
    """`runner` measures `inputs` (of any tasks), every result added to `records`;
    ``on_result(index, result)`` is called as each finishes and must fill `finished`, so
    that, interrupted (Ctrl-C) or failed, what finished is kept, in the batch's order."""
    try:
        results = _measure(runner, inputs, on_result)
    except BaseException:
        if records is not None and finished:
            records.add(*(finished[i].record(inputs[i], runner.backend)
                          for i in sorted(finished)))
        raise
    if records is not None:
        records.add(*(r.record(inp, runner.backend) for inp, r in zip(inputs, results)))
    return results


def _all_costs(records: Records | None, task: TuneTask, backend: str) -> list:
    """(schedule, cost) of every ok record of the task on `backend`."""
    if records is None:
        return []
    rows = [r for r in records.query(task.key, task.platform, backend, target=task.target)
            if r.status == "ok"]
    return [(s, r.cycles) for s, r in readable(task, rows)]


def _measure(runner, inputs: Sequence[MeasureInput],
             on_result: Callable[[int, MeasureResult], None]) -> list[MeasureResult]:
    """`runner.measure(inputs)`, calling ``on_result(index, result)`` for every input: as
    each finishes when the runner's ``measure`` takes ``on_result``, else after the batch,
    in order (a runner need not know the hook)."""
    try:
        takes_hook = "on_result" in inspect.signature(runner.measure).parameters
    except (TypeError, ValueError):      # no signature to read (a C method): assume not
        takes_hook = False
    if takes_hook:
        return runner.measure(inputs, on_result=on_result)
    results = runner.measure(inputs)
    for index, result in enumerate(results):
        on_result(index, result)
    return results


def best_schedules(records: Records, graph, target, backend: str | None = None
                   ) -> dict[str, tuple[Any, int]]:
    """node name -> (schedule, cost) of the recorded schedule `target` picks for each
    tunable node of quantized `graph` (`Target.tasks`), measured on `backend` (default:
    each task's first measurement backend, for the accelerator ``verilator``): its
    fastest, unless the target weighs the nodes together (`Target.choose_schedules`: the
    CPU's layouts, where neighbours that disagree pay for a conversion). Nodes without a
    usable record are left out: they get the target's default. For `compile_model`'s
    ``schedules``."""
    options = {}
    for task in target.tasks(graph):
        ranked = records.ranked(task.key, task.platform, backend or task.measure_backends[0],
                                target=task.target)
        read = [(s, r.cycles) for s, r in readable(task, ranked)]
        if not read:       # none, or unreadable (said so): the target's default
            continue
        for node in task.nodes:
            options[node] = read
    return target.choose_schedules(graph, options)
