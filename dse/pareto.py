"""The Pareto front of a sweep's design points.

A design point is a JSON-ready record (`vdla.dse.report` documents the format); its
objective values sit in ``record["objectives"]``. `OBJECTIVES` is the one place that
says which way each objective is better.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

__all__ = ["OBJECTIVES", "Objective", "check_objectives", "dominates", "pareto_front"]


class Objective(NamedTuple):
    """What one objective means.

    direction : "minimize" or "maximize"
    unit : the unit for labels; "" where it depends on the part's family (LUT6 or LUT4,
        RAMB36 or EBR: a record's ``"units"`` may name it), "fraction" for a share in 0..1
    label : the short name for tables and axes
    """

    direction: str
    unit: str
    label: str


OBJECTIVES: dict[str, Objective] = {
    # The accelerator's time plus the host ops' time (`vdla.dse.evaluate`), and each.
    "latency_ms": Objective("minimize", "ms", "latency"),
    "accelerator_ms": Objective("minimize", "ms", "accelerator"),
    "host_ms": Objective("minimize", "ms", "host"),
    "cycles": Objective("minimize", "cycles", "cycles"),
    "lut": Objective("minimize", "", "LUT"),
    "ff": Objective("minimize", "", "FF"),
    "dsp": Objective("minimize", "", "DSP"),
    "bram": Objective("minimize", "", "BRAM"),
    "gemm_utilization": Objective("maximize", "fraction", "GEMM utilization"),
}


def check_objectives(objectives: Iterable[str]) -> list[str]:
    """The objective names as a list, or a ValueError naming the unknown one."""
    if isinstance(objectives, str):
        raise TypeError(f"objectives must be a list of names, not the string {objectives!r}")
    names = list(objectives)
    if not names:
        raise ValueError(f"no objectives given; known: {', '.join(OBJECTIVES)}")
    for name in names:
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"objectives named twice: {names}")
    return names


def _vector(record: Mapping, names: Sequence[str]) -> list[float] | None:
    """The record's objective values turned so that smaller is better, or None when the
    record is invalid or lacks a value (None or NaN) for one of `names`."""
    if record.get("valid") is not True:
        return None
    values = record.get("objectives") or {}
    vector = []
    for name in names:
        value = values.get(name)
        if value is None or math.isnan(value):
            return None
        vector.append(-float(value) if OBJECTIVES[name].direction == "maximize"
                      else float(value))
    return vector


def dominates(a: Mapping, b: Mapping, objectives: Iterable[str]) -> bool:
    """Whether record `a` dominates record `b`: no worse in every objective, better in one.

    A record that is invalid or lacks one of the values neither dominates nor is dominated.
    """
    names = check_objectives(objectives)
    va, vb = _vector(a, names), _vector(b, names)
    if va is None or vb is None:
        return False
    return all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb))


def pareto_front(records: Sequence[Mapping], objectives: Iterable[str]) -> list[Mapping]:
    """The valid records that no other valid record dominates, in the order given.

    Records that are invalid, or whose value for one of `objectives` is None or NaN, are
    left out. Records with identical objective vectors do not dominate each other, so
    all of them are kept when one is on the front (they are different hardware that
    scores the same; the report shows them side by side).
    """
    names = check_objectives(objectives)
    usable = [(i, v) for i, v in ((i, _vector(r, names)) for i, r in enumerate(records))
              if v is not None]
    if not usable:
        return []
    index = np.array([i for i, _ in usable])
    points = np.array([v for _, v in usable], dtype=float)
    # A dominating point comes strictly earlier in lexicographic order, so one pass in
    # that order needs to compare each point with the front found so far only (any
    # dominated dominator is itself dominated by a front member: dominance is transitive).
    order = np.lexsort(points.T[::-1])
    front: list[int] = []
    front_points = np.empty((0, len(names)))
    for k in order:
        p = points[k]
        if front and np.any(np.all(front_points <= p, axis=1)
                            & np.any(front_points < p, axis=1)):
            continue
        front.append(k)
        front_points = points[front]
    return [records[i] for i in sorted(index[front])]
