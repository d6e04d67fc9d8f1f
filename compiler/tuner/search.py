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
* `PretrainedTuner`: starts from the cost model the target ships, trained on other
  tasks and configs (`TuneTask.pretrained`), so its first batch is already the model's
  best guesses, and keeps learning online: trees fitted to what the pretrained model
  got wrong on this task's measurements correct its predictions. A task whose target
  ships no model is tuned by `ModelTuner` instead (`make_tuner`; the CLI says so).
* `RandomTuner`: a seeded random order of the space (of its parts in turn, where the
  task names parts: `TuneTask.strata`). `GridTuner`: the space in order.

A tuner with a model also answers `expected_best`: the cost it predicts for the best
schedule not measured yet, which the task scheduler (`vdla.compiler.tuner.scheduler`)
weighs against the best measured one.

Every tuner is deterministic for a seed: its proposals depend only on the seed and on the
results it was given, never on timing or on how many workers measured them.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading
from typing import Sequence

import numpy as np

from vdla.compiler.tuner.candidates import POOL, Candidates, remembered_rows
from vdla.compiler.tuner.correction import SharedCorrection, correction_trees
from vdla.compiler.tuner.space import as_space, knob_grid
from vdla.compiler.tuner.task import TuneTask

__all__ = ["GridTuner", "ModelTuner", "PretrainedTuner", "RandomTuner", "TUNERS", "Tuner",
           "make_tuner"]


class Tuner:
    """Base: keeps the space, what was measured and the results.

    task : the `TuneTask`
    space : its valid schedules (`TuneTask.space()`: a list, or a `ProductSpace` that
        is never listed)
    seed : seeds every random choice
    """

    def __init__(self, task: TuneTask, space: Sequence, *, seed: int = 0):
        if not len(space):
            raise ValueError(f"task {task.name}: the schedule space is empty")
        self.task, self.space, self.seed = task, as_space(space), int(seed)
        self.measured: dict[int, int | None] = {}     # space index -> cycles (None: failed)
        self.rng = np.random.default_rng(self.seed)

    def position(self, schedule) -> int | None:
        """`schedule`'s index in the space, or None when it is not in it."""
        return self.space.position(schedule)

    def unmeasured(self) -> list[int]:
        return [i for i in range(len(self.space)) if i not in self.measured]

    def some_unmeasured(self, n: int, *, besides=()) -> list[int]:
        """Up to `n` distinct random indices neither measured nor in `besides`. A large
        space is drawn from with rejection (what was measured is a sliver of it), not
        listed."""
        taken = set(self.measured) | {int(i) for i in besides}
        free = len(self.space) - len(taken)
        if free <= 0 or n <= 0:
            return []
        if len(self.space) <= POOL or free < 4 * n + 64:   # a small space, or few left
            left = [i for i in range(len(self.space)) if i not in taken]
            return [int(i) for i in self.rng.choice(left, min(n, len(left)), replace=False)]
        found: list[int] = []
        while len(found) < n:
            i = int(self.rng.integers(len(self.space)))
            if i not in taken:
                taken.add(i)
                found.append(i)
        return found

    def update(self, schedules: Sequence, cycles: Sequence[int | None]):
        """Tell the tuner what `schedules` measured (None for a failed measurement).
        Schedules outside the space are ignored."""
        for s, c in zip(schedules, cycles):
            i = self.position(s)
            if i is not None:
                self.measured[i] = None if c is None else int(c)

    def propose(self, n: int) -> list:
        """Up to `n` schedules not measured yet (fewer when the space runs out)."""
        raise NotImplementedError

    def expected_best(self) -> float | None:
        """The cost the tuner's model predicts for the best schedule not measured yet, in
        the task's unit; None without a model (or when everything was measured)."""
        return None

    def predicted_cost(self, schedule) -> float | None:
        """The cost the tuner's model predicts for `schedule`; None without a model."""
        return None

    def model_error(self) -> float | None:
        """How far a pretrained model was off on this task's measurements: the mean of
        ``|measured / predicted - 1|`` over them, before any online correction; None
        without a pretrained model or a successful measurement."""
        return None


