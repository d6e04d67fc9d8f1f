"""Moving a program to where its data lies: every LOAD/STORE's DRAM address, from the
arena at address 0 the program was emitted for to the arena (and, where activations
stay in DRAM, the buffers: the compiler's `placement.region_mover`) a session
allocated, or a whole recorded model from a simulator's addresses to a board's DMA
region (`vdla.deploy.board.player`). It is the ISA's business, not one back end's: which
fields are DRAM addresses, and in which units, is the instruction layout's.

`relocate` rebuilds the instructions; `relocate_encoded` rewrites only the dram_base
fields of the words compiled once (`VdlaKernel.encoded`), which is what a session does
before an op's first run. Both move the same accesses (`relocated_bases`).
"""

from __future__ import annotations

import dataclasses

from vdla.config import HardwareConfig
from vdla.isa.encoding import INSN_BYTES, EncodeError
from vdla.isa.insn import Load, MemoryType, Store, memory_geometry
from vdla.isa.layout import layouts_for
from vdla.isa.program import Program

__all__ = ["relocate", "relocate_encoded", "relocated_bases"]


def relocate(program: Program, base: int, config: HardwareConfig, move=None) -> Program:
    """`program` (emitted for an arena at DRAM address 0) for an arena at byte address
    `base` (aligned for every element type): every LOAD/STORE's dram_base moves by
    `base` in its elements. `move(insn, elem_bytes)` may give an access another
    dram_base instead (an activation in its tensor's buffer), or None to leave it to
    the arena."""
    insns = list(program.insns)
    for index, dram_base in relocated_bases(program, base, config, move):
        insns[index] = dataclasses.replace(insns[index], dram_base=dram_base)
    return Program(tuple(insns), config)


def relocate_encoded(program: Program, encoded: bytes, base: int, config: HardwareConfig,
                     move=None) -> bytes:
    """``relocate(program, base, config, move).to_bytes()``, from `encoded` (`program`'s
    own ``to_bytes()``, encoded once when it was compiled): only the moved dram_base
    fields are rewritten, so no instruction is rebuilt or encoded again (a session
    writes every op's program before its first run). EncodeError for an address its
    field cannot hold."""
    if len(encoded) != program.nbytes:
        raise ValueError(f"the encoded program has {len(encoded)} bytes; its "
                         f"{len(program)} instructions take {program.nbytes}")
    out = bytearray(encoded)
    fields = {kind: layouts_for(config)[kind].fields["dram_base"] for kind in ("LOAD", "STORE")}
    for index, dram_base in relocated_bases(program, base, config, move):
        kind = program.insns[index].opcode.name
        lsb, width = fields[kind]
        if not 0 <= dram_base < 1 << width:
            raise EncodeError(f"instruction {index}: {kind} field dram_base={dram_base} does "
                              f"not fit its {width}-bit field (allowed 0..{(1 << width) - 1}) "
                              f"in config {config.name}")
        at = index * INSN_BYTES
        word = int.from_bytes(out[at:at + INSN_BYTES], "little")
        word = word & ~(((1 << width) - 1) << lsb) | dram_base << lsb
        out[at:at + INSN_BYTES] = word.to_bytes(INSN_BYTES, "little")
    return bytes(out)


def relocated_bases(program: Program, base: int, config: HardwareConfig,
                    move=None) -> list[tuple[int, int]]:
    """(index, new dram_base) of every LOAD/STORE of `program` that moves data, for an
    arena at byte address `base` (`relocate`)."""
    elem = {mem: size for mem, (size, _) in memory_geometry(config).items()}
    out = []
    for index, insn in enumerate(program.insns):
        if isinstance(insn, (Load, Store)) and insn.x_size:
            size = elem[insn.memory_type]
            moved = None if move is None else move(insn, size)
            if moved is None:
                if base % size:
                    raise ValueError(f"arena address {base:#x} is not aligned to {size}-byte "
                                     f"{insn.memory_type.name} elements")
                moved = insn.dram_base + base // size
            out.append((index, moved))
    return out
