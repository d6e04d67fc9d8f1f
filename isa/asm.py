"""Text assembly for vdla instruction streams.

One instruction per line: a mnemonic, for LOAD the memory type and for ALU the
operation, then ``field=value`` pairs (decimal or 0x hex; fields left out are 0) and the
names of the set flags (``pop_prev pop_next push_prev push_next reset_reg use_imm``).
``#`` or ``;`` starts a comment. ``.config NAME`` records the configuration the stream
was written for; assembling it for another configuration is an error.

    .config 1x16x16_i8w8a32_15_15_18_17
    LOAD INP sram_base=0 dram_base=0x40 y_size=4 x_size=4 x_stride=4 push_next
    GEMM reset_reg uop_bgn=0 uop_end=1 iter_out=16 iter_in=1 dst_factor_out=1 pop_prev
    ALU SHR use_imm imm=-2 uop_bgn=1 uop_end=2 iter_out=16 iter_in=1 dst_factor_out=1
    FINISH
"""

from __future__ import annotations

import dataclasses

from vdla.config import HardwareConfig
from vdla.isa.encoding import EncodeError, encode
from vdla.isa.insn import AluOp, Alu, Insn, Load, MemoryType, Opcode, INSN_TYPES

__all__ = ["AsmError", "format_insn", "parse_insn", "assemble", "disassemble"]


class AsmError(ValueError):
    """A line of assembly text is not a valid instruction."""


def _is_flag(insn_type, name: str) -> bool:
    return any(f.name == name and f.type in ("bool", bool)
               for f in dataclasses.fields(insn_type))


def format_insn(insn: Insn) -> str:
    """One line of assembly for `insn` (only non-zero fields, then set flags)."""
    words = [insn.opcode.name]
    fields = insn.fields()
    if isinstance(insn, Load):
        words.append(fields.pop("memory_type").name)
    elif insn.opcode == Opcode.STORE:
        fields.pop("memory_type")  # always OUT
    elif isinstance(insn, Alu):
        words.append(fields.pop("alu_opcode").name)
    flags = []
    for name, value in fields.items():
        if _is_flag(type(insn), name):
            if value:
                flags.append(name)
        elif value:
            words.append(f"{name}={value}")
    return " ".join(words + flags)


def parse_insn(line: str) -> Insn:
    """Parse one line of assembly (without comments) into an instruction."""
    tokens = line.split()
    if not tokens:
        raise AsmError("empty line")
    mnemonic = tokens.pop(0).upper()
    if mnemonic not in Opcode.__members__:
        raise AsmError(f"unknown mnemonic {mnemonic!r}; known: "
                       f"{', '.join(op.name for op in Opcode)}")
    insn_type = INSN_TYPES[Opcode[mnemonic]]
    kwargs: dict = {}
    if insn_type is Load:
        choices = ", ".join(m.name for m in Load._memory_types)
        if not tokens or tokens[0].upper() not in {m.name for m in Load._memory_types}:
            raise AsmError(f"LOAD needs a memory type ({choices}) after the mnemonic")
        kwargs["memory_type"] = MemoryType[tokens.pop(0).upper()]
    elif insn_type is Alu:
        if not tokens or tokens[0].upper() not in AluOp.__members__:
            raise AsmError(f"ALU needs an operation ({', '.join(op.name for op in AluOp)}) "
                           "after the mnemonic")
        kwargs["alu_opcode"] = AluOp[tokens.pop(0).upper()]
    valid = {f.name for f in dataclasses.fields(insn_type)} - {"memory_type", "alu_opcode"}
    for token in tokens:
        name, eq, text = token.partition("=")
        if name not in valid:
            raise AsmError(f"{mnemonic} has no field {name!r}; fields: {', '.join(sorted(valid))}")
        if name in kwargs:
            raise AsmError(f"{mnemonic} field {name!r} is given twice")
        if _is_flag(insn_type, name):
            if eq:
                raise AsmError(f"{name} is a flag: write '{name}' alone to set it")
            kwargs[name] = True
            continue
        if not eq:
            raise AsmError(f"{mnemonic} field {name!r} needs a value ({name}=N)")
        try:
            kwargs[name] = int(text, 0)
        except ValueError:
            raise AsmError(f"{mnemonic} field {name}={text!r} is not an integer") from None
    try:
        return insn_type(**kwargs)
    except (TypeError, ValueError) as exc:
        raise AsmError(str(exc)) from None


def assemble(text: str, config: HardwareConfig, *, source: str = "<asm>") -> list[Insn]:
    """Parse assembly text into instructions, checking each fits `config`'s fields.

    Errors name the source and line: ``prog.s:3: GEMM field uop_end=...``.
    """
    insns = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        try:
            if line.startswith("."):
                directive, *arg = line.split(None, 1)
                arg = arg[0] if arg else ""
                if directive != ".config":
                    raise AsmError(f"unknown directive {directive!r}; known: .config")
                if not arg:
                    raise AsmError(".config needs the name of a config, e.g. "
                                   f".config {config.name}")
                if arg.strip() != config.name:
                    raise AsmError(f"written for config {arg.strip()!r}, assembling for "
                                   f"{config.name!r} (pass --config with the matching file)")
                continue
            insn = parse_insn(line)
            encode(insn, config)  # check field widths now, with the line number at hand
        except (AsmError, EncodeError) as exc:
            raise AsmError(f"{source}:{number}: {exc}") from None
        insns.append(insn)
    return insns


def disassemble(insns, config: HardwareConfig | None = None) -> str:
    """Assembly text for `insns`; `assemble` of it gives the same instructions back."""
    lines = [f".config {config.name}"] if config is not None else []
    lines += [format_insn(insn) for insn in insns]
    return "\n".join(lines) + "\n"
