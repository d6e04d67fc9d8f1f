"""The ALU's divide (DIV, an extension past VTA; semantics in `vdla.sim.functional_alu.divide`).

A DIV micro-op replaces each lane of acc[dst] with ``min(max(acc[dst], 0) // operand,
127)``, and 127 where the operand is not positive; out[dst] gets the same value (it fits
int8). The operand is the immediate or acc[src] (held with ``alu_hold`` as for every
vector op).

Why a sequential divider: a combinational 32-bit divider per lane is 32 rows of 32-bit
subtractors (thousands of LUTs a lane, and far too slow for the write stage). The
quotient saturates at 127, so it has 7 bits, and ``max(a, 0) >= 128 · b`` is the one
further test. Both are the steps of one restoring division: with A = max(a, 0) and
P = A >> 8 first, each step shifts A's next bit into P (so the first step's P is A >> 7)
and subtracts b where P >= b. The first step's bit is the saturation test
(A >> 7 >= b exactly when A >= 128 · b); when it is 0, P < b from then on and the next
seven bits are A // b. So each lane has one 32-bit subtractor, a 31-bit remainder P, an
8-bit shift register (A's low bits out, quotient bits in), the 31-bit divisor and a
"not positive" bit: about 110 LUTs and 71 flip-flops a lane, where a radix-4 step (two
bits a cycle) would need three subtractors.

Where it sits: the pipeline (`vdla.hw.compute`) brings a DIV micro-op to the write stage
as any ALU micro-op, with acc[dst] and the operand; there, instead of writing, it loads
the dividers (cycle W). The eight steps take cycles W+1..W+8 and the result is written
to acc[dst] and out[dst] in cycle W+9 through the write stage's ports, which no other
micro-op uses then. The hazard rule of the acc port (each read exactly one cycle before
the write it may depend on, or in the cycle of that write: the read port is
transparent) then asks that the next micro-op read acc[dst] in cycle W+9 or later, and
acc[src] too when it reads one: the engine issues DIV micro-ops `PERIOD` (10) cycles
apart, 11 when the later one reads acc[src] (it does so in its multiply stage, a cycle
before its dst read). With ``alu_hold`` only the micro-ops that read the held row take
the extra cycle, and the held row is captured only at those reads (not at every
micro-op with an empty stage behind it, as for the other ops).

Cycles per DIV micro-op, so (measured in ``tests/hw/tb_compute.py``), retire to retire
for an instruction of N micro-ops (8 is every GEMM/ALU instruction's fixed cost):

- immediate: 10 · N + 8;
- vector: 11 · N + 7 (each micro-op reads acc[src]; the first needs no extra cycle);
- held (``alu_hold``): 10 · N + R + 7, R the operand row's reads: iter_out when
  ``src_factor_out != 0``, else 1.

A reset (``reset_reg``) with the DIV opcode writes zeros at one micro-op a cycle as any
reset. The GEMM/ALU completion waits for the last division's write (`idle`), so the
tokens pushed after a DIV guard written data.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal

from vdla.config import DIV_MAX, HardwareConfig

__all__ = ["LaneDividers", "PERIOD", "STEPS", "engine_signals"]

#: Restoring steps: the saturation test, then 7 quotient bits.
STEPS = 8
#: Cycles from one DIV micro-op's issue to the next's when the next reads no acc[src]:
#: the dividers' load cycle, `STEPS` and the write cycle after the dst read.
PERIOD = STEPS + 2


def engine_signals(engine, config: HardwareConfig, prefix: str) -> None:
    """Give a DIV engine (`LaneDividers`, or the pipelined one of
    `vdla.hw.divider_pipeline`) its config, lane count and the signals the compute
    module reads (`LaneDividers`' list), named ``{prefix}_insn`` and so on."""
    engine.config = config
    engine.lanes = config.batch * config.block_out
    for what in ("insn", "ready", "src_read", "idle"):
        setattr(engine, what, Signal(name=f"{prefix}_{what}"))


class LaneDividers:
    """The DIV engine: a restoring divider per ALU lane and the issue gate.

    Parameters
    ----------
    config : HardwareConfig
        Needs DIV in ``alu_ops``; gives the lanes (batch · block_out) and widths.

    Signals (made here, driven by `engine` and `elaborate`)
    ------------------------------------------------------
    insn : Signal(1)
        The running GEMM/ALU instruction is a DIV that is not a reset.
    ready : Signal(1)
        While ``insn``: a micro-op may issue this cycle (the previous one's division
        is far enough ahead, see the module docstring).
    src_read : Signal(1)
        0 while ``insn`` and the micro-op in flight does not read acc[src] (with
        ``alu_hold``, the held row's capture is then skipped); else 1.
    idle : Signal(1)
        No division is in progress or waiting to write.
    """

    def __init__(self, config: HardwareConfig):
        engine_signals(self, config, "div")

    def engine(self, m: Module, *, start, is_div, issue, reads_src):
        """The issue gate: `start` latches `is_div` (the instruction being started is a DIV
        without ``reset_reg``); each issued DIV micro-op (`issue`) holds the next back
        `PERIOD` cycles, one more when the next one `reads_src` (acc[src])."""
        wait = Signal(range(PERIOD + 1), name="div_wait")
        pending = Signal(name="div_pending_src")   # the last issued micro-op reads acc[src]
        with m.If(start):
            m.d.sync += [self.insn.eq(is_div), wait.eq(0)]
        with m.Elif(issue & self.insn):
            m.d.sync += [wait.eq(PERIOD), pending.eq(reads_src)]
        with m.Elif(wait != 0):
            m.d.sync += wait.eq(wait - 1)
        m.d.comb += [self.ready.eq((wait == 0) | ((wait == 1) & ~reads_src)),
                     self.src_read.eq(~self.insn | pending)]

    def elaborate(self, m: Module, operands, write_valid, dst, acc_value, out_value):
        """The dividers and the write port's sources. `operands` is each lane's
        (acc[dst], operand), both signed, in the write stage; a DIV micro-op there
        (`write_valid` while ``insn``) starts a division of every lane for acc row `dst`,
        and writes nothing itself. Given the write stage's (write, row, acc value, out
        value), returns them with the dividers' results put in, in their write cycle."""
        bits = self.config.acc_width
        load = write_valid & self.insn
        count = Signal(range(STEPS + 2), name="div_count")   # STEPS + 1 at the load, down to 0
        row = Signal.like(dst, name="div_dst")
        with m.If(load):
            m.d.sync += [count.eq(STEPS + 1), row.eq(dst)]
        with m.Elif(count != 0):
            m.d.sync += count.eq(count - 1)
        step, write = count > 1, count == 1
        m.d.comb += self.idle.eq(count == 0)
        quotients = []
        for lane, (x, y) in enumerate(operands):
            rem = Signal(bits - 1, name=f"div{lane}_rem", reset_less=True)      # P < b
            shift = Signal(8, name=f"div{lane}_shift", reset_less=True)         # A low | q
            divisor = Signal(bits - 1, name=f"div{lane}_divisor", reset_less=True)
            nonpositive = Signal(name=f"div{lane}_nonpositive", reset_less=True)
            dividend = Mux(x[-1], 0, x[:bits - 1])                              # max(a, 0)
            trial = Cat(shift[7], rem)                                          # P << 1 | bit
            diff = trial - divisor
            fits = ~diff[-1]
            with m.If(load):
                m.d.sync += [rem.eq(dividend[8:]), shift.eq(dividend[:8]),
                             divisor.eq(y[:bits - 1]), nonpositive.eq(y <= 0)]
            with m.Elif(step):
                m.d.sync += [rem.eq(Mux(fits, diff[:bits - 1], trial[:bits - 1])),
                             shift.eq(Cat(fits, shift[:7]))]
            quotients.append(Mux(nonpositive | shift[7], DIV_MAX, shift[:7])[:7])
        out_bits = self.config.out_width
        div_acc = Cat(*(Cat(q, Const(0, bits - 7)) for q in quotients))
        div_out = Cat(*(Cat(q, Const(0, out_bits - 7)) for q in quotients))
        return ((write_valid & ~self.insn) | write, Mux(write, row, dst),
                Mux(write, div_acc, acc_value), Mux(write, div_out, out_value))
