"""What every simulator of the accelerator agrees on before it runs anything: how the
instruction stream is fetched from DRAM, which module each instruction goes to, and
which token queues its dependency flags name (docs/isa.md, routing and dependency tokens)."""

from __future__ import annotations

import functools

from typing import Sequence

import numpy as np

from vdla.config import HardwareConfig
from vdla.isa import INSN_BYTES, DecodeError, Insn, Module, decode, format_insn
from vdla.sim.errors import ProgramError

__all__ = ["FLAG_QUEUES", "MODULES", "Route", "route", "route_program", "fetch_program"]

#: (module, flag) -> token queue; a flag with no queue (load's prev, store's next) is invalid.
FLAG_QUEUES = {
    (Module.LOAD, "pop_next"): "compute->load",
    (Module.LOAD, "push_next"): "load->compute",
    (Module.COMPUTE, "pop_prev"): "load->compute",
    (Module.COMPUTE, "pop_next"): "store->compute",
    (Module.COMPUTE, "push_prev"): "compute->load",
    (Module.COMPUTE, "push_next"): "compute->store",
    (Module.STORE, "pop_prev"): "compute->store",
    (Module.STORE, "push_prev"): "store->compute",
}
MODULES = (Module.LOAD, Module.COMPUTE, Module.STORE)

#: (module, token queues popped, token queues pushed) of one instruction.
Route = tuple[Module, tuple[str, ...], tuple[str, ...]]


def route(index: int, insn: Insn) -> Route:
    """Where instruction `index` runs and which token queues it pops and pushes.

    Raises `ProgramError` for a flag naming a neighbour the module does not have.
    """
    module = insn.module
    pops, pushes = [], []
    for flag in ("pop_prev", "pop_next", "push_prev", "push_next"):
        if getattr(insn, flag):
            queue = FLAG_QUEUES.get((module, flag))
            if queue is None:
                side = "previous" if flag.endswith("prev") else "next"
                raise ProgramError(
                    f"instruction {index} ({format_insn(insn)}) runs on the "
                    f"{module.value} module, which has no {side} module, but sets {flag}",
                    index)
            (pops if flag.startswith("pop") else pushes).append(queue)
    return module, tuple(pops), tuple(pushes)


def route_program(insns: Sequence[Insn]) -> list[Route]:
    return [route(index, insn) for index, insn in enumerate(insns)]


def fetch_program(dram: np.ndarray, insn_addr: int, insn_count: int,
                  config: HardwareConfig) -> list[Insn]:
    """Decode `insn_count` instructions at DRAM byte address `insn_addr`, as fetch reads
    them; `ProgramError` for an address or count that does not fit, or a bad word."""
    if isinstance(insn_addr, bool) or not isinstance(insn_addr, (int, np.integer)) or \
            isinstance(insn_count, bool) or not isinstance(insn_count, (int, np.integer)):
        raise ProgramError(f"instruction address and count must be integers, not "
                           f"{insn_addr!r} and {insn_count!r}")
    if insn_addr % INSN_BYTES:
        raise ProgramError(f"instruction address {insn_addr:#x} is not a multiple of "
                           f"{INSN_BYTES} bytes")
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or insn_count < 1 or end > len(dram):
        raise ProgramError(f"instructions {insn_addr:#x}..{end:#x} ({insn_count} of them) "
                           f"are not inside DRAM (0..{len(dram):#x})")
    halves = dram[insn_addr:end].view("<u8").tolist()
    insns = []
    for index, (low, high) in enumerate(zip(halves[0::2], halves[1::2])):
        try:
            insns.append(_decoded(low | high << 64, config))
        except DecodeError as exc:
            raise ProgramError(f"fetch at {insn_addr:#x}: instruction {index}: {exc}") \
                from None
    return insns


@functools.lru_cache(maxsize=1 << 16)
def _decoded(word: int, config: HardwareConfig) -> Insn:
    """`decode`, remembered by the word: a compiled model's programs repeat the same GEMM
    and ALU words once per tile, every backend decodes a program to validate it and again
    to count its work, and a tuner or a bench runs one program many times (decoding is
    about 12 us a word). Instructions are frozen, so sharing them is safe."""
    return decode(word, config)
