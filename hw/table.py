"""The ALU's lookup table (TAB, an extension past VTA; semantics in `vdla.config.AluOp`).

A LOAD of TAB fills the table through its own `LoadDma` (32-bit entries in DRAM, one a
cycle); an ALU micro-op with op TAB replaces each lane of acc[dst] with
``table[(operand - acc[dst]) mod 256]``, the entry's `TABLE_BITS` bits sign-extended.

Why one copy per lane: a micro-op looks up every lane of its acc row in the same cycle
(batch · block_out lookups, one micro-op a cycle like every immediate ALU op), and a
memory has as many read ports as copies of itself. So the table is `lanes` memories of
256 × 18 bits, all written with the same address and data in the same cycle (one entry a
cycle, as the DMA delivers them), each read by its own lane.

Why asynchronous reads (``domain="comb"``): the index is known only in the write stage
(acc[dst], which the acc SRAM gives a cycle after its address, and the operand), and
the result is written in that same stage, like every ALU op's. An asynchronous read
keeps the lookup inside that one stage, with no extra pipeline stage and no change to
the acc port's hazard rule (`vdla.hw.compute`). It also makes each copy LUT RAM (a
256 × 1 bit column is four LUT6 on the 7-series), not a block RAM, so the table takes
no BRAM and adds no pressure on the BRAM ports the buffers use.

Cost per lane: 256 × 18 bits of LUT RAM, an 8-bit subtractor for the index and one more
input on the ALU's result multiplexer.
"""

from __future__ import annotations

from amaranth import Module, signed
from amaranth.lib import memory

from vdla.config import TABLE_BITS, TABLE_ENTRIES, HardwareConfig

__all__ = ["LaneTables"]


class LaneTables:
    """One `TABLE_ENTRIES` × signed(`TABLE_BITS`) memory per ALU lane, written together.

    Parameters
    ----------
    config : HardwareConfig
        Gives the lanes (batch · block_out).
    """

    def __init__(self, config: HardwareConfig):
        self.config = config
        self.lanes = config.batch * config.block_out
        self.memories = [memory.Memory(shape=signed(TABLE_BITS), depth=TABLE_ENTRIES, init=[])
                         for _ in range(self.lanes)]

    def elaborate(self, m: Module, write) -> list:
        """Add the memories to `m`, every one written by `write` (the TAB DMA's
        `vdla.hw.dma.SramWriteSignature` port: an entry's low `TABLE_BITS` bits at its
        address); returns each lane's asynchronous read port (``addr`` in, ``data``
        the signed entry in the same cycle)."""
        ports = []
        for lane, mem in enumerate(self.memories):
            m.submodules[f"table{lane}"] = mem
            port = mem.write_port()
            m.d.comb += [port.addr.eq(write.addr), port.data.eq(write.data[:TABLE_BITS]),
                         port.en.eq(write.en)]
            ports.append(mem.read_port(domain="comb"))
        return ports
