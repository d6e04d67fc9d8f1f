"""Clearing the accelerator's on-chip SRAMs between ``vdla serve`` sessions.

The SRAMs keep their contents from one program to the next (on every backend, as on
the hardware), so a session that runs a program reading them before it loads them
would see what the last session left: its weights, inputs, accumulators. `scrub`
overwrites every one of them with zeros, by running a program of the ISA on the device
itself, so the same mechanism serves the functional simulator, Verilator and a board:

- inp and wgt: one LOAD each of a zeroed DRAM block, padded with zero rows (the padding
  is written without reading DRAM, so the block is a sixteenth of the buffer);
- uop: one LOAD of zeros (a LOAD of micro-ops cannot pad); a micro-op of zero bits is
  ``Uop(0, 0, 0)``, so the buffer holds no earlier index;
- acc and out: one GEMM with ``reset_reg`` over every acc row (the micro-op just
  loaded, dst 0, stepped by the loop factors), which writes zero to the accumulator
  and to the out buffer's narrowed copy of it. (A LOAD cannot write the out buffer;
  the reset GEMM is the ISA's way to.)
- the ALU's lookup table, on a config with TAB: one LOAD of TAB of zeros (a session's
  table holds what its model's GELU or softmax is).

Those are every SRAM the hardware has (`vdla.hw.top`: uop, inp, wgt, acc, out; TAB's
table). What else holds data between instructions is registers the ISA
overwrites before it reads them: the depthwise convolution's window of input columns,
which the first micro-op of every pass reloads; the ALU's held operand, read again each
outer iteration; DIV's dividers, loaded by every DIV micro-op before they step
(extensions, `vdla.extensions`); the GEMM pipeline's operand and
product registers, valid only for the micro-op in flight; and the command and token
queues, which a program must leave empty (`vdla.sim.validate`). None of them is
readable by a later program.

The program and its zero block live in a DRAM block the server allocates for the scrub
alone (no session holds it) and frees, zeroed, when it is done.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vdla.config import ISA_FIXED_WIDTHS, TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import INSN_BYTES, MemoryType, Program
from vdla.runtime.builder import COMPUTE, LOAD, ProgramBuilder
from vdla.runtime.device import Device, dram_alignment

__all__ = ["Scrub", "scrub", "scrub_program", "zero_block_bytes"]

#: Zero rows one padded LOAD may add below its data (the ISA's y_pad_1 field).
_MAX_PAD = (1 << ISA_FIXED_WIDTHS["pad"]) - 1
#: Elements one LOAD row may move (the ISA's x_size field), rounded down to a power of
#: two so that it divides every (power-of-two) buffer depth.
_MAX_ROW = 1 << (ISA_FIXED_WIDTHS["x_size"] - 1)
#: Iterations of one GEMM loop (the ISA's iter fields), a power of two likewise.
_MAX_ITER = 1 << (ISA_FIXED_WIDTHS["iter"] - 1)


@dataclasses.dataclass(frozen=True)
class Scrub:
    """What one scrub ran: the device's statistics and its cost.

    stats : the run's statistics (`vdla.runtime.device.STAT_KEYS`)
    cycles : the hardware's cycles (None on the functional simulator, which has no clock)
    seconds : wall time of the whole scrub (writing the program, running it, freeing)
    """

    stats: dict
    cycles: int | None
    seconds: float

    def describe(self) -> str:
        """``on-chip buffers cleared (4,384 cycles, 3 ms)``."""
        cycles = "" if self.cycles is None else f"{self.cycles:,} cycles, "
        return f"on-chip buffers cleared ({cycles}{self.seconds * 1e3:.0f} ms)"


def _padded(depth: int) -> tuple[int, int]:
    """(elements read per LOAD row, zero rows below it) that fill `depth` elements with
    one padded LOAD: rows of `depth` / 16 elements, one read and 15 of padding."""
    rows = min(depth, _MAX_PAD + 1)
    return depth // rows, rows - 1


def _unpadded(depth: int) -> tuple[int, int]:
    """(y_size, x_size) of a LOAD that fills `depth` elements from DRAM alone."""
    width = min(depth, _MAX_ROW)
    return depth // width, width


def zero_block_bytes(config: HardwareConfig) -> int:
    """Bytes of zeros the scrub program reads from DRAM, whole DRAM alignments: the most
    any one of its LOADs reads (the uop buffer, whole, on the default config)."""
    c = config
    need = max(c.uop_depth * c.uop_bytes, TABLE_ENTRIES * 4 * (AluOp.TAB in c.alu_ops),
               _padded(c.inp_depth)[0] * c.inp_elem_bytes,
               _padded(c.wgt_depth)[0] * c.wgt_elem_bytes)
    align = dram_alignment(c)
    return -(-need // align) * align


def scrub_program(config: HardwareConfig, zeros_addr: int) -> Program:
    """The program that zeroes every SRAM of `config` (module docstring).

    config : the device's config
    zeros_addr : DRAM byte address of `zero_block_bytes(config)` zero bytes (aligned as
        `vdla.runtime.device.dram_alignment`)
    """
    c = config
    b = ProgramBuilder(c)
    for memory, depth, elem in ((MemoryType.INP, c.inp_depth, c.inp_elem_bytes),
                                (MemoryType.WGT, c.wgt_depth, c.wgt_elem_bytes)):
        width, pad = _padded(depth)
        b.load(memory, sram_base=0, dram_base=zeros_addr // elem, y_size=1, x_size=width,
               x_stride=width, y_pad_1=pad)
    # FINISH (on compute) waits for the load module's last LOAD.
    b.dep_push(LOAD, COMPUTE)
    rows, width = _unpadded(c.uop_depth)
    b.load(MemoryType.UOP, sram_base=0, dram_base=zeros_addr // c.uop_bytes, y_size=rows,
           x_size=width, x_stride=width)
    if AluOp.TAB in c.alu_ops:
        b.load(MemoryType.TAB, sram_base=0, dram_base=zeros_addr // 4, y_size=1,
               x_size=TABLE_ENTRIES, x_stride=TABLE_ENTRIES)
    # Every acc row once: dst = o * inner + i, over the zero micro-op 0.
    inner = min(c.acc_depth, _MAX_ITER)
    outer = c.acc_depth // inner
    b.gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=outer, iter_in=inner,
           dst_factor_out=inner if outer > 1 else 0, dst_factor_in=1)
    b.dep_pop(LOAD, COMPUTE)
    return b.finish()


def scrub(device: Device) -> Scrub:
    """Zero every on-chip SRAM of `device` with `scrub_program`, in a DRAM block
    allocated for it and zeroed and freed after; returns what it ran (`Scrub`).

    device : any `vdla.runtime.device.Device` (a simulator's, a board's); nothing else
        may use it meanwhile
    Raises what the device's run raises, and RuntimeError when a board is still running
    another program (`vdla.deploy.board_device.BoardDevice.wait_idle`, for its
    timeout) or fetched other instructions than the scrub's: the device is then not
    known to be clear.
    """
    start = time.perf_counter()
    config = device.config
    zeros = zero_block_bytes(config)
    nbytes = zeros + (len(scrub_program(config, 0)) * INSN_BYTES)
    addr = device.alloc(nbytes)
    try:
        program = scrub_program(config, addr)
        image = np.zeros(nbytes, np.uint8)
        image[zeros:] = np.frombuffer(program.to_bytes(), np.uint8)
        device.write(addr, image)     # the zeros rewritten too: whatever the block held
        # A board ignores a start while a run goes on, and would report that run's end.
        wait_idle = getattr(device, "wait_idle", None)
        if wait_idle is not None and not wait_idle(getattr(device, "timeout", 10.0)):
            raise RuntimeError("the accelerator is still running another program")
        stats = device.run(addr + zeros, len(program))
        fetched = stats.get("fetched_insns")
        if fetched is not None and fetched != len(program):
            raise RuntimeError(f"the accelerator fetched {fetched:,} instructions for the "
                               f"{len(program)} of the clearing program: it ran another")
    finally:
        try:
            device.write(addr, np.zeros(nbytes, np.uint8))
        finally:
            device.free(addr)
    cycles = stats.get("cycles")
    return Scrub(stats, None if cycles is None else int(cycles),
                 time.perf_counter() - start)
