"""The task scheduler: one measurement budget spent on a whole model's tasks.

    results = tune_tasks(target.tasks(graph), runner, trials=64, records=db,
                         tuner="pretrained", split="gradient")

A model's tasks do not matter equally: ResNet-18's first convolution runs once and
takes a few percent of the model, a 3x3 convolution of layer1 runs four times. And they
do not gain equally from more measurements: where the default schedule is already the
best, measuring more is wasted. Splitting the budget equally (``split="equal"``,
AutoTVM's way: N / tasks each) ignores both. ``split="gradient"`` spends it where the
model's end-to-end cost is expected to fall most, as Ansor's task scheduler does:

1. Warm-up: each task's default schedule and its tuner's first pick (`WARMUP`), while
   the budget lasts, tasks side by side a batch at a time, the tasks whose tuners
   predict the largest gain first (a pretrained model predicts before measuring): every
   task then has a measured cost and its tuner has seen the task. A batch's picks are
   proposed once the batch before it is measured: the pretrained tuners share one
   correction (`vdla.compiler.tuner.correction`), so a task late in the warm-up starts
   from what the earlier tasks' measurements taught.
2. Then each round measures a batch of the task with the largest expected gain:
   ``weight x (best measured - best predicted + best measured x error)``, where the
   weight is how many of the model's nodes the task's schedule serves (`TuneTask.nodes`),
   the best predicted is the tuner's `expected_best` (its model's cost for the best
   schedule not measured yet) and the error is how far the tuner's pretrained model was
   off on this task's measurements so far (`Tuner.model_error`): where the model has
   been wrong, its prediction that nothing more is to gain is worth little, and the
   task's cost times that error is what it may be hiding (an upper confidence bound, as
   bandit schedulers weigh arms, with the model's own measured error as the width). A
   model that ranks a task right (the accelerator's, 1-3% off) barely moves it; one
   that does not (the CPU's on float depthwise layers it never saw, 20-50% off) sends
   the budget there.
   A task whose tuner predicts nothing (random search, a model not fitted yet) is
   weighed by its share of the model over its measurements so far,
   ``weight x best / trials``: DynaTune's optimism for arms tried least. If no task is
   predicted to gain, that share decides alone.

The model's cost here is the tuned ops' sum, ``sum(weight x best)``: what tuning can
change (the untuned ops' cost stays).

`trials` counts the records' measurements of the tasks as spent, so an interrupted run
resumes with what is left of the same budget.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from vdla.compiler.tuner.correction import SharedCorrection
from vdla.compiler.tuner.measure import MeasureInput
from vdla.compiler.tuner.records import Records
from vdla.compiler.tuner.task import TuneTask
from vdla.compiler.tuner.tune import TaskTuning, TuneResult, check_batch, measure_recorded

__all__ = ["SPLITS", "WARMUP", "ModelTuning", "total_cost", "tune_tasks"]

#: How a budget is split among tasks (see the module docstring).
SPLITS = ("gradient", "equal")
#: Measurements each task gets before the gradient decides (the default and one more).
WARMUP = 2

#: Called with (the task measured, trials done, the budget, the tuned ops' cost or None,
#: how many tasks have a measured cost) before the first measurement and after each one.
#: The cost is None until every task has one; the count says how far it is from there.
ModelProgress = Callable[[TuneTask, int, int, "int | None", int], None]


@dataclasses.dataclass(frozen=True)
class ModelTuning:
    """What `tune_tasks` did: each task's result (in the tasks' order), the order in
    which tasks were measured (task index per batch, warm-up included), the tuned ops'
    cost after each of this run's measurements (None until every task has one),
    `resumed`, the trials the records held before them, and `trace`, each measurement's
    (task index, cost or None) in order."""

    results: tuple[TuneResult, ...]
    order: tuple[int, ...]
    curve: tuple[int | None, ...]
    resumed: int = 0
    trace: tuple[tuple[int, int | None], ...] = ()

    def default_curve(self) -> list[int | None]:
        """The tuned ops' cost after each measurement, a task not measured yet counted
        at its default schedule's cost (measured in this run or the records): a curve
        that starts where compiling with the defaults does, whatever the split. None
        where a task's default has no measured cost. Of this run's measurements: what
        the records held before is not in the trace."""
        best = {i: r.default_cycles for i, r in enumerate(self.results)}
        out = []
        for i, cost in self.trace:
            if cost is not None and best[i] is not None:
                best[i] = min(best[i], cost)
            values = list(best.values())
            out.append(None if None in values else sum(
                _weight(r.task) * best[k] for k, r in enumerate(self.results)))
        return out

    @property
    def trials(self) -> int:
        return sum(r.trials for r in self.results)

    def cost(self, which: str) -> int | None:
        """``sum(weight x cost)`` over the tasks of the ``default`` or the ``best``
        schedules; None unless every task has it."""
        return total_cost(self.results, which)


def total_cost(results, which: str) -> int | None:
    """``sum(weight x cost)`` over `results` (`TuneResult`, some or all of a run's) of
    the ``default`` or the ``best`` schedules, each task weighted by the nodes it serves;
    None unless every one has it."""
    total = 0
    for r in results:
        value = r.default_cycles if which == "default" else r.best_cycles
        if value is None:
            return None
        total += _weight(r.task) * value
    return total


def _weight(task: TuneTask) -> int:
    return len(task.nodes) or 1


def tune_tasks(tasks: Sequence[TuneTask], runner, *, trials: int,
               records: Records | None = None, tuner: str = "pretrained", batch: int = 8,
               seed: int = 0, split: str = "gradient",
               progress: ModelProgress | None = None, share: bool = True) -> ModelTuning:
    """Tune `tasks` with `trials` measurements in all (records included), split by
    `split` (``gradient`` or ``equal``; see the module docstring). With `share`, the
    pretrained tuners of the tasks learn from each other's measurements
    (`SharedCorrection`). The other arguments are `tune_task`'s; every task measures its
    default first."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, not {trials!r}")
    check_batch(batch)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if not tasks:
        raise ValueError("no task to tune")
    batch_start: list = []      # (trials spent, the task's done) when its batch began

    def hook(task, done, budget, best):
        # A task's progress, per measurement: the model's, while one of its batches runs.
        if progress is not None and batch_start:
            spent_then, done_then = batch_start
            instead = {task.uid: best} if best is not None else {}
            progress(task, spent_then + done - done_then, trials, cost(instead),
                     measured(instead))

    # Each task may take its whole space: the scheduler, not a per-task cap, decides.
    options = {"shared": SharedCorrection(seed=seed)} if share and tuner == "pretrained" \
        else None
    states = [TaskTuning(t, runner, trials=None, records=records, tuner=tuner, seed=seed,
                         progress=hook, tuner_options=options) for t in tasks]
    order: list[int] = []
    curve: list[int | None] = []
    trace: list[tuple[int, int | None]] = []
    spent = resumed = sum(s.done for s in states)

    def cost(instead: dict | None = None) -> int | None:
        bests = [(instead or {}).get(s.task.uid, s.best()[0]) for s in states]
        if any(b is None for b in bests):
            return None
        return sum(_weight(s.task) * b for s, b in zip(states, bests))

    def measured(instead: dict | None = None) -> int:
        # The tasks with a measured cost (`instead`: as in `cost`).
        return sum((instead or {}).get(s.task.uid, s.best()[0]) is not None for s in states)

    def measure(index: int, n: int) -> int:
        nonlocal spent
        state = states[index]
        batch_start[:] = [spent, len(state.search.measured)]
        running = state.best()[0]
        got = state.step(min(n, trials - spent))
        batch_start.clear()
        spent += got
        if got:
            order.append(index)
            for _, result in state.history[-got:]:     # the curve, measurement by measurement
                trace.append((index, result.cycles if result.ok else None))
                if result.ok:
                    running = result.cycles if running is None else min(running, result.cycles)
                curve.append(cost({} if running is None else {state.task.uid: running}))
        return got

    def warm_up() -> None:
        # Each task's first `WARMUP` schedules (its default, its tuner's first pick), the
        # tasks by the gain their tuners predict before measuring (the largest first, so
        # that a layer whose default is far off is fixed early), `batch` schedules at once
        # (tasks side by side: the workers stay busy).
        nonlocal spent
        for picks in _warm_up_batches(states, batch):
            picks = picks[:max(0, trials - spent)]
            if not picks:
                return
            inputs = [MeasureInput(states[i].task, s) for i, s in picks]
            finished: dict = {}

            def on_result(k, result, base=spent):
                finished[k] = result
                if progress is not None:
                    # The batch is absorbed when it ends: until then, each task's best
                    # counts this batch's finished measurements too.
                    instead: dict = {}
                    for j, r in finished.items():
                        task = inputs[j].task
                        if r.ok:
                            known = instead.get(task.uid, states[picks[j][0]].best()[0])
                            instead[task.uid] = r.cycles if known is None else \
                                min(known, r.cycles)
                    progress(inputs[k].task, base + len(finished), trials, cost(instead),
                             measured(instead))

            results = measure_recorded(runner, inputs, records, on_result, finished)
            for (i, schedule), result in zip(picks, results):
                states[i].absorb([schedule], [result])
                trace.append((i, result.cycles if result.ok else None))
                spent += 1
                order.append(i)
                curve.append(cost())

    if progress is not None:
        progress(tasks[0], min(spent, trials), trials, cost(), measured())
    if split == "equal":
        share, extra = divmod(max(0, trials - spent), len(tasks))
        for i, s in enumerate(states):
            goal = s.done + share + (i < extra)
            while s.done < goal and measure(i, min(batch, goal - s.done)):
                pass
    else:
        warm_up()
        while spent < trials:
            ranked = sorted(range(len(states)), key=lambda i: -_gain(states[i]))
            if not any(measure(i, batch) for i in ranked):   # lazily: the first that can
                break       # every space is spent
    return ModelTuning(tuple(s.result() for s in states), tuple(order), tuple(curve),
                       resumed, tuple(trace))


