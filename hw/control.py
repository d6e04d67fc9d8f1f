"""The control component: an AXI4-Lite slave with the registers and performance counters.

`ControlRegisters` implements the register map that `vdla.isa.registers` defines (the
one source of truth for offsets, the STATE bits and the counters, kept there as plain
data so host code reads it without Amaranth). The counters freeze at done, so the host
reads a consistent set after a run; they count while the run goes on, so a host that
finds a run hung reads how far each unit got, and STATE says what each is waiting on.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vdla.hw.axi import AxiLiteSignature
from vdla.hw.dma import DRAM_ADDR_WIDTH
from vdla.isa.registers import (ACCEL_ID, CONTROL_ADDR_WIDTH, COUNTERS, REGISTERS,
                                REGMAP_VERSION, STATUS_DONE, STATUS_RUNNING)

__all__ = ["ControlRegisters"]


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
