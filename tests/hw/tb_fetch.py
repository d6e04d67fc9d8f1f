"""cocotb testbench of the fetch module against cocotbext-axi's AXI RAM.

Random programs (instructions of every kind, memory type and ALU op) are encoded into
the RAM; each command stream must receive exactly the instructions `Insn.module` routes
to it, in program order, whatever the streams' back-pressure. A monitor checks all along
that the read channel never waits on fetch (``rvalid`` without ``rready``: the shared
channel would stall every module), that bursts are legal, and that the command streams
keep ``valid`` and the payload until taken.
"""

from __future__ import annotations

import logging
import random

import cocotb
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
from cocotbext.axi import AxiBus, AxiRam

from cocotb_harness import start_clock, testbench_config
from vdla.isa import (INSN_BYTES, Alu, Finish, Gemm, Load, Module, Store, encode,
                      encode_stream, layouts_for)

DRAM_BYTES = 1 << 16
STREAMS = {Module.LOAD: "load_cmd", Module.COMPUTE: "compute_cmd", Module.STORE: "store_cmd"}
FLAGS = {"pop_prev", "pop_next", "push_prev", "push_next", "reset_reg", "use_imm"}


def random_fields(cfg, kind, rng, skip=()):
    fields = {}
    for name, (_, width) in layouts_for(cfg)[kind].fields.items():
        if name in ("opcode", "memory_type", "alu_opcode") or name in skip:
            continue
        if name in FLAGS:
            fields[name] = rng.random() < 0.5
        elif name == "imm":
            fields[name] = rng.randint(-(1 << (width - 1)), (1 << (width - 1)) - 1)
        else:
            fields[name] = rng.randint(0, (1 << width) - 1)
    return fields


def random_insn(cfg, rng, kind=None):
    """An instruction of `kind` (``"LOAD"``, ...; random when None) with random fields."""
    kind = kind or rng.choice(["LOAD", "LOAD", "STORE", "GEMM", "ALU", "FINISH"])
    if kind == "LOAD":
        return Load(memory_type=rng.choice(["UOP", "WGT", "INP", "ACC"]),
                    **random_fields(cfg, "LOAD", rng))
    if kind == "STORE":
        return Store(**random_fields(cfg, "STORE", rng,
                                     skip=("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")))
    if kind == "GEMM":
        return Gemm(**random_fields(cfg, "GEMM", rng))
    if kind == "ALU":
        return Alu(alu_opcode=rng.choice(sorted(cfg.alu_ops)), **random_fields(cfg, "ALU", rng))
    return Finish(**random_fields(cfg, "FINISH", rng))


def random_program(cfg, rng, count):
    return [random_insn(cfg, rng) for _ in range(count)]


class CmdSink:
    """Takes one command stream; checks that a waiting command stays put.

    ``ready`` is low while `hold` is set, and with probability `stall` a cycle starts a
    stall of 1 to 60 cycles (long enough for fetch's buffer to fill)."""

    def __init__(self, dut, name, rng, stall=0.0):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.name, self.rng, self.stall, self.hold = name, rng, stall, False
        self.items = []
        self.ready.value = 0
        cocotb.start_soon(self.run(dut.clk))

    async def run(self, clk):
        waiting = None   # the payload offered and not taken last cycle
        stalled = 0      # cycles left of a random stall
        while True:
            await RisingEdge(clk)
            if not stalled and self.rng.random() < self.stall:
                stalled = self.rng.randint(1, 60)
            stalled = max(0, stalled - 1)
            ready = not self.hold and not stalled
            self.ready.value = ready
            await ReadOnly()
            if waiting is not None:
                assert self.valid.value and int(self.payload.value) == waiting, (
                    f"{self.name}: a waiting command was withdrawn or changed")
                waiting = None
            if self.valid.value:
                if ready:
                    self.items.append(int(self.payload.value))
                else:
                    waiting = int(self.payload.value)