def _warm_up_batches(states: Sequence[TaskTuning], batch: int):
    """The warm-up's batches of (task index, schedule), `batch` at a time: each task's
    first `WARMUP` schedules, the tasks by `_prior_gain`, the largest first. A batch's
    picks are proposed when it is asked for, after the batch before it was measured and
    absorbed, so that what those measurements taught the shared correction guides them."""
    wanting = sorted((i for i, s in enumerate(states) if s.done < WARMUP and s.left),
                     key=lambda i: -_prior_gain(states[i]))
    queue: list = []
    while wanting or queue:
        while wanting and len(queue) < batch:
            i = wanting.pop(0)
            queue += [(i, s) for s in states[i].propose(WARMUP - states[i].done)]
        picks, queue = queue[:batch], queue[batch:]
        yield picks


def _prior_gain(state: TaskTuning) -> float:
    """What a task is expected to gain before it is measured: its weight times its
    predicted default cost over the predicted best (0 without predictions); ties keep the
    tasks' order."""
    default = state.search.predicted_cost(state.default)
    expected = state.search.expected_best()
    if default is None or expected is None:
        return 0.0
    return _weight(state.task) * (default - expected)


def _gain(state: TaskTuning) -> float:
    """The expected fall in the tuned ops' cost from measuring more of `state`'s task
    (see the module docstring); -1 for a task with nothing left to measure."""
    if not state.left:
        return -1.0
    best = state.best()[0]
    if best is None:
        return float("inf")       # nothing measured (all failed): its cost is unknown
    weight = _weight(state.task)
    share = weight * best / max(1, len(state.search.measured))
    expected = state.search.expected_best()
    if expected is None:
        return share
    # A predicted gain ranks first; among tasks predicted to gain nothing, the share
    # decides (scaled down so that any predicted gain outranks it).
    predicted = weight * (best - expected + best * (state.search.model_error() or 0.0))
    return predicted if predicted > 0 else share * 1e-6
