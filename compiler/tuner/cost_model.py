"""A cost model learned across tasks and platforms, kept as plain arrays.

    model = CostModel.fit(rows, feature_set)          # rows: `rows.training_rows`
    model.predict(x)                                  # log2 cost, lower is faster
    model.save("model.npz"); CostModel.load("model.npz", feature_set)

The learner is scikit-learn's gradient-boosted regression trees on the rows' log2 costs.
Its trees are stored as their documented arrays (``tree_.children_left`` and
``children_right``, ``feature``, ``threshold``, ``value``) in a NumPy ``.npz`` file, with
the feature set's name, version and fingerprint, and evaluated with NumPy: a model file
is data, never code (no pickle), so one found on a path cannot run anything, and a file
for another feature set is refused with both versions named.

A target ships its pretrained models as package data, one file a feature set named by
`file_name` (``vdla.conv2d-v1.npz``); `shipped` loads one the first time a tuner or the
pretrained chooser asks for it, and `digest` names a model's contents (what a remembered
choice is keyed on).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from vdla._fileio import atomic_write

__all__ = ["CostModel", "FORMAT", "file_name", "shipped"]

#: The file format's version: bump when the arrays a file holds change meaning.
FORMAT = 1


#: Rows `CostModel.predict` walks the trees with at once.
_CHUNK = 2048


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Regression trees summed: ``base + rate * sum(tree(x))``, each tree as parallel
    arrays over its nodes (`left`, `right`: child indices, -1 at a leaf; `feature`,
    `threshold`: go left when ``x[feature] <= threshold``; `value`: a leaf's output),
    concatenated with `offsets` (the first node of each tree). `meta` says what it was
    trained on and for which feature set."""

    base: float
    rate: float
    offsets: np.ndarray
    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    meta: dict

    #: The feature set it reads, and whether the trees correct its `baseline`.
    feature_set: Any = None
    residual: bool = False

    @classmethod
    def fit(cls, rows, feature_set, *, trees: int = 200, depth: int = 4,
            rate: float = 0.1, seed: int = 0, residual: bool = False,
            meta: dict | None = None) -> "CostModel":
        """Gradient-boosted trees fitted to `rows` (`rows.Rows` of `feature_set`). With
        `residual`, they learn what the feature set's `baseline` (the target's own model)
        gets wrong, and predict its estimate corrected."""
        if rows.feature_names != feature_set.names:
            raise ValueError(f"the rows' features are not {feature_set.name} "
                             f"v{feature_set.version}'s")
        if len(rows) < 2:
            raise ValueError(f"{len(rows)} rows: too few to learn from")
        # heavy: scikit-learn, only to train
        from sklearn.ensemble import GradientBoostingRegressor

        learner = GradientBoostingRegressor(n_estimators=trees, max_depth=depth,
                                            learning_rate=rate, random_state=seed)
        if residual and not feature_set.baseline:
            raise ValueError(f"feature set {feature_set.name} has no baseline to correct")
        prior = feature_set.baseline_of(rows.x) if residual else 0.0
        learner.fit(rows.x, rows.y - prior)
        parts = [est.tree_ for est in learner.estimators_[:, 0]]
        sizes = [t.node_count for t in parts]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return cls(
            base=float(np.ravel(learner.init_.predict(rows.x[:1]))[0]), rate=float(rate),
            offsets=offsets,
            left=np.concatenate([t.children_left for t in parts]).astype(np.int64),
            right=np.concatenate([t.children_right for t in parts]).astype(np.int64),
            feature=np.concatenate([t.feature for t in parts]).astype(np.int64),
            threshold=np.concatenate([t.threshold for t in parts]).astype(np.float64),
            value=np.concatenate([t.value[:, 0, 0] for t in parts]).astype(np.float64),
            feature_set=feature_set, residual=bool(residual),
            meta={"format": FORMAT, "features": feature_set.name, "residual": bool(residual),
                  "version": feature_set.version, "fingerprint": feature_set.fingerprint(),
                  "rows": len(rows), "tasks": len(rows.tasks), **(meta or {})})

    @functools.cached_property
    def digest(self) -> str:
        """A short hash of the model's arrays and metadata: two models with the same
        digest predict the same."""
        h = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode())
        h.update(np.float64([self.base, self.rate]).tobytes())
        for a in (self.offsets, self.left, self.right, self.feature, self.threshold,
                  self.value):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """log2 cost of each row of `x` (features in the feature set's order)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        out = np.full(len(x), self.base)
        if self.residual:
            out += self.feature_set.baseline_of(x)
        # Every tree at once, a level a step: a call costs the trees' depth in numpy
        # operations, not their count times it (a search ranks a few hundred schedules a
        # call, where a tree at a time took 40 ms). Rows go in chunks to bound memory.
        for at in range(0, len(x), _CHUNK):
            part = x[at:at + _CHUNK]
            rows = np.arange(len(part))[:, None]
            node = np.broadcast_to(self.offsets, (len(part), len(self.offsets))).copy()
            while True:
                leaf = self.left[node] < 0
                if leaf.all():
                    break
                go_left = part[rows, self.feature[node]] <= self.threshold[node]
                step = np.where(go_left, self.left[node], self.right[node]) + self.offsets
                node = np.where(leaf, node, step)
            leaves = self.value[node]
            for t in range(leaves.shape[1]):     # tree by tree: the sum as it always was
                out[at:at + _CHUNK] += self.rate * leaves[:, t]
        return out

    def save(self, path: str | Path) -> None:
        """Write the model as an ``.npz`` of arrays and its metadata as JSON text."""
        buffer = io.BytesIO()
        np.savez_compressed(buffer, base=self.base, rate=self.rate, offsets=self.offsets,
                            left=self.left, right=self.right, feature=self.feature,
                            threshold=self.threshold, value=self.value,
                            meta=np.array(json.dumps(self.meta, sort_keys=True)))
        atomic_write(Path(path), buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path, feature_set) -> "CostModel":
        """The model at `path`, for `feature_set`. ValueError naming the difference when
        the file is of another format, feature set, version or set of names."""
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            want = {"format": FORMAT, "features": feature_set.name,
                    "version": feature_set.version, "fingerprint": feature_set.fingerprint()}
            wrong = {k: (meta.get(k), v) for k, v in want.items() if meta.get(k) != v}
            if wrong:
                raise ValueError(f"{path}: a cost model for another feature set (" + "; ".join(
                    f"{k} {got!r}, this vdla's {need!r}" for k, (got, need) in wrong.items())
                    + ")")
            return cls(base=float(data["base"]), rate=float(data["rate"]),
                       offsets=data["offsets"], left=data["left"], right=data["right"],
                       feature=data["feature"], threshold=data["threshold"],
                       value=data["value"], meta=meta,
                       feature_set=feature_set, residual=bool(meta.get("residual")))


def file_name(feature_set) -> str:
    """The file a model of `feature_set` is shipped as: ``<name>-v<version>.npz``."""
    return f"{feature_set.name}-v{feature_set.version}.npz"


@functools.cache
def shipped(folder: Path, feature_set) -> CostModel | None:
    """The model of `feature_set` shipped in `folder` (`file_name`), loaded once per
    process; None when the folder has none. A file for another version of the features
    is an error (`CostModel.load`): the package was built from mismatched files."""
    path = Path(folder) / file_name(feature_set)
    if not path.is_file():
        return None
    return CostModel.load(path, feature_set)
