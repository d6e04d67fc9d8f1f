"""On-chip SRAMs: `amaranth.lib.memory` memories behind the modules' write ports."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import memory

from vdla.hw.dma import SramWriteSignature

__all__ = ["Sram"]


class Sram:
    """A memory of `depth` elements of `elem_bits`, written through one write port.

    The write port's granularity is ``elem_bits // lanes`` so a DMA can fill an element
    wider than the bus one bus word at a time.

    Parameters
    ----------
    name : str
    depth, elem_bits, lanes : int
        As in `SramWriteSignature`.
    """

    def __init__(self, name: str, *, depth: int, elem_bits: int, lanes: int = 1):
        self.name = name
        self.signature = SramWriteSignature(depth=depth, elem_bits=elem_bits, lanes=lanes)
        self.memory = memory.Memory(shape=elem_bits, depth=depth, init=[])
        self.write_port = self.memory.write_port(
            granularity=elem_bits // lanes if lanes > 1 else None)

    def read_port(self, *, transparent: bool = False):
        """A synchronous read port (data one cycle after the address); `transparent`
        returns the data being written to the same address in the same cycle."""
        return self.memory.read_port(
            transparent_for=(self.write_port,) if transparent else ())

    def connect_read(self, m: Module, reader, *, transparent: bool = False):
        """Serve a `SramReadSignature` port `reader` (as seen from the memory's side)."""
        port = self.read_port(transparent=transparent)
        m.d.comb += [port.addr.eq(reader.addr), reader.data.eq(port.data)]
        return port

    def elaborate(self, m: Module, write):
        """Add the memory to `m`, written by interface `write` (a SramWriteSignature port;
        data one lane wide, a ``word`` port's, goes into every lane)."""
        m.submodules[self.name] = self.memory
        data = write.data
        if len(data) != len(self.write_port.data):
            data = data.replicate(len(self.write_port.data) // len(data))
        m.d.comb += [self.write_port.addr.eq(write.addr), self.write_port.data.eq(data),
                     self.write_port.en.eq(write.en)]
