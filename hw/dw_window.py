"""The GEMM core's depthwise window (`HardwareConfig.dw_taps`; semantics in `vdla.isa.Gemm`).

A `dw` GEMM keeps the last T·r inp rows it read (T = `dw_taps`, r = `dw_column_rows`)
and feeds its multipliers from them instead of from the one row a plain GEMM reads.
The micro-op engine (`vdla.hw.compute`) issues one *beat* per inp row read: T·r beats
for the first micro-op of a pass, r for each later one, each reading src plus its row
offset; every beat's row shifts into the window in the multiply stage, and only a
micro-op's last beat goes on to the reduce and write stages. So the window holds rows
W[0] (oldest) .. W[T·r-1] (the row just read), which is exactly `vdla.sim.functional
.dw_window`'s order.

Why beats: the inp SRAM has one read port, so a window of T·r fresh rows takes T·r
reads, and issuing them down the existing fetch, index and operand stages reuses the
address path (one adder for the row offset). Since only last beats reach the reduce and
write stages, the acc port's rule in `vdla.hw.compute` (each read exactly one cycle
before the write it may depend on) holds as it is: micro-ops are never closer together
than a plain GEMM's (r or T·r cycles apart instead of one).

Only the multiplier *inputs* change: weight column k < 2T of lane n multiplies
W[(k // 2)·r + n // block_in][b][(n - n % 2) % block_in + k % 2]; lanes 2j and 2j+1
read the same value, so a packed multiplier pair (one input, two weights) still serves
them, behind one 8-bit 2:1 mux per pair, batch and column. Columns k >= 2T multiply the
row just read, as a plain GEMM's do, and need no mux.

Cost: (T·r - 1) rows of batch·block_in·8 flip-flops (T·r in the WIDE form, see
`DwWindow`) and batch·(block_out / 2)·2T byte-wide muxes in front of the multipliers.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed

from vdla.config import HardwareConfig

__all__ = ["DwBeats", "DwWindow"]


class DwWindow:
    """The window register and the multiplier inputs it gives.

    Parameters
    ----------
    config : HardwareConfig
        Needs ``dw_taps`` > 0.
    row : Value
        The inp SRAM's read data in the multiply stage (batch × block_in int8 values).
    shift : Value
        1 in a cycle whose multiply stage holds a beat of a dw GEMM: `row` shifts in.
    registered : bool
        False (PACKED): the multiply stage uses the window combinationally, the held
        T·r - 1 rows plus `row`, and registers the products. True (WIDE): the reduce
        stage, a cycle later, multiplies; the register then holds all T·r rows, `row`
        included, so the window is still whole after the shift.
    """

    def __init__(self, config: HardwareConfig, row, shift, *, registered: bool):
        if not config.dw_taps:
            raise ValueError(f"config {config.name} has no depthwise window (dw_taps = 0)")
        self.config = config
        self.row = row
        self.shift = shift
        self.registered = registered
        self.rows = config.dw_window_rows
        self.held = self.rows if registered else self.rows - 1
        self.row_bits = config.batch * config.block_in * config.inp_width
        self.window = Signal(self.held * self.row_bits, name="dw_window", reset_less=True)

    def elaborate(self, m: Module, dw, x, bits: int):
        """The shift register, and a function (b, n, k) -> lane n's column-k multiplier
        input in batch b: `input` in a dw GEMM (`dw` 1) for k < 2T, else `x[b][k]` (the
        plain GEMM's input). Each pair's muxed input is one `bits`-wide signal."""
        # Newest row at the top: after a shift, held row h is the (held - h)-th newest.
        with m.If(self.shift):
            m.d.sync += self.window.eq(Cat(self.window[self.row_bits:], self.row)
                                       if self.held > 1 else self.row)
        made = {}

        def lane_input(b: int, n: int, k: int):
            if k >= 2 * self.config.dw_taps:
                return x[b][k]
            if (b, n // 2, k) not in made:
                value = Signal(signed(bits), name=f"dw_x_b{b}_n{n - n % 2}_k{k}")
                m.d.comb += value.eq(Mux(dw, self.input(b, n, k), x[b][k]))
                made[b, n // 2, k] = value
            return made[b, n // 2, k]

        return lane_input

    def _window_row(self, index: int):
        """Window row `index` (0 the oldest, T·r - 1 the row just read)."""
        if index < self.held:
            return self.window.word_select(index, self.row_bits)
        return self.row

    def input(self, b: int, n: int, k: int):
        """The int8 input of lane n's weight column k < 2T in batch b (signed): the
        same for lanes 2j and 2j+1."""
        c = self.config
        if not 0 <= k < 2 * c.dw_taps:
            raise ValueError(f"column {k} is past the window's 2·{c.dw_taps} columns")
        row = (k // 2) * c.dw_column_rows + n // c.block_in
        channel = (n - n % 2) % c.block_in + k % 2
        return self._window_row(row).word_select(b * c.block_in + channel,
                                                 c.inp_width).as_signed()


class DwBeats:
    """The micro-op engine's beat counter for dw GEMMs.

    A dw micro-op is several beats, one inp row read each: T·r if it is the first of
    its pass (the whole window), else r (one column). `beat` is the row offset from src
    of the beat issuing now, so a first micro-op counts 0 .. T·r-1 and a later one
    (T-1)·r .. T·r-1: one counter whose end, T·r-1, marks every micro-op's last beat.
    The engine advances its loop counters only on a last beat; outside dw GEMMs every
    issue is a last beat, which keeps the plain timing.

    Signals
    -------
    dw : 1
        The instruction executing is a dw GEMM, not a reset (a reset with dw is a plain
        reset). Latched at its start, held until it retires.
    beat : range(T·r)
        The row offset, added to src at the fetch stage.
    last : 1
        The beat issuing now is its micro-op's last (1 outside dw GEMMs).
    multiply_last : 1
        `last` of the beat in the multiply stage, three cycles later (it travels down
        the fetch, index and operand stages with its beat): only last beats go on to
        the reduce and write stages.
    """

    def __init__(self, config: HardwareConfig):
        self.config = config
        self.dw = Signal(name="dw")
        self.beat = Signal(range(config.dw_window_rows), name="dw_beat")
        self.last = Signal(name="dw_last_beat")
        self.multiply_last = Signal(name="multiply_last")

    def elaborate(self, m: Module, *, issue, pass_end, start, dw_insn):
        """issue: a beat issues this cycle; pass_end: it is of the pass's last micro-op
        (the next micro-op loads a whole window); start, dw_insn: an instruction starts
        (any: the engine is idle then), and whether it is a dw GEMM, not a reset.
        Returns self."""
        rows, r = self.config.dw_window_rows, self.config.dw_column_rows
        m.d.comb += self.last.eq(~self.dw | (self.beat == rows - 1))
        index_last, operand_last = Signal(name="index_last"), Signal(name="operand_last")
        m.d.sync += [index_last.eq(self.last), operand_last.eq(index_last),
                     self.multiply_last.eq(operand_last)]
        # Only dw beats move it: elsewhere it stays 0, the offset every other
        # instruction's src gets.
        with m.If(issue & self.dw):
            with m.If(~self.last):
                m.d.sync += self.beat.eq(self.beat + 1)
            with m.Elif(pass_end):
                m.d.sync += self.beat.eq(0)
            with m.Else():
                m.d.sync += self.beat.eq(rows - r)
        with m.If(start):
            m.d.sync += [self.dw.eq(dw_insn), self.beat.eq(0)]
        return self
