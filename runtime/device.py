"""The device API: one interface for every backend (functional, Verilator; boards later).

    dev = vdla.runtime.open(config, backend="functional")
    a = dev.alloc(nbytes)            # DRAM byte address, aligned for every memory type
    dev.write(a, array_or_bytes)
    data = dev.read(a, nbytes)       # numpy uint8 array
    stats = dev.run(insn_addr, insn_count)

Every backend's statistics have the same keys (`STAT_KEYS`), so code written for one runs
on the other; a counter a backend cannot measure is None.
"""

from __future__ import annotations

import abc
import dataclasses
import sys
import time

import numpy as np

from vdla.config import AluOp, HardwareConfig
from vdla.extensions import EXTENSIONS, lacking_extensions
from vdla.isa import INSN_BYTES, Alu, Gemm, Program
from vdla.isa.registers import COUNTERS
from vdla.runtime.allocator import DramAllocator
from vdla.sim import FunctionalSimulator
from vdla.sim.counters import WORK_COUNTERS, work_counters
from vdla.sim.protocol import fetch_program
from vdla.sim.verilator import VerilatorSimulator

__all__ = ["Device", "FunctionalDevice", "VerilatorDevice", "open", "BACKENDS", "STAT_KEYS",
           "dram_alignment", "in_stat_order", 
           "program_mismatch"]

#: The keys of every backend's `Device.run` statistics: the program's counters, fixed by
#: its instructions (`vdla.sim.counters.WORK_COUNTERS`: instructions, DMA bytes, GEMM and
#: ALU micro-ops), the hardware's (`vdla.isa.registers.COUNTERS`: cycles, busy, stall and
#: active cycles; ``dram_bytes_*`` there are whole bus words) and ``wall_seconds``. The
#: functional simulator has no clock: its hardware-only counters are None.
STAT_KEYS = tuple(dict.fromkeys((*WORK_COUNTERS, *COUNTERS, "wall_seconds")))
#: Default DRAM size of a simulated device.
DEFAULT_DRAM_SIZE = 256 << 20


