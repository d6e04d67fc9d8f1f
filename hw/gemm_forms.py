"""The forms of the GEMM core's multiply and reduce stages (`GemmArithmetic`): the same
sums in the same cycles, written for synthesis (PACKED), for a fast Verilog model (WIDE)
or for the fastest Verilator model (NATIVE), and the arithmetic each builds on: packed
pairs of products, products from LUTs, adder trees. `vdla.hw.compute` builds the core
from them."""

from __future__ import annotations

import enum
from typing import NamedTuple

from amaranth import Elaboratable, Module, Mux, Signal, signed
from amaranth.utils import bits_for

from vdla.config import HardwareConfig
from vdla.hw.dma import sram_lanes

__all__ = ["GemmArithmetic", "MultiplierPair", "NativeMemory", "PACK_SHIFT", "adder_tree",
           "gemm_arithmetic", "lut_product", "native_gemm_memories", "native_gemm_ports",
           "packed_products", "registered", "unpack_products", "widened"]


class GemmArithmetic(enum.Enum):
    """How the GEMM core's multiply and reduce stages are written.

    Both forms compute the same sums in the same pipeline stages, so results and cycle
    counts are identical (tests run the same programs on both and compare DRAM and every
    counter); they differ in what tools make of them.

    PACKED
        Two int8 products share one 25 x 8 multiplier (below: `packed_products`), and the
        adder trees widen one bit per level. Synthesis maps a multiplier to one DSP48E1
        (one DSP48E2 on UltraScale+), so the default 16 x 16 core needs 128 DSPs and fits
        the xc7z020. With `dsp_pack` off, one 8 x 8 multiplier per product instead (one
        DSP each). The default, and what `vdla verilog` writes for boards.
    WIDE
        One multiplier per product, every operand, product and partial sum a 32-bit
        two's-complement value (the accumulator width), and the multiply stage registers
        the operands instead of the products (the reduce stage multiplies and adds).
        Verilator turns this into plain machine arithmetic, with no sign extension or
        masking between the operations.
        Synthesis would need one DSP per product (256 for the default core).
    NATIVE
        As WIDE in what it computes, for the simulator only: the products and sums,
        and the SRAMs they read, live in the Verilator harness (`native_gemm_ports`).
        The wgt SRAM, and the inp SRAM too without a dw window, are left out of the
        design: the load module's write ports go out on ports, and the harness writes
        its own copy of each memory, as the SRAM would at the clock edge. The operand
        stage puts its addresses on ports; in that cycle, before the edge, the harness
        reads those rows from its copies, which is what the SRAMs' read ports would
        give. Two cycles later, with the micro-op in the reduce stage, it drives the
        lanes' sums (wrapped at the accumulator width, as the adder trees wrap) on an
        input port, and the design registers them in the same stage as the other
        forms, so the cycles are the same. With a dw window the x operand is every
        lane's own inputs, which only the design's window holds: the inp SRAM stays in
        the design and that operand leaves on a port, from the reduce stage.
        The harness computes the sums with vector instructions in a few nanoseconds,
        where the Verilated trees were 256 scalar multiply-adds a cycle, and Verilator
        no longer copies 2,048-bit weight rows through SRAM read data, operand
        registers and ports every cycle, nor checks 32 lane enables of the wgt SRAM's
        write port. The Verilator backend simulates this form by default (tests run
        programs on all three forms); it is not a circuit, and no synthesis tool can
        build it.
    """

    PACKED = "packed"
    WIDE = "wide"
    NATIVE = "native"

