"""The DRAM a program's DMA reaches, and the check that it stays inside the blocks its
session holds. Board side (`vdla.deploy.board`): the standard library and vdla's light
core (the ISA).

The accelerator has no memory protection: its LOADs and STOREs put on the bus whatever
addresses their instructions carry. A device shared between sessions (`vdla serve`)
or a bundle's script playing in a DMA region (`vdla.deploy.board.hardware.RegionDevice`)
checks each program before it starts, so that it reads and writes only memory its own
session allocated, never another session's data or the rest of the region:

    blocks = Blocks({addr: nbytes, ...})                # what the session holds
    check_dma(insns, config, blocks, insn_addr=a, insn_count=n)    # DmaOutsideBlocks

Every LOAD (micro-ops included) and every STORE that moves data must lie, from its first
element to its last (the whole strided span, gaps between rows included), inside the
blocks, and so must the instructions themselves. The same function runs on the
workstation's server and in the board's runtime, so the rule is one rule.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Mapping, Sequence

from vdla.config import HardwareConfig
from vdla.isa import INSN_BYTES, Insn, Load, MemoryType, Store, memory_geometry

__all__ = ["Blocks", "DmaOutsideBlocks", "check_dma", "dma_spans"]


class DmaOutsideBlocks(ValueError):
    """A program whose instructions or DMA reach memory its session does not hold."""


class Blocks:
    """The byte ranges a session holds, merged where adjacent, for range checks.

    blocks : {address: bytes} of every block (or an iterable of (address, bytes))
    """

    def __init__(self, blocks: Mapping[int, int] | Iterable[tuple[int, int]]):
        pairs = sorted(blocks.items() if isinstance(blocks, Mapping) else blocks)
        merged: list[list[int]] = []
        for addr, nbytes in pairs:
            if nbytes <= 0:
                continue
            if merged and addr <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], addr + nbytes)
            else:
                merged.append([addr, addr + nbytes])
        self._starts = [a for a, _ in merged]
        self._ends = [b for _, b in merged]

    def __len__(self) -> int:
        return len(self._starts)

    def covers(self, begin: int, end: int) -> bool:
        """Whether every byte of [begin, end) lies inside the blocks."""
        at = bisect.bisect_right(self._starts, begin) - 1
        return at >= 0 and end <= self._ends[at]

    def describe(self) -> str:
        """The held ranges in words (the first few), for an error message."""
        shown = [f"{a:#x}..{b:#x}" for a, b in zip(self._starts[:4], self._ends[:4])]
        more = f" and {len(self) - 4} more" if len(self) > 4 else ""
        return ", ".join(shown) + more if shown else "nothing"


def _elem_bytes(config: HardwareConfig) -> dict[MemoryType, int]:
    return {mem: size for mem, (size, _) in memory_geometry(config).items()}


def dma_spans(insns: Sequence[Insn], config: HardwareConfig
              ) -> list[tuple[int, str, int, int]]:
    """(instruction index, "reads" or "writes", first byte, end byte) of every LOAD and
    STORE of `insns` that moves data, as byte addresses on the bus.

    insns : the program's instructions (all of them: those after FINISH never run,
        and are checked anyway, which costs a compiled program nothing)
    config : the config the program is encoded for (its element sizes)
    """
    elem = _elem_bytes(config)
    spans = []
    for index, insn in enumerate(insns):
        if not isinstance(insn, (Load, Store)) or not insn.x_size or not insn.y_size:
            continue
        size = elem[insn.memory_type]
        last = insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size
        spans.append((index, "writes" if isinstance(insn, Store) else "reads",
                      insn.dram_base * size, last * size))
    return spans


def check_dma(insns: Sequence[Insn], config: HardwareConfig, blocks: Blocks, *,
              insn_addr: int, insn_count: int) -> None:
    """Refuse a program that reaches outside `blocks`, before it starts.

    insns : the program's instructions, as fetched from `insn_addr`
    config : the config it is encoded for
    blocks : what its session holds (`Blocks`)
    insn_addr, insn_count : where the instructions lie (bus address) and how many
    Raises `DmaOutsideBlocks` naming the first instruction that reaches outside (its
    index, the bytes, and what the session holds).
    """
    end = insn_addr + insn_count * INSN_BYTES
    if not blocks.covers(insn_addr, end):
        raise DmaOutsideBlocks(
            f"the program's {insn_count} instructions at {insn_addr:#x}..{end:#x} are not "
            f"inside memory this session allocated ({blocks.describe()})")
    for index, verb, begin, stop in dma_spans(insns, config):
        if not blocks.covers(begin, stop):
            raise DmaOutsideBlocks(
                f"instruction {index} {verb} DRAM bytes {begin:#x}..{stop:#x}, outside the "
                f"memory this session allocated ({blocks.describe()}): a program may move "
                "data only within its own blocks")
