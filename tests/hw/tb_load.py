"""cocotb testbench of the load module against cocotbext-axi's AXI RAM.

Every LOAD's SRAM contents are compared with the functional simulator running the same
instruction on the same DRAM image.
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge, ReadOnly
from cocotbext.axi import AxiBus, AxiRam

from cocotb_harness import issue_insn, wait_for, start_clock, testbench_config
from vdla.isa import Finish, Load, MemoryType, encode
from vdla.sim import FunctionalSimulator

DRAM_BYTES = 1 << 18


async def setup(dut, seed=1):
    cfg = testbench_config()
    await start_clock(dut)
    ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, size=DRAM_BYTES)
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, DRAM_BYTES, dtype=np.uint8)
    ram.write(0, image.tobytes())
    dut.insn__valid.value = 0
    dut.pop_next__valid.value = 0
    dut.push_next__ready.value = 1
    return cfg, ram, image


async def read_sram(dut, name, begin, end):
    addr, data = getattr(dut, f"{name}_addr"), getattr(dut, f"{name}_data")
    words = []
    for i in range(begin, end):
        addr.value = i
        await RisingEdge(dut.clk)
        await ReadOnly()
        words.append(int(data.value))
        await RisingEdge(dut.clk)
    return words


def expected(cfg, image, insn):
    sim = FunctionalSimulator(cfg, image.copy())
    sim.run([insn, Finish()])
    return sim


def as_ints(rows: np.ndarray) -> list[int]:
    return [int.from_bytes(bytes(row), "little") for row in rows.reshape(len(rows), -1)]


def load_cases(cfg, rng: random.Random):
    """Every padding case (each of the four pads alone, all, none) on INP and WGT, strides
    equal to and larger than x_size, odd DRAM bases, and a row crossing a 4 KiB page."""
    cases = []
    pads = [dict(), dict(y_pad_0=1), dict(y_pad_1=2), dict(x_pad_0=1), dict(x_pad_1=3),
            dict(y_pad_0=2, y_pad_1=1, x_pad_0=3, x_pad_1=2)]
    for mem, depth, elem in (("INP", cfg.inp_depth, cfg.inp_elem_bytes),
                             ("WGT", cfg.wgt_depth, cfg.wgt_elem_bytes)):
        limit = DRAM_BYTES // elem
        for pad in pads:
            y, x = rng.randint(1, 3), rng.randint(1, 4)
            stride = x + rng.choice([0, 0, 1, 5])
            rows = y + pad.get("y_pad_0", 0) + pad.get("y_pad_1", 0)
            width = x + pad.get("x_pad_0", 0) + pad.get("x_pad_1", 0)
            sram = rng.randint(0, depth - rows * width)
            dram = rng.randint(0, limit - y * stride - 1)
            cases.append(Load(memory_type=mem, sram_base=sram, dram_base=dram, y_size=y,
                              x_size=x, x_stride=stride, **pad))
        # A row that crosses a 4 KiB page: the DMA must split the burst.
        per_page = 4096 // elem
        x = min(depth // 2, max(2, per_page + 3))
        cases.append(Load(memory_type=mem, sram_base=0, dram_base=max(0, per_page - 1),
                          y_size=1, x_size=x, x_stride=x))
        # Padding only around an empty block of rows, and a dependency-only no-op.
        cases.append(Load(memory_type=mem, sram_base=3, dram_base=5, y_size=0, x_size=2,
                          x_stride=2, y_pad_0=1, x_pad_1=1))
        cases.append(Load(memory_type=mem, sram_base=0, dram_base=0, y_size=4, x_size=0,
                          x_stride=0))
    return cases


@cocotb.test()
async def loads_match_functional_simulator(dut):
    cfg, ram, image = await setup(dut)
    rng = random.Random(7)
    for insn in load_cases(cfg, rng):
        mem = insn.memory_type.name.lower()
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        begin = insn.sram_base
        end = begin + (rows * width if insn.x_size else 1)
        # Mark the region so stale contents cannot pass for loaded ones.
        before = await read_sram(dut, mem, begin, end)
        await issue_insn(dut, cfg, insn)
        got = await read_sram(dut, mem, begin, end)
        sim = expected(cfg, image, insn)
        if insn.x_size == 0:
            assert got == before, f"{insn}: a no-op LOAD changed the SRAM"
            continue
        want = as_ints(getattr(sim, mem)[begin:end])
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"{insn}: {len(bad)} wrong elements, first at sram {begin + bad[0]}"


@cocotb.test()
async def tokens_pop_before_and_push_after(dut):
    cfg, ram, image = await setup(dut, seed=2)
    insn = Load(memory_type="INP", sram_base=0, dram_base=0, y_size=2, x_size=8, x_stride=8,
                pop_next=True, push_next=True)
    dut.insn__payload.value = encode(insn, cfg)
    dut.insn__valid.value = 1
    await ClockCycles(dut.clk, 20)
    await ReadOnly()
    assert not dut.busy.value, "the load started without its compute->load token"
    assert not dut.push_next__valid.value
    await RisingEdge(dut.clk)
    dut.push_next__ready.value = 0          # the load->compute queue is full
    dut.pop_next__valid.value = 1
    await wait_for(dut, dut.pop_next__ready)  # popped before anything executes
    assert not dut.busy.value
    await RisingEdge(dut.clk)
    dut.pop_next__valid.value = 0
    await wait_for(dut, dut.push_next__valid)
    await ClockCycles(dut.clk, 10)
    await ReadOnly()
    assert dut.push_next__valid.value and not dut.insn__ready.value, \
        "the load retired without room for its token"
    await RisingEdge(dut.clk)
    dut.push_next__ready.value = 1
    await ReadOnly()
    assert dut.insn__ready.value, "the load did not retire once its token could go"


@cocotb.test()
async def one_bus_word_per_cycle(dut):
    """A long INP load moves a bus word per cycle once DRAM data streams."""
    cfg, ram, image = await setup(dut, seed=3)
    words_per_elem = max(1, cfg.inp_elem_bytes * 8 // cfg.dram_bus_width)
    x = min(cfg.inp_depth, 1024)
    insn = Load(memory_type="INP", sram_base=0, dram_base=0, y_size=1, x_size=x, x_stride=x)
    cycles = await issue_insn(dut, cfg, insn)
    beats = x * words_per_elem
    dut._log.info("LOAD of %d beats took %d cycles", beats, cycles)
    # AxiRam answers with a few cycles of latency per burst; allow 25% over the beats.
    assert cycles <= beats * 1.25 + 40, f"{beats} beats took {cycles} cycles"
