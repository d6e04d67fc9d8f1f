"""Counting fuzzed inputs, so the CI output says how much each fuzz target tried.

A fuzz test calls `count` once per input it feeds its target (inside the Hypothesis
test body, so every example, explicit or generated, is counted)::

    from fuzzing import count, fuzz_settings

    @fuzz_settings(examples=400)
    @given(st.binary())
    def test_importer(data):
        count("onnx importer")
        ...

At the end of the session pytest prints one line per run (tests/conftest.py holds the
hooks)::

    fuzzed inputs: HardwareConfig 500, onnx importer 400, programs (functional) 300

Under pytest-xdist each worker counts its own tests; the worker hands its counts to the
controller in ``config.workeroutput`` when it finishes, and the controller adds them up
(`merge`) before printing. Without xdist the process's own counts are printed.
"""

from __future__ import annotations

import collections
from typing import Mapping

from hypothesis import HealthCheck, settings

__all__ = ["WORKEROUTPUT_KEY", "count", "counts", "fuzz_settings", "merge", "summary"]

#: The key of a worker's counts in ``config.workeroutput``.
WORKEROUTPUT_KEY = "vdla_fuzz_counts"

_COUNTS: collections.Counter[str] = collections.Counter()


def count(target: str, n: int = 1) -> None:
    """Record that `n` more inputs were fed to fuzz target `target` (a short name that
    the summary prints, such as ``"onnx importer"`` or ``"programs (verilator)"``)."""
    if not isinstance(target, str) or not target:
        raise ValueError(f"a fuzz target is a non-empty name, not {target!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"a fuzz count is a non-negative integer, not {n!r}")
    _COUNTS[target] += n


def counts() -> dict[str, int]:
    """This process's counts so far (a worker's own, or the controller's merged ones)."""
    return dict(_COUNTS)


def merge(other: Mapping[str, int]) -> None:
    """Add another process's `counts` (a finished xdist worker's) to this one's."""
    for target, n in other.items():
        count(target, n)


def summary(found: Mapping[str, int]) -> str:
    """The summary line, targets in alphabetical order (workers finish in any order)."""
    return "fuzzed inputs: " + ", ".join(
        f"{target} {found[target]}" for target in sorted(found, key=str.lower))


def fuzz_settings(*, examples: int, **more) -> settings:
    """Hypothesis settings for a CI fuzz test: `examples` inputs, derandomized (the same
    inputs on every run, so CI time is bounded and a failure reproduces), no example
    database (nothing written into the checkout), no deadline (first calls import heavy
    modules); `more` overrides or adds settings."""
    options = dict(max_examples=examples, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    options.update(more)
    return settings(**options)
