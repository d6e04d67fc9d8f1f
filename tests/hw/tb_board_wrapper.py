"""cocotb testbench of a board wrapper (`vdla.boards.wrapper`): the accelerator behind the
vendor's port names and reset polarity.

cocotbext-axi finds the buses by the wrapper's prefixes (the same convention the vendor
tools use), the host reads the ID, runs a blocked GEMM through the renamed ports, and
DRAM afterwards must equal the functional simulator's. ``VDLA_WRAPPER`` (JSON) names the
ports: clock, reset, reset_active_low, ctrl and dram prefixes, irq, extras ({port: value}
of the constant AXI attributes).
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from cocotb_harness import testbench_config, testbench_env
from tb_top import run_program
from vdla import runtime
from vdla.isa.registers import ACCEL_ID, REGISTERS
from vdla.runtime.kernels import BlockedGemm

DRAM_BYTES = 1 << 20


@cocotb.test()
async def runs_a_program_through_the_wrapper(dut):
    cfg = testbench_config()
    names = testbench_env("VDLA_WRAPPER")
    clock, reset = getattr(dut, names["clock"]), getattr(dut, names["reset"])
    irq = getattr(dut, names["irq"])
    low = names["reset_active_low"]
    cocotb.start_soon(Clock(clock, 10, unit="ns").start())
    reset.value = 0 if low else 1
    ram = AxiRam(AxiBus.from_prefix(dut, names["dram"]), clock, reset, size=DRAM_BYTES,
                 reset_active_level=not low)
    host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, names["ctrl"]), clock, reset,
                         reset_active_level=not low)
    await ClockCycles(clock, 3)
    reset.value = 1 if low else 0
    await ClockCycles(clock, 2)

    assert await host.read_dword(REGISTERS["ID"][0]) == ACCEL_ID
    for port, value in names["extras"].items():
        assert getattr(dut, port).value == value, port

    rng = np.random.default_rng(11)
    m, k, n = 2 * cfg.batch, 2 * cfg.block_in, 3 * cfg.block_out
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    dev = runtime.open(cfg, dram_size=DRAM_BYTES)
    gemm = BlockedGemm(dev, a, b, shift=5, virtual_threads=2)
    ram.write(0, dev.dram.tobytes())
    gemm.run()
    want = dev.dram.copy()

    await run_program(dut, host, gemm._insn_addr, gemm._insn_count, clock=clock, irq=irq)
    got = np.frombuffer(ram.read(0, DRAM_BYTES), dtype=np.uint8)
    bad = np.flatnonzero(got != want)
    assert not len(bad), f"{len(bad)} DRAM bytes differ, first at {bad[0]:#x}"
