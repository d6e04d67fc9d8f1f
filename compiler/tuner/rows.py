"""Rows for cost models that learn across tasks and platforms, and the ranking figures
that judge them.

    rows = training_rows(tasks, records, "verilator")      # from a training set's tasks
    rows.x, rows.y, rows.groups                            # features, log2 cost, task ids
    pairwise_accuracy(predicted, rows.y, rows.groups)      # ordered pairs within a task
    top1_ratio(predicted, rows.y, rows.groups)             # best over picked, per task

A row is one measured schedule of one task: its `TuneTask.transfer_features` in the
order of the task's `feature_set` (`vdla.compiler.tuner.features`), and the base-2
logarithm of its cost (the median of its measurements). What a model is judged on is
ranking within a task (which schedule to compile), so both figures compare schedules of
the same task only (TenSet's and Ansor's ranking figures). A training set's rows come
from `vdla.compiler.training_sets.training_set`; the model they train is
`vdla.compiler.tuner.cost_model.CostModel` (``scripts/train_cost_model.py``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

import numpy as np

from vdla.compiler.tuner.records import OK, Records

__all__ = ["Rows", "pairwise_accuracy", "top1_ratio", "training_rows"]


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
    picks takes twice as long (the top-1 figure of TenSet and Ansor)."""
    logs = [float(y[groups == g].min() - y[groups == g][np.argmin(predicted[groups == g])])
            for g in np.unique(groups)]
    if not logs:
        raise ValueError("no task to pick a schedule for")
    return float(2.0 ** np.mean(logs))