class GridTuner(Tuner):
    def propose(self, n: int) -> list:
        found = []
        for i in range(len(self.space)):
            if len(found) == n:
                break
            if i not in self.measured:
                found.append(self.space[i])
        return found


class RandomTuner(Tuner):
    def __init__(self, task, space, *, seed: int = 0):
        super().__init__(task, space, seed=seed)
        strata = task.strata(self.space)
        if not strata:
            self.order = self.rng.permutation(len(self.space))
        else:
            # Round robin over the strata, each in its own random order: the k-th draw
            # of stratum j goes to place k * len(strata) + j.
            orders = [self.rng.permutation(np.asarray(part)) for part in strata]
            places = np.concatenate([np.arange(len(o)) * len(orders) + j
                                     for j, o in enumerate(orders)])
            self.order = np.concatenate(orders)[np.argsort(places, kind="stable")]
        self._next = 0      # the order before it is all measured

    def propose(self, n: int) -> list:
        found, at = [], self._next
        while len(found) < n and at < len(self.order):
            i = int(self.order[at])
            if i not in self.measured:
                found.append(self.space[i])
            elif at == self._next:
                self._next += 1
            at += 1
        return found


#: A space too large to featurize whole has its first batch screened by the target's own
#: estimate on a random sample of this many schedules: the estimate of a CPU layer's
#: schedule takes 35 us, and a sample of POOL cost 0.6 s a task, 30% of what 64
#: measurements of MobileNet-v1 take.
SCREEN = 2048


