"""Binary encoding of instructions (128-bit words) and micro-ops, little-endian in DRAM."""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

from vdla.config import INSN_BITS, HardwareConfig
from vdla.extensions import insn_bits
from vdla.isa.insn import INSN_TYPES, Alu, Insn, MemoryType, Opcode, Uop, lacked_op
from vdla.isa.layout import layouts_for, uop_layout

__all__ = ["EncodeError", "DecodeError", "INSN_BYTES", "encode", "decode", "encode_stream",
           "decode_stream", "encode_uop", "decode_uop", "encode_uops", "decode_uops"]

INSN_BYTES = INSN_BITS // 8


class EncodeError(ValueError):
    """A field value does not fit the field's width for this configuration."""


class DecodeError(ValueError):
    """A word is not a valid instruction or micro-op for this configuration."""


def _field_range(name: str, width: int) -> tuple[int, int]:
    if name in Alu._signed_fields:
        return -(1 << (width - 1)), (1 << (width - 1)) - 1
    return 0, (1 << width) - 1


def _unimplemented_alu_op(insn: Insn, config: HardwareConfig) -> str:
    """The ALU operations `config` has, if it lacks the one the instruction needs (its
    own, or TAB for a LOAD of the table); else ""."""
    if lacked_op(insn, config) is None:
        return ""
    return ", ".join(op.name for op in sorted(config.alu_ops))


def encode(insn: Insn, config: HardwareConfig) -> int:
    """Encode one instruction as a 128-bit integer for `config`.

    Raises `EncodeError` naming the field, its value and the allowed range when a value
    does not fit its field.
    """
    if not isinstance(insn, Insn) or insn.opcode is None:
        raise TypeError(f"encode() takes a Load, Store, Gemm, Alu or Finish, not {insn!r}")
    kind = insn.opcode.name
    if allowed := _unimplemented_alu_op(insn, config):
        what = ("ALU field alu_opcode=" if isinstance(insn, Alu)
                else "LOAD field memory_type=")
        raise EncodeError(f"{what}{lacked_op(insn, config).name} is not implemented by "
                          f"config {config.name} (allowed {allowed})")
    layout = layouts_for(config)[kind]
    # An extension's bit (the GEMM's dw) set on a config whose layout lacks it.
    for ext, bits in insn_bits(kind):
        if getattr(insn, bits.field, 0) and bits.field not in layout.fields:
            raise EncodeError(f"{kind} field {bits.field}={int(getattr(insn, bits.field))} (the "
                              f"{ext.title}) is not implemented by config {config.name} (it "
                              f"needs {ext.needs()})")
    word = 0
    values = vars(insn)     # the fields (the opcode is the class's)
    for name, lsb, width, low, high in _encoder(config, kind):
        value = int(insn.opcode if name == "opcode" else values[name])
        if not low <= value <= high:
            raise EncodeError(
                f"{kind} field {name}={value} does not fit its {width}-bit field "
                f"(allowed {low}..{high}) in config {config.name}")
        word |= (value & ((1 << width) - 1)) << lsb
    return word


@functools.lru_cache(maxsize=256)
def _encoder(config: HardwareConfig, kind: str) -> tuple[tuple[str, int, int, int, int], ...]:
    """(name, lsb, width, lowest, highest value) of each field of instruction `kind` on
    `config`, in layout order: what `encode` checks and packs, worked out once."""
    return tuple((name, lsb, width, *_field_range(name, width))
                 for name, (lsb, width) in layouts_for(config)[kind].fields.items())


