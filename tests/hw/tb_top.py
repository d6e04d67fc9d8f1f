"""cocotb testbench of the whole accelerator: a host on AXI4-Lite, DRAM on AXI4.

The host writes a program and its data into the DRAM model, programs the registers,
starts the run, polls done, and reads the counters. DRAM afterwards must equal, byte for
byte, the functional simulator's DRAM after the same program.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from cocotb_harness import start_clock, testbench_config
from vdla import runtime
from vdla.isa.registers import ACCEL_ID, COUNTERS, REGISTERS, REGMAP_VERSION
from vdla.runtime.kernels import BlockedGemm, blocked_gemm_reference

DRAM_BYTES = 1 << 20


async def setup(dut):
    cfg = testbench_config()
    await start_clock(dut)
    ram = AxiRam(AxiBus.from_prefix(dut, "m_axi_"), dut.clk, dut.rst, size=DRAM_BYTES)
    host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_ctrl_"), dut.clk, dut.rst)
    return cfg, ram, host


async def read_counters(host) -> dict:
    values = {}
    for name, (offset, _) in COUNTERS.items():
        low = await host.read_dword(offset)
        high = await host.read_dword(offset + 4)
        values[name] = high << 32 | low
    return values


async def run_program(dut, host, insn_addr: int, insn_count: int, timeout_polls=20000, *,
                      clock=None, irq=None):
    """Program the registers, start, poll done; returns the counters. `clock` and `irq`
    default to the core's ``clk`` and ``irq`` (a board wrapper names them otherwise)."""
    clock = dut.clk if clock is None else clock
    irq = dut.irq if irq is None else irq
    await host.write_dword(REGISTERS["INSN_ADDR"][0], insn_addr)
    await host.write_dword(REGISTERS["INSN_COUNT"][0], insn_count)
    assert await host.read_dword(REGISTERS["INSN_ADDR"][0]) == insn_addr
    assert await host.read_dword(REGISTERS["INSN_COUNT"][0]) == insn_count
    await host.write_dword(REGISTERS["CTRL"][0], 1)
    status = await host.read_dword(REGISTERS["CTRL"][0])
    assert status & 1, f"not running after start (CTRL={status:#x})"
    for _ in range(timeout_polls):
        status = await host.read_dword(REGISTERS["CTRL"][0])
        if status & 2:
            break
    else:
        raise AssertionError("the accelerator did not finish")
    assert not status & 1, f"done but still running (CTRL={status:#x})"
    await ReadOnly()
    assert irq.value == 1
    await RisingEdge(clock)
    return await read_counters(host)


@cocotb.test()
async def identifies_itself(dut):
    cfg, ram, host = await setup(dut)
    assert await host.read_dword(REGISTERS["ID"][0]) == ACCEL_ID
    assert await host.read_dword(REGISTERS["VERSION"][0]) == REGMAP_VERSION
    assert await host.read_dword(REGISTERS["CTRL"][0]) == 0
    assert dut.irq.value == 0


@cocotb.test()
async def blocked_gemm_end_to_end(dut):
    """A blocked GEMM with requantization (GEMM, ALU SHR/MIN/MAX, loads, stores, two
    virtual threads with tokens), run twice: DRAM matches the functional simulator."""
    cfg, ram, host = await setup(dut)
    rng = np.random.default_rng(5)
    m, k, n = 3 * cfg.batch, 3 * cfg.block_in, 5 * cfg.block_out
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    dev = runtime.open(cfg, dram_size=DRAM_BYTES)
    gemm = BlockedGemm(dev, a, b, shift=6, virtual_threads=2)
    image = dev.dram.copy()
    stats = gemm.run()
    want = dev.dram.copy()
    assert np.array_equal(gemm.result(), blocked_gemm_reference(a, b, 6))

    for attempt in range(2):  # a second run must restart cleanly (counters, done)
        ram.write(0, image.tobytes())
        counters = await run_program(dut, host, gemm._insn_addr, gemm._insn_count)
        got = np.frombuffer(ram.read(0, DRAM_BYTES), dtype=np.uint8)
        bad = np.flatnonzero(got != want)
        assert not len(bad), (f"run {attempt}: {len(bad)} DRAM bytes differ from the functional "
                              f"simulator, first at {bad[0]:#x}")
        dut._log.info("run %d: %s", attempt, counters)
        cycles = counters["cycles"]
        assert 0 < cycles
        for name in ("fetch_busy", "load_busy", "compute_busy", "store_busy", "gemm_active"):
            assert 0 < counters[name] <= cycles, (name, counters[name], cycles)
        assert counters["gemm_active"] == stats["gemm_macs"] // cfg.macs_per_cycle
        assert counters["alu_active"] == stats["alu_uops"]
        assert counters["dram_bytes_written"] == stats["dram_bytes_written"]
        bus = cfg.dram_bus_width // 8
        assert counters["dram_bytes_read"] >= stats["dram_bytes_read"] - bus
