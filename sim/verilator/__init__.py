"""Cycle-accurate simulation of the accelerator's Verilog with Verilator.

- `build_model` (``build.py``) turns `vdla.hw`'s Verilog of a config and the C++ harness
  (``harness.cpp``: DRAM model, AXI4-Lite host, run loop, watchdog) into a shared
  library, cached on disk across processes;
- `VerilatorModel` (``binding.py``) is the ctypes binding of one model instance;
- `VerilatorSimulator` (here) runs programs on it with the functional simulator's
  contract: the same statistics names where they mean the same, the same errors
  (`vdla.sim.ProgramError`, and `vdla.sim.WatchdogError`, a `DeadlockError` with the same
  `waits`, for a program that hangs).

Most users reach it through ``vdla.runtime.open(config, backend="verilator")``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from vdla.config import HardwareConfig
from vdla.isa import Module, format_insn
from vdla.isa.registers import COUNTERS, STATE_BITS
from vdla.sim.errors import TOKEN_QUEUES, ProgramError, Wait, WatchdogError
from vdla.sim.protocol import MODULES, fetch_program, route_program
from vdla.sim.timeline import Timeline
from vdla.sim.validate import DEFAULT_MAX_CYCLES, Plan, ProgramValidator
from vdla.sim.verilator.binding import DramTiming, RunResult, RunStatus, VerilatorModel
from vdla._buildcache import CACHE_ENV, cache_root
from vdla.sim.verilator.build import WAVEFORM_FORMATS, BuildError, ModelBuild, build_model

__all__ = ["VerilatorSimulator", "VerilatorModel", "DramTiming", "RunResult", "RunStatus",
           "build_model", "ModelBuild", "BuildError", "cache_root", "CACHE_ENV",
           "WAVEFORM_FORMATS", "DEFAULT_MAX_CYCLES", "STALL_CYCLES"]

#: A run is stalled when every unit waits and STATE has not changed for this many cycles
#: with DRAM idle. Far longer than any pipeline or handshake latency in the design.
STALL_CYCLES = 4096


def _queue_key(queue: str) -> str:
    """"load->compute" -> "load_compute" (the STATE bit names)."""
    return queue.replace("->", "_")


class VerilatorSimulator:
    """Runs programs on the Verilated accelerator of `config`.

    Parameters
    ----------
    config : HardwareConfig
    dram_size : int
        Bytes of DRAM.
    timing : DramTiming
        The DRAM model (defaults: docs/tool-facts.md, the simulated DRAM, at the config's
        `dram_bytes_per_cycle`).
    waveform : path, optional
        Dump a waveform of the whole session there (``.vcd``, or ``.fst`` where the lz4
        headers exist); the model is built with tracing, which makes it slower.
    cache : path, optional
        Build cache folder (default ``$VDLA_CACHE`` or ``~/.cache/vdla``).
    log : callable, optional
        Receives progress lines while the model builds.
    gemm_arithmetic : "native" (default), "wide" or "packed"
        The form of the GEMM core to simulate (`vdla.hw.compute.GemmArithmetic`): the
        same results in the same cycles; "native" is the fastest model, "wide" the
        fastest in plain Verilog, "packed" the netlist `vdla verilog` writes for boards
        (tests run programs on all three).
    optimise : "O3", "lto" or "pgo", optional
        How hard the model's build optimises (`build_model`; default
        ``$VDLA_VERILATOR_OPTIMISE``, else "pgo").
    library : path, optional
        A model library of `config` to load as it is, instead of building one (the
        profile-guided build's training run loads its instrumented build so).
    """

    def __init__(self, config: HardwareConfig, dram_size: int, *,
                 timing: DramTiming | None = None, waveform: str | os.PathLike | None = None,
                 cache: str | os.PathLike | None = None, log=None,
                 gemm_arithmetic: str = "native", optimise: str | None = None,
                 library: str | os.PathLike | None = None):
        self.config = config
        if timing is None:   # the DRAM the compiler planned for (the config's bandwidth)
            timing = DramTiming(bytes_per_cycle=config.dram_bytes_per_cycle)
        if not isinstance(timing, DramTiming):
            raise TypeError(f"timing must be a DramTiming, not {timing!r}")
        fmt = None
        if waveform is not None:
            fmt = os.fspath(waveform).rsplit(".", 1)[-1].lower()
            if fmt not in WAVEFORM_FORMATS:
                raise ValueError(f"waveform file {os.fspath(waveform)!r} must end in "
                                 f"{' or '.join('.' + f for f in WAVEFORM_FORMATS)}")
        if library is not None:
            if fmt is not None:
                raise ValueError("a waveform needs a traced build; a given library is "
                                 "loaded as it is")
            self.build = ModelBuild(Path(library), "given", False, 0.0, None)
        else:
            self.build = build_model(config, waveform=fmt, cache=cache, log=log,
                                     gemm_arithmetic=gemm_arithmetic, optimise=optimise)
        self.model = VerilatorModel(self.build.library, COUNTERS, dram_size=dram_size,
                                    timing=timing, waveform=waveform)
        self.dram = self.model.dram
        self._bits = {name: 1 << bit for name, (bit, _) in STATE_BITS.items()}
        self.validator = ProgramValidator(config, read_latency=timing.read_latency,
                                          write_latency=timing.write_latency,
                                          bytes_per_cycle=timing.bytes_per_cycle)
        self.timeline = None
        self.plan: Plan | None = None

    def close(self):
        self.model.close()

    def run_from_dram(self, insn_addr: int, insn_count: int, *,
                      max_cycles: int | None = None, timeline: bool = False,
                      validate: bool = True) -> dict:
        """Run `insn_count` instructions at DRAM byte address `insn_addr` to FINISH.

        Returns every hardware counter (`vdla.isa.registers.COUNTERS`: ``cycles`` from start
        to done, busy and stall cycles, ``load_insns`` & co.) plus ``wall_seconds``. With
        `timeline`, `self.timeline` becomes the run's `vdla.sim.timeline.Timeline`.

        The program is validated first (`vdla.sim.validate`, the checks every backend
        makes), so an invalid program raises the functional simulator's error before it
        runs: `ProgramError` (a stream that does not decode, a meaningless flag, an index
        or address out of range, no FINISH, work or tokens left at FINISH),
        `DeadlockError`, or `vdla.sim.validate.BudgetError` for work that cannot fit in
        `max_cycles`. The run's budget is `max_cycles`, or by default a generous multiple
        of the program's estimated cycles (`Plan.budget`). What validation cannot see is
        the watchdog's: `WatchdogError` for a run that stalls or exceeds its budget (the
        message names the budget and how to raise it), `ProgramError` for a bus error or a
        FINISH the hardware raised early. After an error the accelerator is reset, so the
        simulator stays usable. `validate` False skips validation (the default budget is
        then `DEFAULT_MAX_CYCLES`): for checking the hardware's own watchdog.
        """
        if max_cycles is not None and (isinstance(max_cycles, bool)
                                       or not isinstance(max_cycles, int) or max_cycles < 1):
            raise ValueError(f"max_cycles must be a positive integer, not {max_cycles!r}")
        insns = fetch_program(self.dram, insn_addr, insn_count, self.config)
        routes = route_program(insns)
        plan: Plan | None = None
        self.plan = None   # the last run's validation Plan (its estimate and budget)
        if validate:
            plan = self.validator.validate(insns, self.dram, insn_addr=int(insn_addr),
                                           max_cycles=max_cycles)
            budget = plan.budget
            self.plan = plan
        else:
            budget = DEFAULT_MAX_CYCLES if max_cycles is None else max_cycles
        start = time.perf_counter()
        result = self.model.run(int(insn_addr), int(insn_count), max_cycles=budget,
                                stall_cycles=STALL_CYCLES, timeline=timeline)
        wall = time.perf_counter() - start
        if timeline:
            self.timeline = Timeline(self.model.last_timeline, result.cycles, insns=insns,
                                     clock_mhz=self.config.clock_mhz)
        try:
            self._check(result, insns, routes, plan)
        except BaseException:
            self.model.reset()
            raise
        stats = dict(result.counters)
        stats["wall_seconds"] = wall
        return stats

    # --- turning a stopped run into the errors of vdla.sim -----------------------------------

    def _has(self, state: int, name: str) -> bool:
        return bool(state & self._bits[name])

    def _heads(self, result: RunResult, insns, routes) -> dict[Module, int | None]:
        """The program index of the instruction at the head of each module's queue."""
        heads = {}
        for module in MODULES:
            done = result.counters[f"{module.value}_insns"]
            mine = [i for i, r in enumerate(routes) if r[0] == module]
            pending = self._has(result.state, f"{module.value}_pending")
            heads[module] = mine[done] if pending and done < len(mine) else None
        return heads

    def _waits(self, result: RunResult, insns, routes) -> tuple[list[Wait], list[str]]:
        """What each unit waits on (in the functional simulator's order) and what still
        executes, from the STATE word and the instruction counters."""
        state = result.state
        waits, busy = [], []
        for module, index in self._heads(result, insns, routes).items():
            if index is None:
                continue
            _, pops, pushes = routes[index]
            text = format_insn(insns[index])
            blocked = False
            for queue in pops:
                if self._has(state, f"wait_token_{_queue_key(queue)}"):
                    waits.append(Wait(module.value, index, queue, "token", text))
                    blocked = True
            for queue in pushes:
                if self._has(state, f"wait_space_{_queue_key(queue)}"):
                    waits.append(Wait(module.value, index, queue, "space", text))
                    blocked = True
            if not blocked and self._has(state, f"{module.value}_busy"):
                busy.append(f"{module.value} at instruction {index} ({text})")
        fetched = result.counters["fetched_insns"]
        if fetched < len(insns):
            target = routes[fetched][0]
            if self._has(state, f"wait_space_{target.value}_cmd"):
                waits.append(Wait("fetch", fetched, f"{target.value} command", "space",
                                  format_insn(insns[fetched])))
        return waits, busy

    def _check(self, result: RunResult, insns, routes, plan: Plan | None):
        status = result.status
        if status == RunStatus.DONE:
            self._check_finished(result, insns, routes)
            return
        if status == RunStatus.BUS_ERROR:
            waits, busy = self._waits(result, insns, routes)
            where = "; ".join(busy + [str(w) for w in waits])
            raise ProgramError(f"{result.error} after {result.cycles} cycles"
                               + (f" ({where})" if where else ""))
        if status == RunStatus.HOST_ERROR:
            raise ProgramError(f"the accelerator's control port stopped answering: "
                               f"{result.error}")
        waits, busy = self._waits(result, insns, routes)
        stalled = status == RunStatus.STALLED
        if stalled and not waits and not busy:
            # Everything ran and went idle without FINISH raising done.
            raise ProgramError(f"the program's {len(insns)} instructions ran without a "
                               "FINISH; end it with FINISH")
        detail = ""
        if not stalled:
            detail = (plan.budget_note() if plan is not None else
                      f"budget {result.cycles:,} cycles; raise it with max_cycles= "
                      "(vdla sim --max-cycles) if the program really needs longer")
        raise WatchdogError(waits, cycles=result.cycles, stalled=stalled, busy=busy,
                            detail=detail)

    def _check_finished(self, result: RunResult, insns, routes):
        """FINISH raised done: like the functional simulator, insist that nothing else is
        left (instructions still to fetch or execute, tokens in the queues)."""
        state = result.state
        finish = sum(result.counters[f"{m.value}_insns"] for m in MODULES) - 1
        heads = self._heads(result, insns, routes)
        pending = sorted(i for i in heads.values() if i is not None)
        busy = [m.value for m in MODULES if self._has(state, f"{m.value}_busy")]
        fetched = result.counters["fetched_insns"]
        if pending or busy or fetched < len(insns):
            first = pending[0] if pending else fetched if fetched < len(insns) else None
            what = (f"instruction {first} ({format_insn(insns[first])}) had not"
                    if first is not None else f"the {busy[0]} module was still busy")
            raise ProgramError(
                f"FINISH ran while {what}: the host would see done before that work; "
                "order it before FINISH with dependency tokens")
        left = [q for q in TOKEN_QUEUES if self._has(state, f"tokens_{_queue_key(q)}")]
        if left:
            raise ProgramError(
                f"the program finished with tokens left in the queues ({', '.join(left)}); "
                "the hardware keeps them and the next program would pop them: every push "
                "needs a pop", finish if finish >= 0 else None)
