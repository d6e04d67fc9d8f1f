"""Program validation: what every backend checks before it runs a program, in one place.

A program that cannot complete fails here, before any simulator (or, later, a board)
spends time on it, with the same error whatever the backend:

- a flag naming a neighbour the module does not have (`vdla.sim.protocol.route`);
- an SRAM index past its buffer (LOAD, STORE, and every index a GEMM or ALU loop nest
  reaches, from the micro-ops it will find in the uop buffer), a DRAM access past the
  end of DRAM, an ALU op the config leaves out, a padded LOAD of micro-ops;
- a STORE over the program's own instructions or micro-ops (fetch and the uop loads
  read them while the program runs, so the outcome would depend on timing);
- the token protocol: the walk below is the functional model's scheduling (fetch in
  order into command queues of ``cmd_queue_depth``, each module in order, popping and
  pushing token queues of ``token_queue_depth``), so a deadlock is reported with what
  every blocked unit waits on, and FINISH with work or tokens left is an error;
- work past the cycle budget: a loop nest of 10^11 micro-ops is valid ISA, but no run
  should silently spend hours on it (`BudgetError`, before it starts).

The walk also yields the order the functional simulator executes instructions in (a
`Plan`), so it does not schedule twice, and an estimate of the program's cycles that sets
a cycle-accurate run's default budget: `Plan.budget` is a generous multiple of the
program's own work, so a run that goes far past it is reported in seconds, naming the
budget and how to raise it, instead of looking like a hang.

The validator keeps the uop buffer's micro-ops across programs (the SRAMs keep their
contents between runs, on the hardware and in every simulator), committed only when a
program validates.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import numpy as np

from vdla.config import HardwareConfig
from vdla.extensions import insn_bits
from vdla.isa import (INSN_BYTES, Alu, Finish, Gemm, Insn, Load, MemoryType, Store,
                      format_insn, lacked_op, memory_geometry)
from vdla.sim.errors import DeadlockError, ProgramError, Wait
from vdla.sim.protocol import MODULES, route_program

__all__ = ["BudgetError", "Plan", "ProgramValidator", "DEFAULT_MAX_CYCLES", "BUDGET_MARGIN",
           "BUDGET_SLACK", "decode_uops"]

#: The largest budget a run gets unless its caller names one: 20 s of accelerator time at
#: 100 MHz, far beyond any single program vdla builds. A program whose work cannot fit
#: is refused before it runs (`BudgetError`).
DEFAULT_MAX_CYCLES = 2_000_000_000
#: A run's default budget is this multiple of the program's estimated cycles ...
BUDGET_MARGIN = 4
#: ... plus this many cycles (start-up, and room for tiny programs).
BUDGET_SLACK = 100_000

# Cycle-estimate constants (an upper bound per instruction, summed as if nothing
# overlapped; `bench/validate.py` prints measured cycles against it): the pipeline fill
# and drain of one instruction, and a DMA row's turnaround beyond the DRAM latency.
_INSN_CYCLES = 16
_ROW_CYCLES = 8


class BudgetError(ProgramError):
    """The program's work cannot fit in the cycle budget (checked before it runs).

    `minimum` is a lower bound of its cycles, `budget` the budget it was checked against.
    """

    def __init__(self, message: str, insn_index: int | None, *, minimum: int, budget: int):
        super().__init__(message, insn_index)
        self.minimum, self.budget = minimum, budget


@dataclasses.dataclass(frozen=True)
class Plan:
    """What validating a program found.

    order : program indices in the order the functional model executes them, ending
        with FINISH
    module_insns : instructions executed per module ("load", "compute", "store")
    estimate : an upper bound of the program's cycles (every instruction's worst case,
        as if none overlapped)
    minimum : a lower bound of its cycles (compute issues at most one micro-op per cycle;
        each DRAM direction moves at most its bandwidth)
    budget : the cycle budget the run gets: the caller's, or a multiple of `estimate`
    default_budget : whether `budget` was derived from the program (not given)
    """

    order: tuple[int, ...]
    module_insns: dict
    estimate: int
    minimum: int
    budget: int
    default_budget: bool

    @property
    def finish(self) -> int:
        return self.order[-1]

    def budget_note(self) -> str:
        """How the budget was set and how to raise it (for a run that went past it)."""
        if self.default_budget:
            how = (f"the default budget: {BUDGET_MARGIN}x the program's estimated "
                   f"{self.estimate:,} cycles + {BUDGET_SLACK:,}, at most "
                   f"{DEFAULT_MAX_CYCLES:,}")
        else:
            how = "the budget given"
        return (f"budget {self.budget:,} cycles ({how}); raise it with max_cycles= "
                "(vdla sim --max-cycles) if the program really needs longer")


def decode_uops(raw: np.ndarray, config: HardwareConfig) -> tuple[np.ndarray, ...]:
    """(dst, src, wgt) index arrays of micro-ops stored as `raw` bytes (n, uop_bytes)."""
    c = config
    words = (raw.view("<u4") if c.uop_bytes == 4 else raw.view("<u8"))[:, 0].astype(np.int64)
    dst = words & ((1 << c.uop_dst_bits) - 1)
    src = (words >> c.uop_dst_bits) & ((1 << c.uop_src_bits) - 1)
    wgt = (words >> (c.uop_dst_bits + c.uop_src_bits)) & ((1 << c.uop_wgt_bits) - 1)
    return dst, src, wgt


class _Invalid(Exception):
    """An instruction's own problem; turned into a ProgramError naming it."""


