"""`ProgramBuilder`: build instruction streams with dependency tokens, VTA-runtime style.

Instructions are appended in program order. `dep_push(a, b)` marks the latest
instruction of module `a` to push a token to module `b`; `dep_pop(a, b)` makes the next
instruction of module `b` pop one. When no instruction can carry a flag (none yet, or the
flag is already set), a no-op of that module carries it (a LOAD or STORE with x_size 0).
`push_at(index, a, b)` sets the push flag on an earlier instruction of `a` (the
`vdla.runtime.tokens.RegionTokens` helper pushes a WAR token only once something waits
for it). `finish()` appends FINISH and checks that every pushed token is popped.

Token queues are first in, first out and tokens carry no data, so the k-th pop of a queue
waits for its k-th push. The builder therefore keeps every queue's pushes in program
order: a `push_at` before a push already made on the same queue is refused, since its
token would be consumed by a pop meant for the other.
"""

from __future__ import annotations

import dataclasses

from vdla.config import AluOp, HardwareConfig
from vdla.isa import Alu, Finish, Gemm, Insn, Load, MemoryType, Module, Program, Store, encode

__all__ = ["ProgramBuilder", "LOAD", "COMPUTE", "STORE"]

LOAD, COMPUTE, STORE = Module.LOAD, Module.COMPUTE, Module.STORE
_ORDER = {LOAD: 0, COMPUTE: 1, STORE: 2}
_NOPS = {LOAD: Load(memory_type=MemoryType.INP), COMPUTE: Load(memory_type=MemoryType.UOP),
         STORE: Store()}


def _edge(src: Module, dst: Module) -> tuple[str, str]:
    """(push flag on src, pop flag on dst) for tokens from src to dst."""
    if not isinstance(src, Module) or not isinstance(dst, Module) or abs(
            _ORDER[src] - _ORDER[dst]) != 1:
        raise ValueError(f"tokens flow only between neighbouring modules (load<->compute, "
                         f"compute<->store), not {src!r} -> {dst!r}")
    return ("push_next", "pop_prev") if _ORDER[dst] > _ORDER[src] else ("push_prev", "pop_next")


class ProgramBuilder:
    """Appends instructions for `config` and manages their dependency flags.

    Each append checks the fields fit the config's encoding and returns the
    instruction's index in the stream.
    """

    def __init__(self, config: HardwareConfig):
        self.config = config
        self._insns: list[Insn] = []
        self._last: dict[Module, int] = {}
        self._pending_pops: dict[Module, set[str]] = {m: set() for m in _ORDER}
        self._tokens: dict[tuple[Module, Module], int] = {}
        self._last_push: dict[tuple[Module, Module], int] = {}   # queue -> latest pusher
        self._finished = False

    def __len__(self) -> int:
        return len(self._insns)

    # --- instructions ---------------------------------------------------------------------

    def append(self, insn: Insn) -> int:
        """Append any instruction (pending pops for its module are added to it)."""
        if self._finished:
            raise RuntimeError("the program is finished; start a new ProgramBuilder")
        module = insn.module
        pops = self._pending_pops[module]
        if pops:
            insn = dataclasses.replace(insn, **{flag: True for flag in pops})
            pops.clear()
        encode(insn, self.config)  # fail here, with the caller's values, not at encode time
        self._insns.append(insn)
        self._last[module] = len(self._insns) - 1
        return len(self._insns) - 1

    def load(self, memory_type: MemoryType, **fields) -> int:
        return self.append(Load(memory_type=memory_type, **fields))

    def store(self, **fields) -> int:
        return self.append(Store(**fields))

    def gemm(self, **fields) -> int:
        return self.append(Gemm(**fields))

    def alu(self, op: AluOp, **fields) -> int:
        return self.append(Alu(alu_opcode=op, **fields))

    def nop(self, module: Module) -> int:
        """A dependency-only no-op on `module`."""
        return self.append(_NOPS[module])

    # --- dependencies ---------------------------------------------------------------------

    def last_index(self, module: Module) -> int:
        """Index of the latest instruction of `module` (ValueError when it has none)."""
        if module not in self._last:
            raise ValueError(f"the program has no {module.value} instruction yet")
        return self._last[module]

    def dep_push(self, src: Module, dst: Module):
        """The latest instruction of `src` pushes a token to `dst` after it executes."""
        push_flag, _ = _edge(src, dst)
        last = self._last.get(src)
        if last is None or getattr(self._insns[last], push_flag):
            self.nop(src)
            last = self._last[src]
        self._set_push(last, src, dst)

    def push_at(self, index: int, src: Module, dst: Module):
        """Instruction `index` (of module `src`, appended earlier) pushes a token to `dst`
        after it executes. Raises ValueError when it is not a `src` instruction, already
        pushes to `dst`, or comes before a push already made to `dst` (see the module
        docstring)."""
        push_flag, _ = _edge(src, dst)
        if not 0 <= index < len(self._insns) or self._insns[index].module != src:
            raise ValueError(f"instruction {index} is not a {src.value} instruction")
        if getattr(self._insns[index], push_flag):
            raise ValueError(f"instruction {index} already pushes a {src.value}->{dst.value} "
                             "token")
        self._set_push(index, src, dst)

    def _set_push(self, index: int, src: Module, dst: Module):
        push_flag, _ = _edge(src, dst)
        latest = self._last_push.get((src, dst), -1)
        if index < latest:
            raise ValueError(f"a {src.value}->{dst.value} token pushed by instruction {index} "
                             f"would come after the one instruction {latest} pushes, so the "
                             "pops would pair with the wrong pushes (tokens are first in, "
                             "first out)")
        self._insns[index] = dataclasses.replace(self._insns[index], **{push_flag: True})
        self._last_push[src, dst] = index
        self._tokens[src, dst] = self._tokens.get((src, dst), 0) + 1

    def dep_pop(self, src: Module, dst: Module):
        """The next instruction of `dst` pops a token from `src` before it executes."""
        _, pop_flag = _edge(src, dst)
        if pop_flag in self._pending_pops[dst]:
            self.nop(dst)  # carries the earlier pop
        self._pending_pops[dst].add(pop_flag)
        self._tokens[src, dst] = self._tokens.get((src, dst), 0) - 1

    # --- end --------------------------------------------------------------------------------

    def finish(self, *, check_tokens: bool = True) -> Program:
        """Append FINISH and return the `Program`.

        With `check_tokens`, raise ValueError if a queue would be left with tokens or a
        pop has no matching push (such a program deadlocks or corrupts the next one).
        """
        for module in (LOAD, STORE):
            if self._pending_pops[module]:
                raise ValueError(f"dep_pop(..., {module.value}) has no {module.value} "
                                 "instruction after it to carry the pop")
        self.append(Finish())
        self._finished = True
        if check_tokens:
            bad = {f"{a.value}->{b.value}": n for (a, b), n in self._tokens.items() if n}
            if bad:
                detail = ", ".join(f"{q}: {'+' if n > 0 else ''}{n}" for q, n in bad.items())
                raise ValueError(f"unbalanced dependency tokens (pushes minus pops): {detail}")
        return Program(tuple(self._insns), self.config)