class ReadMonitor:
    """Checks the AXI read channels: beats never wait on fetch, bursts are legal."""

    def __init__(self, dut):
        self.dut = dut
        self.bus_bytes = len(dut.axi__rdata.value) // 8
        self.ar = self.ar_beats = self.r = 0
        cocotb.start_soon(self.run())

    async def run(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            await ReadOnly()
            if d.axi__rvalid.value:
                assert d.axi__rready.value, "fetch held up a read beat on the shared channel"
                self.r += 1
            if d.axi__arvalid.value and d.axi__arready.value:
                addr, beats = int(d.axi__araddr.value), int(d.axi__arlen.value) + 1
                assert addr % self.bus_bytes == 0, f"unaligned burst address {addr:#x}"
                assert addr // 4096 == (addr + beats * self.bus_bytes - 1) // 4096, (
                    f"the burst at {addr:#x} of {beats} beats crosses a 4 KiB boundary")
                self.ar += 1
                self.ar_beats += beats


async def setup(dut, seed, stall=0.0):
    cfg = testbench_config()
    await start_clock(dut)
    ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, size=DRAM_BYTES)
    logging.getLogger(f"cocotb.{dut._name}.axi_").setLevel(logging.WARNING)  # per-burst chatter
    ram.write(0, random.Random(seed).randbytes(DRAM_BYTES))   # no stale instructions
    dut.start.value = 0
    rng = random.Random(seed)
    sinks = {module: CmdSink(dut, name, rng, stall) for module, name in STREAMS.items()}
    return cfg, ram, sinks, ReadMonitor(dut), rng


async def fetch(dut, addr, count):
    """Pulse start; returns once the start has been sampled."""
    await RisingEdge(dut.clk)
    dut.insn_addr.value = addr
    dut.insn_count.value = count
    dut.start.value = 1
    await RisingEdge(dut.clk)
    dut.start.value = 0


async def wait_idle(dut, timeout=20_000):
    """Wait until fetch is no longer busy; returns the cycles waited."""
    for cycle in range(timeout):
        await RisingEdge(dut.clk)
        await ReadOnly()
        if not dut.busy.value:
            await RisingEdge(dut.clk)
            return cycle
    raise AssertionError(f"fetch still busy after {timeout} cycles")


def expected(cfg, program):
    return {module: [encode(insn, cfg) for insn in program if insn.module == module]
            for module in STREAMS}


def check_routed(cfg, sinks, program, before=None):
    want = expected(cfg, program)
    for module, sink in sinks.items():
        got, exp = sink.items[len(before[module]) if before else 0:], want[module]
        if got != exp:
            first = next((i for i, (g, w) in enumerate(zip(got, exp)) if g != w),
                         min(len(got), len(exp)))
            raise AssertionError(f"{sink.name}: received {len(got)} commands, expected "
                                 f"{len(exp)}; first difference at command {first}")


@cocotb.test()
async def programs_are_routed_in_order(dut):
    """Random programs at several addresses and lengths, under random back-pressure."""
    cfg, ram, sinks, monitor, rng = await setup(dut, seed=1, stall=0.05)
    bus_bytes = cfg.dram_bus_width // 8
    cases = [(0, 600),                               # aligned, many bursts
             (4096 - 5 * INSN_BYTES, 40),            # crosses a 4 KiB page
             (bus_bytes + INSN_BYTES if bus_bytes > INSN_BYTES else 3 * INSN_BYTES, 7),
             (8192 - INSN_BYTES, 1),                 # one instruction, last slot of a word
             (12288 + INSN_BYTES * 3, 2)]
    for addr, count in cases:
        program = random_program(cfg, rng, count)
        ram.write(addr, encode_stream(program, cfg))
        before = {m: list(s.items) for m, s in sinks.items()}
        await fetch(dut, addr, count)
        await wait_idle(dut)
        await ClockCycles(dut.clk, 3)
        check_routed(cfg, sinks, program, before)


