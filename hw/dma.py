"""2-D DMA engines between DRAM and the on-chip SRAMs.

`LoadDma` carries out the data movement of one LOAD instruction: ``y_size`` rows of
``x_size`` elements, ``x_stride`` elements apart in DRAM, written densely into an SRAM
with ``y_pad_0/y_pad_1`` rows and ``x_pad_0/x_pad_1`` columns of zeros around them
(docs/isa.md, LOAD and STORE). The load module uses one per INP and WGT, the compute module
one per UOP and ACC.

Two halves run at once: the *requester* turns rows into legal AXI bursts and issues them
ahead (several outstanding, up to the slave), while the *writer* walks the padded
output block, writing a zero element per cycle for padding and taking beats from DRAM
for data, one bus word per cycle. An element wider than the bus is written lane by lane
through a write port with bus-word granularity (no wide shift register; the port
carries the word, `SramWriteSignature` with ``word``); an element narrower than the bus
(the 32-bit micro-ops) is picked out of the beat, one per cycle.
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from vdla.config import HardwareConfig
from vdla.hw.axi import AXI_4K, ReadClientSignature
from vdla.hw.layouts import dma_command_layout

__all__ = ["DRAM_ADDR_WIDTH", "MAX_BURST_BEATS", "SramWriteSignature", "SramReadSignature",
           "LoadDma", "dram_burst_len", "sram_lanes"]

# Byte addresses to DRAM are 32-bit (a 4 GiB window, as on the Zynq HP ports).
DRAM_ADDR_WIDTH = 32
# Longest burst the DMAs issue. Long enough that address overhead vanishes, short enough
# that one client's burst does not hold the shared read channel for long.
MAX_BURST_BEATS = 32


class SramWriteSignature(wiring.Signature):
    """An SRAM write port, seen from the writer.

    Members
    -------
    addr : Out(range(depth))
    data : Out(elem_bits), or with ``word`` Out(elem_bits // lanes)
        The element; with ``word``, one lane's worth, which the SRAM writes into every
        lane whose enable is set (`vdla.hw.sram.Sram`). A DMA engine writes one bus
        word per cycle, or zeros into every lane: carrying the word rather than the
        element replicated spares a simulator a copy of the widest element each cycle.
    en : Out(lanes)
        One write enable per lane of ``elem_bits // lanes`` bits; all ones writes the
        whole element.
    """

    def __init__(self, *, depth: int, elem_bits: int, lanes: int = 1, word: bool = False):
        if elem_bits % lanes:
            raise TypeError(f"{elem_bits}-bit elements do not split into {lanes} lanes")
        self.depth, self.elem_bits, self.lanes, self.word = depth, elem_bits, lanes, word
        super().__init__({"addr": Out(range(depth)),
                          "data": Out(elem_bits // lanes if word else elem_bits),
                          "en": Out(lanes)})

    def __eq__(self, other):
        return (type(other) is type(self)
                and (other.depth, other.elem_bits, other.lanes, other.word)
                == (self.depth, self.elem_bits, self.lanes, self.word))


class SramReadSignature(wiring.Signature):
    """An SRAM read port, seen from the reader: ``data`` is the element at the ``addr``
    of the previous cycle (a synchronous read, as block RAMs do).

    Members
    -------
    addr : Out(range(depth))
    data : In(elem_bits)
    """

    def __init__(self, *, depth: int, elem_bits: int):
        self.depth, self.elem_bits = depth, elem_bits
        super().__init__({"addr": Out(range(depth)), "data": In(elem_bits)})

    def __eq__(self, other):
        return (type(other) is type(self)
                and (other.depth, other.elem_bits) == (self.depth, self.elem_bits))


def sram_lanes(config: HardwareConfig, elem_bytes: int) -> int:
    """Bus words in an SRAM element of `elem_bytes` (1 for elements up to a bus word):
    the lanes of the write port a `LoadDma` fills it through."""
    return max(1, elem_bytes // (config.dram_bus_width // 8))


def dram_burst_len(m: Module, addr, beats_left, *, bus_bytes: int, name: str):
    """Beats of the next legal burst at byte `addr`: at most `beats_left`,
    `MAX_BURST_BEATS`, and what is left of the 4 KiB page."""
    log_bus = exact_log2(bus_bytes)
    to_page = Signal(range(AXI_4K // bus_bytes + 1), name=f"{name}_to_page")
    m.d.comb += to_page.eq((AXI_4K >> log_bus) - addr[log_bus:exact_log2(AXI_4K)])
    burst = Signal(range(MAX_BURST_BEATS + 1), name=f"{name}_burst")
    limit = Mux(to_page < MAX_BURST_BEATS, to_page, MAX_BURST_BEATS)
    m.d.comb += burst.eq(Mux(beats_left < limit, beats_left, limit))
    return burst


class LoadDma(wiring.Component):
    """Moves one LOAD's 2-D block from DRAM into an SRAM, with zero padding.

    Parameters
    ----------
    config : HardwareConfig
        Gives the instruction field widths and the DRAM bus width.
    elem_bytes : int
        Bytes of one element of the target memory (a power of two).
    depth : int
        Elements in the target SRAM.

    Ports
    -----
    cmd : In(stream.Signature(dma_command_layout(config)))
        The LOAD's fields; taken when the engine is idle.
    done : Out(1)
        Pulses for one cycle when the last element of the command has been written.
    busy : Out(1)
        A command is in progress.
    read : Out(ReadClientSignature)
        Bursts to DRAM and their beats.
    sram : Out(SramWriteSignature(depth, elem_bytes * 8, lanes, word=True))
        ``lanes`` is the number of bus words in an element (`sram_lanes`: 1 for elements
        up to a bus word); ``data`` is the bus word (zeros for padding) or the element.
    """

    def __init__(self, config: HardwareConfig, *, elem_bytes: int, depth: int):
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"LoadDma needs a HardwareConfig, not {config!r}")
        self.config = config
        self.elem_bytes = elem_bytes
        self.bus_bytes = config.dram_bus_width // 8
        self.lanes = sram_lanes(config, elem_bytes)
        self.depth = depth
        super().__init__({
            "cmd": In(stream.Signature(dma_command_layout(config))),
            "done": Out(1),
            "busy": Out(1),
            "read": Out(ReadClientSignature(addr_width=DRAM_ADDR_WIDTH,
                                            data_width=config.dram_bus_width)),
            "sram": Out(SramWriteSignature(depth=depth, elem_bits=elem_bytes * 8,
                                           lanes=self.lanes, word=True)),
        })

    def elaborate(self, platform):
        m = Module()
        cmd = self.cmd.payload
        bus_bytes, elem_bytes = self.bus_bytes, self.elem_bytes
        log_bus, log_elem = exact_log2(bus_bytes), exact_log2(elem_bytes)
        elems_per_beat = max(1, bus_bytes // elem_bytes)

        req_busy = Signal()
        wr_busy = Signal()
        m.d.comb += [self.busy.eq(req_busy | wr_busy),
                     self.cmd.ready.eq(~req_busy & ~wr_busy)]
        start = Signal()
        m.d.comb += start.eq(self.cmd.valid & self.cmd.ready)

        # --- requester: rows -> bursts ---------------------------------------------------
        row_elem = Signal(len(cmd.dram_base) + 16)   # DRAM element index of the row
        rows_left = Signal.like(cmd.y_size)
        x_size = Signal.like(cmd.x_size)
        x_stride = Signal.like(cmd.x_stride)
        cur = Signal(DRAM_ADDR_WIDTH)                 # byte address of the next burst
        beats_left = Signal(len(cmd.x_size) + log_elem + 1)
        row_pending = Signal()                        # the row's beat range needs computing

        byte_start = Signal(DRAM_ADDR_WIDTH)
        byte_end = Signal(DRAM_ADDR_WIDTH + 1)
        m.d.comb += [byte_start.eq(row_elem << log_elem),
                     byte_end.eq(byte_start + (x_size << log_elem))]
        burst = dram_burst_len(m, cur, beats_left, bus_bytes=bus_bytes, name="load")

        with m.If(start):
            m.d.sync += [row_elem.eq(cmd.dram_base), rows_left.eq(cmd.y_size),
                         x_size.eq(cmd.x_size), x_stride.eq(cmd.x_stride),
                         row_pending.eq(1),
                         req_busy.eq((cmd.x_size != 0) & (cmd.y_size != 0))]
        with m.Elif(req_busy & row_pending):
            first_beat = byte_start >> log_bus
            end_beat = (byte_end + bus_bytes - 1) >> log_bus
            m.d.sync += [cur.eq(first_beat << log_bus), beats_left.eq(end_beat - first_beat),
                         row_pending.eq(0)]
        with m.Elif(req_busy):
            m.d.comb += [self.read.req.valid.eq(1),
                         self.read.req.payload.addr.eq(cur),
                         self.read.req.payload.len.eq(burst - 1)]
            with m.If(self.read.req.ready):
                m.d.sync += [cur.eq(cur + (burst << log_bus)),
                             beats_left.eq(beats_left - burst)]
                with m.If(beats_left == burst):   # the row's last burst
                    m.d.sync += [row_elem.eq(row_elem + x_stride), rows_left.eq(rows_left - 1),
                                 row_pending.eq(1)]
                    with m.If(rows_left == 1):
                        m.d.sync += req_busy.eq(0)

        # --- writer: the padded block, element by element ----------------------------------
        out_row = Signal(len(cmd.y_size) + 1)
        col = Signal(len(cmd.x_size) + 1)
        rows_total = Signal.like(out_row)
        row_width = Signal.like(col)
        data_row_begin = Signal.like(cmd.y_pad_0)
        data_row_end = Signal.like(out_row)
        data_col_begin = Signal.like(cmd.x_pad_0)
        data_col_end = Signal.like(col)
        sram_addr = Signal(range(self.depth))
        lane = Signal(range(max(self.lanes, elems_per_beat, 2)))
        w_row_elem = Signal.like(row_elem)  # DRAM element index of the writer's data row
        w_stride = Signal.like(cmd.x_stride)

        with m.If(start):
            width = cmd.x_pad_0 + cmd.x_size + cmd.x_pad_1
            rows = cmd.y_pad_0 + cmd.y_size + cmd.y_pad_1
            m.d.sync += [
                out_row.eq(0), col.eq(0), sram_addr.eq(cmd.sram_base),
                rows_total.eq(rows), row_width.eq(width),
                data_row_begin.eq(cmd.y_pad_0), data_row_end.eq(cmd.y_pad_0 + cmd.y_size),
                data_col_begin.eq(cmd.x_pad_0), data_col_end.eq(cmd.x_pad_0 + cmd.x_size),
                w_row_elem.eq(cmd.dram_base), w_stride.eq(cmd.x_stride),
                lane.eq(cmd.dram_base % elems_per_beat if elems_per_beat > 1 else 0),
                # x_size 0 is a dependency-only no-op (nothing written, not even padding).
                wr_busy.eq((cmd.x_size != 0) & (rows != 0)),
            ]

        data_row = Signal()
        is_data = Signal()
        m.d.comb += [
            data_row.eq((out_row >= data_row_begin) & (out_row < data_row_end)),
            is_data.eq(data_row & (col >= data_col_begin) & (col < data_col_end)),
        ]
        advance = Signal()   # one element of the block is written this cycle
        last_lane = Signal()
        with m.If(wr_busy):
            with m.If(~is_data):
                m.d.comb += [self.sram.data.eq(0), self.sram.en.eq((1 << self.lanes) - 1),
                             advance.eq(1)]
            with m.Else():
                beat = self.read.beat
                if self.lanes > 1:
                    # Element wider than the bus: this beat is lane `lane` of it.
                    m.d.comb += [
                        beat.ready.eq(1),
                        self.sram.data.eq(beat.payload.data),
                        self.sram.en.eq(Mux(beat.valid, Const(1, self.lanes) << lane, 0)),
                        last_lane.eq(lane == self.lanes - 1),
                        advance.eq(beat.valid & last_lane),
                    ]
                    with m.If(beat.valid):
                        m.d.sync += lane.eq(Mux(last_lane, 0, lane + 1))
                else:
                    # Element no wider than the bus: pick element `lane` of the beat; the beat
                    # is used up at its last element or at the row's last element.
                    row_last = col == data_col_end - 1
                    m.d.comb += [
                        self.sram.data.eq(beat.payload.data.word_select(
                            lane, elem_bytes * 8) if elems_per_beat > 1 else beat.payload.data),
                        self.sram.en.eq(beat.valid),
                        last_lane.eq(lane == elems_per_beat - 1),
                        beat.ready.eq(last_lane | row_last),
                        advance.eq(beat.valid),
                    ]
                    if elems_per_beat > 1:
                        with m.If(beat.valid):
                            next_row_lane = (w_row_elem + w_stride) % elems_per_beat
                            m.d.sync += lane.eq(Mux(row_last, next_row_lane,
                                                    Mux(last_lane, 0, lane + 1)))
            m.d.comb += self.sram.addr.eq(sram_addr)

        with m.If(advance):
            m.d.sync += sram_addr.eq(sram_addr + 1)
            with m.If(col == row_width - 1):
                m.d.sync += [col.eq(0), out_row.eq(out_row + 1)]
                with m.If(data_row):
                    m.d.sync += w_row_elem.eq(w_row_elem + w_stride)
                with m.If(out_row == rows_total - 1):
                    m.d.sync += wr_busy.eq(0)
                    m.d.comb += self.done.eq(1)
            with m.Else():
                m.d.sync += col.eq(col + 1)

        # A command that writes nothing still reports completion.
        with m.If(start & ((self.cmd.payload.x_size == 0)
                           | (cmd.y_pad_0 + cmd.y_size + cmd.y_pad_1 == 0))):
            m.d.comb += self.done.eq(1)
        return m
