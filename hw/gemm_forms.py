"""The forms of the GEMM core's multiply and reduce stages (`GemmArithmetic`): the same
sums in the same cycles, written for synthesis (PACKED), for a fast Verilog model (WIDE)
or for the fastest Verilator model (NATIVE), and the arithmetic each builds on: packed
pairs of products, products from LUTs, adder trees. `vdla.hw.compute` builds the core
from them."""

from __future__ import annotations

import enum

from amaranth import Mux

from vdla.config import HardwareConfig

__all__ = ["GemmArithmetic", "PACK_SHIFT", "adder_tree", "gemm_arithmetic", "lut_product",
           "native_gemm_ports", "packed_products", "unpack_products"]


class GemmArithmetic(enum.Enum):
    """How the GEMM core's multiply and reduce stages are written.

    Both forms compute the same sums in the same pipeline stages, so results and cycle
    counts are identical (tests run the same programs on both and compare DRAM and every
    counter); they differ in what tools make of them.

    PACKED
        Two int8 products share one 25 x 8 multiplier (below: `packed_products`), and the
        adder trees widen one bit per level. Synthesis maps a multiplier to one DSP48E1,
        so the default 16 x 16 core needs 128 DSPs and fits the xc7z020. The default,
        and what `vdla verilog` writes for boards.
    WIDE
        One multiplier per product, every operand, product and partial sum a 32-bit
        two's-complement value (the accumulator width), and the multiply stage registers
        the operands instead of the products (the reduce stage multiplies and adds).
        Verilator turns this into plain machine arithmetic, with no sign extension or
        masking between the operations.
        Synthesis would need one DSP per product (256 for the default core).
    NATIVE
        As WIDE up to the operand registers; the reduce stage's products and sums come
        from outside the design: the operands leave on output ports and the sums come
        back on an input port (`native_gemm_ports`), which the Verilator harness drives
        every cycle from the operands it sees (its C++ multiplies the same operands and
        wraps the sums at the accumulator width as the adder trees do). The sums are
        still registered inside, in the same stage, so the cycles are the same. The
        harness computes them with vector instructions in a few nanoseconds, where the
        Verilated trees were 256 scalar multiply-adds a cycle. The Verilator backend
        simulates this form by default (tests run programs on all three forms); it is
        not a circuit, and no synthesis tool can build it.
    """

    PACKED = "packed"
    WIDE = "wide"
    NATIVE = "native"

# Two int8 × int8 products that share the inp operand are computed by one multiplier:
# (w_hi · 2**PACK_SHIFT + w_lo) · x holds w_lo·x in its low PACK_SHIFT bits (a 16-bit
# signed value: |w·x| <= 2**14) and w_hi·x above, minus the borrow of a negative low
# product. The packed weight is 25 bits signed (it can be DSP48E1's pre-adder A + D) and
# x 8 bits: one DSP48E1 (25 × 18) per pair, so the default 16 × 16 core needs 128
# multipliers instead of 256, inside the xc7z020's 220 DSP48s.
PACK_SHIFT = 16


def native_gemm_ports(config: HardwareConfig) -> dict[str, int]:
    """The NATIVE form's ports (name -> width) on the compute module and the top: the
    operands out (``native_gemm_x``: one inp row, batch x block_in elements, or with a
    dw window every lane's own inputs, batch x block_out x block_in; ``native_gemm_w``:
    one wgt row) and the lanes' sums in (``native_gemm_sums``: acc_width bits a lane,
    lane b x block_out + n at the bottom)."""
    x_bits = config.batch * config.block_in * config.inp_width
    if config.dw_taps:
        x_bits *= config.block_out
    return {"native_gemm_x": x_bits,
            "native_gemm_w": config.block_out * config.block_in * config.wgt_width,
            "native_gemm_sums": config.batch * config.block_out * config.acc_width}


def packed_products(x, w_lo, w_hi):
    """The packed product of signed 8-bit Amaranth values `x`, `w_lo`, `w_hi`: a
    33-bit signed value (25-bit packed weight times 8-bit x)."""
    return (w_hi.shift_left(PACK_SHIFT) + w_lo) * x


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
