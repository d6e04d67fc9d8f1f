"""Feature sets for cost models that learn across layers, configs and targets.

A task's own `TuneTask.features` serve the from-scratch tuner (`ModelTuner`), which
learns one task at a time: the knobs and their waste are enough there. A model trained
on many tasks, configs and platforms needs features whose meaning does not change from
one to the next: sizes as logarithms, footprints as fractions of the buffer they fill,
the hardware's parameters among the inputs. A `FeatureSet` names them, says what each
one is, and has a version, so that a trained model can refuse vectors of another.

    from vdla.compiler.targets.vdla.features import CONV2D
    vector = CONV2D.vector(conv2d_values(layer, schedule, config, estimate))

Changing what a feature means, or adding, removing or reordering features, makes a new
version: `FeatureSet.fingerprint` (the names in order) is pinned by the tests next to
`version`, so a change that forgets the version fails them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Mapping

import numpy as np

__all__ = ["Feature", "FeatureSet", "log2"]


@dataclasses.dataclass(frozen=True)
class Feature:
    """One input of a cost model: `name` (unique in its set) and `doc`, what it is."""

    name: str
    doc: str


@dataclasses.dataclass(frozen=True)
class FeatureSet:
    """The ordered features of one kind of task (`name`, e.g. ``vdla.conv2d``) at one
    `version`. `baseline` names features whose sum is a prior estimate of the log2 cost
    (the target's own model), which a learned model may start from and correct.
    `baseline_vetoes` says that estimate ranks a task's schedules well enough to overrule
    its learned correction: the pretrained chooser then keeps the default schedule where
    the baseline has it faster than the model's pick (`pretrained_chooser.pretrained_choice`)."""

    name: str
    version: int
    features: tuple[Feature, ...]
    baseline: tuple[str, ...] = ()
    baseline_vetoes: bool = False

    def __post_init__(self):
        names = [f.name for f in self.features]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"feature set {self.name}: features named twice: {dupes}")
        unknown = [n for n in self.baseline if n not in names]
        if unknown:
            raise ValueError(f"feature set {self.name}: baseline features not in it: {unknown}")
        if self.baseline_vetoes and not self.baseline:
            raise ValueError(f"feature set {self.name}: baseline_vetoes without a baseline")
        undocumented = [f.name for f in self.features if not f.doc.strip()]
        if undocumented:
            raise ValueError(f"feature set {self.name}: features without a doc: {undocumented}")

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        # Cached: a tuner asks for it once per schedule of a space.
        return tuple(f.name for f in self.features)

    def baseline_of(self, x: np.ndarray) -> np.ndarray:
        """The baseline estimate of each row of `x` (zeros without a baseline)."""
        x = np.atleast_2d(x)
        return sum((x[:, self.names.index(n)] for n in self.baseline), np.zeros(len(x)))

    def fingerprint(self) -> str:
        """A short hash of the names in order: what a trained model checks besides the
        version."""
        return hashlib.sha256("\n".join(self.names).encode()).hexdigest()[:12]

    def vector(self, values: Mapping[str, float]) -> np.ndarray:
        """`values` (name -> value) in the set's order as float64. ValueError names the
        features missing from `values`, those it has that the set lacks, and any value
        that is not a finite number."""
        missing = [n for n in self.names if n not in values]
        extra = sorted(set(values) - set(self.names))
        if missing or extra:
            raise ValueError(f"feature set {self.name} v{self.version}: "
                             + "; ".join(filter(None, [
                                 f"missing {missing}" if missing else "",
                                 f"not in the set {extra}" if extra else ""])))
        out = np.array([float(values[n]) for n in self.names], dtype=np.float64)
        bad = [n for n, v in zip(self.names, out) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"feature set {self.name} v{self.version}: values that are not "
                             f"finite: {', '.join(f'{n}={values[n]!r}' for n in bad)}")
        return out

    def table(self) -> str:
        """The features as a Markdown table (name, what it is), for the docs."""
        rows = [f"| `{f.name}` | {f.doc} |" for f in self.features]
        return "\n".join(["| feature | what it is |", "|---|---|", *rows])


def log2(value: float) -> float:
    """log2 of a size, with 0 for sizes below 1 (an absent buffer, no work)."""
    return math.log2(value) if value >= 1 else 0.0
