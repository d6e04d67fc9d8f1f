"""Two int8 products per DSP (`HardwareConfig.dsp_pack`): the packed pair's arithmetic is
exact over every int8 triple (a numpy model of the bit-level arithmetic, checked against
the Amaranth unit), the unit itself (`vdla.hw.gemm_forms.MultiplierPair`) in Amaranth's
simulator on every corner and a few thousand random triples, packed and not, and small
GEMM cores with one product per DSP against the functional simulator (with and without a
DSP limit). Whole programs on Verilator with both settings: tests/sim/test_gemm_arithmetic.py.
"""

import gc
import itertools
import random

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from vdla import HardwareConfig
from vdla.hw.gemm_forms import PACK_SHIFT, MultiplierPair

CORNERS = (-128, -127, -1, 0, 1, 126, 127)


def packed_model(x, w_lo, w_hi):
    """The packed pair's bit-level arithmetic in numpy (int64 arrays), as
    `vdla.hw.gemm_forms.packed_products` and `unpack_products` write it: the 33-bit
    product p of the 25-bit packed weight and x, lo = p[0:16] as signed, hi = p[16:] as
    signed plus p[15] (the low product's borrow). Returns (p, lo, hi)."""
    p = ((w_hi << PACK_SHIFT) + w_lo) * x
    lo = ((p & 0xFFFF) ^ 0x8000) - 0x8000
    hi = (p >> PACK_SHIFT) + ((p >> (PACK_SHIFT - 1)) & 1)
    return p, lo, hi


def test_packed_model_is_exact_for_every_int8_triple():
    """All 2**24 (x, w_lo, w_hi): lo = w_lo·x and hi = w_hi·x, and the operands fit one
    DSP48E1 (25 x 18) and one DSP48E2 (27 x 18): a 25-bit packed weight, a 33-bit
    product."""
    w = np.arange(-128, 128, dtype=np.int64)
    w_hi, w_lo = (a.reshape(-1) for a in np.meshgrid(w, w, indexing="ij"))
    packed = (w_hi << PACK_SHIFT) + w_lo
    assert packed.min() >= -2**24 and packed.max() < 2**24
    for x in range(-128, 128):
        p, lo, hi = packed_model(np.int64(x), w_lo, w_hi)
        assert p.min() >= -2**32 and p.max() < 2**32
        np.testing.assert_array_equal(lo, w_lo * x)
        np.testing.assert_array_equal(hi, w_hi * x)


def _triples(count: int, seed: int = 7) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return (list(itertools.product(CORNERS, repeat=3))
            + [tuple(rng.randrange(-128, 128) for _ in range(3)) for _ in range(count)])


def simulate_pair(packed: bool, triples) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of `MultiplierPair(packed=packed)` for each (x, w_lo, w_hi), one triple a
    cycle, read two cycles later."""
    dut = MultiplierPair(packed=packed)
    got = []

    async def testbench(ctx):
        pending = []
        for triple in [*triples, (0, 0, 0), (0, 0, 0)]:
            for signal, value in zip((dut.x, dut.w_lo, dut.w_hi), triple):
                ctx.set(signal, value)
            await ctx.tick()
            pending.append(triple)
            if len(pending) > 1:   # after its second edge, the triple before this one
                got.append((ctx.get(dut.lo), ctx.get(dut.hi)))
        return got

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    out = np.array(got[:len(triples)], dtype=np.int64)
    return out[:, 0], out[:, 1]


@pytest.mark.parametrize("packed", [True, False])
def test_multiplier_pair_is_exact(packed):
    """The Amaranth unit on every corner triple (-128, -1, 0, 127 and neighbours) and
    3,000 random ones: two plain products, and, packed, the numpy model's lo and hi."""
    triples = _triples(3000)
    lo, hi = simulate_pair(packed, triples)
    x, w_lo, w_hi = (np.array(v, dtype=np.int64) for v in zip(*triples))
    np.testing.assert_array_equal(lo, w_lo * x)
    np.testing.assert_array_equal(hi, w_hi * x)
    if packed:
        _, model_lo, model_hi = packed_model(x, w_lo, w_hi)
        np.testing.assert_array_equal(lo, model_lo)
        np.testing.assert_array_equal(hi, model_hi)


def test_multiplier_pair_checks_its_parameter():
    # The half-built object is an Elaboratable never elaborated: Amaranth says so when it
    # is collected, here rather than in a later test.
    with pytest.warns(UnusedElaboratable):
        with pytest.raises(TypeError, match="MultiplierPair packed must be a bool, not 1"):
            MultiplierPair(packed=1)
        gc.collect()


def test_dsp_pack_in_the_config():
    """Off: one multiplier per product, the name ends in -unpacked, the DSP limit counts
    single products; a core with block_out 1 has nothing to pack (stored on)."""
    packed, unpacked = HardwareConfig(), HardwareConfig(dsp_pack=False)
    assert packed.dsp_pack and packed.gemm_multipliers == 128
    assert unpacked.gemm_multipliers == 256 and unpacked.gemm_products_per_multiplier == 1
    assert unpacked.name == packed.name + "-unpacked"
    assert HardwareConfig.from_dict(unpacked.to_dict()) == unpacked
    limited = HardwareConfig(dsp_pack=False, gemm_dsp_limit=200)
    assert limited.gemm_lut_multipliers == 56 and limited.gemm_lut_products == 56
    assert HardwareConfig(gemm_dsp_limit=100).gemm_lut_products == 56
    # A limit at or past the unpacked core's 256 multipliers is no limit.
    assert HardwareConfig(dsp_pack=False, gemm_dsp_limit=256).gemm_dsp_limit == 0
    narrow = HardwareConfig(block_in=1, block_out=1, uop_buff_size=1024, inp_buff_size=1024,
                            wgt_buff_size=1024, acc_buff_size=1024, dsp_pack=False)
    assert narrow.dsp_pack and narrow.gemm_multipliers == 1
    # Only synthesis differs: no extension a program could depend on, the same ISA.
    assert unpacked.program_extensions == packed.program_extensions == ()
    assert unpacked.insn_field_widths() == packed.insn_field_widths()


@pytest.mark.parametrize("value", [0, 1, "false", None])
def test_dsp_pack_must_be_a_bool(value):
    with pytest.raises(ValueError, match=r"HardwareConfig.dsp_pack must be true or false, "
                                         rf"not {value!r}"):
        HardwareConfig(dsp_pack=value)
