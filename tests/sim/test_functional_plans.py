"""The functional simulator's fast paths against one-micro-op-at-a-time references.

`vdla.sim.functional_plan` runs GEMMs whose micro-ops form a matrix product (groups of
taps by destination sharing a weight sequence, as a convolution's; or sharing an input
sequence) as one BLAS product, and caches every loop nest's indices by its micro-ops'
bytes. These tests drive those paths directly: random nests of those shapes (any issue
order, loops that move one operand, both or neither, repeated destinations), a cache
that must not survive a change of micro-ops, the 32-bit ALU arithmetic against the
64-bit one it replaced, strided DMA, the decoding memo of `run_from_dram`, and BLAS's
thread count during a run.
"""

import numpy as np
import pytest
import threadpoolctl
from hypothesis import given, settings, strategies as st

import vdla
from vdla import AluOp
from vdla.isa import Alu, Finish, Gemm, Load, MemoryType, Store, Uop, encode_stream, encode_uops
from vdla.sim import FunctionalSimulator, ProgramError
from vdla.sim.functional_alu import alu_apply, alu_apply_wide
from vdla.sim.functional_plan import PlanCache, plan_gemm
from vdla.sim.protocol import fetch_program
from vdla_testing import reference_alu, reference_gemm

SMALL = dict(uop_buff_size=128, inp_buff_size=256, wgt_buff_size=512, acc_buff_size=1024,
             alu_ops=set(AluOp))
CONFIGS = {
    "batch2": vdla.HardwareConfig(batch=2, block_in=4, block_out=4, **SMALL),
    "batch1": vdla.HardwareConfig(batch=1, block_in=4, block_out=8,
                                  **{**SMALL, "inp_buff_size": 128, "wgt_buff_size": 1024}),
}
DEPTH = 32
for _cfg in CONFIGS.values():
    assert _cfg.inp_depth == _cfg.wgt_depth == _cfg.uop_depth == DEPTH <= _cfg.acc_depth
REACH = 2 * 3 + 2 * 3   # the largest offset the loops below add to a micro-op's field


@st.composite
def grouped_nests(draw, shared: str):
    """A GEMM of matrix-product shape: `groups` destinations of `taps` micro-ops each,
    every group reading the same `shared` ("wgt" or "src") sequence, micro-ops in any
    order, loops with factors 0..3 (0 on both operands: the same product in many rows;
    0 on dst: sums into one row)."""
    groups, taps = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    field = st.integers(0, DEPTH - 1 - REACH)
    dsts = draw(st.lists(field, min_size=groups, max_size=groups, unique=True))
    sequence = [draw(field) for _ in range(taps)]
    own = [[draw(field) for _ in range(taps)] for _ in range(groups)]
    pairs = [(g, t) for g in range(groups) for t in range(taps)]
    order = draw(st.permutations(pairs))
    uops = [Uop(dsts[g], own[g][t] if shared == "wgt" else sequence[t],
                sequence[t] if shared == "wgt" else own[g][t]) for g, t in order]
    loop = dict(iter_out=draw(st.integers(1, 3)), iter_in=draw(st.integers(1, 3)),
                uop_bgn=0, uop_end=len(uops))
    factors = {f"{p}_factor_{w}": draw(st.integers(0, 3)) for p in ("dst", "src", "wgt")
               for w in ("out", "in")}
    return uops, loop, factors


def _simulator(cfg, seed, acc_range=2**31):
    """A simulator with random SRAM contents; returns (simulator, a copy of them)."""
    rng = np.random.default_rng(seed)
    sim = FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8))
    sim.inp[...] = rng.integers(-128, 128, sim.inp.shape)
    sim.wgt[...] = rng.integers(-128, 128, sim.wgt.shape)
    sim.acc[...] = rng.integers(-acc_range, acc_range, sim.acc.shape, dtype=np.int64)
    sim.out[...] = rng.integers(-128, 128, sim.out.shape)
    state = {k: getattr(sim, k).copy() for k in ("inp", "wgt", "acc", "out")}
    return sim, state


