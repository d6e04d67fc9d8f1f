"""The store module: STOREs of out-buffer elements to DRAM.

A STORE writes ``y_size`` rows of ``x_size`` out elements, read densely from the out
SRAM at ``sram_base``, to DRAM element ``dram_base + y * x_stride`` (elements of
``config.out_elem_bytes``; docs/isa.md, LOAD and STORE). Three parts run at once:

* the *requester* turns rows into legal AXI write bursts (`dram_burst_len`) and issues
  their addresses (AW) ahead of the data, several outstanding;
* the *reader* reads the out SRAM (synchronous: data one cycle after the address) into
  a small FIFO of bus words. It issues a read only when the FIFO has room for it and for
  the read still in flight (credit counting), so it never needs to stall a read whose
  data is already on its way, and keeps one word per cycle flowing under back-pressure;
* the *writer* sends the FIFO's words as W beats of the bursts whose addresses have
  been accepted (AW always leads W, which some interconnects require), marking each
  burst's last beat.

The instruction completes only once every burst's write response (B) has arrived, so a
token pushed after it, and the FINISH behind that token, mean the data is in DRAM.

An out element as wide as the bus or wider (a multiple, as both are powers of two) is
sent as ``out_elem_bytes / bus_bytes`` beats with all strobes on. A narrower element is
packed with its neighbours into a beat and written with byte strobes; its row may start
and end anywhere inside a bus word.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from vdla.config import INSN_BITS, HardwareConfig
from vdla.hw.axi import WriteClientSignature
from vdla.hw.dma import DRAM_ADDR_WIDTH, SramReadSignature, dram_burst_len
from vdla.hw.layouts import insn_layout
from vdla.hw.queues import TokenSignature
from vdla.hw.sequencer import InsnSequencer

__all__ = ["StoreModule", "STORE_DATA_FIFO_DEPTH", "STORE_MAX_OUTSTANDING"]

#: Bus words buffered between the out SRAM and the W channel. The SRAM read takes one
#: cycle and the FIFO's output is registered, so a few words keep one beat per cycle
#: going; more only add area.
STORE_DATA_FIFO_DEPTH = 8
#: Write bursts in flight (address accepted, response not yet received). Enough to cover
#: the response latency of short bursts; long bursts never come close.
STORE_MAX_OUTSTANDING = 16
#: Accepted burst addresses whose data has not all been sent (the writer's burst lengths).
_BURST_FIFO_DEPTH = 8


class StoreModule(wiring.Component):
    """Executes the store command queue: 2-D STOREs from the out buffer to DRAM.

    Parameters
    ----------
    config : HardwareConfig
        Gives the instruction layout, the out buffer's depth and element size, and the
        DRAM bus width. Out elements and the bus must both be a power of two bytes wide
        (always so for a valid `HardwareConfig`); any ratio between them works.

    Ports
    -----
    insn : In(stream.Signature(128))
        The store command queue's head; retired after the pushes.
    pop_prev : In(TokenSignature())
        Tokens from the compute module (compute->store: the out data is ready).
    push_prev : Out(TokenSignature())
        Tokens to the compute module (store->compute: the out region may be overwritten);
        pushed only once the stored data is in DRAM (all write responses received).
    out : Out(SramReadSignature(depth=out_depth, elem_bits=out_elem_bytes * 8))
        Read port of the out SRAM (which lives in the top).
    write : Out(WriteClientSignature(addr_width=32, data_width=dram_bus_width))
        DRAM writes: bursts, beats (with byte strobes) and responses.
    busy : Out(1)
        An instruction is executing or pushing its tokens.
    wait_pop_prev : Out(1)
        The head instruction waits for a compute->store token.
    """

    def __init__(self, config: HardwareConfig):
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"StoreModule needs a HardwareConfig, not {config!r}")
        elem_bytes = config.out_elem_bytes
        self.config = config
        super().__init__({
            "insn": In(stream.Signature(INSN_BITS)),
            "pop_prev": In(TokenSignature()),
            "push_prev": Out(TokenSignature()),
            "out": Out(SramReadSignature(depth=config.out_depth, elem_bits=elem_bytes * 8)),
            "write": Out(WriteClientSignature(addr_width=DRAM_ADDR_WIDTH,
                                              data_width=config.dram_bus_width)),
            "busy": Out(1),
            "wait_pop_prev": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        seq = InsnSequencer(cfg, self.insn, pops={"pop_prev": self.pop_prev},
                            pushes={"push_prev": self.push_prev}, name="store")
        seq.elaborate(m)
        m.d.comb += [self.busy.eq(seq.busy), self.wait_pop_prev.eq(seq.waiting["pop_prev"])]

        # The instruction stays on the queue's head until it retires, so its constant
        # fields (x_size, x_stride) are used from there rather than copied into registers.
        insn = data.View(insn_layout(cfg, "STORE"), self.insn.payload)
        elem_bytes = cfg.out_elem_bytes
        bus_bits = cfg.dram_bus_width
        bus_bytes = bus_bits // 8
        log_elem, log_bus = exact_log2(elem_bytes), exact_log2(bus_bytes)
        # An element is `lanes` bus words (wide elements), or a beat holds `per_beat`
        # elements (narrow ones); one of the two is 1.
        lanes = max(1, elem_bytes // bus_bytes)
        per_beat = max(1, bus_bytes // elem_bytes)
        log_per_beat = exact_log2(per_beat)
        narrow = per_beat > 1

        start = Signal()     # the first executing cycle: the engines take the instruction
        m.d.comb += start.eq(seq.first)
        empty = (insn.x_size == 0) | (insn.y_size == 0)   # nothing to move: a no-op

        # --- requester: rows -> AW bursts ------------------------------------------------
        req_busy = Signal()
        row_elem = Signal(len(insn.dram_base) + 1)   # DRAM element index of the row
        rows_left = Signal.like(insn.y_size)
        in_row = Signal()                            # some of the row's bursts were issued
        cur = Signal(DRAM_ADDR_WIDTH)                # byte address of the row's next burst
        beats_left = Signal(len(insn.x_size) + exact_log2(lanes) + 1)

        # The row's first beat and its beat count come straight from `row_elem`, so a new
        # row costs no extra cycle (rows of one beat still get an address per cycle).
        row_byte = Signal(DRAM_ADDR_WIDTH)
        row_pos = Signal(max(1, log_per_beat))       # first element's place in its beat
        row_beats = Signal.like(beats_left)
        m.d.comb += [
            row_byte.eq(row_elem << log_elem),
            row_pos.eq(row_elem[:log_per_beat] if narrow else 0),
            row_beats.eq((((row_pos + insn.x_size) << log_elem) + bus_bytes - 1) >> log_bus),
        ]
        addr = Signal(DRAM_ADDR_WIDTH)
        left = Signal.like(beats_left)
        m.d.comb += [
            addr.eq(Mux(in_row, cur, Cat(Const(0, log_bus), row_byte[log_bus:]))),
            left.eq(Mux(in_row, beats_left, row_beats)),
        ]
        burst = dram_burst_len(m, addr, left, bus_bytes=bus_bytes, name="store")

        m.submodules.bursts = bursts = fifo.SyncFIFOBuffered(width=8, depth=_BURST_FIFO_DEPTH)
        outstanding = Signal(range(STORE_MAX_OUTSTANDING + 1))   # AW accepted, B not yet
        aw_done = Signal()
        b_done = Signal()
        # VALID may not depend on READY and may not drop before the handshake: the room
        # in `bursts` and below the outstanding limit only grows until we issue.
        m.d.comb += [
            self.write.req.valid.eq(req_busy & bursts.w_rdy
                                    & (outstanding != STORE_MAX_OUTSTANDING)),
            self.write.req.payload.addr.eq(addr),
            self.write.req.payload.len.eq(burst - 1),
            aw_done.eq(self.write.req.valid & self.write.req.ready),
            bursts.w_data.eq(burst - 1),
            bursts.w_en.eq(aw_done),
        ]
        with m.If(start):
            m.d.sync += [row_elem.eq(insn.dram_base), rows_left.eq(insn.y_size),
                         in_row.eq(0), req_busy.eq(~empty)]
        with m.Elif(aw_done):
            m.d.sync += [cur.eq(addr + (burst << log_bus)), beats_left.eq(left - burst),
                         in_row.eq(1)]
            with m.If(left == burst):   # the row's last burst
                m.d.sync += [in_row.eq(0), row_elem.eq(row_elem + insn.x_stride),
                             rows_left.eq(rows_left - 1)]
                with m.If(rows_left == 1):
                    m.d.sync += req_busy.eq(0)

        # Write responses: every burst gets one; the instruction waits for all of them.
        # (An error response is not reported: the accelerator has no error path yet.)
        m.d.comb += [self.write.resp.ready.eq(1),
                     b_done.eq(self.write.resp.valid & self.write.resp.ready)]
        with m.If(aw_done & ~b_done):
            m.d.sync += outstanding.eq(outstanding + 1)
        with m.Elif(b_done & ~aw_done):
            m.d.sync += outstanding.eq(outstanding - 1)

        # --- reader: out SRAM -> FIFO of bus words -----------------------------------------
        strb_bits = bus_bytes if narrow else 0   # wide elements always write whole words
        m.submodules.words = words = fifo.SyncFIFOBuffered(
            width=bus_bits + strb_bits, depth=STORE_DATA_FIFO_DEPTH)
        rd_busy = Signal()
        rd_addr = Signal.like(self.out.addr)
        rd_col = Signal.like(insn.x_size)
        rd_rows_left = Signal.like(insn.y_size)
        rd_lane = Signal(range(max(lanes, 2)))        # bus word of a wide element
        rd_pos = Signal(max(1, log_per_beat))         # place of a narrow element in its beat
        rd_row_pos = Signal.like(rd_pos)              # ... of the row's first element
        # The read issued in the previous cycle: its data is on `out.data` now.
        got = Signal()
        got_lane = Signal.like(rd_lane)
        got_pos = Signal.like(rd_pos)
        got_ends_beat = Signal()

        # Credit: the FIFO must hold what is in it, the word arriving now and the one we
        # ask for, even if the writer takes nothing meanwhile. (Each read yields at most
        # one word; a narrow element that does not end its beat yields none.)
        issue = Signal()
        m.d.comb += [
            issue.eq(rd_busy & (words.level + got < STORE_DATA_FIFO_DEPTH)),
            self.out.addr.eq(rd_addr),
        ]
        m.d.sync += got.eq(issue)
        with m.If(start):
            m.d.sync += [rd_addr.eq(insn.sram_base), rd_col.eq(0),
                         rd_rows_left.eq(insn.y_size), rd_lane.eq(0), rd_busy.eq(~empty)]
            if narrow:
                m.d.sync += [rd_pos.eq(insn.dram_base[:log_per_beat]),
                             rd_row_pos.eq(insn.dram_base[:log_per_beat])]
        with m.Elif(issue):
            row_last = rd_col == insn.x_size - 1
            m.d.sync += [got_lane.eq(rd_lane), got_pos.eq(rd_pos),
                         got_ends_beat.eq((rd_pos == per_beat - 1) | row_last)]
            next_elem = Signal()
            if lanes > 1:
                m.d.comb += next_elem.eq(rd_lane == lanes - 1)
                m.d.sync += rd_lane.eq(Mux(next_elem, 0, rd_lane + 1))
            else:
                m.d.comb += next_elem.eq(1)
            if narrow:
                # Wraps around the beat by the register's width.
                m.d.sync += rd_pos.eq(rd_pos + 1)
            with m.If(next_elem):
                m.d.sync += rd_addr.eq(rd_addr + 1)
                with m.If(row_last):
                    m.d.sync += [rd_col.eq(0), rd_rows_left.eq(rd_rows_left - 1)]
                    if narrow:
                        next_row_pos = (rd_row_pos + insn.x_stride)[:log_per_beat]
                        m.d.sync += [rd_row_pos.eq(next_row_pos), rd_pos.eq(next_row_pos)]
                    with m.If(rd_rows_left == 1):
                        m.d.sync += rd_busy.eq(0)
                with m.Else():
                    m.d.sync += rd_col.eq(rd_col + 1)

        if narrow:
            # Pack elements into a beat; the beat goes into the FIFO at its last element
            # or the row's last one, with a strobe for each element it holds.
            elem_bits = elem_bytes * 8
            pack_data = Signal(bus_bits)
            pack_strb = Signal(bus_bytes)
            beat_data = Signal(bus_bits)
            beat_strb = Signal(bus_bytes)
            for i in range(per_beat):
                here = got & (got_pos == i)
                m.d.comb += [
                    beat_data.word_select(i, elem_bits).eq(
                        Mux(here, self.out.data, pack_data.word_select(i, elem_bits))),
                    beat_strb.word_select(i, elem_bytes).eq(
                        Mux(here, (1 << elem_bytes) - 1, pack_strb.word_select(i, elem_bytes))),
                ]
            m.d.comb += [words.w_data.eq(Cat(beat_data, beat_strb)),
                         words.w_en.eq(got & got_ends_beat)]
            with m.If(got):
                m.d.sync += [pack_data.eq(beat_data),
                             pack_strb.eq(Mux(got_ends_beat, 0, beat_strb))]
        else:
            word = (self.out.data.word_select(got_lane, bus_bits) if lanes > 1
                    else self.out.data)
            m.d.comb += [words.w_data.eq(word), words.w_en.eq(got)]

        # --- writer: FIFO -> W beats of accepted bursts --------------------------------------
        beat_index = Signal(8)
        beat = self.write.beat
        m.d.comb += [
            beat.valid.eq(words.r_rdy & bursts.r_rdy),
            beat.payload.data.eq(words.r_data[:bus_bits]),
            beat.payload.strb.eq(words.r_data[bus_bits:] if narrow else (1 << bus_bytes) - 1),
            beat.payload.last.eq(beat_index == bursts.r_data),
            words.r_en.eq(beat.valid & beat.ready),
            bursts.r_en.eq(beat.valid & beat.ready & beat.payload.last),
        ]
        with m.If(beat.valid & beat.ready):
            m.d.sync += beat_index.eq(Mux(beat.payload.last, 0, beat_index + 1))

        # --- completion ------------------------------------------------------------------
        # Every burst has been answered, hence all its beats were sent, hence all reads
        # were done; the reader and FIFO terms only make that independent of the slave.
        idle = Signal()
        m.d.comb += idle.eq(~req_busy & ~rd_busy & ~got & (outstanding == 0)
                            & (words.level == 0) & (bursts.level == 0))
        with m.If(seq.executing & ~seq.first & idle):
            m.d.comb += seq.done.eq(1)
        return m