# Two int8 × int8 products that share the inp operand are computed by one multiplier
# (`HardwareConfig.dsp_pack`): (w_hi · 2**PACK_SHIFT + w_lo) · x holds w_lo·x in its low
# PACK_SHIFT bits (a 16-bit signed value: |w·x| <= 2**14) and w_hi·x above, minus the
# borrow of a negative low product. The packed weight is 25 bits signed (it can be
# DSP48E1's pre-adder A + D) and x 8 bits: one DSP48E1 (25 × 18) or DSP48E2 (27 × 18)
# per pair, so the default 16 × 16 core needs 128 multipliers instead of 256, inside the
# xc7z020's 220 DSP48s. Why 16 and not Xilinx's 18 (WP486, which packs into the
# DSP48E2's 27-bit port): a 25-bit packed weight fits both families' ports, and 16 bits
# hold the low product exactly, so one form serves the 7-series and UltraScale+.
PACK_SHIFT = 16


class NativeMemory(NamedTuple):
    """The shape of an SRAM that the NATIVE form's harness holds (`native_gemm_memories`):
    `depth` rows of `row_bytes`, written `lanes` bus words at a time."""
    depth: int
    row_bytes: int
    lanes: int


def native_gemm_memories(config: HardwareConfig) -> dict[str, NativeMemory]:
    """The SRAMs the NATIVE form leaves to the harness, by name: wgt, and inp without a
    dw window (whose window reads the inp SRAM inside the design)."""
    memories = {} if config.dw_taps else {"inp": (config.inp_depth, config.inp_elem_bytes)}
    memories["wgt"] = (config.wgt_depth, config.wgt_elem_bytes)
    return {name: NativeMemory(depth, row_bytes, sram_lanes(config, row_bytes))
            for name, (depth, row_bytes) in memories.items()}


def native_gemm_ports(config: HardwareConfig) -> dict[str, int]:
    """The NATIVE form's ports on the top (name -> width; ``native_gemm_sums`` is the
    input), in the order of a cycle:

    ``native_M_write_addr``, ``native_M_write_en``, ``native_M_write_word`` (M: inp, wgt)
        The load module's write port into each SRAM M of `native_gemm_memories`: in
        this cycle, ``word`` (a bus word, or the element where an element is no wider
        than one) is written into every lane of row ``addr`` whose ``en`` bit is set
        (the DMA engine writes one lane of a data beat, or every lane of padding with
        a zero word).
    ``native_gemm_read``
        1 when the operand stage holds a micro-op: the harness reads its rows now.
    ``native_gemm_inp_addr``, ``native_gemm_wgt_addr``
        The operand stage's inp and wgt addresses. Without a dw window only: with one,
        the x operand is ``native_gemm_x`` instead.
    ``native_gemm_x`` (dw window only)
        The reduce stage's x operand: every lane's own inputs, batch x block_out x
        block_in elements, lane b x block_out + n at the bottom.
    ``native_gemm_sums`` (in)
        The reduce stage's sums, acc_width bits a lane, lane b x block_out + n at the
        bottom, from the operands read two cycles before."""
    ports = {}
    for name, memory in native_gemm_memories(config).items():
        ports[f"native_{name}_write_addr"] = bits_for(memory.depth - 1)
        ports[f"native_{name}_write_en"] = memory.lanes
        ports[f"native_{name}_write_word"] = memory.row_bytes * 8 // memory.lanes
    ports["native_gemm_read"] = 1
    if config.dw_taps:
        ports["native_gemm_x"] = (config.batch * config.block_out * config.block_in
                                  * config.inp_width)
    else:
        ports["native_gemm_inp_addr"] = bits_for(config.inp_depth - 1)
    ports["native_gemm_wgt_addr"] = bits_for(config.wgt_depth - 1)
    ports["native_gemm_sums"] = config.batch * config.block_out * config.acc_width
    return ports


def packed_products(x, w_lo, w_hi):
    """The packed product of signed 8-bit Amaranth values `x`, `w_lo`, `w_hi`: a
    33-bit signed value (25-bit packed weight times 8-bit x)."""
    return (w_hi.shift_left(PACK_SHIFT) + w_lo) * x