def scratch_rows(task, space: Sequence, use_estimate: bool
                 ) -> tuple[np.ndarray | None, np.ndarray]:
    """What `ModelTuner` learns from on a whole space: (the target's estimates, or None
    without `use_estimate`, and `TuneTask.features` of every schedule)."""
    estimates = [task.estimate(s) for s in space] if use_estimate else []
    return ((np.array([e.cycles for e in estimates], dtype=np.float64)
             if estimates else None),
            np.array([task.features(s, e) for s, e in
                      zip(space, estimates or [None] * len(space))], dtype=np.float64))


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
        self.grid = knob_grid(task, self.space)
        # A space larger than POOL (the CPU's) is never featurized whole: its rows are
        # computed as annealing visits them, and the first batch is screened on a sample.
        self.whole = len(self.space) <= POOL
        self._rows: dict[int, np.ndarray] = {}
        if use_estimate and task.estimate(self.space[0]) is None:
            self.use_estimate = False       # the target has no model
        self.estimates = self.features = None
        if self.whole:      # the timing model on every schedule: computed once, kept
            self.estimates, self.features = remembered_rows(
                task, self.space, {"scratch": "features", "estimate": self.use_estimate},
                lambda: scratch_rows(task, self.space, self.use_estimate))
        self.model = None

    def features_of(self, indices) -> np.ndarray:
        """The feature rows of the schedules at `indices`."""
        if self.whole:
            return self.features[indices]
        for i in indices:
            if int(i) not in self._rows:
                s = self.space[int(i)]
                self._rows[int(i)] = np.array(self.task.features(
                    s, self.task.estimate(s) if self.use_estimate else None), dtype=np.float64)
        return np.array([self._rows[int(i)] for i in indices], dtype=np.float64)

    # --- learning -------------------------------------------------------------------------

    def expected_best(self) -> float | None:
        # A large space: the best of what annealing has visited.
        todo = self.unmeasured() if self.whole else [i for i in self._rows
                                                      if i not in self.measured]
        if self.model is None or not todo:
            return None
        return float(math.exp(self.model.predict(self.features_of(todo)).min()))

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
        self.model.fit(self.features_of(rows), np.asarray(y))
        return True

    def _anneal(self, scores_of, n: int) -> list[int]:
        """Simulated annealing on the knob grid with the model's predictions; the `n`
        best unmeasured points it visited, best first."""
        count = len(self.space)
        chains = min(self.chains, count - len(self.measured))
        # Start from the best measured points and random unmeasured ones.
        ok = sorted((c, i) for i, c in self.measured.items() if c is not None)
        starts = [i for _, i in ok[: chains // 2]]
        starts += self.some_unmeasured(chains - len(starts))
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
                knob = int(self.rng.integers(self.grid.dims))
                delta = 1 if self.rng.random() < 0.5 else -1
                point = self.grid.point(current[c])
                point[knob] += delta
                j = self.grid.at(point)
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
        n = min(n, len(self.space) - len(self.measured))
        if n == 0:
            return []
        if self._fit():
            n_random = int(round(self.explore * n)) if n > 1 else 0
            picked = self._anneal(lambda pts: self.model.predict(self.features_of(pts)),
                                  n - n_random)
        elif self.use_estimate:
            # Pre-screening: the target model's fastest, then random ones (of a sample,
            # in a large space).
            n_random = n // 2
            todo = self.unmeasured() if self.whole else sorted(self.some_unmeasured(SCREEN))
            est = (self.estimates[todo] if self.whole else
                   [self.task.estimate(self.space[i]).cycles for i in todo])
            picked = [todo[int(k)] for k in np.argsort(est, kind="stable")[: n - n_random]]
        else:
            n_random, picked = n, []
        picked += self.some_unmeasured(n - len(picked), besides=picked)
        return [self.space[i] for i in picked]


def _import_learner_meanwhile() -> None:
    """Import scikit-learn's trees in a thread: a second and a half that the first
    measurements hide (the tuner needs them only once measurements come in, and this
    process mostly waits on its workers while they measure)."""
    if "sklearn.ensemble" not in sys.modules:
        threading.Thread(target=importlib.import_module, args=("sklearn.ensemble",),
                         daemon=True).start()


class PretrainedTuner(Tuner):
    """The target's pretrained cost model, corrected online (see the module docstring).

    Every round ranks the space (`Candidates`: the whole space, whose features are
    remembered, or a large space's sample widened around the best by hill climbing
    after every correction; the model reads `TuneTask.transfer_features`) and proposes
    the best unmeasured ones (one of each group of schedules whose features are equal: they cost
    the same), a share of each batch drawn at random: `explore`, or more where the
    measurements contradict the pretrained ranking (`explore_share`). Once `learn_after`
    measurements succeed, gradient-boosted trees on the same features learn the
    residual, measured log2 cost minus the pretrained prediction (a failed schedule
    counts as twice the slowest), and their correction is added to the prediction of
    every schedule: what the measurements teach spreads to similar schedules. With
    `shared`, the tuners of a model's tasks also learn from each other: each hands its
    residuals to the `SharedCorrection`, whose trees (fitted on every task's) correct
    the prediction first, and its own trees learn what those leave.

    model : a `CostModel` of the task's feature set (default `task.pretrained()`)
    explore : share of each batch drawn at random at least (0: the pretrained ranking
        is trusted while the measurements agree with it; it was right within 1% on
        unseen configs, docs/tuner.md)
    learn_after : successful measurements before the correction is fitted
    pool : a space larger than this is ranked on a sample of this many (`Candidates`)
    shared : the `SharedCorrection` of the tuning run, or None to learn from this task's
        measurements alone
    ValueError when the task has no feature set or no model is given or shipped.
    """

    def __init__(self, task, space, *, seed: int = 0, model=None, explore: float = 0.0,
                 learn_after: int = 3, pool: int = POOL,
                 shared: SharedCorrection | None = None):
        super().__init__(task, space, seed=seed)
        self.pretrained = model if model is not None else task.pretrained()
        if self.pretrained is None:
            raise ValueError(f"task {task.name} ({task.target}, {task.platform}): no "
                             "pretrained cost model for it; use the model tuner")
        self.found = Candidates(task, self.pretrained, self.space, pool=pool, seed=seed)
        self.fix = None            # the task's own correction, once fitted
        self.common = None         # the shared correction, once fitted
        _import_learner_meanwhile()
        self.explore, self.learn_after = explore, learn_after
        self.shared = shared
        self._token = None if shared is None else shared.join(task.feature_set)
        self._fitted_on = (0, 0)     # (measurements, shared version) fitted on
        self._taught = 0
        self._climbed_on = None      # the fit last climbed on

    @property
    def predicted(self) -> np.ndarray:
        """log2 cost of every candidate row, corrected by what was measured."""
        found = self.found
        predicted = found.prior
        for fix in (self.common, self.fix):
            if fix is not None:
                predicted = predicted + fix.predict(found.features)
        return predicted

    def update(self, schedules, cycles):
        super().update(schedules, cycles)
        self.found.add(self.measured)     # schedules measured outside the candidates

    def _learn(self, climb: bool = True):
        """Fit the corrections to what was measured since the last fit (this task's and,
        through the shared correction, the other tasks'), and with `climb` widen a
        sampled space around what they rank best. Only a proposal climbs: the task
        scheduler asks every task's `expected_best` each round, and climbing every
        task's space each time would cost more than the fit."""
        ok = {i: c for i, c in self.measured.items() if c is not None}
        shared, features = self.shared, self.task.feature_set
        if shared is not None and ok and len(self.measured) != self._taught:
            self._teach(ok)          # the other tasks' tuners learn from it too
            self._taught = len(self.measured)
        state = (len(self.measured), 0 if shared is None else shared.version(features))
        common = None if shared is None else shared.correction(features)
        if state != self._fitted_on and (len(ok) >= self.learn_after or common is not None):
            self._fitted_on, self.common = state, common
            if len(ok) >= self.learn_after:
                # The task's own correction: what the prior and the shared one leave.
                rows, residuals = self._residuals(ok)
                if common is not None:
                    residuals = residuals - common.predict(self.found.features[rows])
                self.fix = correction_trees(self.found.features[rows], residuals,
                                            seed=self.seed)
        if climb and self._climbed_on != self._fitted_on:
            # What the corrections (or, before any, the model) rank best, widened.
            self.found.climb(lambda: self.predicted)
            self._climbed_on = self._fitted_on

    def _residuals(self, ok: dict) -> tuple[np.ndarray, np.ndarray]:
        """The candidate rows of every measurement and its measured log2 cost minus the
        pretrained prediction (a failed schedule as twice the slowest measured)."""
        worst = math.log2(max(ok.values())) + 1.0
        measured = sorted(self.measured)
        rows = self.found.add(measured)
        y = np.array([math.log2(self.measured[i]) if self.measured[i] is not None else worst
                      for i in measured])
        return rows, y - self.found.prior[rows]

    def _teach(self, ok: dict) -> None:
        rows, residuals = self._residuals(ok)
        self.shared.teach(self.task.feature_set, self._token, self.found.features[rows],
                          residuals)

    def _todo(self) -> np.ndarray:
        """The candidate rows not measured yet."""
        measured = np.fromiter(self.measured, dtype=np.int64, count=len(self.measured))
        return np.flatnonzero(~np.isin(self.found.index, measured)).astype(np.int64)

    def expected_best(self) -> float | None:
        self._learn(climb=False)
        todo = self._todo()
        return float(2.0 ** self.predicted[todo].min()) if len(todo) else None

    def predicted_cost(self, schedule) -> float | None:
        self._learn(climb=False)
        row = self.found.add([self.position(schedule)])[0]
        return float(2.0 ** self.predicted[row])

    def model_error(self) -> float | None:
        ok = [(i, c) for i, c in self.measured.items() if c is not None]
        if not ok:
            return None
        rows = self.found.add([i for i, _ in ok])
        measured = np.log2([c for _, c in ok])
        return float(np.mean(np.abs(2.0 ** (measured - self.found.prior[rows]) - 1.0)))

    #: A pair of measurements closer than this (relative) is not counted as ordered: a
    #: noisy task's (wall time: two runs of one schedule differ by a few %), and an exact
    #: one's (cycles), where the model's own accuracy is about this.
    NOISE = {True: 0.05, False: 0.02}
    #: The most of a batch that disagreement sends to random schedules.
    MAX_EXPLORE = 0.5

    def explore_share(self) -> float:
        """The share of the next batch drawn at random: `explore`, or where at least three
        measurements succeeded the share of their pairs the pretrained prediction orders
        the other way round, up to `MAX_EXPLORE`. On a machine or config the model was
        not trained for (an instruction set it never saw) its ranking may be wrong
        everywhere, and the online correction needs more measurements than a small
        budget gives each task; random schedules then find more than its picks."""
        ok = [(i, c) for i, c in self.measured.items() if c is not None]
        if len(ok) < 3:
            return self.explore
        prior = self.found.prior[self.found.add([i for i, _ in ok])]
        cost = np.array([c for _, c in ok], dtype=np.float64)
        a, b = np.triu_indices(len(ok), 1)          # every pair once
        floor = self.NOISE[bool(self.task.noisy)]
        apart = np.abs(cost[a] - cost[b]) > floor * np.minimum(cost[a], cost[b])
        wrong = (prior[a] < prior[b]) != (cost[a] < cost[b])
        share = float(wrong[apart].mean()) if apart.any() else 0.0
        return max(self.explore, min(self.MAX_EXPLORE, share))

    def propose(self, n: int) -> list:
        self._learn()
        todo = self._todo()
        if len(todo) < n and not self.found.whole:
            # The sample ran out: rank what remains of the space (rare: a whole budget
            # larger than the sample).
            self.found.add([i for i in range(len(self.space)) if i not in self.measured])
            todo = self._todo()
        n = min(n, len(todo))
        if n == 0:
            return []
        predicted, features, index = self.predicted, self.found.features, self.found.index
        # A fractional share of a small batch is drawn with that probability.
        share = self.explore_share() * n
        rest = share - int(share)
        n_random = int(share) + int(rest > 0 and self.rng.random() < rest)
        order = todo[np.argsort(predicted[todo], kind="stable")]
        # Schedules the features cannot tell apart (tile sizes that clamp to the same
        # tiling) cost the same: one of each such group is worth measuring.
        seen = {features[self.found.row[i]].tobytes() for i in self.measured}
        picked = []
        for r in order:
            if len(picked) == n - n_random:
                break
            if features[r].tobytes() not in seen:   # no twin measured or picked
                seen.add(features[r].tobytes())
                picked.append(int(r))
        # Only twins left: they are still schedules to measure.
        chosen = set(picked)
        for r in order:
            if len(picked) >= n - n_random:
                break
            if int(r) not in chosen:
                picked.append(int(r))
        chosen = set(picked)
        rest = [int(r) for r in todo if int(r) not in chosen] if n_random else []
        if n_random and rest:
            picked += [int(r) for r in self.rng.choice(rest, min(n_random, len(rest)),
                                                       replace=False)]
        return [self.space[int(index[r])] for r in picked]


TUNERS = {"pretrained": PretrainedTuner, "model": ModelTuner, "random": RandomTuner,
          "grid": GridTuner}


def make_tuner(name: str, task: TuneTask, space, *, seed: int = 0, **options) -> Tuner:
    """A tuner by name (`TUNERS`); ValueError for an unknown one. ``pretrained`` for a
    task whose target ships no model (`TuneTask.pretrained`) is `ModelTuner`, from
    scratch (`options` are then the model tuner's defaults)."""
    try:
        cls = TUNERS[name]
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; available: {', '.join(TUNERS)}") from None
    if cls is PretrainedTuner and "model" not in options and task.pretrained() is None:
        return ModelTuner(task, space, seed=seed)
    return cls(task, space, seed=seed, **options)
