"""Per-unit busy/wait timeline of a cycle-accurate run, and its Chrome/Perfetto trace.

The cycle-accurate backend records every change of the accelerator's 32-bit STATE word
(bit meanings: `vdla.isa.registers.STATE_BITS`) as rows ``[cycle, state]``: the first row,
at cycle 0, holds the state at the start of the run, and each later row the state from
its cycle on, until the next row or the end of the run. `Timeline` turns these rows into
intervals of each bit, labels the busy intervals of load, compute and store with the
instruction they executed, and writes a trace that ui.perfetto.dev or chrome://tracing
shows as one track per unit: where the modules overlap (latency hiding) and what each
waits on.

Labelling rests on two properties of the hardware: each module executes the
instructions routed to it (`vdla.isa.Insn.module`) in program order, and its busy bit
drops for at least one cycle between two instructions. So the k-th busy interval of a
module is the k-th instruction routed to it.

Intervals are half-open, ``[start, end)`` in cycles: ``end - start`` cycles long.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from vdla._fileio import atomic_write
from vdla.isa import Insn, format_insn
from vdla.isa.registers import STATE_BITS

__all__ = ["Timeline", "UNITS"]

#: The units with a busy bit, in the order of their trace tracks.
UNITS = ("fetch", "load", "compute", "store")

#: Longest instruction text in a label; the full text stays in the trace's args.
_LABEL_TEXT_MAX = 60

_PID = 1  # the one trace process, "vdla accelerator"


#: STATE bit name -> bit position.
_BITS = {name: bit for name, (bit, _) in STATE_BITS.items()}


def _wait_owner(name: str) -> tuple[str, str] | None:
    """(unit that waits, track title) of a ``wait_*`` STATE bit; None for other bits.

    ``wait_token_P_C``: C waits for a token from P. ``wait_space_P_C``: P waits for room
    in the P->C queue. ``wait_space_M_cmd``: fetch waits for room in M's command queue.
    """
    parts = name.split("_")
    if len(parts) != 4 or parts[0] != "wait" or parts[1] not in ("token", "space"):
        return None
    _, kind, producer, consumer = parts
    if consumer == "cmd":
        return "fetch", f"wait {producer} cmd space"
    return (consumer if kind == "token" else producer), f"wait {producer}->{consumer} {kind}"


def _as_int(value, what: str) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an integer, not {value!r}")
    return int(value)


class Timeline:
    """What each unit of the accelerator did in every cycle of one run.

    Parameters
    ----------
    changes : array of shape (N, 2), integers (the backend gives uint64)
        Rows ``[cycle, state]`` in strictly increasing cycle order; the first row is at
        cycle 0 and holds the initial state. `state` is the 32-bit STATE word.
    end_cycle : int
        The cycle the run finished (the last state lasts until then).
    insns : sequence of `vdla.isa.Insn`, optional
        The program, in program order, to label busy and wait intervals.
    clock_mhz : float
        Clock used to turn cycles into trace time.

    Raises ValueError (or TypeError) for malformed input, and ValueError when `insns`
    routes fewer instructions to a module than it has busy intervals (not the program
    that ran).
    """

    def __init__(self, changes, end_cycle: int, *, insns: Sequence[Insn] | None = None,
                 clock_mhz: float = 100.0):
        array = np.asarray(changes)
        if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
            raise ValueError(f"changes must have shape (N, 2) with N >= 1 (rows [cycle, "
                             f"state], the first at cycle 0), not {array.shape}")
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"changes must hold integers, not {array.dtype}")
        if array.min() < 0 or array[:, 1].max() > 0xFFFF_FFFF:
            raise ValueError("changes hold negative values or states wider than 32 bits")
        self.changes = array.astype(np.uint64)
        self.changes.setflags(write=False)
        cycles = self.changes[:, 0].astype(np.int64)
        if cycles[0] != 0:
            raise ValueError(f"the first row of changes must be the initial state at cycle 0, "
                             f"not at cycle {cycles[0]}")
        unsorted = np.flatnonzero(np.diff(cycles) <= 0)
        if len(unsorted):
            row = int(unsorted[0]) + 1
            raise ValueError(f"the cycles of changes must increase strictly: row {row} is at "
                             f"cycle {cycles[row]}, after cycle {cycles[row - 1]}")
        self.end_cycle = _as_int(end_cycle, "end_cycle")
        if self.end_cycle < cycles[-1]:
            raise ValueError(f"end_cycle {self.end_cycle} is before the last change "
                             f"(cycle {cycles[-1]})")
        if (isinstance(clock_mhz, bool) or not isinstance(clock_mhz, (int, float))
                or not math.isfinite(clock_mhz) or clock_mhz <= 0):
            raise ValueError(f"clock_mhz must be a positive number, not {clock_mhz!r}")
        self.clock_mhz = float(clock_mhz)
        self._states = self.changes[:, 1].astype(np.int64)
        self._starts = cycles
        # Row i's state lasts from cycle starts[i] for durations[i] cycles.
        self._durations = np.diff(np.append(cycles, self.end_cycle))

        self._busy_ends: dict[str, list[int]] = {}  # unit -> end cycles of its busy intervals
        self._texts: dict[Insn, str] = {}  # format_insn is slow; programs repeat instructions
        self.insns: tuple[Insn, ...] | None = None
        self._routed: dict[str, list[int]] = {}  # module -> program indices routed to it
        if insns is not None:
            self.insns = tuple(insns)
            self._routed = {unit: [] for unit in UNITS[1:]}
            for index, insn in enumerate(self.insns):
                if not isinstance(insn, Insn):
                    raise TypeError(f"insns[{index}] is not a vdla.isa instruction: {insn!r}")
                self._routed[insn.module.value].append(index)
            for unit, routed in self._routed.items():
                busy = len(self._ends_of_busy(unit))
                if busy > len(routed):
                    raise ValueError(f"the timeline has {busy} {unit} busy intervals but insns "
                                     f"routes only {len(routed)} instructions to {unit}: "
                                     "insns is not the program that ran")

    # --- queries -------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"<Timeline {self.end_cycle} cycles, {len(self.changes)} state changes, "
                f"{self.clock_mhz:g} MHz>")

    def intervals(self, unit: str, bit_name: str | None = None) -> list[tuple[int, int, str]]:
        """``(start_cycle, end_cycle, label)`` of every interval in which `bit_name` is set.

        `bit_name` is any `STATE_BITS` name; by default `unit`'s busy bit. `unit` names
        whose instructions label the intervals: an interval is labelled with the
        instruction `unit` is executing when it starts or, when idle, the next one it
        executes (a module waits for a token before it starts an instruction, and for room
        in a token queue while it pushes). A label is ``"INDEX: ASSEMBLY"`` (the program
        index and the shortened text); empty without `insns` and for fetch.
        """
        self._check_unit(unit)
        spans = self._bit_intervals(f"{unit}_busy" if bit_name is None else bit_name)
        return [(start, end, self._label(unit, start)[0]) for start, end in spans]

    def busy_cycles(self, unit: str) -> int:
        """Cycles `unit` was busy."""
        self._check_unit(unit)
        return self.bit_cycles(f"{unit}_busy")

    def bit_cycles(self, bit_name: str) -> int:
        """Cycles in which STATE bit `bit_name` was set."""
        return int(self._durations[self._bit_mask(bit_name)].sum())

    def overlap_cycles(self, a: str, b: str) -> int:
        """Cycles in which units `a` and `b` were both busy: the latency the decoupled
        modules hide (load under compute, store under compute, ...)."""
        self._check_unit(a)
        self._check_unit(b)
        both = self._bit_mask(f"{a}_busy") & self._bit_mask(f"{b}_busy")
        return int(self._durations[both].sum())

    # --- trace -----------------------------------------------------------------------------

    def to_chrome_trace(self) -> dict:
        """The timeline as Chrome/Perfetto trace-event JSON (a dict ready for `json.dump`).

        One process, "vdla accelerator"; one track per unit with a complete event
        (``"ph": "X"``) per busy interval, named by its instruction; below each unit a
        track per kind of wait that occurred (e.g. "compute wait load->compute token");
        and a counter track with the four token queues' non-empty bits. Times are in
        microseconds at `clock_mhz`; each event's args give the cycles.
        """
        events = [{"name": "process_name", "ph": "M", "ts": 0, "pid": _PID, "tid": 0,
                   "args": {"name": "vdla accelerator"}}]
        tid = 0

        def track(title: str):
            nonlocal tid
            tid += 1
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": _PID, "tid": tid,
                           "args": {"name": title}})
            events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": _PID,
                           "tid": tid, "args": {"sort_index": tid}})
            return tid

        waits_of = {unit: [] for unit in UNITS}
        for name in _BITS:
            owner = _wait_owner(name)
            if owner is not None:
                waits_of[owner[0]].append((name, owner[1]))
        for unit in UNITS:
            unit_tid = track(unit)
            for start, end in self._bit_intervals(f"{unit}_busy"):
                events.append(self._slice(unit, start, end, unit_tid, "busy", f"{unit} busy"))
            for name, title in waits_of[unit]:
                spans = self._bit_intervals(name)
                if spans:
                    wait_tid = track(f"{unit} {title}")
                    for start, end in spans:
                        events.append(self._slice(unit, start, end, wait_tid, "wait", title))
        events.extend(self._token_counters())
        return {
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "source": "vdla cycle-accurate simulator",
                "clock_mhz": self.clock_mhz,
                "cycles": self.end_cycle,
                "busy_cycles": {unit: self.busy_cycles(unit) for unit in UNITS},
            },
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write `to_chrome_trace` as JSON to `path`, atomically; returns the path."""
        text = json.dumps(self.to_chrome_trace(), separators=(",", ":"))
        return atomic_write(path, text.encode())

    # --- internals -------------------------------------------------------------------------

    @staticmethod
    def _check_unit(unit: str):
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r}; units: {', '.join(UNITS)}")

    def _bit_mask(self, bit_name: str) -> np.ndarray:
        """Per row of changes: whether `bit_name` is set."""
        if bit_name not in _BITS:
            raise ValueError(f"unknown STATE bit {bit_name!r}; bits: {', '.join(_BITS)}")
        return ((self._states >> _BITS[bit_name]) & 1).astype(bool)

    def _bit_intervals(self, bit_name: str) -> list[tuple[int, int]]:
        """Maximal non-empty ``[start, end)`` cycle ranges in which `bit_name` is set."""
        on = self._bit_mask(bit_name)
        on &= self._durations > 0  # a last change at end_cycle lasts no cycle
        edges = np.diff(np.concatenate(([0], on.astype(np.int8), [0])))
        first_rows = np.flatnonzero(edges == 1)
        last_rows = np.flatnonzero(edges == -1) - 1
        ends = self._starts[last_rows] + self._durations[last_rows]
        return [(int(s), int(e)) for s, e in zip(self._starts[first_rows], ends)]

    def _ends_of_busy(self, unit: str) -> list[int]:
        """End cycles of `unit`'s busy intervals, in order (cached)."""
        if unit not in self._busy_ends:
            self._busy_ends[unit] = [end for _, end in self._bit_intervals(f"{unit}_busy")]
        return self._busy_ends[unit]

    def _insn_text(self, index: int) -> str:
        """Assembly text of program instruction `index`."""
        insn = self.insns[index]
        if insn not in self._texts:
            self._texts[insn] = format_insn(insn)
        return self._texts[insn]

    def _label(self, unit: str, cycle: int) -> tuple[str, int | None]:
        """(label, program index) of the instruction `unit` executes at `cycle`, or the
        next one it will execute: the k-th routed to it, k = busy intervals ended by then."""
        routed = self._routed.get(unit)
        if not routed:
            return "", None
        k = bisect.bisect_right(self._ends_of_busy(unit), cycle)
        if k >= len(routed):
            return "", None
        index = routed[k]
        text = self._insn_text(index)
        if len(text) > _LABEL_TEXT_MAX:
            text = text[:_LABEL_TEXT_MAX - 3] + "..."
        return f"{index}: {text}", index

    def _us(self, cycles: int) -> float:
        return cycles / self.clock_mhz

    def _slice(self, unit: str, start: int, end: int, tid: int, category: str,
               fallback_name: str) -> dict:
        """A complete event for `[start, end)` on track `tid`."""
        label, index = self._label(unit, start)
        args = {"start_cycle": start, "end_cycle": end, "cycles": end - start}
        if index is not None:
            args["insn_index"] = index
            args["insn"] = self._insn_text(index)
        name = label if category == "busy" and label else fallback_name
        return {"name": name, "cat": category, "ph": "X", "ts": self._us(start),
                "dur": self._us(end - start), "pid": _PID, "tid": tid, "args": args}

    def _token_counters(self) -> list[dict]:
        """Counter events: which token queues hold a token, at each change and at the end."""
        queues = {}
        for name in _BITS:
            if name.startswith("tokens_"):
                producer, consumer = name[len("tokens_"):].split("_")
                queues[f"{producer}->{consumer}"] = self._bit_mask(name)
        word = np.zeros(len(self._starts), dtype=np.int64)
        for position, mask in enumerate(queues.values()):
            word |= mask.astype(np.int64) << position
        rows = np.flatnonzero(np.diff(word, prepend=-1))
        events = [self._counter(int(self._starts[row]),
                                {queue: int(mask[row]) for queue, mask in queues.items()})
                  for row in rows]
        if self.end_cycle > self._starts[-1]:
            events.append(self._counter(self.end_cycle, events[-1]["args"]))
        return events

    def _counter(self, cycle: int, values: dict) -> dict:
        return {"name": "token queues non-empty", "ph": "C", "ts": self._us(cycle),
                "pid": _PID, "tid": 0, "args": values}