@cocotb.test()
async def stalled_queue_does_not_block_the_read_channel(dut):
    """One stream refuses commands for a long time: the others get every command ahead of
    its first one, fetch stops asking for data instead of refusing it, and nothing is
    lost once the stream takes commands again."""
    cfg, ram, sinks, monitor, rng = await setup(dut, seed=2)
    for stalled in (Module.COMPUTE, Module.LOAD):
        kind = "GEMM" if stalled == Module.COMPUTE else "LOAD"
        others = [random_insn(cfg, rng, k) for k in ["STORE", "STORE", "ALU", "FINISH", "GEMM",
                                                       "STORE", "LOAD", "STORE"] * 40]
        head = [insn for insn in others if insn.module != stalled][:12]
        blocker = random_insn(cfg, rng, kind)
        while blocker.module != stalled:
            blocker = random_insn(cfg, rng, kind)
        program = head + [blocker] + others
        ram.write(0, encode_stream(program, cfg))
        before = {m: list(s.items) for m, s in sinks.items()}
        sinks[stalled].hold = True
        beats_before = monitor.ar_beats
        await fetch(dut, 0, len(program))
        await ClockCycles(dut.clk, 500)
        requested = monitor.ar_beats
        await ClockCycles(dut.clk, 1500)
        await ReadOnly()
        assert dut.busy.value
        assert monitor.ar_beats == requested, "fetch kept reading with nowhere to put it"
        got = {m: s.items[len(before[m]):] for m, s in sinks.items()}
        assert got[stalled] == []
        want = expected(cfg, head)
        for module in STREAMS:
            if module != stalled:
                assert got[module] == want[module], (
                    f"{sinks[module].name} got {len(got[module])} of the {len(want[module])} "
                    "commands ahead of the stalled one")
        dut._log.info("%s stalled: fetch read %d of the program's %d beats and stopped",
                      stalled.value, requested - beats_before,
                      len(program) * INSN_BYTES // (cfg.dram_bus_width // 8))
        await RisingEdge(dut.clk)
        sinks[stalled].hold = False
        await wait_idle(dut)
        await ClockCycles(dut.clk, 3)
        check_routed(cfg, sinks, program, before)


@cocotb.test()
async def count_zero_fetches_nothing(dut):
    cfg, ram, sinks, monitor, rng = await setup(dut, seed=3)
    # Inside a bus word when the bus is wider than an instruction: still no beat to read.
    await fetch(dut, 256 + INSN_BYTES, 0)
    for _ in range(50):
        await RisingEdge(dut.clk)
        await ReadOnly()
        assert not dut.busy.value, "busy with nothing to fetch"
    assert monitor.ar == 0 and not any(s.items for s in sinks.values())
    # And fetch still works afterwards.
    program = random_program(cfg, rng, 5)
    ram.write(256, encode_stream(program, cfg))
    await RisingEdge(dut.clk)
    await fetch(dut, 256, len(program))
    await wait_idle(dut)
    await ClockCycles(dut.clk, 3)
    check_routed(cfg, sinks, program)


@cocotb.test()
async def fetch_rate(dut):
    """Figures: instructions per cycle with every stream ready."""
    cfg, ram, sinks, monitor, rng = await setup(dut, seed=4)
    program = random_program(cfg, rng, 1024)
    ram.write(0, encode_stream(program, cfg))
    await fetch(dut, 0, len(program))
    cycles = await wait_idle(dut) + 1
    await ClockCycles(dut.clk, 3)
    check_routed(cfg, sinks, program)
    bus_bytes = cfg.dram_bus_width // 8
    beats = len(program) * INSN_BYTES // bus_bytes
    dut._log.info("fetched %d instructions (%d beats of %d bytes) in %d cycles: "
                  "%.2f instructions/cycle, %.2f beats/cycle", len(program),
                  beats, bus_bytes, cycles, len(program) / cycles, beats / cycles)
    # Bound by one beat per cycle on a narrow bus and one routed instruction per cycle on
    # a wide one; AxiRam adds a few cycles per burst.
    assert cycles <= max(beats, len(program)) * 1.25 + 50
