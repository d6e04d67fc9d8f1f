"""The accelerator on a Zynq board behind vdla's full device API (`vdla.runtime.Device`).

    dev = vdla.boards.get("pynq-z1").open_hardware()     # on the board's Linux
    a = dev.alloc(nbytes); dev.write(a, x); stats = dev.run(insn_addr, insn_count)

`BoardDevice` is `vdla.deploy.board.hardware.Accelerator` (the register protocol, the
DMA region's cache maintenance) with what every vdla device has on top: its allocator
(bus addresses: the region's physical address plus an offset), programs validated
before they start (`vdla.sim.ProgramValidator`: a program that would hang the
accelerator or reach outside its buffers is refused, not started) and the statistics of
every backend (`vdla.runtime.STAT_KEYS`: the program's work counters beside the
hardware's). It is what `vdla serve` serves on a board with vdla installed, and what
the tests drive on the Verilator shim (``tests/board_shim.py``). It needs vdla's runtime
and simulators, so a deploy bundle does not carry it: the bundle's runner plays its
checked script on `vdla.deploy.board.hardware.RegionDevice` instead.
"""

from __future__ import annotations

import time

import numpy as np

from vdla.config import HardwareConfig
from vdla.deploy.board.hardware import (POLL_SECONDS, Accelerator, DmaMemory, Interrupt,
                                        Mmio)
from vdla.isa.registers import REGISTERS, STATUS_RUNNING
from vdla.runtime.allocator import DramAllocator
from vdla.runtime.device import Device, dram_alignment, in_stat_order
from vdla.sim.counters import work_counters
from vdla.sim.protocol import fetch_program
from vdla.sim.validate import ProgramValidator

__all__ = ["BoardDevice"]


class BoardDevice(Device):
    """The accelerator of `config` behind `mmio`, over the DMA region `memory`.

    config : the `HardwareConfig` the bitstream was built from
    mmio, memory : the control window and the DMA region
        (`vdla.deploy.board.hardware.Mmio`, `DmaMemory`)
    interrupt : the done interrupt (`Interrupt`), or None to poll CTRL
    timeout : seconds a run may take before `BoardTimeout`
    poll : seconds between reads of CTRL while a run goes on
    `BoardError` when the window does not answer as a vdla accelerator of this register
    map's version, naming what it read; ValueError for a timeout that is not a positive
    number or a region not aligned as the config's DRAM.
    """

    backend = "board"

    def __init__(self, config: HardwareConfig, *, mmio: Mmio, memory: DmaMemory,
                 interrupt: Interrupt | None = None, timeout: float = 10.0,
                 poll: float = POLL_SECONDS):
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        super().__init__(config, len(memory.array))
        base = int(memory.physical_address)
        align = dram_alignment(config)
        if base % align:
            raise ValueError(f"the DMA region's physical address {base:#x} is not a "
                             f"multiple of {align} bytes, the config's DRAM alignment")
        self.accelerator = Accelerator(mmio, memory, interrupt, timeout=timeout, poll=poll)
        # Bus addresses: the region's own. Its first aligned block stays unused, as a
        # simulator leaves address 0, so that a compiled model lands at the same offsets
        # from a page, and bursts alike, on a board as in simulation.
        self.base = base
        self.allocator = DramAllocator(base + len(memory.array), alignment=align,
                                       base=base + align)
        self.validator = ProgramValidator(config)

    # The layers, as the tests and a register log read them.
    mmio = property(lambda self: self.accelerator.mmio)
    memory = property(lambda self: self.accelerator.memory)
    interrupt = property(lambda self: self.accelerator.interrupt)
    timeout = property(lambda self: self.accelerator.timeout)

    def _write(self, addr: int, raw: np.ndarray):
        self.accelerator.write(addr - self.base, raw)

    def _read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.accelerator.read(addr - self.base, nbytes)

    def run(self, insn_addr: int, insn_count: int, *, validate: bool = True,
            timeout: float | None = None) -> dict:
        """As `Device.run`: the program is checked as on every backend (`validate`
        False leaves a bad one to the timeout), started, and waited for; the stats are
        the hardware's counters, the program's own counts and ``wall_seconds``.
        `BoardTimeout` after `timeout` seconds (the device's by default)."""
        array = self.accelerator.memory.array
        insns = fetch_program(array, int(insn_addr) - self.base, int(insn_count), self.config)
        if validate:
            self.validator.validate(insns, array, insn_addr=int(insn_addr),
                                    dram_base=self.base)
        stats = self.accelerator.run(insn_addr, insn_count, timeout)
        return in_stat_order({**work_counters(insns, self.config), **stats})

    def wait_idle(self, seconds: float) -> bool:
        """Wait up to `seconds` for the accelerator to stop running; whether it has.

        A run stopped by its timeout (`BoardTimeout`) leaves the program running on the
        board, and a start is ignored while one runs: ``vdla serve`` waits here at a
        session's end, before it zeroes the session's memory and clears the SRAMs (the
        program could still write both), and before its clearing program starts.
        """
        accelerator = self.accelerator
        end = time.perf_counter() + seconds
        while accelerator.mmio.read(REGISTERS["CTRL"][0]) & STATUS_RUNNING:
            if time.perf_counter() > end:
                return False
            time.sleep(accelerator.poll)
        return True

    def close(self):
        self.accelerator.close()
