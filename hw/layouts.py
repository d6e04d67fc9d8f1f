"""Amaranth views of instructions and micro-ops, derived from `vdla.isa`'s layouts.

The bit positions come from `vdla.isa.layouts_for(config)` (itself derived from
`HardwareConfig`), so the hardware decodes exactly what the encoder writes; no field
position is written down twice.
"""

from __future__ import annotations

import functools

from amaranth.hdl import Cat, Value, signed, unsigned
from amaranth.lib import data

from vdla.config import INSN_BITS, HardwareConfig
from vdla.isa import layouts_for, uop_layout
from vdla.isa.insn import MemoryType, Opcode

__all__ = ["insn_layout", "uop_view_layout", "INSN_BITS", "Opcode", "MemoryType",
           "DMA_FIELDS", "dma_command", "dma_command_layout"]

_SIGNED_FIELDS = {"imm"}

# The fields a 2-D DMA needs from a LOAD or STORE.
DMA_FIELDS = ("sram_base", "dram_base", "y_size", "x_size", "x_stride",
              "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")


@functools.lru_cache(maxsize=64)
def insn_layout(config: HardwareConfig, kind: str) -> data.FlexibleLayout:
    """A 128-bit layout with the fields of `kind` (``"LOAD"``, ``"GEMM"``, ...) in place."""
    fields = layouts_for(config)[kind].fields
    return data.FlexibleLayout(INSN_BITS, {
        name: data.Field(signed(width) if name in _SIGNED_FIELDS else unsigned(width), lsb)
        for name, (lsb, width) in fields.items()
    })


@functools.lru_cache(maxsize=64)
def uop_view_layout(config: HardwareConfig) -> data.FlexibleLayout:
    """The micro-op word: dst, src and wgt indices."""
    return data.FlexibleLayout(config.uop_bits, {
        name: data.Field(unsigned(width), lsb) for name, (lsb, width) in uop_layout(config).items()
    })


@functools.lru_cache(maxsize=64)
def dma_command_layout(config: HardwareConfig) -> data.StructLayout:
    """What a DMA engine takes from a LOAD/STORE instruction (same field widths)."""
    fields = layouts_for(config)["LOAD"].fields
    return data.StructLayout({name: unsigned(fields[name][1]) for name in DMA_FIELDS})


def dma_command(insn) -> Value:
    """The `dma_command_layout` value of `insn` (a View of a LOAD or STORE instruction):
    its fields in one concatenation, which a simulator computes in one assignment
    rather than one masked update of the command per field."""
    return Cat(*(getattr(insn, name) for name in DMA_FIELDS))
