"""Choosing and running a sweep's points: the grid, or an Optuna multi-objective sampler.

    result = run_sweep(spec, store, executor, progress=show)   # -> SweepResult

The grid evaluates every combination of the parameter values. A sampler (Optuna's
NSGA-II, or its multi-objective TPE) proposes `spec.trials` points in batches of twice
the executor's workers, learns from each batch's objectives, and treats a point that
does not fit the part (or misses the latency bound) as a constraint violation and an
invalid point as a failed trial. Either way a point already in the store is answered
from it (a killed sweep resumes without redoing finished points) and every new record
is written as soon as it arrives.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Mapping, Sequence

from vdla.dse.evaluate import Evaluator
from vdla.dse.pareto import OBJECTIVES
from vdla.dse.spec import SweepSpec

__all__ = ["SweepResult", "eta", "run_sweep", "violation"]

#: progress(done, total, record, eta_seconds or None)
Progress = Callable[[int, int, dict, "float | None"], None]

#: Points evaluated (per worker, and in all) before `eta` says anything: the first
#: points carry each worker's start-up (loading the models), and invalid points that
#: take no time can come first, so a few points say little about the rest.
ETA_POINTS_PER_WORKER = 2
ETA_MIN_POINTS = 5


def eta(evaluated: int, remaining: int, elapsed: float, workers: int) -> float | None:
    """Seconds until the sweep's last point is done, or None until enough are done to say.

    evaluated : points this run has evaluated (points answered from the store are not
        counted: they take no time, so would make the rest look fast)
    remaining : points still to come
    elapsed : seconds since the evaluations began
    workers : evaluations that run at once

    The rate is the completed points' (a point takes ``elapsed * workers / evaluated``
    of a worker), and the remaining points run `workers` at a time, so a last point
    still takes a whole point's time, not a fraction of it.
    """
    if remaining <= 0:
        return 0.0
    if evaluated < max(ETA_POINTS_PER_WORKER * workers, ETA_MIN_POINTS) or elapsed <= 0:
        return None
    per_point = elapsed * workers / evaluated
    return math.ceil(remaining / workers) * per_point


@dataclasses.dataclass
class SweepResult:
    """What a sweep evaluated: its records (in the order the points were chosen), how
    many came from the store, and the wall time."""

    records: list[dict]
    reused: int
    seconds: float
    method: str


def violation(record: Mapping, spec: SweepSpec) -> float:
    """How far a valid record is from meeting the spec's constraints (<= 0: it meets
    them): the worst resource's use over the share of the part it may take
    (`SweepSpec.max_utilization`, a fraction), and the latency's excess over the bound (a
    fraction of it)."""
    worst = -1.0
    if spec.fits and record.get("utilization"):
        worst = max(worst, max(record["utilization"].values()) - spec.max_utilization)
    if spec.max_latency_ms is not None:
        worst = max(worst, record["objectives"]["latency_ms"] / spec.max_latency_ms - 1.0)
    return worst


def _evaluate_batch(designs, store, executor, sweep_key, on_record) -> int:
    """Records of `designs` (store hits first, then the executor's), each given to
    ``on_record(design, record, evaluated)``; returns the hits."""
    found = store.get_many([d.key for d in designs])
    todo = [d for d in designs if d.key not in found]
    for d in designs:
        if d.key in found:
            on_record(d, found[d.key], False)
    # Several designs may share a key (a parameter that changes nothing): evaluate once.
    unique = list({d.key: d for d in todo}.values())
    for index, record in executor.map_unordered([dict(d.params) for d in unique]):
        store.put(record)
        store.add_to_sweep(sweep_key, [record["key"]])
        first = True   # one evaluation; designs that share its key come with it
        for d in todo:
            if d.key == unique[index].key:
                on_record(d, record, first)
                first = False
    store.add_to_sweep(sweep_key, list(found))
    return len(designs) - len(todo)


def run_sweep(spec: SweepSpec, store, executor, *, progress: Progress | None = None,
              evaluator: Evaluator | None = None) -> SweepResult:
    """Evaluate the spec's points (`SweepSpec.method`) with `executor` (whose workers
    build `Evaluator` s of the same spec), keeping every record in `store`."""
    start = time.perf_counter()
    evaluator = evaluator or Evaluator(spec)
    method = spec.method
    records: list[dict] = []
    clock = {"evaluated": 0}

    def on_record(design, record, evaluated):
        records.append(record)
        clock["evaluated"] += evaluated
        if progress is not None:
            done = len(records)
            progress(done, total, record,
                     eta(clock["evaluated"], total - done,
                         time.perf_counter() - clock["start"], executor.workers))

    if method == "grid":
        designs = [evaluator.design(p) for p in spec.points()]
        total = len(designs)
        clock["start"] = time.perf_counter()
        reused = _evaluate_batch(designs, store, executor, spec.key, on_record)
    else:
        total = spec.trials
        clock["start"] = time.perf_counter()
        reused = _run_sampler(spec, evaluator, store, executor, on_record)
    return SweepResult(records, reused, time.perf_counter() - start, method)


def _run_sampler(spec: SweepSpec, evaluator: Evaluator, store, executor, on_record) -> int:
    import optuna  # heavy: imports sqlalchemy and friends; only a sampled sweep needs it
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(logging.WARNING)
    names = list(spec.parameters)
    # Values may be lists (alu_ops), which Optuna's categorical choices cannot hold:
    # the sampler chooses an index into each parameter's values.
    choices = {n: list(range(len(spec.parameters[n]))) for n in names}

    # Constraints (fits the part, the latency bound) are set on each trial
    # (`Trial.set_constraint`, Optuna 5); both samplers prefer feasible trials.
    if spec.method == "nsga2":
        sampler = optuna.samplers.NSGAIISampler(seed=spec.seed,
                                                population_size=max(8, 2 * executor.workers))
    else:
        sampler = optuna.samplers.TPESampler(seed=spec.seed, multivariate=True)
    study = optuna.create_study(
        directions=[OBJECTIVES[name].direction for name in spec.objectives], sampler=sampler)
    batch = max(2, 2 * executor.workers)
    reused = asked = 0
    while asked < spec.trials:
        trials = [study.ask() for _ in range(min(batch, spec.trials - asked))]
        asked += len(trials)
        designs = []
        for trial in trials:
            params = {n: spec.parameters[n][trial.suggest_categorical(n, choices[n])]
                      for n in names}
            designs.append(evaluator.design(params))
        results: dict[int, dict] = {}

        def keep(design, record, evaluated, results=results, designs=designs):
            results[next(i for i, d in enumerate(designs)
                         if d is design and i not in results)] = record
            on_record(design, record, evaluated)

        reused += _evaluate_batch(designs, store, executor, spec.key, keep)
        for i, trial in enumerate(trials):
            record = results[i]
            values = _values(record, spec.objectives)
            if values is None:
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_constraint("constraints", violation(record, spec))
            study.tell(trial, values)
    return reused


def _values(record: Mapping, objectives: Sequence[str]) -> list[float] | None:
    if not record.get("valid"):
        return None
    values = [record["objectives"].get(name) for name in objectives]
    return None if any(v is None for v in values) else [float(v) for v in values]
