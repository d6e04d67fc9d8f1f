"""The CPU target's fixtures: a target on each instruction set this machine runs
(`cpu`), and one on the best (`best`), both on two threads."""

from __future__ import annotations

import pytest

from vdla.compiler import targets
from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu.build import machine_features

#: The instruction sets this machine runs, best first.
ISAS = [name for name, isa in cpu_isa.ISAS.items() if isa.runs_on(machine_features())]


@pytest.fixture(scope="module", params=ISAS)
def cpu(request):
    return targets.get("cpu", threads=2, isa=request.param)


@pytest.fixture(scope="module")
def best():
    return targets.get("cpu", threads=2)