class MultiplierPair(Elaboratable):
    """Two int8 products that share an input, as the GEMM core's multiply stage makes
    them: packed into one multiplier (`packed_products`, `unpack_products`) or one
    multiplier each; the unit alone, for tests and for synthesis of the pair by itself
    (scripts/dsp_pack_figure.py).

    Parameters
    packed : bool (keyword-only): one packed multiplier (`HardwareConfig.dsp_pack`), or two

    Ports
    x, w_lo, w_hi : Signal(signed(8)), in: the shared input and the two weights
    lo, hi : Signal(signed(16)), out: w_lo·x and w_hi·x, two cycles after the inputs
        (the multiplier's register, as the core's, then the unpacked products')
    """

    def __init__(self, *, packed: bool):
        if not isinstance(packed, bool):
            raise TypeError(f"MultiplierPair packed must be a bool, not {packed!r}")
        self.packed = packed
        self.x, self.w_lo, self.w_hi = (Signal(signed(8), name=n) for n in ("x", "w_lo", "w_hi"))
        self.lo, self.hi = Signal(signed(16), name="lo"), Signal(signed(16), name="hi")

    @property
    def ports(self) -> list[Signal]:
        return [self.x, self.w_lo, self.w_hi, self.lo, self.hi]

    def elaborate(self, platform) -> Module:
        m = Module()
        if self.packed:
            product = Signal(signed(8 + 25), name="product", reset_less=True)
            m.d.sync += product.eq(packed_products(self.x, self.w_lo, self.w_hi))
            lo, hi = unpack_products(product)
        else:
            lo, hi = (Signal(signed(16), name=n, reset_less=True) for n in ("lo_q", "hi_q"))
            m.d.sync += [lo.eq(self.x * self.w_lo), hi.eq(self.x * self.w_hi)]
        m.d.sync += [self.lo.eq(lo), self.hi.eq(hi)]
        return m


def registered(m: Module, value, name: str) -> Signal:
    """`value` (signed) in a register of its width, with no reset (a datapath stage)."""
    reg = Signal(signed(len(value)), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def widened(m: Module, value, bits: int, name: str) -> Signal:
    """`value` (signed) sign-extended to a `bits`-wide signal, computed once."""
    wide = Signal(signed(bits), name=name)
    m.d.comb += wide.eq(value)
    return wide


def lut_product(x, w):
    """x·w of signed 8-bit Amaranth values as a 16-bit signed value, built from shifted
    adds (x's bits select copies of w) rather than a multiplication, so that synthesis
    makes it from LUTs and carry chains instead of a DSP slice (`gemm_dsp_limit`)."""
    bits = len(x)
    terms = [Mux(x[i], w.as_signed().shift_left(i), 0) for i in range(bits - 1)]
    terms.append(Mux(x[bits - 1], -w.as_signed().shift_left(bits - 1), 0))  # the sign bit
    return adder_tree(terms)[:2 * bits].as_signed()


def unpack_products(p):
    """(w_lo·x, w_hi·x) from a packed product `p` (a signed Amaranth value)."""
    lo = p[:PACK_SHIFT].as_signed()
    hi = p[PACK_SHIFT:].as_signed() + p[PACK_SHIFT - 1]   # undo the low product's borrow
    return lo, hi


def adder_tree(terms, wrap: int | None = None):
    """Sum of `terms` as a balanced tree (log2 depth). Amaranth widens each level by a
    bit; with `wrap`, every partial sum is cut back to `wrap` bits (two's complement)."""
    terms = list(terms)
    while len(terms) > 1:
        pairs = [a + b for a, b in zip(terms[0::2], terms[1::2])]
        if wrap is not None:
            pairs = [p[:wrap].as_signed() for p in pairs]
        terms = pairs + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def gemm_arithmetic(value: GemmArithmetic | str) -> GemmArithmetic:
    """`value` as a `GemmArithmetic` (its name or value as a string is accepted)."""
    if isinstance(value, GemmArithmetic):
        return value
    try:
        return GemmArithmetic(str(value).lower())
    except ValueError:
        allowed = ", ".join(repr(a.value) for a in GemmArithmetic)
        raise ValueError(f"GEMM arithmetic must be one of {allowed}, not {value!r}") from None
