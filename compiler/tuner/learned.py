"""Rows for cost models that learn across tasks and platforms, and the figures that
judge them.

    rows = training_rows(tasks, records, "verilator")      # from a training set's tasks
    rows.x, rows.y, rows.groups                            # features, log2 cost, task ids
    pairwise_accuracy(predicted, rows.y, rows.groups)      # ordered pairs within a task
    top1_ratio(predicted, rows.y, rows.groups)             # best over picked, per task
    learned_schedules(graph, target)                       # zero-shot: no measurement

A row is one measured schedule of one task: its `TuneTask.transfer_features` in the
order of the task's `feature_set`, and the base-2 logarithm of its cost (the median of
its measurements). What a model is judged on is ranking within a task (which schedule
to compile), so both figures compare schedules of the same task only (TenSet's and
Ansor's ranking figures).

The learned chooser (``vdla run --chooser learned``) compiles each tunable op with the
schedule the target's pretrained model (`TuneTask.pretrained`) ranks first, measuring
nothing: `learned_choice` for one task, remembered on disk (``cache_root()/schedules``)
keyed on the task, the model's digest and the task's `sources`, since ranking a space of
thousands takes a second (`vdla.compiler.tuner.candidates`: a larger space is sampled
and searched around the model's best).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vdla._memo import remembered
from vdla.compiler.tuner.candidates import POOL, Candidates, remembered_space
from vdla.compiler.tuner.records import OK, Records

__all__ = ["MARGIN", "Rows", "learned_choice", "learned_schedules", "pairwise_accuracy",
           "top1_ratio", "training_rows"]


@dataclasses.dataclass(frozen=True)
class Rows:
    """x : features, one row a measured schedule; y : log2 of its cost; groups : the index
    of its task in `tasks`; feature_names : the columns of x; tasks : (platform, workload
    key, task name) of each group."""

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    feature_names: tuple[str, ...]
    tasks: tuple[tuple[str, str, str], ...]

    def __len__(self) -> int:
        return len(self.y)

    @classmethod
    def join(cls, parts: Sequence["Rows"]) -> "Rows":
        """The rows of `parts` (of one feature set) together, their tasks renumbered."""
        names = {p.feature_names for p in parts}
        if len(names) != 1:
            raise ValueError(f"rows of {len(names)} different feature sets cannot be joined")
        offsets = np.cumsum([0] + [len(p.tasks) for p in parts[:-1]])
        return cls(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                   np.concatenate([p.groups + o for p, o in zip(parts, offsets)]),
                   names.pop(), tuple(t for p in parts for t in p.tasks))

    def subset(self, keep: np.ndarray) -> "Rows":
        """The rows where `keep` (a boolean mask), their tasks renumbered."""
        groups, new = np.unique(self.groups[keep], return_inverse=True)
        return Rows(self.x[keep], self.y[keep], new, self.feature_names,
                    tuple(self.tasks[g] for g in groups))


def training_rows(tasks: Sequence, records: Records, backend: str) -> Rows:
    """The rows of every ok measurement of `tasks` (`TuneTask`s of one feature set) on
    `backend` in `records`. ValueError when the tasks have no feature set or two
    different ones."""
    sets = {getattr(t, "feature_set", None) for t in tasks}
    if None in sets or len(sets) != 1:
        raise ValueError(f"the tasks need one feature set to learn across them, not "
                         f"{sorted(str(getattr(s, 'name', s)) for s in sets)}")
    feature_set = sets.pop()
    x, y, groups, described = [], [], [], []
    for task in tasks:
        costs: dict[str, list[int]] = {}
        rows: dict[str, object] = {}
        for record in records.query(task.key, task.platform, backend, target=task.target,
                                    status=OK):
            costs.setdefault(record.schedule_json, []).append(record.cycles)
            rows[record.schedule_json] = record.schedule
        if not costs:
            continue
        group = len(described)
        described.append((task.platform, task.key, task.name))
        for key, cost in costs.items():
            schedule = task.schedule_from_dict(rows[key])
            x.append(feature_set.vector(task.transfer_features(schedule)))
            y.append(math.log2(statistics.median(cost)))
            groups.append(group)
    width = len(feature_set.names)
    return Rows(np.array(x, dtype=np.float64).reshape(-1, width), np.array(y, dtype=np.float64),
                np.array(groups, dtype=np.int64), feature_set.names, tuple(described))


def pairwise_accuracy(predicted: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float:
    """The share of pairs of schedules of one task, with different costs, that
    `predicted` orders as `y` does (0.5 is a coin's; ties in the prediction count half)."""
    right = total = 0.0
    for g in np.unique(groups):
        p, t = predicted[groups == g], y[groups == g]
        dt = np.sign(t[:, None] - t[None, :])
        dp = np.sign(p[:, None] - p[None, :])
        upper = np.triu(dt != 0, 1)
        total += upper.sum()
        right += ((dp == dt) & upper).sum() + 0.5 * ((dp == 0) & upper).sum()
    if not total:
        raise ValueError("no pair of schedules of one task with different costs")
    return float(right / total)


def top1_ratio(predicted: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float:
    """The geometric mean over tasks of the best measured cost over the cost of the
    schedule `predicted` ranks first: 1.0 when it always picks the best, 0.5 when what it
    picks takes twice as long (the issue's top-1 figure)."""
    logs = [float(y[groups == g].min() - y[groups == g][np.argmin(predicted[groups == g])])
            for g in np.unique(groups)]
    if not logs:
        raise ValueError("no task to pick a schedule for")
    return float(2.0 ** np.mean(logs))


#: The learned chooser keeps the task's default schedule unless the model predicts its
#: own pick faster by more than this share. The model's error on one schedule of a
#: config it never saw is under 2.7% for 95% of schedules (leaving each training config
#: out in turn, centred per task: `bench/tuner_transfer.py`), and its first pick, the
#: one of thousands it flatters most, is predicted 2.9% too fast or more on 5% of tasks;
#: below about 5% a predicted gain is as likely that error as a gain, and following it
#: loses as often as it wins (docs/tuner.md).
MARGIN = 0.05


def learned_choice(task, *, margin: float = MARGIN, pool: int = POOL) -> Any:
    """The schedule of `task`'s space that its pretrained model predicts fastest, unless
    it predicts the default schedule within `margin` of it, or the target's own estimate
    has the default faster and overrules the model (`FeatureSet.baseline_vetoes`) (then
    the default); None when the task has no model (`TuneTask.pretrained`). A space
    larger than `pool` is ranked on a sample widened around the model's best
    (`Candidates`).

    Why the second condition: the correction is learned across tasks, and where it turns
    the target's own order of two schedules of one task around it extrapolates. On the
    five configs no training set measured, every pick that paid off had both estimates
    agree (by 7% to 2.1x), and the one that lost did not: MobileNet-v1's
    ``features.2.dw`` on the default config, corrected 9.8% faster, timing model 1.2%
    slower, measured 1.1% slower (docs/tuner.md). Zero-shot promises no more cycles than
    the default chooser, so a pick must convince both. The CPU's own estimate ranks
    schedules at pairwise 0.6-0.7 and vetoes nothing."""
    model = task.pretrained()
    if model is None:
        return None

    def choose():
        space = remembered_space(task)
        found = Candidates(task, model, space, pool=pool)
        found.climb(found.prior)
        default = task.default_schedule()
        pick = int(np.argmin(found.prior))
        fallback = found.add([space.index(default)])[0] if default in space else pick
        better = found.prior[fallback] - found.prior[pick] > math.log2(1 + margin)
        if better and model.feature_set.baseline_vetoes:
            own = model.feature_set.baseline_of(found.features[[pick, fallback]])
            better = own[0] <= own[1]
        return space[int(found.index[pick if better else fallback])]

    sources = task.sources()
    if not sources:
        return choose()
    key = {"target": task.target, "platform": task.platform_key(), "workload": task.key,
           "model": model.digest, "margin": margin, "pool": pool}
    # This module's rule decides the choice too: a change to it forgets the old ones.
    return remembered("schedules", "learned", key, choose, to_json=task.schedule_to_dict,
                      from_json=task.schedule_from_dict, sources=(*sources, Path(__file__)))


def learned_schedules(graph, target) -> dict[str, Any]:
    """node name -> `learned_choice` for each tunable node of `graph` on `target` whose
    task has a pretrained model (the others keep the target's default)."""
    found = {}
    for task in target.tasks(graph):
        choice = learned_choice(task)
        if choice is not None:
            found.update(dict.fromkeys(task.nodes, choice))
    return found
