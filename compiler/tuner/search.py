"""Search strategies over a task's schedule space.

A tuner proposes the next schedules to measure and learns from the results:

    tuner = ModelTuner(task, space, seed=0)
    while budget:
        batch = tuner.propose(8)                 # not measured before
        tuner.update(batch, runner.measure(...))

* `ModelTuner` (in the spirit of AutoTVM's XGBTuner): a gradient-boosted-trees model
  (scikit-learn's `GradientBoostingRegressor`) learns log(cost) from the task's schedule
  features (`TuneTask.features`); each round, simulated annealing over the knob grid
  (`TuneTask.knobs`; a move changes one knob to the next smaller or larger candidate)
  finds the schedules the model rates fastest, and the batch is the best of them plus a
  few random ones (exploration). Unless ``use_estimate=False``, the features include the
  target's own model (`TuneTask.estimate`), and before two measurements succeed (nothing
  to learn from yet) the first batch is pre-screened with it: half the schedules it rates
  fastest, half random.
* `RandomTuner`: a seeded random order of the space. `GridTuner`: the space in order.

Every tuner is deterministic for a seed: its proposals depend only on the seed and on the
results it was given, never on timing or on how many workers measured them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vdla.compiler.tuner.task import TuneTask

__all__ = ["GridTuner", "ModelTuner", "RandomTuner", "TUNERS", "Tuner", "make_tuner"]


class Tuner:
    """Base: keeps the space, what was measured and the results.

    task : the `TuneTask`
    space : its valid schedules (`TuneTask.space()`)
    seed : seeds every random choice
    """

    def __init__(self, task: TuneTask, space: Sequence, *, seed: int = 0):
        if not space:
            raise ValueError(f"task {task.name}: the schedule space is empty")
        self.task, self.space, self.seed = task, list(space), int(seed)
        self.index = {s: i for i, s in enumerate(self.space)}
        self.measured: dict[int, int | None] = {}     # space index -> cycles (None: failed)
        self.rng = np.random.default_rng(self.seed)

    def unmeasured(self) -> list[int]:
        return [i for i in range(len(self.space)) if i not in self.measured]

    def update(self, schedules: Sequence, cycles: Sequence[int | None]):
        """Tell the tuner what `schedules` measured (None for a failed measurement).
        Schedules outside the space are ignored."""
        for s, c in zip(schedules, cycles):
            i = self.index.get(s)
            if i is not None:
                self.measured[i] = None if c is None else int(c)

    def propose(self, n: int) -> list:
        """Up to `n` schedules not measured yet (fewer when the space runs out)."""
        raise NotImplementedError


class GridTuner(Tuner):
    def propose(self, n: int) -> list:
        return [self.space[i] for i in self.unmeasured()[:n]]


class RandomTuner(Tuner):
    def __init__(self, task, space, *, seed: int = 0):
        super().__init__(task, space, seed=seed)
        self.order = [int(i) for i in self.rng.permutation(len(self.space))]

    def propose(self, n: int) -> list:
        return [self.space[i] for i in self.order if i not in self.measured][:n]


class ModelTuner(Tuner):
    """Learned cost model + simulated annealing (see the module docstring).

    use_estimate : include the target's model (`TuneTask.estimate`) among the features and
        pre-screen the first batch with it (True); False learns from the schedule alone
        (so does a task whose target has no model)
    explore : share of each batch chosen at random among unmeasured schedules
    chains, steps : simulated annealing's parallel chains and steps per round
    """

    def __init__(self, task, space, *, seed: int = 0, use_estimate: bool = True,
                 explore: float = 0.15, chains: int = 64, steps: int = 60):
        super().__init__(task, space, seed=seed)
        self.use_estimate, self.explore = use_estimate, explore
        self.chains, self.steps = chains, steps
        # The knob grid: each knob's sorted candidate values; a schedule is a point.
        knobs = np.array([task.knobs(s) for s in self.space], dtype=np.int64)
        # Each knob's value -> its rank among the knob's values (np.unique's inverse).
        self.coords = np.stack([np.unique(knobs[:, d], return_inverse=True)[1]
                                for d in range(knobs.shape[1])], axis=1)
        self.position = {tuple(int(v) for v in point): i for i, point in enumerate(self.coords)}
        estimates = [task.estimate(s) for s in self.space] if use_estimate else []
        if use_estimate and any(e is None for e in estimates):
            estimates, self.use_estimate = [], False     # the target has no model
        self.estimates = (np.array([e.cycles for e in estimates], dtype=np.float64)
                          if estimates else None)
        self.features = np.array([task.features(s, e) for s, e in
                                  zip(self.space, estimates or [None] * len(self.space))],
                                 dtype=np.float64)
        self.model = None

    # --- learning -------------------------------------------------------------------------

    def _fit(self) -> bool:
        ok = {i: c for i, c in self.measured.items() if c is not None}
        if len(ok) < 2:
            return False
        # scikit-learn is a heavy import that only the model tuner needs.
        from sklearn.ensemble import GradientBoostingRegressor

        worst = math.log(max(ok.values()))
        rows = sorted(self.measured)
        # A failed schedule is taught as twice the slowest one: avoid, but keep learning.
        y = [math.log(self.measured[i]) if self.measured[i] is not None else worst + math.log(2)
             for i in rows]
        self.model = GradientBoostingRegressor(n_estimators=120, max_depth=3,
                                               learning_rate=0.1, random_state=self.seed)
        self.model.fit(self.features[rows], np.asarray(y))
        return True

    def _anneal(self, scores_of, n: int) -> list[int]:
        """Simulated annealing on the knob grid with the model's predictions; the `n`
        best unmeasured points it visited, best first."""
        count = len(self.space)
        todo = np.array(self.unmeasured())
        chains = min(self.chains, len(todo))
        # Start from the best measured points and random unmeasured ones.
        ok = sorted((c, i) for i, c in self.measured.items() if c is not None)
        starts = [i for _, i in ok[: chains // 2]]
        starts += [int(i) for i in self.rng.choice(todo, chains - len(starts), replace=False)]
        current = np.array(starts)
        cache: dict[int, float] = {}

        def score(points) -> np.ndarray:
            missing = sorted({int(p) for p in points} - cache.keys())
            if missing:
                for p, v in zip(missing, scores_of(missing)):
                    cache[p] = float(v)
            return np.array([cache[int(p)] for p in points])

        cur_score = score(current)
        spread = float(np.std(list(cache.values()))) or 1.0
        for step in range(self.steps):
            temp = spread * (1.0 - step / self.steps)
            proposal = current.copy()
            for c in range(len(current)):
                knob = int(self.rng.integers(self.coords.shape[1]))
                delta = 1 if self.rng.random() < 0.5 else -1
                point = self.coords[current[c]].copy()
                point[knob] += delta
                j = self.position.get(tuple(int(v) for v in point))
                if j is not None:
                    proposal[c] = j
            new_score = score(proposal)
            accept = (new_score <= cur_score) | (
                self.rng.random(len(current)) < np.exp(-(new_score - cur_score)
                                                       / max(temp, 1e-9)))
            current = np.where(accept, proposal, current)
            cur_score = np.where(accept, new_score, cur_score)
            if len(cache) >= count:
                break
        ranked = sorted((v, p) for p, v in cache.items() if p not in self.measured)
        return [p for _, p in ranked[:n]]

    def propose(self, n: int) -> list:
        todo = self.unmeasured()
        n = min(n, len(todo))
        if n == 0:
            return []
        if self._fit():
            n_random = int(round(self.explore * n)) if n > 1 else 0
            picked = self._anneal(lambda pts: self.model.predict(self.features[pts]),
                                  n - n_random)
        elif self.use_estimate:
            # Pre-screening: the target model's fastest, then random ones.
            n_random = n // 2
            est = self.estimates[todo]
            picked = [todo[int(k)] for k in np.argsort(est, kind="stable")[: n - n_random]]
        else:
            n_random, picked = n, []
        rest = [i for i in todo if i not in set(picked)]
        if n - len(picked) > 0 and rest:
            picked += [int(i) for i in self.rng.choice(rest, min(n - len(picked), len(rest)),
                                                       replace=False)]
        return [self.space[i] for i in picked]


TUNERS = {"model": ModelTuner, "random": RandomTuner, "grid": GridTuner}


def make_tuner(name: str, task: TuneTask, space, *, seed: int = 0, **options) -> Tuner:
    """A tuner by name (`TUNERS`); ValueError for an unknown one."""
    try:
        cls = TUNERS[name]
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; available: {', '.join(TUNERS)}") from None
    return cls(task, space, seed=seed, **options)
