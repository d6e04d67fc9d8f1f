"""cocotb testbench of the store module against cocotbext-axi's AXI RAM.

The out SRAM is filled with random elements through the harness's write port; after
every STORE the whole DRAM is compared with the functional simulator running the same
STORE from the same out-buffer contents (so bytes outside the stored region must be
unchanged). A bus monitor checks the write channels all along: AW before W, legal bursts
(at most 256 beats, inside a 4 KiB page), ``wlast`` on each burst's last beat, one
response per burst, and that no instruction retires before its last response.
"""

from __future__ import annotations

import itertools
import logging
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from cocotb_harness import issue_insn, wait_for, start_clock, testbench_config
from vdla.isa import Finish, MemoryType, Store, encode
from vdla.sim import FunctionalSimulator

DRAM_BYTES = 1 << 18


class WriteMonitor:
    """Watches the AXI write channels and the instruction port every cycle."""

    def __init__(self, dut):
        self.dut = dut
        self.cycle = 0
        self.bursts = []         # (addr, beats) accepted on AW, data not all sent
        self.beat = 0            # beats sent of bursts[0]
        self.aw = self.w = self.b = 0
        self.last_b_cycle = -1
        self.last_w_cycle = -1
        self.retired = []        # cycles in which an instruction retired
        bus = dut.axi__wdata.value
        self.bus_bytes = len(bus) // 8
        cocotb.start_soon(self.run())

    async def run(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            await ReadOnly()
            self.cycle += 1
            if d.insn__valid.value and d.insn__ready.value:
                assert self.b == self.aw and not self.bursts, (
                    f"cycle {self.cycle}: the STORE retired with {self.aw - self.b} write "
                    f"responses outstanding")
                self.retired.append(self.cycle)
            # W before AW: a beat may only belong to a burst accepted in an earlier cycle.
            if d.axi__wvalid.value and d.axi__wready.value:
                assert self.bursts, f"cycle {self.cycle}: a W beat before its AW"
                addr, beats = self.bursts[0]
                last = self.beat == beats - 1
                assert bool(d.axi__wlast.value) == last, (
                    f"cycle {self.cycle}: wlast={int(d.axi__wlast.value)} on beat {self.beat} "
                    f"of a {beats}-beat burst at {addr:#x}")
                self.beat += 1
                self.w += 1
                self.last_w_cycle = self.cycle
                if last:
                    self.bursts.pop(0)
                    self.beat = 0
            if d.axi__awvalid.value and d.axi__awready.value:
                addr, beats = int(d.axi__awaddr.value), int(d.axi__awlen.value) + 1
                assert addr % self.bus_bytes == 0, f"unaligned burst address {addr:#x}"
                assert beats <= 256, f"a {beats}-beat burst"
                assert addr // 4096 == (addr + beats * self.bus_bytes - 1) // 4096, (
                    f"the burst at {addr:#x} of {beats} beats crosses a 4 KiB boundary")
                assert int(d.axi__awsize.value) == self.bus_bytes.bit_length() - 1
                assert int(d.axi__awburst.value) == 1, "not an INCR burst"
                self.bursts.append((addr, beats))
                self.aw += 1
            if d.axi__bvalid.value and d.axi__bready.value:
                self.b += 1
                self.last_b_cycle = self.cycle
                assert self.b <= self.aw, "more write responses than bursts"


async def setup(dut, seed=1):
    cfg = testbench_config()
    await start_clock(dut)
    ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, size=DRAM_BYTES)
    logging.getLogger(f"cocotb.{dut._name}.axi_").setLevel(logging.WARNING)  # per-burst chatter
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, DRAM_BYTES, dtype=np.uint8)
    ram.write(0, image.tobytes())
    dut.insn__valid.value = 0
    dut.pop_prev__valid.value = 0
    dut.push_prev__ready.value = 1
    dut.out_wen.value = 0
    # The out buffer's contents, written through the backdoor port.
    out = rng.integers(0, 256, (cfg.out_depth, cfg.out_elem_bytes), dtype=np.uint8)
    for addr, row in enumerate(out):
        dut.out_waddr.value = addr
        dut.out_wdata.value = int.from_bytes(row.tobytes(), "little")
        dut.out_wen.value = 1
        await RisingEdge(dut.clk)
    dut.out_wen.value = 0
    sim = FunctionalSimulator(cfg, image)   # shares `image`: it becomes the expected DRAM
    sim.sram[MemoryType.OUT][...] = out
    monitor = WriteMonitor(dut)
    return cfg, ram, image, sim, monitor


