"""Errors every vdla simulator raises, so callers handle one set whatever the backend."""

from __future__ import annotations

import dataclasses

__all__ = ["SimError", "ProgramError", "DeadlockError", "WatchdogError", "Wait", "TOKEN_QUEUES"]

#: The four dependency-token queues: name -> (producer module, consumer module).
TOKEN_QUEUES = {
    "load->compute": ("load", "compute"),
    "compute->load": ("compute", "load"),
    "compute->store": ("compute", "store"),
    "store->compute": ("store", "compute"),
}


class SimError(RuntimeError):
    """Base class of simulation errors."""


class ProgramError(SimError):
    """The program is invalid: an index or address out of range, a meaningless flag, ...

    `insn_index` is the index of the offending instruction in the stream (or None).
    """

    def __init__(self, message: str, insn_index: int | None = None):
        super().__init__(message)
        self.insn_index = insn_index


@dataclasses.dataclass(frozen=True)
class Wait:
    """What one blocked unit (fetch or a module) waits on when a program deadlocks.

    `unit` is "fetch", "load", "compute" or "store"; `insn_index` the instruction it is
    stuck at; `queue` the token queue (see `TOKEN_QUEUES`) or command queue it waits on;
    `reason` is "token" (the queue is empty) or "space" (the queue is full).
    """

    unit: str
    insn_index: int
    queue: str
    reason: str
    insn_text: str = ""

    def __str__(self) -> str:
        what = ("a token on the" if self.reason == "token" else "space in the")
        text = f" ({self.insn_text})" if self.insn_text else ""
        return f"{self.unit} waits at instruction {self.insn_index}{text} for {what} {self.queue} queue"


class DeadlockError(SimError):
    """No unit can make progress and the program has not finished.

    `waits` lists what each blocked unit waits on (module, instruction index, queue).
    """

    def __init__(self, waits: list[Wait], detail: str = ""):
        self.waits = list(waits)
        lines = "; ".join(str(w) for w in self.waits) or "no unit is blocked"
        super().__init__(f"deadlock: {lines}{'. ' + detail if detail else ''}")


class WatchdogError(DeadlockError):
    """A cycle-accurate run stopped by its watchdog.

    Either every unit with work waited on a token or on room in a queue and nothing moved
    for a while (`stalled` True: a deadlock, which is why this is a `DeadlockError`), or
    the run used up its cycle budget while still moving (`stalled` False: raise the
    budget, or look for a program that loops far longer than meant).

    `waits` lists what each blocked unit waited on (as `DeadlockError.waits`, so the two
    backends report the same list for the same program); `busy` names the instructions
    still executing; `cycles` is how long the run went on.
    """

    def __init__(self, waits: list[Wait], *, cycles: int, stalled: bool, busy: list[str] = (),
                 detail: str = ""):
        super().__init__(waits)
        self.cycles = cycles
        self.stalled = stalled
        self.busy = list(busy)
        what = (f"nothing moved for the last cycles of a {cycles}-cycle run (deadlock)"
                if stalled else f"the program did not finish within {cycles} cycles")
        parts = [str(w) for w in self.waits] + [f"{b} is still executing" for b in self.busy]
        message = f"watchdog: {what}: " + ("; ".join(parts) or "no unit is blocked")
        if detail:
            message += f". {detail}"
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]
