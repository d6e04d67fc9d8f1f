"""The schedules of a task's space that a pretrained model ranks.

A space of a few thousand schedules is ranked whole: its features are computed once and
remembered (`space_features`, `space_predictions`). Some spaces are far larger:
the CPU target's register tiles, loop orders and cache tiles give a MobileNet-v1
pointwise layer 218,880 schedules, whose features take five seconds and 60 MB each, for
a ranking that only its top matters for. Such a space is ranked on a seeded sample of
`POOL` schedules, and the sample is widened around the model's best by hill climbing
on the knob grid (`TuneTask.knobs`: one step along one knob, as simulated annealing
moves in `ModelTuner`), in the spirit of Ansor's search, which mutates the cost model's
best programs rather than ranking a space it cannot enumerate:

    found = Candidates(task, model, space)
    found.climb(found.prior)              # the sample's best and their neighbours' best
    space[found.index[found.prior.argmin()]]

`PretrainedTuner` climbs again after each correction it learns from measurements, and
the pretrained chooser climbs once on the model's own predictions.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from vdla._memo import remembered_object
from vdla.compiler.tuner.space import KnobGrid, ProductSpace

__all__ = ["Candidates", "POOL", "memo_code", "memo_key", "remembered_rows",
           "remembered_space", "space_features", "space_predictions"]

#: A space larger than this is ranked on a sample of this many schedules and the
#: neighbourhoods of the sample's best (module docstring). 16,384 keeps every space of
#: the accelerator's layers whole (the largest hold a few thousand schedules).
POOL = 16384
#: Hill climbing widens around this many of the best-ranked candidates a round ...
CLIMB_TOP = 16
#: ... for at most this many rounds (it stops sooner when the best stay the same).
CLIMB_ROUNDS = 8


def memo_key(task, space: Sequence | None = None, **what) -> dict:
    """What a memo of `task` is keyed on besides its code (`memo_code`): the target, the
    platform (`TuneTask.platform_key`), the workload, the task's feature set (name,
    version, fingerprint) when it has one, the size of `space` when given, and `what`
    (the model's digest, a sample's size and seed, ...)."""
    key = {"target": task.target, "platform": task.platform_key(), "workload": task.key,
           **what}
    fs = task.feature_set
    if fs is not None:
        key["features"] = [fs.name, fs.version, fs.fingerprint()]
    if space is not None:
        key["schedules"] = len(space)
    return key


def memo_code(task, *code) -> tuple:
    """The code that a memo of `task` is keyed on (`vdla._memo`): this module's (the
    sampling, the climb), the task's class's (its space, timing model and features,
    reached through the task, not imported here) and `code` (a cost model, whose
    `predict` is reached the same way; the module of a rule built on these)."""
    return (__name__, task, *code)


def remembered_space(task) -> Sequence:
    """`task.space()`, remembered on disk (``cache_root()/features``) keyed on the task
    and its code (`memo_key`, `memo_code`): enumerating a convolution's thousands of
    tilings and checking each against the buffers takes a fifth of a second a layer,
    which a whole model's tuning run would pay before its first measurement. Tasks not
    `TuneTask.remembered_on_disk` compute it, and so do tasks whose space is cheap
    (`TuneTask.cheap_space`: the CPU's products of tiles, `space.ProductSpace`, made in
    microseconds and never listed)."""
    if not task.remembered_on_disk or task.cheap_space:
        return task.space()
    return list(remembered_object("features", "schedules", memo_key(task),
                                  lambda: tuple(task.space()), code=memo_code(task),
                                  check=lambda value: isinstance(value, tuple)))


def space_features(task, space: Sequence | None = None) -> np.ndarray:
    """The `feature_set` vectors of every schedule of `task`'s space (or of `space`, the
    task's space as a caller already has it), one row a schedule, remembered on disk
    (``cache_root()/features``) keyed on the task, its feature set and its code:
    computing them runs the target's timing model on every schedule, about a second per
    layer, and the pretrained tuner and the pretrained chooser both need them."""
    space = remembered_space(task) if space is None else space
    return _remembered(task, space, {}, lambda: _vectors(task, space),
                       (len(space), len(task.feature_set.names)), "space")


def space_predictions(task, model, space: Sequence | None = None) -> np.ndarray:
    """`model`'s log2 cost of every schedule of `task`'s space (`space_features`),
    remembered on disk as the features are, keyed on the model's digest too: a tuning
    run that starts from the same model on the same workload reads them back."""
    space = remembered_space(task) if space is None else space
    return _remembered(task, space, {"model": model.digest},
                       lambda: model.predict(space_features(task, space)), (len(space),),
                       "predictions", model)


def _vectors(task, schedules: Sequence) -> np.ndarray:
    """The `feature_set` vectors of `schedules`, one row each."""
    names = task.feature_set.names
    return np.array([task.feature_set.vector(task.transfer_features(s)) for s in schedules],
                    dtype=np.float64).reshape(len(schedules), len(names))


def _remembered(task, space: Sequence, what: dict, compute, shape, kind="candidates",
                *code):
    """`compute()` remembered on disk (``cache_root()/features``, as `kind`) keyed on
    the task, its feature set, the space's size and `what` (`memo_key`) and on the code
    of this module, the task and `code` (`memo_code`: a model whose predictions these
    are); an array of `shape`, or any value when `shape` is None. A task not
    `TuneTask.remembered_on_disk`, or without a feature set, computes it."""
    if not task.remembered_on_disk or task.feature_set is None:
        return compute()
    return remembered_object("features", kind, memo_key(task, space, **what), compute,
                             code=memo_code(task, *code),
                             check=lambda value: value is not None and (
                                 shape is None or getattr(value, "shape", None) == shape))


def remembered_rows(task, space: Sequence, what: dict, compute):
    """`compute()` for `task`'s `space`, remembered on disk with its features (keyed on
    the task, its feature set, its code, `compute`'s module's code and `what`): what a
    tuner derives from a whole space once and reads back in every later run (the
    from-scratch tuner's features)."""
    return _remembered(task, space, what, compute, None, "candidates", compute)


class Candidates:
    """The schedules of `space` that `model` ranks, with their features and the model's
    log2 cost (`prior`), one row each; `index` gives a row's space index, `row` the
    reverse.

    task : the `TuneTask` (its `feature_set` and `transfer_features`)
    model : a `CostModel` of the task's feature set
    space : the task's schedules
    pool : a space larger than this is sampled (module docstring)
    seed : seeds the sample
    """

    def __init__(self, task, model, space: Sequence, *, pool: int = POOL, seed: int = 0):
        self.task, self.model, self.space = task, model, space
        self.whole = len(space) <= pool
        self.grid = None   # the knob grid, made by the first climb
        if self.whole:
            self.index = np.arange(len(space), dtype=np.int64)
            self.features = space_features(task, space)
            self.prior = space_predictions(task, model, space)
        else:
            rng = np.random.default_rng(seed)
            self.index = np.sort(rng.choice(len(space), pool, replace=False)).astype(np.int64)
            self.features = _remembered(task, space, {"sample": [pool, seed]},
                                        lambda: self._features(self.index),
                                        (len(self.index), len(task.feature_set.names)))
            self.prior = _remembered(task, space, {"sample": [pool, seed],
                                                   "model": model.digest},
                                     lambda: model.predict(self.features), (pool,),
                                     "candidates", model)
        self.row = {int(i): r for r, i in enumerate(self.index)}

    def _features(self, indices) -> np.ndarray:
        return _vectors(self.task, [self.space[i] for i in indices])

    def _rank(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self._features(indices)
        return x, self.model.predict(x)

    def add(self, indices) -> np.ndarray:
        """Rank the schedules of `indices` (space indices) not ranked yet; their rows."""
        new = np.array(sorted({int(i) for i in indices} - self.row.keys()), dtype=np.int64)
        if len(new):
            x, prior = self._rank(new)
            start = len(self.index)
            self.index = np.concatenate([self.index, new])
            self.features = np.concatenate([self.features, x])
            self.prior = np.concatenate([self.prior, prior])
            self.row.update({int(i): start + k for k, i in enumerate(new)})
        return np.array([self.row[int(i)] for i in indices], dtype=np.int64)

    def climb(self, score: np.ndarray | Callable[[], np.ndarray], *,
              top: int = CLIMB_TOP, rounds: int = CLIMB_ROUNDS) -> None:
        """Widen a sampled space around its best: rank the knob-grid neighbours of the
        `top` rows with the lowest `score` (the log2 costs of every row, or a function
        that gives them for the rows as they now are), until the best `top` stay the
        same or `rounds` pass. A whole space has nothing to widen."""
        if self.whole:
            return
        if self.grid is None:    # a product space's grid lists nothing: nothing to keep
            self.grid = self.space.grid() if isinstance(self.space, ProductSpace) else \
                _remembered(self.task, self.space, {"grid": "knobs"},
                            lambda: KnobGrid(self.task, self.space), None)
        scores = score if callable(score) else (lambda: score)
        best = None
        for _ in range(rounds):
            values = scores()
            if len(values) < len(self.index):   # a fixed score: the new rows' priors
                values = np.concatenate([values, self.prior[len(values):]])
            lead = frozenset(int(self.index[r]) for r in np.argsort(values, kind="stable")[:top])
            if lead == best:
                return
            best = lead
            self.add(self.grid.neighbours(np.array(sorted(lead))))