def dram_alignment(config: HardwareConfig) -> int:
    """Alignment of every allocation: a whole element of every memory type, a whole
    instruction and a whole bus word, so any buffer can hold any of them."""
    return max(config.uop_bytes, config.inp_elem_bytes, config.wgt_elem_bytes,
               config.acc_elem_bytes, config.out_elem_bytes, INSN_BYTES,
               config.dram_bus_width // 8)


def _as_bytes(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        array = data
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise TypeError(f"write() takes a numpy array or a bytes-like object, not "
                        f"{type(data).__name__}") from None


class Device(abc.ABC):
    """A (simulated or real) accelerator with its DRAM.

    Memory is managed by the host: `alloc` returns byte addresses aligned to
    `dram_alignment(config)`; reads and writes must stay inside allocated blocks.
    """

    backend: str = ""
    #: The bus address of DRAM offset 0: 0 on a simulator, a board's DMA region's
    #: physical address (`vdla.deploy.board_device.BoardDevice`), which its programs carry.
    base: int = 0

    def __init__(self, config: HardwareConfig, dram_size: int):
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"config must be a vdla.HardwareConfig, not {type(config).__name__}")
        if isinstance(dram_size, bool) or not isinstance(dram_size, int) or dram_size < (1 << 16):
            raise ValueError(f"dram_size must be an integer of at least 65536 bytes, not {dram_size!r}")
        self.config = config
        self.dram_size = dram_size
        self.allocator = DramAllocator(dram_size, alignment=dram_alignment(config))

    def alloc(self, nbytes: int) -> int:
        """Allocate `nbytes` of DRAM; returns the byte address."""
        return self.allocator.alloc(nbytes)

    def free(self, addr: int):
        self.allocator.free(addr)

    def _check_range(self, addr: int, nbytes: int, what: str):
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)):
            raise TypeError(f"{what} address must be an integer, not {addr!r}")
        if not self.allocator.contains(int(addr), nbytes):
            raise ValueError(f"{what} of {nbytes} bytes at {int(addr):#x} is not inside one "
                             "allocated DRAM block (use alloc() first)")

    def write(self, addr: int, data) -> None:
        """Copy a numpy array (any dtype, little-endian) or bytes into DRAM at `addr`."""
        raw = _as_bytes(data)
        self._check_range(addr, len(raw), "write")
        self._write(int(addr), raw)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """A copy of `nbytes` of DRAM at `addr`, as a uint8 array (use ``.view(dtype)``)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"read size must be a non-negative integer, not {nbytes!r}")
        self._check_range(addr, int(nbytes), "read")
        return self._read(int(addr), int(nbytes))

    def load_program(self, program: Program) -> tuple[int, int]:
        """Allocate DRAM for `program`'s instructions and write them; returns
        ``(insn_addr, insn_count)`` for `run`.

        program : a `vdla.isa.Program` encoded for this device's config
        Raises ValueError, before anything is written, for a program encoded for another
        config or with an ALU instruction this device's ALU lacks (`program_mismatch`
        says which extensions and instructions): such a program would not run as written.
        """
        problem = program_mismatch(program, self.config)
        if problem:
            raise ValueError(problem)
        stream = program.to_bytes()
        addr = self.alloc(len(stream))
        self.write(addr, stream)
        return addr, len(program)

    @abc.abstractmethod
    def run(self, insn_addr: int, insn_count: int) -> dict:
        """Run `insn_count` instructions from DRAM byte address `insn_addr` to FINISH.

        Returns statistics: a flat dict of numbers with the keys `STAT_KEYS` on every
        backend (None for a counter the backend cannot measure). Raises
        `vdla.sim.DeadlockError` or `vdla.sim.ProgramError` for a program that cannot
        complete.
        """

    # The simulators keep DRAM as a numpy uint8 array `self.dram`; a board overrides these.
    def _write(self, addr: int, raw: np.ndarray):
        self.dram[addr:addr + len(raw)] = raw

    def _read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.dram[addr:addr + nbytes].copy()

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def program_mismatch(program: Program, config: HardwareConfig) -> str:
    """Why `program` cannot run on a device of `config`, or "" when it can.

    program : the program to load
    config : the device's config
    A program runs only on the config it is encoded for: the ISA's field widths, the ALU
    ops and the extensions' semantics (`alu_hold`'s held operand, the depthwise window's
    taps) all follow from it. The reason names the extensions the program's config has
    and `config` lacks, the ALU instructions (by index) whose op `config` lacks, the
    instructions (by index) with an extension's bit (the dw GEMMs) when `config`'s
    extension differs, and any other parameter that differs.
    """
    pc = program.config
    missing_ops = _alu_uses(program, config)
    bit_uses = _bit_uses(program, config)
    if pc == config:
        # A Program built by hand may hold an op or an extension's bit (dw) its own
        # config lacks (it is checked only when encoded): name it before the encoder's
        # less specific refusal.
        if missing_ops:
            return (f"program has ALU instructions config {config.name} lacks: "
                    f"{missing_ops} (its ALU has "
                    f"{', '.join(op.name for op in sorted(config.alu_ops))})")
        for ext, bits, uses in bit_uses:
            return (f"program has {bits.layout}s with the {ext.title}'s {bits.field} bit, "
                    f"which config {config.name} lacks (it needs {ext.needs()}): {uses}")
        return ""
    text = f"program is encoded for config {pc.name}, the device has {config.name}"
    needed = lacking_extensions(pc, config)
    if needed:
        listed = ", ".join(f"{short} ({what})" for short, what in needed)
        text += f"; the program needs extension(s) {listed}, which config {config.name} lacks"
    uses = "; ".join(u for u in (missing_ops, *(u for _, _, u in bit_uses)) if u)
    if uses:
        text += f" (it uses {uses})"
    extra = [short for short, _ in lacking_extensions(config, pc)]
    if extra:
        text += f"; config {config.name} has extension(s) {', '.join(extra)}, which the " \
                "program's config lacks"
    # What the extension lists above do not already say (the clock, the sizes, and the
    # extensions only synthesis sees, like the DSP limit).
    skip = {ext.field for ext in EXTENSIONS if ext.in_programs}
    others = [f"{f.name} (program {getattr(pc, f.name)!r}, device "
              f"{getattr(config, f.name)!r})"
              for f in dataclasses.fields(HardwareConfig)
              if f.name not in skip and getattr(pc, f.name) != getattr(config, f.name)]
    if others:
        text += f"; they differ in {', '.join(others)}"
    return text


def _at(what: str, indices: list[int], shown: int = 3) -> str:
    """``what at instruction(s) 4, 9, 14 and 3 more`` (the first `shown` indices)."""
    more = f" and {len(indices) - shown} more" if len(indices) > shown else ""
    return f"{what} at instruction(s) {', '.join(map(str, indices[:shown]))}{more}"


def _bit_uses(program: Program, config: HardwareConfig) -> list[tuple]:
    """For each extension's instruction bit (`vdla.extensions.InsnBits`: the GEMM's dw)
    that `config` lacks or has otherwise than the program's config (a window of other
    taps), the instructions of `program` that set it, by index: (extension, bits,
    ``dw GEMMs at instruction(s) 2, 5, 8 and 1 more``); none where no instruction sets it."""
    found = []
    kinds = {"GEMM": Gemm, "ALU": Alu}
    for ext in EXTENSIONS:
        if ext.present(config) and ext.value(config) == ext.value(program.config):
            continue
        for bits in ext.insn_bits:
            at = [i for i, insn in enumerate(program.insns)
                  if isinstance(insn, kinds[bits.layout]) and getattr(insn, bits.field, 0)]
            if at:
                found.append((ext, bits, _at(f"{bits.field} {bits.layout}s", at)))
    return found


def _alu_uses(program: Program, config: HardwareConfig) -> str:
    """The ALU instructions of `program` whose op `config` lacks, per op with the first
    indices: ``REQ at instruction(s) 4, 9, 14 and 3 more``; "" when none."""
    at: dict[AluOp, list[int]] = {}
    for index, insn in enumerate(program.insns):
        if isinstance(insn, Alu) and insn.alu_opcode not in config.alu_ops:
            at.setdefault(insn.alu_opcode, []).append(index)
    return "; ".join(_at(op.name, indices) for op, indices in sorted(at.items()))


def in_stat_order(stats: dict) -> dict:
    """`stats` with every `STAT_KEYS` key (None where it has none), in that order."""
    return {key: stats.get(key) for key in STAT_KEYS} | stats


class FunctionalDevice(Device):
    """Device backed by the functional simulator (`vdla.sim.FunctionalSimulator`)."""

    backend = "functional"

    def __init__(self, config: HardwareConfig, dram_size: int = DEFAULT_DRAM_SIZE):
        super().__init__(config, dram_size)
        self.dram = np.zeros(dram_size, dtype=np.uint8)
        self.simulator = FunctionalSimulator(config, self.dram)

    def run(self, insn_addr: int, insn_count: int, *, max_cycles: int | None = None) -> dict:
        """As `Device.run`; `max_cycles` bounds the work validation accepts (a program that
        cannot fit raises `vdla.sim.validate.BudgetError`, as on Verilator). The program's
        counters as the simulator counted them (0 for those it leaves out), None for the
        hardware's cycle counters, and the wall time."""
        start = time.perf_counter()
        counted = self.simulator.run_from_dram(insn_addr, insn_count, max_cycles=max_cycles)
        wall = time.perf_counter() - start
        return in_stat_order({**dict.fromkeys(WORK_COUNTERS, 0), **counted,
                               "wall_seconds": wall})