def decode(word: int, config: HardwareConfig) -> Insn:
    """Decode a 128-bit instruction word for `config`.

    Raises `DecodeError` for an unknown opcode or memory type, or for set bits that no
    field of the instruction uses.
    """
    if not 0 <= word < 1 << INSN_BITS:
        raise DecodeError(f"instruction word {word:#x} is not a {INSN_BITS}-bit value")
    code = word & 0b111
    try:
        opcode = Opcode(code)
    except ValueError:
        known = ", ".join(f"{op.name} {op.value}" for op in Opcode)
        raise DecodeError(f"instruction word {word:#034x} has unknown opcode {code}; "
                          f"known: {known}") from None
    layout = layouts_for(config)[opcode.name]
    stray = word & layout.reserved_mask
    if stray:
        raise DecodeError(f"{opcode.name} instruction word {word:#034x} sets bits "
                          f"{stray:#x} that no field uses (they must be zero)")
    values = {name: (word >> lsb) & mask for name, lsb, mask in _decoder(config, opcode.name)}
    if "imm" in values and values["imm"] >> (layout.fields["imm"][1] - 1):
        values["imm"] -= 1 << layout.fields["imm"][1]
    if "memory_type" in values:
        mem = values["memory_type"]
        if mem not in MemoryType._value2member_map_:
            known = ", ".join(f"{m.name} {m.value}" for m in MemoryType)
            raise DecodeError(f"{opcode.name} instruction word {word:#034x} has unknown "
                              f"memory_type {mem}; known: {known}")
    try:
        insn = INSN_TYPES[opcode](**values)
    except ValueError as exc:
        raise DecodeError(f"instruction word {word:#034x}: {exc}") from None
    if allowed := _unimplemented_alu_op(insn, config):
        what = "alu_opcode" if isinstance(insn, Alu) else "memory_type"
        raise DecodeError(f"{opcode.name} instruction word {word:#034x} uses {what} "
                          f"{lacked_op(insn, config).name}, which config {config.name} "
                          f"does not implement (allowed {allowed})")
    return insn


@functools.lru_cache(maxsize=256)
def _decoder(config: HardwareConfig, kind: str) -> tuple[tuple[str, int, int], ...]:
    """(name, lsb, mask) of each field of instruction `kind` on `config` but the opcode,
    in layout order: what `decode` extracts, worked out once."""
    return tuple((name, lsb, (1 << width) - 1)
                 for name, (lsb, width) in layouts_for(config)[kind].fields.items()
                 if name != "opcode")


def encode_stream(insns: Iterable[Insn], config: HardwareConfig) -> bytes:
    """Encode instructions as the little-endian byte stream the hardware fetches."""
    out = bytearray()
    for index, insn in enumerate(insns):
        try:
            out += encode(insn, config).to_bytes(INSN_BYTES, "little")
        except EncodeError as exc:
            raise EncodeError(f"instruction {index}: {exc}") from None
    return bytes(out)


def decode_stream(data: bytes, config: HardwareConfig) -> list[Insn]:
    """Decode a little-endian instruction stream (a multiple of 16 bytes)."""
    data = bytes(data)
    if len(data) % INSN_BYTES:
        raise DecodeError(f"an instruction stream is a multiple of {INSN_BYTES} bytes; "
                          f"got {len(data)} bytes")
    insns = []
    for index in range(len(data) // INSN_BYTES):
        word = int.from_bytes(data[index * INSN_BYTES:(index + 1) * INSN_BYTES], "little")
        try:
            insns.append(decode(word, config))
        except DecodeError as exc:
            raise DecodeError(f"instruction {index}: {exc}") from None
    return insns


def encode_uop(uop: Uop, config: HardwareConfig) -> int:
    word = 0
    for name, (lsb, width) in uop_layout(config).items():
        value = getattr(uop, name)
        if value >> width:
            raise EncodeError(f"Uop field {name}={value} does not fit its {width}-bit field "
                              f"(allowed 0..{(1 << width) - 1}) in config {config.name}")
        word |= value << lsb
    return word


def decode_uop(word: int, config: HardwareConfig) -> Uop:
    used = sum(width for _, width in uop_layout(config).values())
    if not 0 <= word < 1 << config.uop_bits or word >> used:
        raise DecodeError(f"micro-op word {word:#x} sets bits above the {used} used by "
                          f"dst, src and wgt in config {config.name}")
    return Uop(**{name: (word >> lsb) & ((1 << width) - 1)
                  for name, (lsb, width) in uop_layout(config).items()})


def encode_uops(uops: Sequence[Uop], config: HardwareConfig) -> bytes:
    """Encode micro-ops as little-endian words of `config.uop_bytes` each."""
    out = bytearray()
    for index, uop in enumerate(uops):
        try:
            out += encode_uop(uop, config).to_bytes(config.uop_bytes, "little")
        except EncodeError as exc:
            raise EncodeError(f"micro-op {index}: {exc}") from None
    return bytes(out)


def decode_uops(data: bytes, config: HardwareConfig) -> list[Uop]:
    data = bytes(data)
    size = config.uop_bytes
    if len(data) % size:
        raise DecodeError(f"a micro-op table is a multiple of {size} bytes; got {len(data)}")
    return [decode_uop(int.from_bytes(data[i:i + size], "little"), config)
            for i in range(0, len(data), size)]
