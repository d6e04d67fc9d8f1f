"""Bit positions of each instruction's fields, derived from a `HardwareConfig`."""

from __future__ import annotations

import dataclasses
import functools

from vdla.config import INSN_BITS, HardwareConfig

__all__ = ["FieldLayout", "layouts_for", "uop_layout"]


@dataclasses.dataclass(frozen=True)
class FieldLayout:
    """Where each field of one instruction kind sits: ``fields[name] = (lsb, width)``."""

    kind: str
    fields: dict[str, tuple[int, int]]

    @functools.cached_property  # decode reads it for every instruction
    def used_mask(self) -> int:
        mask = 0
        for lsb, width in self.fields.values():
            mask |= ((1 << width) - 1) << lsb
        return mask

    @functools.cached_property
    def reserved_mask(self) -> int:
        """Bits no field uses; they must be zero in a valid instruction."""
        return ((1 << INSN_BITS) - 1) & ~self.used_mask

    def bit_ranges(self) -> dict[str, str]:
        """``{"sram_base": "25:10", ...}``, as docs/isa.md's layout table writes them."""
        return {name: (f"{lsb + width - 1}:{lsb}" if width > 1 else f"{lsb}")
                for name, (lsb, width) in self.fields.items()}


@functools.lru_cache(maxsize=64)
def layouts_for(config: HardwareConfig) -> dict[str, FieldLayout]:
    """The layout of LOAD, STORE, GEMM, ALU and FINISH for `config`.

    Fields pack in order from bit 0; the second group starts at bit 64 (VTA's second
    64-bit word) or right after the first group if that needs more than 64 bits.
    `HardwareConfig` has already checked that every layout fits 128 bits.
    """
    layouts = {}
    for kind, (group_a, group_b) in config.insn_field_widths().items():
        fields = {}
        lsb = 0
        for name, width in group_a:
            fields[name] = (lsb, width)
            lsb += width
        lsb = max(lsb, 64) if group_b else lsb
        for name, width in group_b:
            fields[name] = (lsb, width)
            lsb += width
        layouts[kind] = FieldLayout(kind, fields)
    return layouts


@functools.lru_cache(maxsize=64)
def uop_layout(config: HardwareConfig) -> dict[str, tuple[int, int]]:
    """``{"dst": (lsb, width), "src": ..., "wgt": ...}`` of a micro-op word."""
    dst, src, wgt = config.uop_dst_bits, config.uop_src_bits, config.uop_wgt_bits
    return {"dst": (0, dst), "src": (dst, src), "wgt": (dst + src, wgt)}
