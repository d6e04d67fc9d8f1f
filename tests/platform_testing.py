"""Pretend to be another machine: the CPU name vdla reads (`vdla._platform.cpu_name`)
replaced for one test, so that a test of something measured elsewhere (the committed
training sets, measured on an AMD EPYC) shows it does not depend on the machine that
runs it."""

from __future__ import annotations

from vdla import _platform

#: A CPU name that none of the committed training sets names.
FOREIGN_CPU = "Intel(R) Xeon(R) Platinum 8480+"


def pretend_cpu(monkeypatch, name: str) -> None:
    """`cpu_name()` returns `name` until `monkeypatch` undoes it, in every module that
    imported it, before or after (it reads the name through `_read_cpu_name`)."""
    monkeypatch.setattr(_platform, "_read_cpu_name", lambda: name)
