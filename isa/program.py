"""`Program`: an instruction stream bound to the configuration it is encoded for."""

from __future__ import annotations

import dataclasses
from typing import Iterator

from vdla.config import HardwareConfig
from vdla.isa.asm import assemble, disassemble
from vdla.isa.encoding import INSN_BYTES, decode_stream, encode_stream
from vdla.isa.insn import Insn

__all__ = ["Program"]


@dataclasses.dataclass(frozen=True)
class Program:
    """A sequence of instructions for one `HardwareConfig`.

    `to_bytes` gives the little-endian stream the hardware fetches from DRAM
    (`INSN_BYTES` per instruction); `to_asm` the text form.
    """

    insns: tuple[Insn, ...]
    config: HardwareConfig

    def __post_init__(self):
        object.__setattr__(self, "insns", tuple(self.insns))
        for index, insn in enumerate(self.insns):
            if not isinstance(insn, Insn) or insn.opcode is None:
                raise TypeError(f"Program instruction {index} is not an instruction: {insn!r}")

    def __len__(self) -> int:
        return len(self.insns)

    def __iter__(self) -> Iterator[Insn]:
        return iter(self.insns)

    def __getitem__(self, index):
        return self.insns[index]

    @property
    def nbytes(self) -> int:
        return len(self.insns) * INSN_BYTES

    def to_bytes(self) -> bytes:
        return encode_stream(self.insns, self.config)

    @classmethod
    def from_bytes(cls, data: bytes, config: HardwareConfig) -> "Program":
        return cls(tuple(decode_stream(data, config)), config)

    def to_asm(self) -> str:
        return disassemble(self.insns, self.config)

    @classmethod
    def from_asm(cls, text: str, config: HardwareConfig, *, source: str = "<asm>") -> "Program":
        return cls(tuple(assemble(text, config, source=source)), config)
