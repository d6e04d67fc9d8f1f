"""The host's view of the accelerator: an AXI4-Lite register file and performance counters.

Register map (32-bit registers, byte offsets in the control window; `REGISTERS` is the
one source of truth, and the manifest, the README and the drivers read it):

======  ==================  ====  ========================================================
offset  name                 acc  meaning
======  ==================  ====  ========================================================
0x00    CTRL                 RW   write bit 0 = 1: start (ignored while running);
                                  read: bit 0 running, bit 1 done (since the last start)
0x04    ID                   RO   0x56444C41 ("VDLA")
0x08    VERSION              RO   register-map version (1)
0x10    INSN_ADDR            RW   DRAM byte address of the first instruction (16-aligned)
0x14    INSN_COUNT           RW   number of instructions
0x18    STATE                RO   live state of every unit (`STATE_BITS`), to diagnose a
                                  run that hangs
0x20..  counters             RO   64-bit counters, low word at the offset, high word at
                                  offset + 4; cleared by start, counting while running
======  ==================  ====  ========================================================

Counters (`COUNTERS`): ``cycles``; ``fetch_busy``, ``load_busy``, ``compute_busy``,
``store_busy`` (cycles with an instruction executing or pushing its tokens);
``gemm_active`` and ``alu_active`` (cycles a GEMM / ALU micro-op entered the pipeline);
``stall_load_compute``, ``stall_compute_load``, ``stall_compute_store``,
``stall_store_compute`` (cycles the consumer of that token queue waited on it with an
instruction at its head); ``dram_bytes_read`` and ``dram_bytes_written`` (whole bus
words moved on the AXI master, so a partial word counts in full); ``fetched_insns``
(instructions fetch routed), ``load_insns``, ``compute_insns`` and ``store_insns``
(instructions each module retired).
The counters freeze at done, so the host reads a consistent set after a run. They count
while the run goes on, so a host that finds a run hung reads how far each unit got, and
STATE says what each is waiting on.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vdla.hw.axi import AxiLiteSignature
from vdla.hw.dma import DRAM_ADDR_WIDTH

__all__ = ["REGISTERS", "COUNTERS", "STATE_BITS", "CONTROL_ADDR_WIDTH", "ACCEL_ID",
           "REGMAP_VERSION", "ControlRegisters", "register_map"]

ACCEL_ID = 0x56444C41  # "VDLA"
REGMAP_VERSION = 2  # 2: STATE register and the instruction counters
CONTROL_ADDR_WIDTH = 12  # a 4 KiB register window

CTRL_START = 1 << 0
STATUS_RUNNING = 1 << 0
STATUS_DONE = 1 << 1

#: name -> (offset, access, description) of the plain registers.
REGISTERS = {
    "CTRL": (0x00, "RW", "write bit 0 = 1 to start; read bit 0 running, bit 1 done"),
    "ID": (0x04, "RO", f"constant {ACCEL_ID:#010x} ('VDLA')"),
    "VERSION": (0x08, "RO", f"register-map version ({REGMAP_VERSION})"),
    "INSN_ADDR": (0x10, "RW", "DRAM byte address of the first instruction"),
    "INSN_COUNT": (0x14, "RW", "number of instructions to fetch"),
    "STATE": (0x18, "RO", "live state of the units, one bit each (STATE_BITS)"),
}

#: Bits of the STATE register (and of the top's ``state`` port): name -> (bit, meaning).
#: Token queues are named producer_consumer, as in the stall counters.
STATE_BITS = {
    "fetch_busy": (0, "fetch has instructions left to read or route"),
    "load_busy": (1, "load executes an instruction or pushes its tokens"),
    "compute_busy": (2, "compute executes an instruction or pushes its tokens"),
    "store_busy": (3, "store executes an instruction or pushes its tokens"),
    "load_pending": (4, "an instruction is at the head of load's command queue"),
    "compute_pending": (5, "an instruction is at the head of compute's command queue"),
    "store_pending": (6, "an instruction is at the head of store's command queue"),
    "wait_token_compute_load": (8, "load waits for a compute->load token"),
    "wait_token_load_compute": (9, "compute waits for a load->compute token"),
    "wait_token_store_compute": (10, "compute waits for a store->compute token"),
    "wait_token_compute_store": (11, "store waits for a compute->store token"),
    "wait_space_load_compute": (12, "load waits for room in the load->compute queue"),
    "wait_space_compute_load": (13, "compute waits for room in the compute->load queue"),
    "wait_space_compute_store": (14, "compute waits for room in the compute->store queue"),
    "wait_space_store_compute": (15, "store waits for room in the store->compute queue"),
    "wait_space_load_cmd": (16, "fetch waits for room in load's command queue"),
    "wait_space_compute_cmd": (17, "fetch waits for room in compute's command queue"),
    "wait_space_store_cmd": (18, "fetch waits for room in store's command queue"),
    "tokens_load_compute": (20, "the load->compute queue holds a token"),
    "tokens_compute_load": (21, "the compute->load queue holds a token"),
    "tokens_compute_store": (22, "the compute->store queue holds a token"),
    "tokens_store_compute": (23, "the store->compute queue holds a token"),
}

_COUNTER_BASE = 0x20
_COUNTER_NAMES = [
    ("cycles", "clock cycles from start to done"),
    ("fetch_busy", "cycles the fetch module had instructions left to read or route"),
    ("load_busy", "cycles the load module executed an instruction or pushed its tokens"),
    ("compute_busy", "cycles the compute module executed an instruction or pushed its tokens"),
    ("store_busy", "cycles the store module executed an instruction or pushed its tokens"),
    ("gemm_active", "cycles a GEMM micro-op entered the GEMM pipeline"),
    ("alu_active", "cycles an ALU micro-op entered the ALU pipeline"),
    ("stall_load_compute", "cycles compute waited for a load->compute token"),
    ("stall_compute_load", "cycles load waited for a compute->load token"),
    ("stall_compute_store", "cycles store waited for a compute->store token"),
    ("stall_store_compute", "cycles compute waited for a store->compute token"),
    ("dram_bytes_read", "bytes read on the AXI master (whole bus words)"),
    ("dram_bytes_written", "bytes written on the AXI master (whole bus words)"),
    ("fetched_insns", "instructions fetch routed into a command queue"),
    ("load_insns", "instructions the load module retired"),
    ("compute_insns", "instructions the compute module retired"),
    ("store_insns", "instructions the store module retired"),
]
#: counter name -> (offset of the low word, description); 64 bits each.
COUNTERS = {name: (_COUNTER_BASE + 8 * i, text) for i, (name, text) in enumerate(_COUNTER_NAMES)}


def register_map() -> list[dict]:
    """Every 32-bit register as ``{"name", "offset", "access", "description"}``."""
    rows = [{"name": name, "offset": off, "access": acc, "description": text}
            for name, (off, acc, text) in REGISTERS.items()]
    for name, (off, text) in COUNTERS.items():
        rows.append({"name": f"{name.upper()}_LO", "offset": off, "access": "RO",
                     "description": f"{text} (bits 31:0)"})
        rows.append({"name": f"{name.upper()}_HI", "offset": off + 4, "access": "RO",
                     "description": f"{text} (bits 63:32)"})
    return rows


class ControlRegisters(wiring.Component):
    """AXI4-Lite slave holding the control registers and the performance counters.

    Ports
    -----
    bus : In(AxiLiteSignature(addr_width=CONTROL_ADDR_WIDTH))
        From the host.
    start : Out(1)
        Pulses when the host starts a run.
    insn_addr : Out(DRAM_ADDR_WIDTH), insn_count : Out(32)
        The run's instruction stream.
    finish : In(1)
        The compute module retired FINISH: the run is done.
    events : In(...) one bit per counter except ``cycles`` and the byte counters
        (`COUNTERS` names), high in each cycle the event happens.
    bytes_read, bytes_written : In(16)
        Bytes moved on the AXI master this cycle.
    state : In(32)
        The units' live state (`STATE_BITS`), read back as STATE.
    running : Out(1)
    done : Out(1)
        The last run finished (cleared by the next start).
    """

    EVENT_COUNTERS = [name for name in COUNTERS
                      if name not in ("cycles", "dram_bytes_read", "dram_bytes_written")]

    def __init__(self):
        members = {
            "bus": In(AxiLiteSignature(addr_width=CONTROL_ADDR_WIDTH)),
            "start": Out(1), "insn_addr": Out(DRAM_ADDR_WIDTH), "insn_count": Out(32),
            "finish": In(1), "running": Out(1), "done": Out(1),
            "bytes_read": In(16), "bytes_written": In(16), "state": In(32),
        }
        members.update({f"event_{name}": In(1) for name in self.EVENT_COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        done = self.done
        counters = {name: Signal(64, name=f"count_{name}") for name in COUNTERS}

        # --- writes: take AW and W together, answer OKAY --------------------------------
        take_write = Signal()
        m.d.comb += [
            take_write.eq(bus.awvalid & bus.wvalid & ~bus.bvalid),
            bus.awready.eq(take_write), bus.wready.eq(take_write),
        ]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(take_write):
            m.d.sync += bus.bvalid.eq(1)
            offset = bus.awaddr[2:CONTROL_ADDR_WIDTH]
            with m.Switch(offset):
                with m.Case(REGISTERS["CTRL"][0] >> 2):
                    with m.If(bus.wdata[0] & ~self.running):
                        m.d.comb += self.start.eq(1)
                with m.Case(REGISTERS["INSN_ADDR"][0] >> 2):
                    m.d.sync += self.insn_addr.eq(bus.wdata)
                with m.Case(REGISTERS["INSN_COUNT"][0] >> 2):
                    m.d.sync += self.insn_count.eq(bus.wdata)
        m.d.comb += bus.bresp.eq(0)

        # --- reads -----------------------------------------------------------------------
        m.d.comb += [bus.arready.eq(~bus.rvalid), bus.rresp.eq(0)]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.rvalid.eq(1)
            with m.Switch(bus.araddr[2:CONTROL_ADDR_WIDTH]):
                with m.Case(REGISTERS["CTRL"][0] >> 2):
                    m.d.sync += bus.rdata.eq(self.running * STATUS_RUNNING | done * STATUS_DONE)
                with m.Case(REGISTERS["ID"][0] >> 2):
                    m.d.sync += bus.rdata.eq(ACCEL_ID)
                with m.Case(REGISTERS["VERSION"][0] >> 2):
                    m.d.sync += bus.rdata.eq(REGMAP_VERSION)
                with m.Case(REGISTERS["INSN_ADDR"][0] >> 2):
                    m.d.sync += bus.rdata.eq(self.insn_addr)
                with m.Case(REGISTERS["INSN_COUNT"][0] >> 2):
                    m.d.sync += bus.rdata.eq(self.insn_count)
                with m.Case(REGISTERS["STATE"][0] >> 2):
                    m.d.sync += bus.rdata.eq(self.state)
                for name, (offset, _) in COUNTERS.items():
                    with m.Case(offset >> 2):
                        m.d.sync += bus.rdata.eq(counters[name][:32])
                    with m.Case((offset + 4) >> 2):
                        m.d.sync += bus.rdata.eq(counters[name][32:])
                with m.Default():
                    m.d.sync += bus.rdata.eq(0)

        # --- run state and counters ------------------------------------------------------
        with m.If(self.start):
            m.d.sync += [self.running.eq(1), done.eq(0)]
            m.d.sync += [counter.eq(0) for counter in counters.values()]
        with m.Elif(self.running):
            m.d.sync += counters["cycles"].eq(counters["cycles"] + 1)
            for name in self.EVENT_COUNTERS:
                with m.If(getattr(self, f"event_{name}")):
                    m.d.sync += counters[name].eq(counters[name] + 1)
            m.d.sync += [
                counters["dram_bytes_read"].eq(counters["dram_bytes_read"] + self.bytes_read),
                counters["dram_bytes_written"].eq(
                    counters["dram_bytes_written"] + self.bytes_written),
            ]
            with m.If(self.finish):
                m.d.sync += [self.running.eq(0), done.eq(1)]
        return m