class VerilatorDevice(Device):
    """Device backed by the cycle-accurate Verilator model of the accelerator's Verilog.

    The first device of a config builds the model (about a minute; cached on disk, see
    `vdla.sim.verilator.build`). Options:

    dram_size : bytes of DRAM (default 256 MiB, allocated lazily)
    dram : `vdla.sim.verilator.DramTiming` (default: 8 bytes per cycle each way, 32 cycles
        of read latency; docs/tool-facts.md, the simulated DRAM)
    max_cycles : the cycle budget of every `run` (the watchdog; default: a multiple of
        each program's estimated cycles, see `vdla.sim.validate`)
    waveform : write a VCD (or FST) waveform of every cycle of the session to this path
    cache : the build cache folder (default ``$VDLA_CACHE`` or ``~/.cache/vdla``)
    log : callable receiving progress lines while building (default: print to stderr)
    gemm_arithmetic : "native" (default), "wide" or "packed": the form of the GEMM core
        simulated (`vdla.hw.compute.GemmArithmetic`); same results and cycles, "native"
        runs fastest, "packed" is the netlist written for boards
    optimise : how hard the model's build optimises: "O3", "lto" or "pgo" (default
        ``$VDLA_VERILATOR_OPTIMISE``, else "pgo"; `vdla.sim.verilator.build`)
    library : load this model library of `config` instead of building one
    """

    backend = "verilator"

    def __init__(self, config: HardwareConfig, dram_size: int = DEFAULT_DRAM_SIZE, *,
                 dram=None, max_cycles: int | None = None, waveform=None, cache=None,
                 log=None, gemm_arithmetic="native", optimise=None, library=None):
        super().__init__(config, dram_size)
        if log is None:
            def log(message):
                print(f"vdla: {message}", file=sys.stderr, flush=True)
        self.max_cycles = max_cycles
        self.simulator = VerilatorSimulator(config, dram_size, timing=dram, waveform=waveform,
                                            cache=cache, log=log,
                                            gemm_arithmetic=gemm_arithmetic, optimise=optimise,
                                            library=library)
        self.dram = self.simulator.dram
        self.timeline = None

    def run(self, insn_addr: int, insn_count: int, *, max_cycles: int | None = None,
            timeline: bool = False, validate: bool = True) -> dict:
        """As `Device.run`; the stats are the hardware's counters (``cycles`` first) and
        ``wall_seconds``. `max_cycles` overrides the device's budget (by default a
        multiple of the program's estimated cycles); with `timeline`, `self.timeline`
        becomes the run's per-unit busy timeline (`vdla.sim.timeline.Timeline`,
        exportable as a Perfetto trace). `validate` False skips the checks every backend
        makes before a run (`vdla.sim.validate`), leaving a bad program to the watchdog:
        for testing the hardware, not for running programs."""
        stats = self.simulator.run_from_dram(
            insn_addr, insn_count, timeline=timeline, validate=validate,
            max_cycles=self.max_cycles if max_cycles is None else max_cycles)
        if timeline:
            self.timeline = self.simulator.timeline
        # The program's counters the hardware does not count (micro-ops, DMA bytes), read
        # off its instructions; where both count (instructions per module, DRAM bytes:
        # whole bus words) the hardware's value stays.
        work = work_counters(fetch_program(self.dram, insn_addr, insn_count, self.config),
                             self.config)
        return in_stat_order({**work, **stats})

    def close(self):
        simulator, self.simulator = getattr(self, "simulator", None), None
        if simulator is not None:
            self.dram = None
            simulator.close()


BACKENDS = {"functional": FunctionalDevice, "verilator": VerilatorDevice}


def open(config: HardwareConfig | None = None, backend: str = "functional", **options) -> Device:
    """Open a device of `backend` for `config` (the default config when None).

    Options go to the backend (``dram_size`` for the simulators; `VerilatorDevice` lists
    its own).
    """
    config = HardwareConfig() if config is None else config
    try:
        cls = BACKENDS[backend]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {backend!r}; available: "
                         f"{', '.join(sorted(BACKENDS))}") from None
    return cls(config, **options)
