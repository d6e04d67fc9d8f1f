"""What one model's tasks teach a pretrained cost model together.

A pretrained model that never saw the machine (or config) it tunes for is wrong there in
ways its tasks share: on an instruction set it was not trained on, a register tile or a
loop order it rates well may be slow on every layer alike. One task's handful of
measurements cannot teach that (a model's 64 trials over 19 tasks give each three or
four); all the tasks' measurements together can. So the pretrained tuners of one tuning
run share a `SharedCorrection`, as Ansor fits one cost model to every task of a model:

    shared = SharedCorrection()
    tuners = [PretrainedTuner(task, space, shared=shared) for task in tasks]

Each tuner hands it its measurements' residuals (measured log2 cost minus the pretrained
prediction) on the feature set's features, which mean the same on every task; the shared
correction is gradient-boosted trees fitted to all of them, one per feature set (a
model's convolutions teach each other, not its dense layers). Each tuner then fits its
own correction to what the shared one leaves (`PretrainedTuner`), so what is particular
to its task still bends its ranking.

The fit is deterministic: it depends only on the residuals handed in, ordered by the
tuners' order of joining, never on timing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SharedCorrection", "correction_trees"]


def correction_trees(x: np.ndarray, y: np.ndarray, *, seed: int):
    """Gradient-boosted trees fitted to residuals `y` on features `x`: shallow and shrunk,
    so that a handful of measurements bend the pretrained ranking near them rather than
    replace what it learned from thousands of rows."""
    # heavy: scikit-learn, only once measurements come in
    from sklearn.ensemble import GradientBoostingRegressor

    fix = GradientBoostingRegressor(n_estimators=40, max_depth=2, learning_rate=0.1,
                                    random_state=seed)
    fix.fit(x, y)
    return fix


class SharedCorrection:
    """The residuals of every pretrained tuner of one tuning run, and the trees fitted to
    them, per feature set (see the module docstring).

    min_rows : residuals (over all tasks of a feature set) before a correction is fitted
    seed : seeds the trees
    """

    def __init__(self, *, min_rows: int = 3, seed: int = 0):
        if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
            raise ValueError(f"min_rows must be a positive integer, not {min_rows!r}")
        self.min_rows, self.seed = min_rows, int(seed)
        self._rows: dict[tuple, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
        self._versions: dict[tuple, int] = {}
        self._fitted: dict[tuple, tuple[int, object]] = {}

    @staticmethod
    def _key(feature_set) -> tuple:
        return (feature_set.name, feature_set.version)

    def join(self, feature_set) -> int:
        """A new tuner's token for `teach` (its place among the feature set's tuners)."""
        rows = self._rows.setdefault(self._key(feature_set), {})
        token = len(rows)
        rows[token] = (np.zeros((0, len(feature_set.names))), np.zeros(0))
        return token

    def teach(self, feature_set, token: int, x: np.ndarray, residuals: np.ndarray) -> None:
        """Tuner `token`'s residuals now (they replace what it taught before: a tuner's
        residuals are all its measurements so far)."""
        key = self._key(feature_set)
        x = np.asarray(x, dtype=np.float64)
        residuals = np.asarray(residuals, dtype=np.float64)
        if x.shape != (len(residuals), len(feature_set.names)):
            raise ValueError(f"{len(residuals)} residuals with features of shape {x.shape}: "
                             f"want ({len(residuals)}, {len(feature_set.names)})")
        self._rows[key][token] = (x, residuals)
        self._versions[key] = self._versions.get(key, 0) + 1

    def version(self, feature_set) -> int:
        """How many times the feature set's residuals changed: a tuner refits when it
        changed since its last fit."""
        return self._versions.get(self._key(feature_set), 0)

    def rows(self, feature_set) -> int:
        """The residuals held for the feature set."""
        return sum(len(r) for _, r in self._rows.get(self._key(feature_set), {}).values())

    def correction(self, feature_set):
        """The trees fitted to every tuner's residuals of `feature_set` (fitted once per
        `version`), or None while fewer than `min_rows` are held."""
        key = self._key(feature_set)
        version = self.version(feature_set)
        fitted = self._fitted.get(key)
        if fitted is not None and fitted[0] == version:
            return fitted[1]
        held = [self._rows[key][t] for t in sorted(self._rows.get(key, {}))]
        fix = None
        if sum(len(r) for _, r in held) >= self.min_rows:
            fix = correction_trees(np.concatenate([x for x, _ in held]),
                                   np.concatenate([r for _, r in held]), seed=self.seed)
        self._fitted[key] = (version, fix)
        return fix