def run_golden(sim, insn):
    """The same STORE in the functional simulator (updating the expected DRAM). Its
    completion token orders it before FINISH; tokens do not change what is stored."""
    if insn.y_size == 0:
        # FunctionalSimulator._store fails to reshape an empty block when y_size is 0
        # and x_size is not (reported); such a STORE writes nothing.
        return
    fields = {**insn.fields(), "pop_prev": False, "push_prev": True}
    sim.run([Store(**fields), Finish(pop_next=True)])


def check_dram(ram, image, insn):
    got = np.frombuffer(ram.read(0, DRAM_BYTES), dtype=np.uint8)
    bad = np.flatnonzero(got != image)
    assert not len(bad), (f"{insn}: {len(bad)} DRAM bytes differ from the functional "
                          f"simulator, first at {bad[0]:#x} (got {got[bad[0]]:#04x}, "
                          f"want {image[bad[0]]:#04x})")


def store_cases(cfg, rng: random.Random):
    """Random 2-D stores (strides equal to and larger than x_size, odd bases), rows longer
    than a burst, rows crossing a 4 KiB page, and empty stores."""
    elem, depth = cfg.out_elem_bytes, cfg.out_depth
    limit = DRAM_BYTES // elem
    cases = []
    for _ in range(10):
        y, x = rng.randint(1, 4), rng.randint(1, 9)
        stride = x + rng.choice([0, 0, 1, 3])
        cases.append(Store(sram_base=rng.randint(0, depth - x * y),
                           dram_base=rng.randint(0, limit - y * stride), y_size=y,
                           x_size=x, x_stride=stride))
    # Rows of several bursts, with and without a gap between them.
    x = min(depth // 2, 70)
    cases.append(Store(sram_base=1, dram_base=3, y_size=2, x_size=x, x_stride=x + 5))
    # One row crossing a 4 KiB page from an element just before it, and one starting there.
    per_page = 4096 // elem
    x = min(depth, per_page + 5)
    cases.append(Store(sram_base=0, dram_base=per_page - 1, y_size=1, x_size=x, x_stride=x))
    cases.append(Store(sram_base=depth - 6, dram_base=2 * per_page - 3, y_size=3, x_size=2,
                       x_stride=per_page))
    # Single-element rows, one bus word or less apart (narrow elements share a beat).
    cases.append(Store(sram_base=5, dram_base=7, y_size=6, x_size=1, x_stride=1))
    cases.append(Store(sram_base=9, dram_base=1, y_size=5, x_size=3, x_stride=3))
    # Dependency-only no-ops: nothing is written.
    cases.append(Store(sram_base=0, dram_base=0, y_size=3, x_size=0, x_stride=0))
    cases.append(Store(sram_base=0, dram_base=0, y_size=0, x_size=4, x_stride=4))
    rng.shuffle(cases)
    return cases


@cocotb.test()
async def stores_match_functional_simulator(dut):
    cfg, ram, image, sim, monitor = await setup(dut)
    for insn in store_cases(cfg, random.Random(11)):
        bursts_before = monitor.aw
        await issue_insn(dut, cfg, insn)
        run_golden(sim, insn)
        check_dram(ram, image, insn)
        if insn.x_size == 0 or insn.y_size == 0:
            assert monitor.aw == bursts_before, f"{insn}: a no-op STORE wrote to DRAM"
    await ClockCycles(dut.clk, 2)
    assert monitor.aw == monitor.b and not monitor.bursts


@cocotb.test()
async def tokens_pop_before_and_push_after(dut):
    cfg, ram, image, sim, monitor = await setup(dut, seed=2)
    insn = Store(sram_base=0, dram_base=64, y_size=2, x_size=4, x_stride=6,
                 pop_prev=True, push_prev=True)
    dut.insn__payload.value = encode(insn, cfg)
    dut.insn__valid.value = 1
    await ClockCycles(dut.clk, 20)
    await ReadOnly()
    assert not dut.busy.value, "the store started without its compute->store token"
    assert dut.wait_pop_prev.value, "wait_pop_prev low while waiting for the token"
    assert monitor.aw == 0 and not dut.push_prev__valid.value
    await RisingEdge(dut.clk)
    dut.push_prev__ready.value = 0           # the store->compute queue is full
    dut.pop_prev__valid.value = 1
    await wait_for(dut, dut.pop_prev__ready)  # popped before anything executes
    assert not dut.busy.value and monitor.aw == 0
    await RisingEdge(dut.clk)
    dut.pop_prev__valid.value = 0
    await ReadOnly()
    assert not dut.wait_pop_prev.value
    await RisingEdge(dut.clk)
    await wait_for(dut, dut.push_prev__valid)
    assert monitor.b == monitor.aw > 0, "the token was offered before the data was in DRAM"
    await ClockCycles(dut.clk, 10)
    await ReadOnly()
    assert dut.push_prev__valid.value and not dut.insn__ready.value, \
        "the store retired without room for its token"
    await RisingEdge(dut.clk)
    dut.push_prev__ready.value = 1
    await ReadOnly()
    assert dut.insn__ready.value, "the store did not retire once its token could go"
    await RisingEdge(dut.clk)
    dut.insn__valid.value = 0
    run_golden(sim, insn)
    check_dram(ram, image, insn)


@cocotb.test()
async def done_only_after_write_responses(dut):
    """With B held back, every beat goes out but the STORE waits for its responses."""
    cfg, ram, image, sim, monitor = await setup(dut, seed=3)
    ram.write_if.b_channel.set_pause_generator(itertools.repeat(True))
    words_per_elem = max(1, cfg.out_elem_bytes * 8 // cfg.dram_bus_width)
    x = max(1, 16 // words_per_elem)     # one burst
    insn = Store(sram_base=4, dram_base=0, y_size=1, x_size=x, x_stride=x, push_prev=True)
    dut.insn__payload.value = encode(insn, cfg)
    dut.insn__valid.value = 1
    await ClockCycles(dut.clk, 200)
    await ReadOnly()
    assert monitor.aw == 1 and not monitor.bursts and monitor.w > 0, \
        "the burst's data did not go out"
    assert monitor.b == 0
    assert dut.busy.value and not dut.insn__ready.value and not dut.push_prev__valid.value, \
        "the STORE completed before its write response"
    await RisingEdge(dut.clk)
    ram.write_if.b_channel.clear_pause_generator()
    ram.write_if.b_channel.pause = False
    await wait_for(dut, dut.insn__ready)
    await RisingEdge(dut.clk)
    dut.insn__valid.value = 0
    assert monitor.b == 1 and monitor.retired[-1] > monitor.last_b_cycle
    run_golden(sim, insn)
    check_dram(ram, image, insn)


@cocotb.test()
async def one_bus_word_per_cycle(dut):
    """A long STORE sends a bus word per cycle (a narrow element per cycle)."""
    cfg, ram, image, sim, monitor = await setup(dut, seed=4)
    bus_bytes = cfg.dram_bus_width // 8
    words_per_elem = max(1, cfg.out_elem_bytes // bus_bytes)
    x = min(cfg.out_depth, 1024)
    for y, stride in ((1, x), (4, x // 4 + 3)):
        insn = Store(sram_base=0, dram_base=0, y_size=y, x_size=x // y, x_stride=stride)
        w_before = monitor.w
        cycles = await issue_insn(dut, cfg, insn)
        beats = monitor.w - w_before
        # The SRAM gives one element per cycle, so narrow elements take a cycle each.
        work = max(beats, x * words_per_elem)
        dut._log.info("STORE of %d rows x %d elements: %d beats (%d bytes) in %d cycles, "
                      "%.2f beats/cycle", y, x // y, beats, x * cfg.out_elem_bytes, cycles,
                      beats / cycles)
        run_golden(sim, insn)
        check_dram(ram, image, insn)
        # AxiRam adds a few cycles per burst and the response at the end; allow 25%.
        assert cycles <= work * 1.25 + 40, f"{beats} beats took {cycles} cycles"
