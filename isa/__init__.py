"""The vdla instruction set: instruction and micro-op types, binary encoding, assembly.

The layout is VTA 0.0.2's for the default `HardwareConfig`; field widths that depend on
buffer depths come from the config (see `vdla.isa.layout`).

`vdla.isa.registers` is the control register map the host programs the accelerator
through (plain data, imported by that path; no Amaranth needed).
"""

from vdla.isa.asm import AsmError, assemble, disassemble, format_insn, parse_insn
from vdla.isa.encoding import (INSN_BYTES, DecodeError, EncodeError, decode, decode_stream,
                               decode_uop, decode_uops, encode, encode_stream, encode_uop,
                               encode_uops)
from vdla.isa.insn import (DEP_FLAGS, Alu, AluOp, Finish, Gemm, Insn, Load, MemoryType,
                           Module, Opcode, Store, Uop, lacked_op, memory_geometry)
from vdla.isa.layout import FieldLayout, layouts_for, uop_layout
from vdla.isa.program import Program

__all__ = [
    "Opcode", "MemoryType", "Module", "AluOp", "DEP_FLAGS",
    "Insn", "Load", "Store", "Gemm", "Alu", "Finish", "Uop", "Program",
    "encode", "decode", "encode_stream", "decode_stream",
    "encode_uop", "decode_uop", "encode_uops", "decode_uops", "INSN_BYTES",
    "EncodeError", "DecodeError", "AsmError",
    "assemble", "disassemble", "format_insn", "parse_insn",
    "FieldLayout", "layouts_for", "uop_layout", "lacked_op", "memory_geometry",
]
