"""What a measurement is: a (task, schedule) in, a status and a cost out.

`MeasureInput` pairs a task (`vdla.compiler.tuner.task.TuneTask`) with one of its
schedules; `MeasureResult` is what came back, whatever the target: ``ok`` and the cost
(accelerator cycles, or nanoseconds for a target that measures wall time: the task's
``unit``), or the reason it failed. `MeasureResult.record` turns it into the row the
records keep.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vdla.compiler.tuner.records import OK, Record

__all__ = ["MeasureInput", "MeasureResult"]


@dataclasses.dataclass(frozen=True)
class MeasureInput:
    """task : a `TuneTask`; schedule : one of its schedules (`TuneTask.space`)."""

    task: Any
    schedule: Any


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """status : ``ok`` or why not (`vdla.compiler.tuner.records.STATUSES`)
    cycles : the measured cost when ok, in the task's unit (accelerator cycles; wall-time
        targets: nanoseconds)
    counters : the target's own figures (the accelerator's counters; the timing model's
        parts in the fast mode)
    error : what went wrong, one line
    seconds : wall time of the measurement"""

    status: str
    cycles: int | None = None
    counters: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def record(self, inp: MeasureInput, backend: str) -> Record:
        """The records row of this result for `inp` measured on `backend`."""
        task = inp.task
        return Record(target=task.target, workload=task.key, config=task.platform,
                      backend=backend, schedule=task.schedule_to_dict(inp.schedule),
                      cycles=self.cycles, status=self.status, counters=self.counters,
                      error=self.error, seconds=self.seconds)


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most 2000 characters, for a result's error."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
