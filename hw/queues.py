"""Dependency-token queues and command queues.

A dependency token carries no data, so a token queue is a counting semaphore: an up/down
counter with full and empty, not a FIFO of zero-width words (which would still spend a
memory and its pointers on nothing). Command queues carry 128-bit instructions and are
`amaranth.lib.fifo.SyncFIFOBuffered`, whose registered output suits the decode logic
behind it.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from vdla.config import INSN_BITS

__all__ = ["DepQueue", "TokenSignature", "CommandQueue"]


def TokenSignature() -> wiring.Signature:
    """A stream of tokens: a ``valid``/``ready`` handshake with no payload.

    Not ``stream.Signature(0)``: its zero-width payload becomes a ``[-1:0]`` port in the
    Verilog, which lint tools reject.
    """
    return wiring.Signature({"valid": Out(1), "ready": In(1)})


class DepQueue(wiring.Component):
    """A queue of up to `depth` dependency tokens.

    Parameters
    ----------
    depth : int
        Tokens the queue holds (at least 1).

    Ports
    -----
    push : In(TokenSignature())
        ``ready`` while not full; a handshake adds a token.
    pop : Out(TokenSignature())
        ``valid`` while not empty; a handshake takes a token. A push and a pop in the same
        cycle leave the count unchanged (a full queue still takes the push then).
    level : Out(range(depth + 1))
        Tokens held.
    """

    def __init__(self, depth: int):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise TypeError(f"DepQueue depth must be a positive integer, not {depth!r}")
        self.depth = depth
        super().__init__({
            "push": In(TokenSignature()),
            "pop": Out(TokenSignature()),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        count = self.level
        do_pop = Signal()
        do_push = Signal()
        m.d.comb += [
            self.pop.valid.eq(count != 0),
            # When full, a push can still enter in the cycle a token leaves.
            self.push.ready.eq((count != self.depth) | self.pop.ready),
            do_pop.eq(self.pop.valid & self.pop.ready),
            do_push.eq(self.push.valid & self.push.ready),
        ]
        with m.If(do_push & ~do_pop):
            m.d.sync += count.eq(count + 1)
        with m.Elif(do_pop & ~do_push):
            m.d.sync += count.eq(count - 1)
        return m


class CommandQueue(wiring.Component):
    """A queue of `depth` instructions between fetch and one module.

    Ports
    -----
    w : In(stream.Signature(INSN_BITS))
        From fetch.
    r : Out(stream.Signature(INSN_BITS))
        To the module; the head stays on ``payload`` until the module takes it.
    level : Out(range(depth + 1))
    """

    def __init__(self, depth: int):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise TypeError(f"CommandQueue depth must be an integer of at least 2, not {depth!r}")
        self.depth = depth
        super().__init__({
            "w": In(stream.Signature(INSN_BITS)),
            "r": Out(stream.Signature(INSN_BITS)),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = queue = fifo.SyncFIFOBuffered(width=INSN_BITS, depth=self.depth)
        m.d.comb += [
            queue.w_data.eq(self.w.payload), queue.w_en.eq(self.w.valid),
            self.w.ready.eq(queue.w_rdy),
            self.r.payload.eq(queue.r_data), self.r.valid.eq(queue.r_rdy),
            queue.r_en.eq(self.r.ready), self.level.eq(queue.level),
        ]
        return m
