"""GEMM and ALU loop nests against a naive one-micro-op-at-a-time reference (hypothesis).

The functional simulator vectorizes over micro-ops; these random instructions (with
repeated destinations and chained reads in a small SRAM) check that the vectorized
result equals sequential execution bit for bit.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

import vdla
from vdla import AluOp
from vdla.isa import Alu, Finish, Gemm, Load, MemoryType, Uop, encode_uops
from vdla.sim import FunctionalSimulator
from vdla_testing import reference_alu, reference_gemm

CFG = vdla.HardwareConfig(batch=2, block_in=4, block_out=4, uop_buff_size=128,
                          inp_buff_size=256, wgt_buff_size=512, acc_buff_size=1024,
                          alu_ops=set(AluOp))
DEPTH = 32
assert CFG.inp_depth == CFG.wgt_depth == CFG.acc_depth == CFG.uop_depth == DEPTH


@st.composite
def loop_nests(draw):
    iter_out, iter_in = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    factors = {f"{p}_factor_{w}": draw(st.integers(0, 4)) for p in ("dst", "src", "wgt")
               for w in ("out", "in")}
    reach = 2 * 4 + 2 * 4  # largest offset the loops add to a micro-op's fields
    n_uops = draw(st.integers(1, 6))
    uops = [Uop(*(draw(st.integers(0, DEPTH - 1 - reach)) for _ in range(3)))
            for _ in range(n_uops)]
    bgn = draw(st.integers(0, n_uops))
    end = draw(st.integers(bgn, n_uops))
    return uops, dict(iter_out=iter_out, iter_in=iter_in, uop_bgn=bgn, uop_end=end), factors


def _simulate(insn, uops, seed):
    rng = np.random.default_rng(seed)
    sim = FunctionalSimulator(CFG, np.zeros(1 << 16, np.uint8))
    sim.inp[...] = rng.integers(-128, 128, sim.inp.shape)
    sim.wgt[...] = rng.integers(-128, 128, sim.wgt.shape)
    sim.acc[...] = rng.integers(-2**31, 2**31, sim.acc.shape, dtype=np.int64)
    sim.out[...] = rng.integers(-128, 128, sim.out.shape)
    sim.table[...] = rng.integers(-2**17, 2**17, sim.table.shape)   # as a LOAD of TAB leaves it
    state = {k: getattr(sim, k).copy() for k in ("inp", "wgt", "acc", "out", "table")}
    sim.dram[:len(uops) * 4] = np.frombuffer(encode_uops(uops, CFG), np.uint8)
    load = Load(memory_type=MemoryType.UOP, y_size=1, x_size=len(uops), x_stride=len(uops))
    sim.run([load, insn, Finish()])
    return sim, state


@settings(max_examples=150, deadline=None)
@given(loop_nests(), st.booleans(), st.integers(0, 2**32 - 1))
def test_gemm_matches_sequential_reference(nest, reset, seed):
    uops, loop, factors = nest
    insn = Gemm(reset_reg=reset, **loop, **factors)
    sim, state = _simulate(insn, uops, seed)
    reference_gemm(insn, uops, state["inp"], state["wgt"], state["acc"], state["out"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    np.testing.assert_array_equal(sim.out, state["out"])


@settings(max_examples=250, deadline=None)
@given(loop_nests(), st.sampled_from(list(AluOp)), st.booleans(),
       st.integers(-2**15, 2**15 - 1), st.integers(0, 2**32 - 1))
def test_alu_matches_sequential_reference(nest, op, use_imm, imm, seed):
    uops, loop, factors = nest
    factors = {k: v for k, v in factors.items() if not k.startswith("wgt")}
    insn = Alu(alu_opcode=op, use_imm=use_imm, imm=imm, **loop, **factors)
    sim, state = _simulate(insn, uops, seed)
    reference_alu(insn, uops, state["acc"], state["out"], state["table"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    np.testing.assert_array_equal(sim.out, state["out"])


@st.composite
def matmul_nests(draw):
    """Loop nests of the matrix-multiply shape (one dst per micro-op range, src moving
    with iter_out only, wgt with iter_in only), which the simulator runs as one BLAS
    product; dst factors may be 0 so that (o, i) pairs add into the same accumulator."""
    uops, loop, factors = draw(loop_nests())
    dst = uops[0].dst
    uops = [Uop(dst, u.src, u.wgt) for u in uops]
    factors.update(src_factor_in=0, wgt_factor_out=0)
    return uops, loop, factors


@settings(max_examples=150, deadline=None)
@given(matmul_nests(), st.integers(0, 2**32 - 1))
def test_matmul_shaped_gemm_matches_sequential_reference(nest, seed):
    uops, loop, factors = nest
    insn = Gemm(**loop, **factors)
    sim, state = _simulate(insn, uops, seed)
    reference_gemm(insn, uops, state["inp"], state["wgt"], state["acc"], state["out"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    np.testing.assert_array_equal(sim.out, state["out"])


def test_long_reductions_stay_exact():
    """K = 128 blocks x 16 = 2048 products per output: sums pass 2**24, where float32
    stops being exact (an odd sum there is not representable); the result must still
    equal integer arithmetic."""
    cfg = vdla.HardwareConfig()
    blocks = 128
    sim = FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8))
    sim.inp[:blocks] = -127
    sim.inp[0, 0, 0] = 1
    sim.wgt[:blocks] = -128
    sim.wgt[0, :, 0] = 1
    sim.acc[:] = 0
    uops = [Uop(0, k, k) for k in range(blocks)]
    sim.dram[:blocks * 4] = np.frombuffer(encode_uops(uops, cfg), np.uint8)
    load = Load(memory_type=MemoryType.UOP, y_size=1, x_size=blocks, x_stride=blocks)
    sim.run([load, Gemm(uop_bgn=0, uop_end=blocks, iter_out=1, iter_in=1), Finish()])
    a = sim.inp[:blocks].reshape(-1).astype(np.int64)
    w = sim.wgt[:blocks].transpose(1, 0, 2).reshape(16, -1).astype(np.int64)
    expected = w @ a
    assert expected[0] == 2047 * 127 * 128 + 1 and expected[0] > 2**24
    np.testing.assert_array_equal(sim.acc[0, 0], expected)


def test_accumulation_beyond_float64_exactness():
    """Sums whose float64 total could pass 2**53 are added as integers (white box: no
    realistic instruction reaches them, but the code path must still be exact)."""
    sim = FunctionalSimulator(CFG, np.zeros(1 << 16, np.uint8))
    sim.acc[:] = 7
    products = np.full((3, CFG.batch, CFG.block_out), 2.0**52 + 5)
    sim._accumulate(np.array([4, 4, 9]), products)
    assert (sim.acc[4] == 7 + 2 * 5).all() and (sim.acc[9] == 7 + 5).all()  # mod 2**32
    assert (sim.acc[5] == 7).all()
    assert (sim.out[4] == 17).all()
