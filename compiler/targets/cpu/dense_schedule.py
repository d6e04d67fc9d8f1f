"""Dense layers' schedules on the CPU target: the knobs, their checks, the default chooser
and the space the tuner searches (`vdla.compiler.targets.cpu.dense` runs them).

A `DenseSchedule` has its vectors along output features: ``vl`` lanes, ``ov`` vectors of
outputs in registers, ``unroll`` of the reduction loop, ``parallel``. It shares the
register budget (`schedule.MAX_TILE`), the knob checks and `schedule.knobs_from_dict`
with the convolutions' schedules.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.schedule import (MAX_TILE, SERIAL_MACS, UNROLLS, ScheduleError,
                                                SpaceBlock, check_int, knobs_from_dict)

__all__ = ["DenseSchedule", "choose_dense", "dense_blocks", "dense_space"]


@dataclasses.dataclass(frozen=True)
class DenseSchedule:
    """A dense layer's loop nest: ``vl`` lanes along output features, ``ov`` vectors of
    outputs in registers, ``unroll`` of the reduction loop, ``parallel``: "all" (output
    tiles over the threads) or "none"."""

    vl: int
    ov: int
    unroll: int = 1
    parallel: str = "all"

    def check(self, dense, isa: Isa) -> "DenseSchedule":
        if self.vl not in isa.lanes:
            raise ScheduleError(f"schedule knob vl={self.vl!r} is not a vector width of "
                                f"the {isa.name} code: allowed {list(isa.lanes)}")
        check_int("ov", self.ov, 1, MAX_TILE[isa.registers])
        if self.unroll not in UNROLLS:
            raise ScheduleError(f"schedule knob unroll={self.unroll!r}: allowed "
                                f"{list(UNROLLS)}")
        if self.parallel not in ("all", "none"):
            raise ScheduleError(f"schedule knob parallel={self.parallel!r}: allowed "
                                "['all', 'none']")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DenseSchedule":
        return knobs_from_dict(cls, data, "dense")


def choose_dense(dense, isa: Isa, costs: MachineCosts = NOMINAL) -> DenseSchedule:
    """Four output vectors a step for one row (a batch-1 layer reads each weight once);
    with several rows (a transformer's tokens) a register tile of rows by two (16
    registers: 6 x 2) or four (32: 6 x 4) vectors, `dense.row_tile`'s rows; vectors of
    the width `costs` (the machine) runs fastest (`MachineCosts.vector_lanes`)."""
    vl = costs.vector_lanes(isa.lanes)
    ov = 4 if dense.n < 4 or isa.registers >= 32 else 2
    return DenseSchedule(vl, max(1, min(ov, -(-dense.o // vl))), 1,
                         "none" if dense.macs < SERIAL_MACS else "all")


def dense_space(dense, isa: Isa) -> Iterator[DenseSchedule]:
    for fixed, axes in dense_blocks(dense, isa):
        for unroll, parallel in itertools.product(*(v for _, v in axes)):
            yield DenseSchedule(**fixed, unroll=unroll, parallel=parallel)


def dense_blocks(dense, isa: Isa) -> list[SpaceBlock]:
    """`dense_space` as products (`conv_blocks`): a register tile crossed with the
    reduction's unrolls and the split."""
    return [({"vl": vl, "ov": ov}, (("unroll", UNROLLS), ("parallel", ("all", "none"))))
            for vl in isa.lanes for ov in range(1, 9)
            if not (ov > 1 and (ov - 1) * vl >= dense.o)]
