"""The pipelined DIV engine (`HardwareConfig.div_pipeline`): the sequential divider's
restoring steps (`vdla.hw.divider`) unrolled into a pipeline, one stage a step and lane.

Semantics are the sequential engine's and the functional simulator's
(`vdla.sim.functional_alu.divide`); only the cycles differ. The steps are the same: with
A = max(acc[dst], 0) and P = A >> 8, each step shifts A's next bit into P and subtracts
the divisor b where P >= b; the first step's bit is the saturation test, the next seven
are the quotient.

Timing: a DIV micro-op reaches the write stage (cycle W, `vdla.hw.compute`) as any ALU
micro-op, and there, instead of writing, enters the pipeline: the first step is done in
that cycle on the loaded values (a 32-bit subtractor after the acc read, no deeper than
the write stage's other ops), so the steps' registers hold 1..8 steps in cycles
W+1..W+8, and the result is written to acc[dst] and out[dst] in cycle W+8 (`LATENCY`
cycles after the write stage) through the write stage's ports. Those are free then: the
micro-ops in the write stage meanwhile are DIVs, which write nothing there, and the next
instruction starts only once the pipeline is empty (`idle`).

Hazards: the acc port's rule (a read exactly one cycle before the write it may depend on,
or in its cycle: the read port is transparent) asks that a micro-op issued J cycles after
a DIV micro-op that writes row r read r no earlier than that DIV's write. A micro-op reads
acc[dst] 4 cycles after its issue and acc[src] (a vector or a held operand's read) 3
cycles after; the DIV issued at I writes at I + 5 + LATENCY. So the *scoreboard*, the
dst rows of the DIV micro-ops issued in the last `SRC_AGES` cycles, holds a micro-op back
while its dst is among the last `DST_AGES` (J - I < 9) or the acc[src] it reads among the
last `SRC_AGES` (J - I < 10). Writes stay in issue order (a fixed latency), so a later
micro-op's write to the same row lands after the earlier one's. One acc read port: a
micro-op that reads acc[src] also needs the cycle before its issue free (its src read
then finds the reduce stage empty), so vector micro-ops issue every second cycle.

The scoreboard needs a micro-op's rows in its issue cycle, before its index stage: on a
config with the pipeline, the compute module reads the uop SRAM a cycle ahead (at the
address the engine will issue next) and delays the word into the index stage.

Cycles, retire to retire, of a DIV instruction of N micro-ops with no hazard (measured in
``tests/hw/tb_compute.py``; an ALU instruction's N + 8, plus `LATENCY`):

- immediate: N + 16;
- held (``alu_hold``): N + R + 15, R the operand row's reads (iter_out when
  ``src_factor_out != 0``, else 1);
- vector: 2 N + 15.

A micro-op that waits for the scoreboard adds its wait. A reset (``reset_reg``) with the
DIV opcode writes zeros at one micro-op a cycle as any reset.

Cost: per lane, 8 stages of a subtractor and the registers of the partial remainder (31
bits), the shift register (8), the divisor (31) and a bit, fewer in the last stage: about
eight sequential dividers' flip-flops and subtractors; the scoreboard is a few hundred
flip-flops and comparators for the whole core.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data

from vdla.config import DIV_MAX, AluOp, HardwareConfig
from vdla.hw.divider import STEPS, LaneDividers, engine_signals
from vdla.hw.layouts import uop_view_layout

__all__ = ["DST_AGES", "LATENCY", "PipelinedDividers", "SRC_AGES", "dividers",
           "uop_lookahead"]

#: Cycles from a DIV micro-op's write stage to its result's write: one a step, the first
#: done in the write stage itself.
LATENCY = STEPS
#: Issue cycles back within which a DIV's dst row is still unwritten when a later
#: micro-op reads its acc[dst] (4 cycles after issue; the write is 5 + LATENCY after).
DST_AGES = LATENCY + 1
#: The same for a read of acc[src], a cycle earlier in the pipeline.
SRC_AGES = LATENCY + 2
#: Cycles from issue to the multiply stage, where a micro-op reads acc[src].
_TO_MULTIPLY = 3


class PipelinedDividers:
    """The pipelined DIV engine: `STEPS` stages per ALU lane, the scoreboard and the
    issue gate. The same signals and methods as `vdla.hw.divider.LaneDividers`, so the
    compute module drives either; `engine` also takes the issuing micro-op's rows.

    Parameters
    ----------
    config : HardwareConfig
        Needs DIV in ``alu_ops`` (and ``div_pipeline``); gives the lanes and widths.

    Signals (made here, driven by `engine` and `elaborate`)
    ------------------------------------------------------
    insn : Signal(1)
        The running GEMM/ALU instruction is a DIV that is not a reset.
    ready : Signal(1)
        While ``insn``: the micro-op at the engine's counters may issue this cycle (no
        hazard with a division in flight, and a free cycle before an acc[src] read).
    src_read : Signal(1)
        0 while ``insn`` and the micro-op in the multiply stage does not read acc[src]
        (with ``alu_hold``, the held row's capture is then skipped); else 1.
    idle : Signal(1)
        No division is in the pipeline.
    """

    def __init__(self, config: HardwareConfig):
        engine_signals(self, config, "divp")

    def engine(self, m: Module, *, start, is_div, issue, reads_src, dst, src):
        """The issue gate. `start` latches `is_div` (the instruction being started is a
        DIV without ``reset_reg``); `issue`: a micro-op enters the pipeline; `reads_src`:
        the micro-op at the counters reads acc[src]; `dst`, `src`: its acc rows (src cut
        or extended to an acc index)."""
        with m.If(start):
            m.d.sync += self.insn.eq(is_div)
        issued = issue & self.insn
        # The scoreboard: entry k is the DIV micro-op issued k + 1 cycles ago (valid, dst).
        valid = [Signal(name=f"divp_sb{k}_valid") for k in range(SRC_AGES - 1)]
        rows = [Signal.like(dst, name=f"divp_sb{k}_row", reset_less=True)
                for k in range(SRC_AGES - 1)]
        m.d.sync += [valid[0].eq(issued), rows[0].eq(dst)]
        m.d.sync += [v.eq(w) for v, w in zip(valid[1:], valid)]
        m.d.sync += [r.eq(s) for r, s in zip(rows[1:], rows)]
        dst_hit = Cat(*(v & (r == dst) for v, r in zip(valid[:DST_AGES - 1], rows))).any()
        src_hit = Cat(*(v & (r == src) for v, r in zip(valid, rows))).any()
        # An acc[src] read needs the reduce stage empty in its cycle: no issue just before.
        m.d.comb += self.ready.eq(~dst_hit & ~(reads_src & (src_hit | valid[0])))
        # Whether each micro-op reads acc[src], carried to the multiply stage.
        reads = [Signal(name=f"divp_reads{k}") for k in range(_TO_MULTIPLY)]
        m.d.sync += [reads[0].eq(issued & reads_src)]
        m.d.sync += [r.eq(s) for r, s in zip(reads[1:], reads)]
        m.d.comb += self.src_read.eq(~self.insn | reads[-1])

    def elaborate(self, m: Module, operands, write_valid, dst, acc_value, out_value):
        """The pipeline and the write port's sources. `operands` is each lane's (acc[dst],
        operand), both signed, in the write stage; a DIV micro-op there (`write_valid`
        while ``insn``) enters the pipeline for acc row `dst` and writes nothing itself.
        Given the write stage's (write, row, acc value, out value), returns them with the
        pipeline's results put in, in their write cycle."""
        bits = self.config.acc_width
        load = write_valid & self.insn
        # valid[k], row[k]: stage k + 1 (k + 1 steps done) holds a division for that row.
        valid = [Signal(name=f"divp_valid{k + 1}") for k in range(STEPS)]
        row = [Signal.like(dst, name=f"divp_dst{k + 1}", reset_less=True)
               for k in range(STEPS)]
        m.d.sync += [valid[0].eq(load), row[0].eq(dst)]
        m.d.sync += [v.eq(w) for v, w in zip(valid[1:], valid)]
        m.d.sync += [r.eq(s) for r, s in zip(row[1:], row)]
        m.d.comb += self.idle.eq(~Cat(*valid).any())
        quotients = []
        for lane, (x, y) in enumerate(operands):
            dividend = Mux(x[-1], 0, x[:bits - 1])                      # max(a, 0)
            rem, shift = dividend[8:], dividend[:8]                     # P = A >> 8, A low
            divisor, nonpositive = y[:bits - 1], y <= 0
            for k in range(STEPS):
                rem, shift = _step(rem, shift, divisor, bits)
                last = k == STEPS - 1   # the last stage keeps only the quotient's bits
                regs = [(shift, Signal(8, name=f"divp{lane}_shift{k + 1}", reset_less=True)),
                        (nonpositive, Signal(name=f"divp{lane}_nonpositive{k + 1}",
                                             reset_less=True))]
                if not last:
                    regs += [(rem, Signal(bits - 1, name=f"divp{lane}_rem{k + 1}",
                                          reset_less=True)),
                             (divisor, Signal(bits - 1, name=f"divp{lane}_divisor{k + 1}",
                                              reset_less=True))]
                m.d.sync += [reg.eq(value) for value, reg in regs]
                shift, nonpositive = regs[0][1], regs[1][1]
                if not last:
                    rem, divisor = regs[2][1], regs[3][1]
            quotients.append(Mux(nonpositive | shift[7], DIV_MAX, shift[:7])[:7])
        out_bits = self.config.out_width
        div_acc = Cat(*(Cat(q, Const(0, bits - 7)) for q in quotients))
        div_out = Cat(*(Cat(q, Const(0, out_bits - 7)) for q in quotients))
        write = valid[-1]
        return ((write_valid & ~self.insn) | write, Mux(write, row[-1], dst),
                Mux(write, div_acc, acc_value), Mux(write, div_out, out_value))


def dividers(config: HardwareConfig) -> "LaneDividers | PipelinedDividers | None":
    """The DIV engine of `config`: None without DIV, the pipelined one with
    ``div_pipeline``, else the sequential `LaneDividers`."""
    if AluOp.DIV not in config.alu_ops:
        return None
    return (PipelinedDividers if config.div_pipeline else LaneDividers)(config)


def uop_lookahead(m: Module, config: HardwareConfig, uop_read, offset: dict, next_u):
    """The compute module's micro-op fetch on a config with the pipeline: the scoreboard
    needs a micro-op's rows in its issue cycle, so the uop SRAM's read port `uop_read`
    reads `next_u` (the address the engine's counter u holds next cycle) and the word
    read is the micro-op at u in each cycle. Returns that word delayed a cycle (the index
    stage's, as the fetch stage would read it) and the issuing micro-op's acc rows
    ``{"dst": ..., "src": ...}``: each field plus its loop `offset`, wrapped as the index
    stage wraps it, src then cut to an acc index as the acc read port cuts it."""
    m.d.comb += uop_read.addr.eq(next_u)
    word = Signal.like(uop_read.data, name="uop_word", reset_less=True)
    m.d.sync += word.eq(uop_read.data)
    now = data.View(uop_view_layout(config), uop_read.data)
    rows = {f: Signal(config.log_acc_depth, name=f"divp_{f}") for f in ("dst", "src")}
    m.d.comb += [rows[f].eq((getattr(now, f) + offset[f])[:len(offset[f])]) for f in rows]
    return word, rows


def _step(rem, shift, divisor, bits: int):
    """One restoring step: shift A's next bit (`shift`'s top) into the remainder and
    subtract the divisor where it fits; the quotient bit enters `shift` at the bottom.
    Returns the next (remainder, shift) as expressions."""
    trial = Cat(shift[7], rem)                                          # P << 1 | bit
    diff = trial - divisor
    fits = ~diff[-1]
    return Mux(fits, diff[:bits - 1], trial[:bits - 1]), Cat(fits, shift[:7])
