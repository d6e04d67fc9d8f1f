"""ctypes binding of the harness library: one `VerilatorModel` per simulated accelerator.

In the spirit of pyverilator (which does not run here: docs/tool-facts.md), with two levels:

- debugging: `peek`/`poke` any top-level port, `step` clock cycles, `ctrl_read` and
  `ctrl_write` the control registers over AXI4-Lite, `reset`;
- speed: `dram` (a numpy view of the model's DRAM, no copies), and `run`, which starts a
  program and runs it to done entirely in C++, returning the counters.

The DRAM model behind the accelerator's AXI4 master answers reads `read_latency` cycles
after their address, moves at most `bytes_per_cycle` bytes per cycle in each direction,
and accepts up to `max_reads` read and `max_writes` write bursts outstanding
(`DramTiming`; the defaults model a 64-bit bus at the accelerator clock, as on PYNQ's HP
ports, with 32 cycles of read latency: docs/tool-facts.md, the simulated DRAM).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import os
from pathlib import Path

import numpy as np

__all__ = ["DramTiming", "RunStatus", "RunResult", "VerilatorModel"]


@dataclasses.dataclass(frozen=True)
class DramTiming:
    """Timing of the simulated DRAM (per direction: reads and writes have their own
    channels, as AXI has).

    read_latency : cycles from an accepted read address to its first data beat (>= 1)
    write_latency : cycles from a burst's last data beat to its write response (>= 1)
    bytes_per_cycle : bandwidth of each direction; a beat of a wider bus waits for it
    max_reads, max_writes : bursts accepted and not yet answered (>= 1)
    """

    read_latency: int = 32
    write_latency: int = 16
    bytes_per_cycle: float = 8.0
    max_reads: int = 8
    max_writes: int = 8

    def __post_init__(self):
        for name in ("read_latency", "write_latency", "max_reads", "max_writes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
                raise ValueError(f"DramTiming.{name} must be an integer from 1 to {1 << 20}, "
                                 f"not {value!r}")
        bpc = self.bytes_per_cycle
        if isinstance(bpc, bool) or not isinstance(bpc, (int, float)) or not 0.125 <= bpc <= 1024:
            raise ValueError(f"DramTiming.bytes_per_cycle must be a number from 0.125 to 1024, "
                             f"not {bpc!r}")


class RunStatus(enum.IntEnum):
    """How `VerilatorModel.run` ended (the harness's codes)."""

    DONE = 0         # the accelerator raised done
    TIMEOUT = 1      # the cycle budget ran out
    STALLED = 2      # every unit waits and nothing has changed for `stall_cycles`
    BUS_ERROR = 3    # a DRAM access outside DRAM or against the AXI rules
    HOST_ERROR = 4   # the control port did not answer


class _CRunResult(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("state", ctypes.c_uint32),
                ("cycles", ctypes.c_uint64), ("counters", ctypes.c_uint64 * 64)]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `VerilatorModel.run` saw: its `status`, the harness `cycles` from start to
    the stop, the STATE word at the stop, the counters by name, and the DRAM model's
    `error` message (empty when none)."""

    status: RunStatus
    cycles: int
    state: int
    counters: dict[str, int]
    error: str


_U64P = ctypes.POINTER(ctypes.c_uint64)
_U8P = ctypes.POINTER(ctypes.c_uint8)

_SIGNATURES = {
    "vdla_build_info": (ctypes.c_char_p, []),
    "vdla_create": (ctypes.c_void_p, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                      ctypes.c_double, ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_char_p]),
    "vdla_destroy": (None, [ctypes.c_void_p]),
    "vdla_dram": (_U8P, [ctypes.c_void_p]),
    "vdla_cycle": (ctypes.c_uint64, [ctypes.c_void_p]),
    "vdla_error": (ctypes.c_char_p, [ctypes.c_void_p]),
    "vdla_clear_error": (None, [ctypes.c_void_p]),
    "vdla_reset": (None, [ctypes.c_void_p, ctypes.c_uint32]),
    "vdla_state": (ctypes.c_uint32, [ctypes.c_void_p]),
    "vdla_step": (None, [ctypes.c_void_p, ctypes.c_uint64]),
    "vdla_eval": (None, [ctypes.c_void_p]),
    "vdla_flush_wave": (None, [ctypes.c_void_p]),
    "vdla_port_count": (ctypes.c_int32, [ctypes.c_void_p]),
    "vdla_port_name": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int32,
                                         ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_int32)]),
    "vdla_peek": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_int32, _U8P]),
    "vdla_poke": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_int32, _U8P]),
    "vdla_ctrl_write": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]),
    "vdla_ctrl_read": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_uint32,
                                        ctypes.POINTER(ctypes.c_uint32)]),
    "vdla_run": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                  ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32,
                                  ctypes.POINTER(_CRunResult)]),
    "vdla_timeline_size": (ctypes.c_uint64, [ctypes.c_void_p]),
    "vdla_timeline_copy": (None, [ctypes.c_void_p, _U64P]),
    "vdla_dram_pending": (ctypes.c_uint64, [ctypes.c_void_p]),
}

_LIBRARIES: dict[str, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    """The library at `path`, loaded once per process (RTLD_LOCAL: each config's model
    keeps its own copy of the Verilator runtime)."""
    key = str(Path(path).resolve())
    lib = _LIBRARIES.get(key)
    if lib is None:
        lib = ctypes.CDLL(key, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        _LIBRARIES[key] = lib
    return lib


def _storage_bytes(width: int) -> int:
    """Bytes Verilator stores a port of `width` bits in (CData .. QData, then 32-bit words)."""
    for limit, size in ((8, 1), (16, 2), (32, 4), (64, 8)):
        if width <= limit:
            return size
    return 4 * ((width + 31) // 32)


class VerilatorModel:
    """One instance of the accelerator's Verilated model with its DRAM.

    Parameters
    ----------
    library : path
        A harness library from `vdla.sim.verilator.build_model`.
    counters : sequence of str
        The names of the counters in register order (`vdla.isa.registers.COUNTERS`).
    dram_size : int
        Bytes of DRAM (allocated lazily by the OS, so large sizes are cheap).
    timing : DramTiming
    waveform : path, optional
        Dump every cycle to this VCD/FST file (the library must be built for it).
    """

    def __init__(self, library: str | os.PathLike, counters, *, dram_size: int,
                 timing: DramTiming = DramTiming(), waveform: str | os.PathLike | None = None):
        self._lib = _load(Path(library))
        self.counter_names = list(counters)
        self.dram_size = int(dram_size)
        self.timing = timing
        wave = os.fsencode(waveform) if waveform is not None else None
        self._h = self._lib.vdla_create(self.dram_size, timing.read_latency,
                                        timing.write_latency, float(timing.bytes_per_cycle),
                                        timing.max_reads, timing.max_writes, wave)
        if not self._h:
            raise MemoryError(f"cannot allocate {self.dram_size} bytes of simulated DRAM")
        pointer = self._lib.vdla_dram(self._h)
        self.dram = np.ctypeslib.as_array(pointer, shape=(self.dram_size,))
        self._ports = {}
        width, is_input = ctypes.c_uint32(), ctypes.c_int32()
        for index in range(self._lib.vdla_port_count(self._h)):
            name = self._lib.vdla_port_name(self._h, index, ctypes.byref(width),
                                            ctypes.byref(is_input))
            self._ports[name.decode()] = (index, width.value, bool(is_input.value))

    # --- life cycle ---------------------------------------------------------------------

    def close(self):
        """Free the model and its DRAM (and close its waveform file)."""
        if self._h:
            self.dram = None
            self._lib.vdla_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if not self._h:
            raise RuntimeError("the Verilator model is closed")
        return self._h

    @property
    def build_info(self) -> str:
        return self._lib.vdla_build_info().decode()

    @property
    def cycle(self) -> int:
        """Clock cycles since the model was created."""
        return self._lib.vdla_cycle(self._handle())

    @property
    def state(self) -> int:
        """The accelerator's STATE word now (`vdla.isa.registers.STATE_BITS`)."""
        return self._lib.vdla_state(self._handle())

    def reset(self, cycles: int = 8):
        """Hold reset for `cycles` cycles. Queues, tokens and modules restart empty; SRAM
        contents stay, as on the hardware. The DRAM model drops requests in flight."""
        self._lib.vdla_reset(self._handle(), cycles)

    # --- debugging --------------------------------------------------------------------------

    @property
    def ports(self) -> dict[str, tuple[int, bool]]:
        """Top-level port name -> (width, is_input)."""
        return {name: (width, is_input) for name, (_, width, is_input) in self._ports.items()}

    def _port(self, name: str):
        try:
            return self._ports[name]
        except KeyError:
            raise KeyError(f"the model has no port {name!r}; ports: "
                           f"{', '.join(sorted(self._ports))}") from None

    def peek(self, name: str) -> int:
        """The value of top-level port `name`."""
        index, width, _ = self._port(name)
        buf = (ctypes.c_uint8 * _storage_bytes(width))()
        self._lib.vdla_peek(self._handle(), index, buf)
        return int.from_bytes(bytes(buf), "little")

    def poke(self, name: str, value: int):
        """Set input port `name`; it takes effect at the next `eval` or `step`. The ports of
        ``m_axi`` and ``s_axi_ctrl`` are driven every cycle by the DRAM model and the host
        side, and ``clk`` by `step`, so a poke of them lasts until the next cycle. In the
        NATIVE form (the default) the bus inputs are latched at the clock edge
        (`vdla.hw.top._latched`): a poked bus input reaches the design at an edge, not at
        `eval`."""
        index, width, is_input = self._port(name)
        if not is_input:
            raise ValueError(f"port {name!r} is an output; only inputs can be poked")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
                0 <= int(value) < 1 << width):
            raise ValueError(f"value {value!r} does not fit port {name!r} ({width} bits, "
                             f"0..{(1 << width) - 1})")
        raw = int(value).to_bytes(_storage_bytes(width), "little")
        buf = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
        self._lib.vdla_poke(self._handle(), index, buf)

    def eval(self):
        """Settle the design's combinational logic after `poke` (no clock edge)."""
        self._lib.vdla_eval(self._handle())

    def step(self, cycles: int = 1):
        """Run `cycles` clock cycles (the DRAM model serving the AXI master)."""
        if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
            raise ValueError(f"cycles must be a non-negative integer, not {cycles!r}")
        self._lib.vdla_step(self._handle(), cycles)

    def ctrl_write(self, offset: int, value: int):
        """Write a 32-bit control register over AXI4-Lite (a few cycles)."""
        if self._lib.vdla_ctrl_write(self._handle(), offset, value & 0xFFFFFFFF) != 0:
            raise RuntimeError(self.error or f"control write to {offset:#x} failed")

    def ctrl_read(self, offset: int) -> int:
        """Read a 32-bit control register over AXI4-Lite (a few cycles)."""
        value = ctypes.c_uint32()
        if self._lib.vdla_ctrl_read(self._handle(), offset, ctypes.byref(value)) != 0:
            raise RuntimeError(self.error or f"control read of {offset:#x} failed")
        return value.value

    @property
    def error(self) -> str:
        """The first error the DRAM model or host saw in the last run (empty when none)."""
        return self._lib.vdla_error(self._handle()).decode(errors="replace")

    def flush_waveform(self):
        self._lib.vdla_flush_wave(self._handle())

    # --- running ------------------------------------------------------------------------------

    def run(self, insn_addr: int, insn_count: int, *, max_cycles: int,
            stall_cycles: int = 4096, timeline: bool = False) -> RunResult:
        """Start `insn_count` instructions at `insn_addr` and run until done, until
        `max_cycles`, or until the accelerator has been stuck for `stall_cycles`.

        With `timeline`, every change of the STATE word is recorded (`last_timeline`)."""
        result = _CRunResult()
        self._lib.vdla_run(self._handle(), insn_addr, insn_count, max_cycles, stall_cycles,
                           int(bool(timeline)), ctypes.byref(result))
        counters = dict(zip(self.counter_names, result.counters[:len(self.counter_names)]))
        return RunResult(RunStatus(result.status), result.cycles, result.state, counters,
                         self.error)

    @property
    def last_timeline(self) -> np.ndarray:
        """(N, 2) uint64 array of [cycle from the run's start, STATE] at every change."""
        n = self._lib.vdla_timeline_size(self._handle())
        out = np.zeros((n, 2), dtype=np.uint64)
        if n:
            self._lib.vdla_timeline_copy(self._handle(), out.ctypes.data_as(_U64P))
        return out
