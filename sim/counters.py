"""The counters a program's instructions fix, whatever runs it: instructions up to FINISH,
bytes each DMA moves, GEMM and ALU micro-ops. The functional simulator counts them as it
executes; `work_counters` reads them off the instruction stream, so that a backend that
does not count them (the Verilator model counts cycles and bus words) reports them too.

The hardware's own counters (`vdla.isa.registers.COUNTERS`: cycles, busy, stall and
active cycles, bus words) need a clock: only the cycle-accurate backend has them.
"""

from __future__ import annotations

from typing import Sequence

from vdla.config import HardwareConfig
from vdla.isa import INSN_BYTES, Alu, Finish, Gemm, Insn, Load, MemoryType, Store, memory_geometry

__all__ = ["WORK_COUNTERS", "work_counters"]

#: The program's counters, as `vdla.sim.FunctionalSimulator.run` documents them.
WORK_COUNTERS = ("instructions", "fetch_bytes", "load_insns", "compute_insns", "store_insns",
                 "load_bytes_uop", "load_bytes_wgt", "load_bytes_inp", "load_bytes_acc",
                 "load_bytes_tab", "store_bytes_out", "dram_bytes_read", "dram_bytes_written", "gemm_uops",
                 "gemm_macs", "alu_uops")


def work_counters(insns: Sequence[Insn], config: HardwareConfig) -> dict[str, int]:
    """Every `WORK_COUNTERS` counter of a program that runs to its first FINISH (each
    instruction before it runs once, whatever the order), 0 included. Instructions
    after FINISH are not counted, as the hardware never executes them."""
    elem_bytes = {mem: size for mem, (size, _) in memory_geometry(config).items()}
    counts = dict.fromkeys(WORK_COUNTERS, 0)
    finish = next((i for i, insn in enumerate(insns) if isinstance(insn, Finish)),
                  len(insns) - 1)
    for insn in insns[:finish + 1]:
        counts[f"{insn.module.value}_insns"] += 1
        if isinstance(insn, Load):
            # Padding is written into SRAM, not read from DRAM.
            nbytes = insn.y_size * insn.x_size * elem_bytes[insn.memory_type]
            counts[f"load_bytes_{insn.memory_type.name.lower()}"] += nbytes
            counts["dram_bytes_read"] += nbytes
        elif isinstance(insn, Store):
            nbytes = insn.y_size * insn.x_size * elem_bytes[MemoryType.OUT]
            counts["store_bytes_out"] += nbytes
            counts["dram_bytes_written"] += nbytes
        elif isinstance(insn, (Gemm, Alu)):
            uops = insn.iter_out * insn.iter_in * max(insn.uop_end - insn.uop_bgn, 0)
            if isinstance(insn, Alu):
                counts["alu_uops"] += uops
            else:
                counts["gemm_uops"] += uops
                if not insn.reset_reg:
                    counts["gemm_macs"] += uops * config.macs_per_cycle
    counts["instructions"] = finish + 1
    counts["fetch_bytes"] = (finish + 1) * INSN_BYTES
    counts["dram_bytes_read"] += counts["fetch_bytes"]
    return counts
