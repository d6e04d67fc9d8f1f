"""The token protocol every module follows: pop, execute, push.

A module takes the instruction at the head of its command queue, pops a token from each
queue its ``pop_prev``/``pop_next`` flags name (waiting until all are there), executes,
then pushes a token into each queue its ``push_prev``/``push_next`` flags name (waiting
for room) and only then retires the instruction (docs/isa.md, dependency tokens).
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data

from vdla.config import HardwareConfig
from vdla.hw.layouts import insn_layout

__all__ = ["InsnSequencer"]


class InsnSequencer:
    """Pop/execute/push control of one module, elaborated into the module's `Module`.

    Parameters
    ----------
    config : HardwareConfig
    insn : stream interface (``payload`` of INSN_BITS, ``valid``, ``ready``)
        The head of the module's command queue; retired (``ready``) after the pushes.
    pops, pushes : dict of flag name -> token stream
        The module's token queues by ISA flag (``"pop_prev"``, ``"push_next"``, ...); a
        flag with no queue here is ignored, as the module has no such neighbour.

    Signals (after `elaborate`)
    ---------------------------
    start : pulses for one cycle when the instruction's tokens are popped; execution
        begins in that cycle.
    executing : high from the cycle after `start` until the module raises `done`.
    first : high in the first `executing` cycle; a module hands the instruction to its
        engine then (engines are idle, as the previous instruction has completed).
    done : driven by the module; sampled only while `executing`; one cycle high means
        the execution is complete (it may be the first `executing` cycle).
    busy : an instruction is executing or pushing its tokens.
    waiting[flag] : high in cycles spent waiting for a token on `flag`'s queue (for the
        stall counters).
    """

    def __init__(self, config: HardwareConfig, insn, *, pops: dict, pushes: dict, name: str):
        self.config = config
        self.insn = insn
        self.pops = dict(pops)
        self.pushes = dict(pushes)
        self.name = name
        self.header = data.View(insn_layout(config, "FINISH"), insn.payload)
        self.start = Signal(name=f"{name}_start")
        self.executing = Signal(name=f"{name}_executing")
        self.first = Signal(name=f"{name}_first")
        self.done = Signal(name=f"{name}_done")
        self.busy = Signal(name=f"{name}_busy")
        self.waiting = {flag: Signal(name=f"{name}_wait_{flag}") for flag in self.pops}

    def elaborate(self, m: Module):
        header = self.header
        pops_ready = Signal(name=f"{self.name}_pops_ready")
        pushes_done = Signal(name=f"{self.name}_pushes_done")
        pushed = {flag: Signal(name=f"{self.name}_pushed_{flag}") for flag in self.pushes}
        in_push = Signal(name=f"{self.name}_in_push")
        for flag, queue in self.pushes.items():
            m.d.comb += queue.valid.eq(in_push & getattr(header, flag) & ~pushed[flag])
        m.d.comb += [
            pops_ready.eq(1 if not self.pops else
                          _all(~getattr(header, f) | q.valid for f, q in self.pops.items())),
            pushes_done.eq(1 if not self.pushes else _all(
                ~getattr(header, f) | pushed[f] | q.ready for f, q in self.pushes.items())),
        ]
        m.d.sync += self.first.eq(self.start)
        with m.FSM(name=f"{self.name}_seq"):
            with m.State("IDLE"):
                with m.If(self.insn.valid):
                    for flag, queue in self.pops.items():
                        m.d.comb += self.waiting[flag].eq(getattr(header, flag) & ~queue.valid)
                    with m.If(pops_ready):
                        m.d.comb += self.start.eq(1)
                        for flag, queue in self.pops.items():
                            m.d.comb += queue.ready.eq(getattr(header, flag))
                        m.next = "EXECUTE"
            with m.State("EXECUTE"):
                m.d.comb += [self.executing.eq(1), self.busy.eq(1)]
                with m.If(self.done):
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += in_push.eq(1)
                # Each token is offered (valid independent of ready, as streams require)
                # until its queue takes it; the instruction retires once all are in.
                m.d.comb += self.busy.eq(1)
                with m.If(pushes_done):
                    m.d.comb += self.insn.ready.eq(1)
                    m.d.sync += [pushed[flag].eq(0) for flag in self.pushes]
                    m.next = "IDLE"
                with m.Else():
                    for flag, queue in self.pushes.items():
                        with m.If(queue.valid & queue.ready):
                            m.d.sync += pushed[flag].eq(1)


def _all(terms):
    terms = list(terms)
    result = terms[0]
    for term in terms[1:]:
        result = result & term
    return result
