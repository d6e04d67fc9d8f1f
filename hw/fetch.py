"""The fetch module: reads the instruction stream from DRAM and routes it to the modules.

Fetch reads ``insn_count`` 128-bit instructions from ``insn_addr`` in legal AXI bursts,
several outstanding, into a local buffer of bus words; assembles instructions from the
words (a bus narrower than 128 bits gives an instruction every few beats, a wider one
several per beat); and routes each, in program order, to the load, compute or store
command queue (docs/isa.md, routing: STORE -> store; LOAD of INP or WGT -> load; everything else,
LOAD of UOP or ACC, GEMM, ALU, FINISH, -> compute).

The DRAM read channel is shared by every module. If fetch ever refused a read beat (say,
because the command queue its next instruction goes to is full), the beats of the other
modules' bursts queued behind it in the interconnect would stall too, and the module that
would drain that queue might be the one waiting for them: a deadlock. So fetch accepts
every beat the moment it arrives, and only asks for a burst when its buffer has room for
all the beats already asked for plus the new burst (credit counting). A full command
queue then stops fetch from issuing reads, never from taking data.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.axi import ReadClientSignature
from vdla.hw.dma import DRAM_ADDR_WIDTH, MAX_BURST_BEATS, dram_burst_len
from vdla.hw.layouts import MemoryType, Opcode, insn_layout
from vdla.isa import INSN_BYTES

__all__ = ["FetchModule", "FETCH_BUFFER_BYTES"]

#: Bytes of fetched instructions buffered before routing (64 instructions). Two bursts'
#: worth at a 128-bit bus or narrower, so a burst can be asked for while the previous
#: one is still arriving.
FETCH_BUFFER_BYTES = 1024


class FetchModule(wiring.Component):
    """Fetches instructions from DRAM and routes them into the three command queues.

    Parameters
    ----------
    config : HardwareConfig
        Gives the instruction layout and the DRAM bus width (32 to 1024 bits).

    Ports
    -----
    start : In(1)
        One-cycle pulse: fetch ``insn_count`` instructions from ``insn_addr``. Ignored
        while `busy` (the current program's reads are still in flight).
    insn_addr : In(32)
        Byte address of the first instruction; instructions are 16 bytes, so its low four
        bits are ignored. Sampled with `start`.
    insn_count : In(32)
        Number of instructions; sampled with `start`. 0 fetches nothing.
    busy : Out(1)
        Instructions are left to fetch or to route.
    read : Out(ReadClientSignature(addr_width=32, data_width=dram_bus_width))
        DRAM reads; every beat is accepted at once (``beat.ready`` is always high).
    load_cmd, compute_cmd, store_cmd : Out(stream.Signature(128))
        The routed instructions, in program order, into the command queues.
    """

    def __init__(self, config: HardwareConfig):
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"FetchModule needs a HardwareConfig, not {config!r}")
        self.config = config
        bus_bytes = config.dram_bus_width // 8
        # Buffer size in bus words, and the burst that keeps two of them in flight.
        self.buffer_beats = max(8, FETCH_BUFFER_BYTES // bus_bytes)
        self.max_burst = min(MAX_BURST_BEATS, self.buffer_beats // 2)
        super().__init__({
            "start": In(1),
            "insn_addr": In(DRAM_ADDR_WIDTH),
            "insn_count": In(32),
            "busy": Out(1),
            "read": Out(ReadClientSignature(addr_width=DRAM_ADDR_WIDTH,
                                            data_width=config.dram_bus_width)),
            "load_cmd": Out(stream.Signature(INSN_BITS)),
            "compute_cmd": Out(stream.Signature(INSN_BITS)),
            "store_cmd": Out(stream.Signature(INSN_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        bus_bits = cfg.dram_bus_width
        bus_bytes = bus_bits // 8
        log_bus, log_insn = exact_log2(bus_bytes), exact_log2(INSN_BYTES)
        depth, max_burst = self.buffer_beats, self.max_burst

        insns_left = Signal.like(self.insn_count)   # not yet routed
        m.d.comb += self.busy.eq(insns_left != 0)
        begin = Signal()
        m.d.comb += begin.eq(self.start & ~self.busy)

        # --- requester: bursts, issued only with room for their beats ----------------------
        req_addr = Signal(DRAM_ADDR_WIDTH)
        req_left = Signal(DRAM_ADDR_WIDTH + log_insn + 1 - min(log_bus, log_insn))  # beats
        reserved = Signal(range(depth + 1))   # beats asked for and not yet routed away
        legal = dram_burst_len(m, req_addr, req_left, bus_bytes=bus_bytes, name="fetch")
        burst = Signal.like(legal)
        m.d.comb += burst.eq(Mux(legal < max_burst, legal, max_burst))

        # Credit check, see the module docstring. It only gets easier while a request
        # waits (`reserved` falls as beats are routed), so VALID never drops early.
        m.d.comb += [
            self.read.req.valid.eq((req_left != 0) & (reserved + burst <= depth)),
            self.read.req.payload.addr.eq(req_addr),
            self.read.req.payload.len.eq(burst - 1),
        ]
        aligned = Signal(DRAM_ADDR_WIDTH)   # the start address, whole instructions
        m.d.comb += aligned.eq(Cat(Const(0, log_insn), self.insn_addr[log_insn:]))
        with m.If(begin):
            first_beat = aligned >> log_bus
            end_byte = aligned + (self.insn_count << log_insn)
            end_beat = (end_byte + bus_bytes - 1) >> log_bus
            # (A count of 0 at an address inside a bus word still spans no beat.)
            m.d.sync += [req_addr.eq(first_beat << log_bus),
                         req_left.eq(Mux(self.insn_count == 0, 0, end_beat - first_beat)),
                         insns_left.eq(self.insn_count)]
        with m.Elif(self.read.req.valid & self.read.req.ready):
            m.d.sync += [req_addr.eq(req_addr + (burst << log_bus)),
                         req_left.eq(req_left - burst)]

        # --- buffer: takes every beat (credit guarantees the room) --------------------------
        m.submodules.buffer = buffer = fifo.SyncFIFOBuffered(width=bus_bits, depth=depth)
        m.d.comb += [
            self.read.beat.ready.eq(1),
            buffer.w_data.eq(self.read.beat.payload.data),
            buffer.w_en.eq(self.read.beat.valid),
        ]
        pop = Signal()   # a buffered beat is used up
        granted = self.read.req.valid & self.read.req.ready
        with m.If(granted & ~pop):
            m.d.sync += reserved.eq(reserved + burst)
        with m.Elif(granted & pop):
            m.d.sync += reserved.eq(reserved + burst - 1)
        with m.Elif(pop):
            m.d.sync += reserved.eq(reserved - 1)

        # --- assembler: bus words -> instructions -------------------------------------------
        word = Signal(INSN_BITS)     # the instruction at the head
        valid = Signal()
        taken = Signal()             # routed this cycle
        if bus_bytes < INSN_BYTES:
            # Several beats per instruction: keep the earlier ones, then present them with
            # the last beat still in the buffer, so an instruction leaves per last beat.
            parts = INSN_BYTES // bus_bytes
            held = Signal(INSN_BITS - bus_bits)
            part = Signal(range(parts))
            complete = part == parts - 1
            m.d.comb += [word.eq(Cat(held, buffer.r_data)), valid.eq(buffer.r_rdy & complete),
                         pop.eq(buffer.r_rdy & (~complete | taken))]
            with m.If(buffer.r_rdy & ~complete):
                m.d.sync += held.word_select(part, bus_bits).eq(buffer.r_data)
            with m.If(pop):
                m.d.sync += part.eq(Mux(complete, 0, part + 1))
            with m.If(begin):
                m.d.sync += part.eq(0)
        elif bus_bytes == INSN_BYTES:
            m.d.comb += [word.eq(buffer.r_data), valid.eq(buffer.r_rdy), pop.eq(taken)]
        else:
            # Several instructions per beat: the first beat may start, and the last end,
            # part-way (the address is only 16-byte aligned; the count is any number).
            per_beat = bus_bytes // INSN_BYTES
            slot = Signal(exact_log2(per_beat))   # wraps at the end of the beat
            m.d.comb += [word.eq(buffer.r_data.word_select(slot, INSN_BITS)),
                         valid.eq(buffer.r_rdy & (insns_left != 0)),
                         pop.eq(taken & ((slot == per_beat - 1) | (insns_left == 1)))]
            with m.If(taken):
                m.d.sync += slot.eq(slot + 1)
            with m.If(begin):
                m.d.sync += slot.eq(self.insn_addr[log_insn:log_bus])
        m.d.comb += buffer.r_en.eq(pop)

        # --- router -------------------------------------------------------------------------
        view = data.View(insn_layout(cfg, "LOAD"), word)
        to_load = Signal()
        to_store = Signal()
        m.d.comb += [
            to_store.eq(view.opcode == Opcode.STORE),
            to_load.eq((view.opcode == Opcode.LOAD) & ((view.memory_type == MemoryType.INP)
                                                       | (view.memory_type == MemoryType.WGT))),
        ]
        # Everything else goes to compute, including opcodes the ISA leaves unused (which
        # the encoder never writes), so that no word can stall routing.
        targets = ((self.load_cmd, to_load), (self.store_cmd, to_store),
                   (self.compute_cmd, ~to_load & ~to_store))
        for port, selected in targets:
            m.d.comb += [port.payload.eq(word), port.valid.eq(valid & selected)]
            with m.If(port.valid & port.ready):
                m.d.comb += taken.eq(1)
        with m.If(taken):
            m.d.sync += insns_left.eq(insns_left - 1)
        return m