class ProgramValidator:
    """Validates programs for one accelerator, keeping its uop buffer's micro-ops.

    Parameters
    ----------
    config : HardwareConfig
    read_latency, write_latency, bytes_per_cycle : the DRAM timing the cycle estimate
        assumes (`vdla.sim.verilator.DramTiming`'s defaults unless a backend says)
    """

    def __init__(self, config: HardwareConfig, *, read_latency: int = 32,
                 write_latency: int = 16, bytes_per_cycle: float = 8.0):
        self.config = config
        self.read_latency, self.write_latency = read_latency, write_latency
        # One bus beat per cycle at most, however fast the DRAM.
        self.bytes_per_cycle = min(float(bytes_per_cycle), config.dram_bus_width / 8)
        c = config
        geometry = memory_geometry(c)
        self._elem_bytes = {mem: size for mem, (size, _) in geometry.items()}
        self._depths = {mem: depth for mem, (_, depth) in geometry.items()}
        # The uop buffer as the hardware holds it between programs (zero after reset).
        self.uops = tuple(np.zeros(c.uop_depth, dtype=np.int64) for _ in range(3))

    # --- the walk -----------------------------------------------------------------------

    def validate(self, insns: Sequence[Insn], dram: np.ndarray, *, insn_addr: int | None = None,
                 max_cycles: int | None = None, dram_base: int = 0) -> Plan:
        """Check `insns` (to run over `dram`, fetched from byte `insn_addr` when known)
        and return its `Plan`; raise `ProgramError` (`BudgetError` for work past
        `max_cycles`, or past `DEFAULT_MAX_CYCLES` when None) or `DeadlockError`.
        `dram_base` is the bus address of `dram`'s first byte: a board's DMA region sits
        at its physical address, and the program addresses it there (0 in a simulator)."""
        if max_cycles is not None and (isinstance(max_cycles, bool) or not isinstance(
                max_cycles, (int, np.integer)) or max_cycles < 1):
            raise ValueError(f"max_cycles must be a positive integer, not {max_cycles!r}")
        insns = list(insns)
        routes = route_program(insns)
        self._dram, self._base = dram, int(dram_base)
        try:
            return self._walk(insns, routes, insn_addr, max_cycles)
        finally:   # per-run state: nothing of a run (its DRAM) outlives it
            self._dram = self._shadow = self._work = self._protected = None
            self._reaches = {}

    def _walk(self, insns, routes, insn_addr, max_cycles) -> Plan:
        c = self.config
        self._protected = self._protected_spans(insns, insn_addr)
        self._shadow = tuple(a.copy() for a in self.uops)
        self._reaches: dict[tuple[int, int, int], int] = {}
        self._work = collections.Counter()
        self._heaviest = (None, 0, None)  # (index, micro-op cycles, insn) of the longest loop
        queues = {m: collections.deque() for m in MODULES}
        tokens = dict.fromkeys(("load->compute", "compute->load", "compute->store",
                                "store->compute"), 0)
        order, executed = [], collections.Counter()
        fetched = 0
        while True:
            progress = False
            while fetched < len(insns):
                module = routes[fetched][0]
                if len(queues[module]) >= c.cmd_queue_depth:
                    break
                queues[module].append(fetched)
                fetched += 1
                progress = True
            for module in MODULES:
                queue = queues[module]
                while queue:
                    index = queue[0]
                    _, pops, pushes = routes[index]
                    if any(tokens[q] == 0 for q in pops) or any(
                            tokens[q] >= c.token_queue_depth for q in pushes):
                        break
                    for q in pops:
                        tokens[q] -= 1
                    insn = insns[index]
                    self._check(index, insn)
                    order.append(index)
                    executed[module.value] += 1
                    for q in pushes:
                        tokens[q] += 1
                    queue.popleft()
                    progress = True
                    if isinstance(insn, Finish):
                        self._check_finished(index, insns, fetched, queues, tokens)
                        plan = self._plan(order, executed, max_cycles)
                        self.uops = self._shadow
                        return plan
            if not progress:
                if fetched == len(insns) and not any(queues.values()):
                    raise ProgramError(f"the program's {len(insns)} instructions ran without "
                                       "a FINISH; end it with FINISH")
                raise DeadlockError(self._waits(insns, routes, fetched, queues, tokens))

    def _check_finished(self, index, insns, fetched, queues, tokens):
        pending = sorted(i for q in queues.values() for i in q)
        if fetched < len(insns) or pending:
            first = pending[0] if pending else fetched
            raise ProgramError(
                f"FINISH (instruction {index}) ran while instruction {first} "
                f"({format_insn(insns[first])}) had not: the host would see done before "
                "that work; order it before FINISH with dependency tokens", index)
        left = {q: n for q, n in tokens.items() if n}
        if left:
            desc = ", ".join(f"{n} on {q}" for q, n in left.items())
            raise ProgramError(
                f"the program finished with tokens left in the queues ({desc}); the hardware "
                "keeps them and the next program would pop them: every push needs a pop", index)

    def _waits(self, insns, routes, fetched, queues, tokens) -> list[Wait]:
        c = self.config
        waits = []
        for module in MODULES:
            if not queues[module]:
                continue
            index = queues[module][0]
            _, pops, pushes = routes[index]
            text = format_insn(insns[index])
            for q in pops:
                if tokens[q] == 0:
                    waits.append(Wait(module.value, index, q, "token", text))
            for q in pushes:
                if tokens[q] >= c.token_queue_depth:
                    waits.append(Wait(module.value, index, q, "space", text))
        if fetched < len(insns):
            module = routes[fetched][0]
            waits.append(Wait("fetch", fetched, f"{module.value} command", "space",
                              format_insn(insns[fetched])))
        return waits

    # --- work and budget ----------------------------------------------------------------

    def _plan(self, order, executed, max_cycles) -> Plan:
        w = self._work
        count = len(order)
        fetch = math.ceil(count * INSN_BYTES / self.bytes_per_cycle) + self.read_latency * (
            count // 4 + 1)
        estimate = int(w["estimate"]) + fetch + _INSN_CYCLES * count
        minimum = int(max(w["uop_cycles"],
                          (w["read_bytes"] + count * INSN_BYTES) / self.bytes_per_cycle,
                          w["write_bytes"] / self.bytes_per_cycle))
        default = max_cycles is None
        budget = (min(DEFAULT_MAX_CYCLES, BUDGET_MARGIN * estimate + BUDGET_SLACK) if default
                  else int(max_cycles))
        if minimum > budget:
            index, cycles, insn = self._heaviest
            culprit = (f"; instruction {index} ({format_insn(insn)}) alone issues {cycles:,} "
                       "micro-ops, most likely a wrong iter_out/iter_in or uop range"
                       if index is not None and cycles * 2 > minimum else "")
            raise BudgetError(
                f"the program needs at least {minimum:,} cycles, past the cycle budget of "
                f"{budget:,}" + (f" (at most {DEFAULT_MAX_CYCLES:,} unless given)" if default
                                 else "") + culprit +
                "; if the work is meant, pass a larger max_cycles= (vdla sim --max-cycles)",
                index, minimum=minimum, budget=budget)
        return Plan(tuple(order), dict(executed), estimate, minimum, budget, default)

    def _dma_cycles(self, insn, latency: int) -> int:
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        elem = self._elem_bytes[insn.memory_type]
        beats = max(1, math.ceil(elem * 8 / self.config.dram_bus_width))
        data = insn.y_size * insn.x_size * elem
        return (insn.y_size * (latency + _ROW_CYCLES) + math.ceil(data / self.bytes_per_cycle)
                + rows * width * beats)

    # --- one instruction ----------------------------------------------------------------

    def _check(self, index: int, insn: Insn):
        try:
            if isinstance(insn, Load):
                self._load(insn)
            elif isinstance(insn, Store):
                self._store(insn)
            elif isinstance(insn, (Gemm, Alu)):
                self._loop(index, insn)
        except _Invalid as exc:
            raise ProgramError(f"instruction {index} ({format_insn(insn)}): {exc}", index) from None

    def _dram_span(self, insn, what: str) -> tuple[int, int]:
        """The DRAM byte range [begin, end) of a 2-D LOAD or STORE, range-checked."""
        elem = self._elem_bytes[insn.memory_type]
        count = (self._base + len(self._dram)) // elem
        last = insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size - 1
        if last >= count:
            raise _Invalid(
                f"{what} DRAM elements {insn.dram_base}..{last} of {elem} bytes (byte "
                f"{insn.dram_base * elem:#x}..{(last + 1) * elem - 1:#x}) past the end of "
                f"DRAM ({self._base + len(self._dram):#x} bytes)")
        if insn.dram_base * elem < self._base:
            raise _Invalid(
                f"{what} DRAM byte {insn.dram_base * elem:#x}, below the DRAM the device "
                f"holds ({self._base:#x}..{self._base + len(self._dram) - 1:#x})")
        return insn.dram_base * elem, (last + 1) * elem

    def _load(self, insn: Load):
        if insn.x_size == 0:
            return  # a dependency-only no-op
        mem = insn.memory_type
        if lacked_op(insn, self.config) is not None:
            raise _Invalid(f"a LOAD of TAB needs the ALU's table (TAB in alu_ops), which "
                           f"this config lacks ({', '.join(sorted(op.name for op in self.config.alu_ops))})")
        padded = insn.y_pad_0 or insn.y_pad_1 or insn.x_pad_0 or insn.x_pad_1
        if mem == MemoryType.UOP and padded:
            raise _Invalid("a LOAD of UOP cannot pad (a zero micro-op is not padding)")
        if mem == MemoryType.TAB and padded:
            raise _Invalid("a LOAD of TAB cannot pad (it moves table entries as they are)")
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        end = insn.sram_base + rows * width
        if end > self._depths[mem]:
            raise _Invalid(f"writes {mem.name} SRAM elements {insn.sram_base}..{end - 1}, "
                           f"past its depth {self._depths[mem]}")
        if insn.y_size:
            self._dram_span(insn, "reads")
        if mem == MemoryType.UOP and insn.y_size:
            elem = self._elem_bytes[mem]
            view = self._dram[:len(self._dram) // elem * elem].reshape(-1, elem)
            rows_at = insn.dram_base - self._base // elem + insn.x_stride * np.arange(
                insn.y_size, dtype=np.int64)
            raw = view[(rows_at[:, None] + np.arange(insn.x_size, dtype=np.int64)).reshape(-1)]
            for field, values in zip(self._shadow, decode_uops(raw, self.config)):
                field[insn.sram_base:end] = values
            self._reaches.clear()
        self._work["estimate"] += self._dma_cycles(insn, self.read_latency)
        self._work["read_bytes"] += insn.y_size * insn.x_size * self._elem_bytes[mem]

    def _store(self, insn: Store):
        if insn.x_size == 0 or insn.y_size == 0:
            return  # nothing to write (stores have no padding)
        if insn.y_size > 1 and insn.x_stride < insn.x_size:
            raise _Invalid(f"x_stride {insn.x_stride} < x_size {insn.x_size}: stored rows "
                           "would overlap in DRAM")
        end = insn.sram_base + insn.y_size * insn.x_size
        if end > self.config.out_depth:
            raise _Invalid(f"reads OUT SRAM elements {insn.sram_base}..{end - 1}, past its "
                           f"depth {self.config.out_depth}")
        begin, stop = self._dram_span(insn, "writes")
        for what, (a, b) in self._protected:
            if begin < b and a < stop:
                raise _Invalid(f"writes DRAM bytes {begin:#x}..{stop - 1:#x}, over {what} "
                               f"({a:#x}..{b - 1:#x}), which the accelerator reads while the "
                               "program runs: a program must not overwrite its own "
                               "instructions or micro-ops")
        self._work["estimate"] += self._dma_cycles(insn, self.write_latency)
        self._work["write_bytes"] += insn.y_size * insn.x_size * self._elem_bytes[MemoryType.OUT]

    def _protected_spans(self, insns, insn_addr) -> list[tuple[str, tuple[int, int]]]:
        """DRAM byte ranges a STORE must not write: the instructions and every micro-op
        a LOAD of UOP reads (whole spans; strided gaps count, which costs nothing real)."""
        spans = []
        if insn_addr is not None:
            spans.append(("the program's instructions",
                          (insn_addr, insn_addr + len(insns) * INSN_BYTES)))
        elem = self._elem_bytes[MemoryType.UOP]
        for index, insn in enumerate(insns):
            if (isinstance(insn, Load) and insn.memory_type == MemoryType.UOP
                    and insn.x_size and insn.y_size):
                last = insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size
                spans.append((f"the micro-ops instruction {index} loads",
                              (insn.dram_base * elem, last * elem)))
        return spans

    def _reach(self, field: int, begin: int, end: int) -> int:
        """The largest value of micro-op field `field` (dst, src, wgt) over uop buffer
        entries [begin, end): remembered until the next LOAD of micro-ops (`_load`),
        since a program's loops mostly reuse a few ranges."""
        key = (field, begin, end)
        top = self._reaches.get(key)
        if top is None:
            top = self._reaches[key] = int(self._shadow[field][begin:end].max())
        return top

    def _loop(self, index: int, insn):
        c = self.config
        if isinstance(insn, Alu) and insn.alu_opcode not in c.alu_ops:
            raise _Invalid(f"ALU {insn.alu_opcode.name} is not in this config's alu_ops "
                           f"({', '.join(sorted(op.name for op in c.alu_ops))})")
        kind = "GEMM" if isinstance(insn, Gemm) else "ALU"
        for ext, bits in insn_bits(kind):   # an extension's bit (the GEMM's dw) it lacks
            if getattr(insn, bits.field, 0) and not ext.present(c):
                raise _Invalid(f"{kind} {bits.field} (the {ext.title}) is not implemented by "
                               f"this config (it needs {ext.needs()})")
        depths = self._depths   # (the config's depths are properties: computed per call)
        if insn.uop_end < insn.uop_bgn or insn.uop_end > depths[MemoryType.UOP]:
            raise _Invalid(f"micro-op range {insn.uop_bgn}..{insn.uop_end} is not inside "
                           f"the uop buffer (0..{depths[MemoryType.UOP]})")
        if not (insn.iter_out and insn.iter_in and insn.uop_end > insn.uop_bgn):
            return
        udst, usrc, uwgt = range(3)     # the micro-op fields, as `_reach` indexes them
        fields = {"dst": (udst, "dst", depths[MemoryType.ACC], "acc buffer")}
        reach = {"src": 0}   # rows read past src: the depthwise window's
        if isinstance(insn, Gemm):
            if not insn.reset_reg:
                fields["src"] = (usrc, "src", depths[MemoryType.INP], "inp buffer")
                fields["wgt"] = (uwgt, "wgt", depths[MemoryType.WGT], "wgt buffer")
            per_uop = 1
            if insn.dw and not insn.reset_reg:
                reach["src"] = c.dw_window_rows - 1
        else:
            vector = not insn.use_imm and not insn.reset_reg
            if vector:
                fields["src"] = (usrc, "src", depths[MemoryType.ACC], "acc buffer")
            per_uop = 2 if vector else 1  # a vector operand reads the acc buffer twice
        for name, (uop_field, prefix, depth, sram) in fields.items():
            top = (self._reach(uop_field, insn.uop_bgn, insn.uop_end)
                   + (insn.iter_out - 1) * getattr(insn, f"{prefix}_factor_out")
                   + (insn.iter_in - 1) * getattr(insn, f"{prefix}_factor_in")
                   + reach.get(name, 0))
            if top >= depth:
                raise _Invalid(f"{name} index reaches {top}, past the {sram} depth {depth}"
                               + (" (with the depthwise window's rows)" if reach.get(name) else ""))
        uops = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        if reach["src"]:   # the window's cycles: T·r for a pass's first micro-op, r later
            uops = insn.iter_out * insn.iter_in * c.dw_pass_cycles(insn.uop_end - insn.uop_bgn)
        self._work["uop_cycles"] += uops
        self._work["estimate"] += uops * per_uop
        if uops > self._heaviest[1]:
            self._heaviest = (index, uops, insn)