def _run(sim, uops, *insns):
    """Load `uops` at uop 0 and run `insns`."""
    cfg = sim.config
    sim.dram[:len(uops) * cfg.uop_bytes] = np.frombuffer(encode_uops(uops, cfg), np.uint8)
    load = Load(memory_type=MemoryType.UOP, y_size=1, x_size=len(uops), x_stride=len(uops))
    return sim.run([load, *insns, Finish()])


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("shared", ["wgt", "src"])
@settings(max_examples=120, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_grouped_gemm_matches_sequential_reference(name, shared, data, seed):
    cfg = CONFIGS[name]
    uops, loop, factors = data.draw(grouped_nests(shared))
    insn = Gemm(**loop, **factors)
    sim, state = _simulator(cfg, seed)
    stats = _run(sim, uops, insn)
    # The nest has the shape the planner turns into a product.
    fields = [np.array([getattr(u, f) for u in uops]) for f in ("dst", "src", "wgt")]
    assert plan_gemm(insn, *fields, cfg) is not None
    reference_gemm(insn, uops, state["inp"], state["wgt"], state["acc"], state["out"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    np.testing.assert_array_equal(sim.out, state["out"])
    count = loop["iter_out"] * loop["iter_in"] * len(uops)
    assert stats["gemm_uops"] == count
    assert stats["gemm_macs"] == count * cfg.macs_per_cycle


def test_convolution_shaped_gemm_writes_its_tile_as_one_block():
    """A 3x3-tap convolution row over 2 output-channel blocks: its results come in
    (row, pixel, channel block) order, its acc tile is (channel block, row, pixel); the
    plan permutes the products onto one consecutive block of acc rows."""
    cfg = CONFIGS["batch2"]
    pixels, rows, blocks, taps = 3, 2, 2, 3
    uops = [Uop(p, p + t, t) for p in range(pixels) for t in range(taps)]
    insn = Gemm(uop_bgn=0, uop_end=len(uops), iter_out=blocks, iter_in=rows,
                dst_factor_out=rows * pixels, dst_factor_in=pixels, src_factor_in=4,
                wgt_factor_out=taps)
    fields = [np.array([getattr(u, f) for u in uops]) for f in ("dst", "src", "wgt")]
    plan = plan_gemm(insn, *fields, cfg)
    assert plan.dst == slice(0, blocks * rows * pixels) and plan.order is not None
    sim, state = _simulator(cfg, 11)
    _run(sim, uops, insn)
    reference_gemm(insn, uops, state["inp"], state["wgt"], state["acc"], state["out"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    np.testing.assert_array_equal(sim.out, state["out"])


def test_long_grouped_reduction_leaves_float32_exactly():
    """Three groups of 80 taps (K = 80 x 16 = 1280 products per output): past float32's
    exact range, so the plan computes in float64; the result must equal int64 math."""
    cfg = vdla.HardwareConfig()
    taps, groups = 80, 3
    sim = FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8))
    rng = np.random.default_rng(1)
    sim.inp[:taps + groups] = -128
    sim.wgt[:taps] = -128
    sim.inp[0, 0, 0] = rng.integers(-128, 128)
    sim.acc[:] = 0
    uops = [Uop(g, g + t, t) for g in range(groups) for t in range(taps)]
    before = {k: getattr(sim, k).copy() for k in ("inp", "wgt", "acc", "out")}
    _run(sim, uops, Gemm(uop_bgn=0, uop_end=len(uops), iter_out=1, iter_in=1))
    reference_gemm(Gemm(uop_bgn=0, uop_end=len(uops), iter_out=1, iter_in=1), uops,
                   before["inp"], before["wgt"], before["acc"], before["out"])
    assert abs(int(before["acc"][1, 0, 0])) > 2**24
    np.testing.assert_array_equal(sim.acc, before["acc"])
    np.testing.assert_array_equal(sim.out, before["out"])


def test_changed_micro_ops_do_not_reuse_a_stale_plan():
    """The same GEMM and ALU instructions over the same uop range, after a LOAD put other
    micro-ops there: each run must follow the micro-ops it finds."""
    cfg = CONFIGS["batch2"]
    gemm = Gemm(uop_bgn=0, uop_end=4, iter_out=2, iter_in=2, dst_factor_out=8,
                dst_factor_in=4, src_factor_in=5, wgt_factor_out=4)
    alu = Alu(alu_opcode=AluOp.ADD, uop_bgn=0, uop_end=4, iter_out=2, iter_in=1,
              dst_factor_out=8, src_factor_out=1)
    first = [Uop(g, g + t, t) for g in range(2) for t in range(2)]
    second = [Uop(g + 1, 2 * g + t, 3 - t) for g in range(2) for t in range(2)]
    sim, _ = _simulator(cfg, 7)
    for uops in (first, second, first):
        for insn, reference in ((gemm, "gemm"), (alu, "alu")):
            state = {k: getattr(sim, k).copy() for k in ("inp", "wgt", "acc", "out")}
            _run(sim, uops, insn)
            if reference == "gemm":
                reference_gemm(insn, uops, state["inp"], state["wgt"], state["acc"],
                               state["out"])
            else:
                reference_alu(insn, uops, state["acc"], state["out"])
            np.testing.assert_array_equal(sim.acc, state["acc"])
            np.testing.assert_array_equal(sim.out, state["out"])
    # Two micro-op contents x two nests were planned; the third round reused the first's.
    assert (sim.plans.misses, sim.plans.hits) == (4, 2)


def test_micro_ops_changed_in_place_do_not_reuse_a_stale_plan():
    """The key is the decoded micro-ops themselves, so a white-box edit of them (as
    tests/sim/test_depthwise_window.py makes) is seen too."""
    cfg = CONFIGS["batch2"]
    uops = [Uop(g, g + t, t) for g in range(2) for t in range(2)]
    gemm = Gemm(uop_bgn=0, uop_end=4, iter_out=1, iter_in=2, dst_factor_in=4,
                src_factor_in=3)
    sim, _ = _simulator(cfg, 5)
    _run(sim, uops, gemm)
    sim.uop_dst[:4] += 8                          # every micro-op now writes 8 rows on
    state = {k: getattr(sim, k).copy() for k in ("inp", "wgt", "acc", "out")}
    sim.run([gemm, Finish()])
    moved = [Uop(u.dst + 8, u.src, u.wgt) for u in uops]
    reference_gemm(gemm, moved, state["inp"], state["wgt"], state["acc"], state["out"])
    np.testing.assert_array_equal(sim.acc, state["acc"])
    assert sim.plans.misses == 2


def test_plans_are_shared_by_instructions_that_differ_only_in_flags_and_opcode():
    cfg = CONFIGS["batch2"]
    uops = [Uop(d, d + 1, 0) for d in range(3)]
    sim, _ = _simulator(cfg, 3)
    nest = dict(uop_bgn=0, uop_end=3, iter_out=2, iter_in=1, dst_factor_out=3)
    _run(sim, uops, Alu(alu_opcode=AluOp.MAX, use_imm=True, imm=0, **nest),
         Alu(alu_opcode=AluOp.ADD, use_imm=True, imm=-5, **nest))
    assert (sim.plans.misses, sim.plans.hits) == (1, 1)


def test_plan_cache_drops_the_oldest_past_its_limit():
    class Plan:
        def __init__(self, elems):
            self.elems = elems

    cache = PlanCache(limit=10)
    cache.lookup("a", lambda: Plan(4))
    cache.lookup("b", lambda: Plan(4))
    cache.lookup("none", lambda: None)          # "no fast path" costs nothing
    cache.lookup("c", lambda: Plan(4))          # 12 > 10: "a" goes
    assert list(cache.plans) == ["b", "none", "c"] and cache.elems == 8
    assert cache.lookup("b", lambda: pytest.fail("b is cached")).elems == 4
    big = cache.lookup("big", lambda: Plan(50))  # alone over the limit: kept until the next
    assert big.elems == 50 and list(cache.plans) == ["big"]
    assert (cache.hits, cache.misses) == (1, 5)


LANES = st.lists(st.integers(-2**31, 2**31 - 1), min_size=6, max_size=6)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(AluOp)), LANES, st.one_of(
    st.integers(-2**15, 2**15 - 1), st.integers(-2**31, 2**31 - 1), LANES))
def test_alu_32_bit_arithmetic_equals_the_64_bit_one(op, lanes, operand):
    """`alu_apply` (32-bit, with shortcuts) against `alu_apply_wide` (the int64 form)."""
    a = np.array(lanes, dtype=np.int32).reshape(3, 1, 2)
    if isinstance(operand, list):
        b = np.array(operand, dtype=np.int32).reshape(3, 1, 2)
        use_imm = False
    else:
        b, use_imm = operand, True
    table = np.random.default_rng(len(lanes)).integers(-2**17, 2**17, 256).astype(np.int32)
    got = alu_apply(op, a.copy(), b, use_imm, table)
    want = alu_apply_wide(op, a.copy(), b if use_imm else b.copy(), use_imm, table)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_alu_shift_amounts_at_the_edges():
    """SHR by -32..31 (negative: left) with an immediate and per lane, and REQ's clamp."""
    a = np.array([[[-2**31, 2**31 - 1, -1, 1, 12345, -777]]], dtype=np.int32)
    for amount in range(-40, 40):
        for op in (AluOp.SHR, AluOp.REQ):
            imm = amount | (0x85 << 8)
            np.testing.assert_array_equal(alu_apply(op, a, imm), alu_apply_wide(op, a, imm))
            lanes = np.full(a.shape, amount | (0x10 << 8) | (0x7E << 16), dtype=np.int32)
            np.testing.assert_array_equal(alu_apply(op, a, lanes, False),
                                          alu_apply_wide(op, a, lanes, False))


def test_strided_loads_and_stores_match_elementwise_copies():
    """LOADs whose rows overlap in DRAM (x_stride < x_size) or end at its last element,
    and strided STOREs, against copies one element at a time."""
    cfg = vdla.HardwareConfig()
    elem = cfg.inp_elem_bytes
    dram = np.random.default_rng(5).integers(0, 256, 1 << 16, dtype=np.uint8)
    sim = FunctionalSimulator(cfg, dram)
    last = len(dram) // elem
    cases = [dict(dram_base=10, y_size=4, x_size=6, x_stride=3),      # rows overlap
             dict(dram_base=last - 2 * 9 - 5, y_size=3, x_size=5, x_stride=9),  # at the end
             dict(dram_base=100, y_size=3, x_size=4, x_stride=7, y_pad_0=1, x_pad_1=2),
             dict(dram_base=0, y_size=0, x_size=1, x_stride=1, y_pad_0=2)]   # padding only
    for fields in cases:
        load = Load(memory_type=MemoryType.INP, sram_base=20, **fields)
        sim.run([load, Finish()])
        rows = fields["y_size"] + fields.get("y_pad_0", 0)
        width = fields["x_size"] + fields.get("x_pad_1", 0)
        want = np.zeros((rows, width, elem), np.uint8)
        for y in range(fields["y_size"]):
            for x in range(fields["x_size"]):
                at = (fields["dram_base"] + y * fields["x_stride"] + x) * elem
                want[y + fields.get("y_pad_0", 0), x] = dram[at:at + elem]
        got = sim.sram[MemoryType.INP][20:20 + rows * width].reshape(rows, width, elem)
        np.testing.assert_array_equal(got, want)
    out = cfg.out_elem_bytes
    sim.sram[MemoryType.OUT][:12] = np.arange(12 * out, dtype=np.uint8).reshape(12, out)
    store = Store(sram_base=0, dram_base=last * elem // out - 2 * 5 - 4, y_size=3, x_size=4,
                  x_stride=5, push_prev=True)
    before = dram.copy()
    sim.run([store, Finish(pop_next=True)])
    for y in range(3):
        for x in range(4):
            at = (store.dram_base + y * 5 + x) * out
            before[at:at + out] = sim.sram[MemoryType.OUT][y * 4 + x]
    np.testing.assert_array_equal(dram, before)


def test_run_from_dram_decodes_like_fetch_and_fails_like_it():
    cfg = vdla.HardwareConfig()
    sim = FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8))
    program = [Gemm(reset_reg=True, uop_bgn=0, uop_end=0), Finish()]
    stream = np.frombuffer(encode_stream(program, cfg), np.uint8)
    sim.dram[256:256 + len(stream)] = stream
    fetched_once = fetch_program(sim.dram, 256, 2, cfg)
    assert fetched_once == fetch_program(sim.dram, 256, 2, cfg) == program
    # Each word is decoded once, for every backend: the same frozen instructions again.
    assert all(a is b for a, b in zip(fetched_once, fetch_program(sim.dram, 256, 2, cfg)))
    sim.run_from_dram(256, 2)
    sim.dram[256 + 16] = 0b111                       # an opcode that does not exist
    with pytest.raises(ProgramError) as fetched:
        fetch_program(sim.dram, 256, 2, cfg)
    with pytest.raises(ProgramError) as ran:
        sim.run_from_dram(256, 2)
    assert str(ran.value) == str(fetched.value)
    for addr, count in ((8, 1), (np.int64(256), 0), (1 << 20, 1), ("256", 1)):
        with pytest.raises(ProgramError):
            sim.run_from_dram(addr, count)


def test_blas_runs_on_one_thread_during_a_run_and_gets_its_threads_back():
    seen = []

    class Watching(FunctionalSimulator):
        def _gemm(self, insn):
            seen.append([i["num_threads"] for i in threadpoolctl.threadpool_info()
                         if i["user_api"] == "blas"])
            super()._gemm(insn)

    before = [i["num_threads"] for i in threadpoolctl.threadpool_info()
              if i["user_api"] == "blas"]
    sim = Watching(vdla.HardwareConfig(), np.zeros(1 << 16, np.uint8))
    sim.run([Gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), Finish()])
    assert seen and all(n == 1 for n in seen[0])
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"] == before
