"""The compute module: cocotb tests in Verilator of LOAD UOP/ACC, GEMM, ALU, tokens and
throughput against the functional simulator (the extended config's: TAB, and DIV with its
cycles a micro-op), and short Amaranth simulations of the ALU's table and divide, and of a core
too narrow to pack products (block_out 1), of one with one product per DSP (`dsp_pack`
off, with and without a DSP limit), of one with LUT-built products (`gemm_dsp_limit`,
and `lut_product` over every int8 pair) and of
two with the depthwise window (`dw_taps`; the cocotb tests of the dw configs also check
its cycle contract); both forms of the GEMM arithmetic (packed for synthesis, wide for
Verilator)."""

import collections
import random

import numpy as np
import pytest
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator

from cocotb_harness import run_cocotb
from compute_harness import ComputeHarness
from hw_harnesses import HW_CONFIGS
from vdla import HardwareConfig
from vdla.hw.compute import ComputeModule, GemmArithmetic, gemm_arithmetic, lut_product
from vdla.isa import Alu, Finish, Gemm, Load, Uop, encode, encode_uops
from vdla.sim import FunctionalSimulator


def test_gemm_arithmetic_names():
    assert gemm_arithmetic("WIDE") is GemmArithmetic.WIDE
    assert gemm_arithmetic(GemmArithmetic.PACKED) is GemmArithmetic.PACKED
    assert gemm_arithmetic("native") is GemmArithmetic.NATIVE
    with pytest.raises(ValueError, match="GEMM arithmetic must be one of 'packed', 'wide', "
                                         "'native', not 'fast'"):
        ComputeModule(HardwareConfig(), arithmetic="fast")


def test_lut_products_are_exact():
    """`lut_product` (shifted adds, no multiplier) over every int8 x int8 pair, in
    Amaranth's simulator."""
    m = Module()
    x, w = Signal(signed(8)), Signal(signed(8))
    product = Signal(signed(16))
    m.d.comb += product.eq(lut_product(x, w))
    values = np.arange(-128, 128)
    got = np.zeros((256, 256), np.int64)

    async def testbench(ctx):
        for i, xv in enumerate(values.tolist()):
            ctx.set(x, xv)
            for j, wv in enumerate(values.tolist()):
                ctx.set(w, wv)
                got[i, j] = ctx.get(product)

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    np.testing.assert_array_equal(got, np.outer(values, values))


@pytest.mark.parametrize("name, arithmetic", [
    ("default", "packed"), ("batch2", "packed"), ("block8", "packed"),
    ("mul-bus128", "packed"), ("extended", "packed"), ("extended-divp", "packed"),
    ("dw3", "packed"), ("dw4-r1", "packed"),
    # The Verilator backend's form of the GEMM core (one 32-bit multiplier per product).
    # batch2-wide is slow: batch2-packed (the batch) and default-wide (the form) cover it.
    # dw3-wide is slow: the window's wide form runs in Amaranth's simulator on two dw
    # cores, r = 2 and r = 1 (test_small_dw_core_matches_functional_simulator), and on
    # Verilator, which builds the wide form, in every differential run of the EXTENDED
    # config (r = 1).
    ("default", "wide"), pytest.param("batch2", "wide", marks=pytest.mark.slow),
    pytest.param("dw3", "wide", marks=pytest.mark.slow)])
def test_compute_module(name, arithmetic):
    cfg = HW_CONFIGS[name]
    run_cocotb(ComputeHarness(cfg, arithmetic=arithmetic), toplevel="compute_harness",
               testbench="tb_compute", config=cfg)


def run_amaranth(cfg, dram: np.ndarray, inp: np.ndarray, wgt: np.ndarray, program,
                 arithmetic="packed"):
    """Run `program` on `ComputeModule(cfg)` in Amaranth's simulator with a zero-latency
    DRAM model and inp/wgt memories; returns the acc and out rows it leaves."""
    dut = ComputeModule(cfg, probes=True, arithmetic=arithmetic)
    bus_bytes = cfg.dram_bus_width // 8
    as_words = lambda tiles: [int.from_bytes(t.tobytes(), "little") for t in tiles]
    inp_words, wgt_words = as_words(inp), as_words(wgt)
    out = np.zeros((cfg.out_depth, cfg.batch, cfg.block_out), np.int8)
    acc = np.zeros((cfg.acc_depth, cfg.batch, cfg.block_out), np.int32)

    async def testbench(ctx):
        beats = collections.deque()
        inp_addr = wgt_addr = 0
        ctx.set(dut.read.req.ready, 1)
        for insn in program:
            ctx.set(dut.insn.payload, encode(insn, cfg))
            ctx.set(dut.insn.valid, 1)
            for _ in range(10_000):
                # Synchronous reads: data for the address of the previous cycle.
                ctx.set(dut.inp.data, inp_words[inp_addr])
                ctx.set(dut.wgt.data, wgt_words[wgt_addr])
                ctx.set(dut.read.beat.valid, bool(beats))
                ctx.set(dut.read.beat.payload.data, beats[0] if beats else 0)
                if beats and ctx.get(dut.read.beat.ready):
                    beats.popleft()
                if ctx.get(dut.read.req.valid):
                    req = ctx.get(dut.read.req.payload)
                    for beat in range(req.len + 1):
                        addr = req.addr + beat * bus_bytes
                        word = dram[addr:addr + bus_bytes].tobytes()
                        beats.append(int.from_bytes(word, "little"))
                if ctx.get(dut.out.en):
                    out[ctx.get(dut.out.addr)] = np.frombuffer(ctx.get(dut.out.data).to_bytes(
                        cfg.out_elem_bytes, "little"), np.int8).reshape(cfg.batch, cfg.block_out)
                inp_addr, wgt_addr = ctx.get(dut.inp.addr), ctx.get(dut.wgt.addr)
                retired = ctx.get(dut.insn.ready)
                await ctx.tick()
                if retired:
                    break
            else:
                raise AssertionError(f"{insn} did not retire")
            ctx.set(dut.insn.valid, 0)
        for row in range(cfg.acc_depth):
            ctx.set(dut.acc_probe_addr, row)
            await ctx.tick()
            acc[row] = np.frombuffer(ctx.get(dut.acc_probe_data).to_bytes(
                cfg.acc_elem_bytes, "little"), "<i4").reshape(cfg.batch, cfg.block_out)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return acc, out


SMALL_CORES = {
    # block_out 1 cannot pair products: the plain-multiplier core (or the 32-bit one).
    "unpacked": dict(batch=2, block_in=2, block_out=1),
    # Four multiplier pairs, one of them a DSP: three pairs of LUT-built products.
    "dsp_limit": dict(batch=1, block_in=2, block_out=4, gemm_dsp_limit=1),
    # One product per DSP (`dsp_pack` off): eight multipliers, then three of them DSPs
    # and five LUT-built products.
    "dsp_unpacked": dict(batch=1, block_in=2, block_out=4, dsp_pack=False),
    "dsp_unpacked_limit": dict(batch=1, block_in=2, block_out=4, dsp_pack=False,
                               gemm_dsp_limit=3),
}


@pytest.mark.parametrize("arithmetic, core", [
    (arithmetic, core) for core in SMALL_CORES for arithmetic in ("packed", "wide")
    # The wide form has one product per multiplier whatever `dsp_pack` says.
    if arithmetic == "packed" or not core.startswith("dsp_unpacked")])
def test_small_core_matches_functional_simulator(arithmetic, core):
    """Small GEMM cores in Amaranth's simulator, GEMM and ALU: the unpacked one and one
    whose `gemm_dsp_limit` builds most products from LUTs."""
    cfg = HardwareConfig(uop_buff_size=256, inp_buff_size=256, wgt_buff_size=128 * 4,
                         acc_buff_size=256 * 4, **SMALL_CORES[core])
    if core == "dsp_limit":
        assert cfg.gemm_lut_multipliers == 3
    if core == "dsp_unpacked_limit":
        assert cfg.gemm_lut_products == 5 and cfg.gemm_multipliers == 8
    rng = random.Random(5)
    gen = np.random.default_rng(5)
    dram = gen.integers(0, 256, 1 << 12, dtype=np.uint8)
    uops = [Uop(dst=rng.randrange(8), src=rng.randrange(8), wgt=rng.randrange(8))
            for _ in range(6)]
    table = encode_uops(uops, cfg)
    dram[64:64 + len(table)] = np.frombuffer(table, np.uint8)
    acc_base = 1024 // cfg.acc_elem_bytes
    program = [
        Load(memory_type="UOP", sram_base=1, dram_base=64 // cfg.uop_bytes, y_size=1,
             x_size=len(uops), x_stride=len(uops)),
        Load(memory_type="ACC", sram_base=0, dram_base=acc_base, y_size=1,
             x_size=cfg.acc_depth, x_stride=cfg.acc_depth),
        Gemm(uop_bgn=1, uop_end=1 + len(uops), iter_out=2, iter_in=2, dst_factor_out=1,
             dst_factor_in=3, src_factor_out=2, src_factor_in=1, wgt_factor_out=1,
             wgt_factor_in=2),
        Alu(alu_opcode="SHR", use_imm=True, imm=-3, uop_bgn=1, uop_end=4, iter_out=1,
            iter_in=1),
        Alu(alu_opcode="MAX", uop_bgn=1, uop_end=1 + len(uops), iter_out=1, iter_in=2,
            dst_factor_in=1, src_factor_in=2),
    ]
    matches_functional(cfg, dram, gen, program, arithmetic)


def matches_functional(cfg, dram, gen, program, arithmetic):
    """Run `program` (random inp and wgt buffers from `gen`) on the functional simulator
    and on the compute module in Amaranth's simulator; the acc and out buffers agree."""
    sim = FunctionalSimulator(cfg, dram.copy())
    sim.inp[:] = gen.integers(-128, 128, sim.inp.shape, dtype=np.int8)
    sim.wgt[:] = gen.integers(-128, 128, sim.wgt.shape, dtype=np.int8)
    inp, wgt = sim.inp.copy(), sim.wgt.copy()
    sim.run([*program, Finish()])
    acc, out = run_amaranth(cfg, dram, inp, wgt, program, arithmetic)
    np.testing.assert_array_equal(acc, sim.acc)
    np.testing.assert_array_equal(out, sim.out)


#: Small cores with the depthwise window: r = 2 inp rows a window column, with plain
#: columns past 2T; r = 1 with batch 2 and every column in the window (T = block_in / 2).
DW_CORES = {
    "dw3-r2": dict(batch=1, block_in=8, block_out=16, dw_taps=3),
    "dw2-r1-batch2": dict(batch=2, block_in=4, block_out=4, dw_taps=2),
}


def dw_program(cfg, rng):
    """(micro-ops, GEMMs) exercising the depthwise window: passes that slide (src + r per
    micro-op), srcs that do not (the window keeps its older columns: the stateful rule),
    one-micro-op passes (a whole window each), a reset with dw, and plain GEMMs between
    dw ones (the window must not leak into them)."""
    r = cfg.dw_column_rows
    sliding = [Uop(dst=d, src=3 + d * r, wgt=d) for d in range(4)]
    jumping = [Uop(dst=rng.randrange(6), src=rng.randrange(12), wgt=rng.randrange(8))
               for _ in range(5)]
    single = [Uop(dst=2, src=5, wgt=3)]
    uops = sliding + jumping + single
    a, b, c = len(sliding), len(sliding) + len(jumping), len(uops)
    gemms = [
        Gemm(uop_bgn=0, uop_end=a, iter_out=2, iter_in=2, dst_factor_out=4, dst_factor_in=1,
             src_factor_out=r, src_factor_in=2 * r, wgt_factor_in=1, dw=True),
        Gemm(uop_bgn=a, uop_end=b, iter_out=1, iter_in=2, src_factor_in=1, wgt_factor_in=2,
             dw=True),
        Gemm(uop_bgn=0, uop_end=b, iter_out=1, iter_in=1),                      # plain
        Gemm(uop_bgn=b, uop_end=c, iter_out=2, iter_in=3, dst_factor_out=1, dst_factor_in=2,
             src_factor_in=1, src_factor_out=3, wgt_factor_out=1, dw=True),
        Gemm(uop_bgn=a, uop_end=b, iter_out=1, iter_in=2, dst_factor_in=6, reset_reg=True,
             dw=True),
        Gemm(uop_bgn=0, uop_end=c, iter_out=1, iter_in=1, dw=True),
    ]
    return uops, gemms


@pytest.mark.parametrize("core", list(DW_CORES))
@pytest.mark.parametrize("arithmetic", ["packed", "wide"])
def test_small_dw_core_matches_functional_simulator(arithmetic, core):
    """The depthwise window in Amaranth's simulator: dw GEMMs (sliding, non-sliding,
    one-micro-op passes, a dw reset) and a plain one between them, both arithmetic forms."""
    cfg = HardwareConfig(uop_buff_size=256, inp_buff_size=64 * 8, wgt_buff_size=32 * 128,
                         acc_buff_size=32 * 64, **DW_CORES[core])
    rng = random.Random(7)
    gen = np.random.default_rng(7)
    dram = gen.integers(0, 256, 1 << 13, dtype=np.uint8)
    uops, gemms = dw_program(cfg, rng)
    table = encode_uops(uops, cfg)
    dram[64:64 + len(table)] = np.frombuffer(table, np.uint8)
    acc_base = 2048 // cfg.acc_elem_bytes
    program = [
        Load(memory_type="UOP", sram_base=0, dram_base=64 // cfg.uop_bytes, y_size=1,
             x_size=len(uops), x_stride=len(uops)),
        Load(memory_type="ACC", sram_base=0, dram_base=acc_base, y_size=1,
             x_size=16, x_stride=16),
        *gemms,
    ]
    matches_functional(cfg, dram, gen, program, arithmetic)


@pytest.mark.parametrize("hold", [False, True], ids=["plain", "hold"])
def test_small_core_table_matches_functional_simulator(hold):
    """The ALU's table (TAB) in Amaranth's simulator: LOADs of TAB (2-D, strided, at odd
    DRAM and table bases, one over entries already loaded), then TAB by immediates (one
    negative) and by an acc operand (held, with alu_hold), against the functional
    simulator. DRAM holds random 32-bit words: each entry keeps its low 18 bits."""
    cfg = HardwareConfig(batch=2, block_in=2, block_out=2, uop_buff_size=256,
                         inp_buff_size=256, wgt_buff_size=128 * 4, acc_buff_size=256 * 4,
                         alu_ops={"MIN", "MAX", "ADD", "SHR", "TAB"}, alu_hold=hold)
    gen = np.random.default_rng(11)
    dram = gen.integers(0, 256, 1 << 13, dtype=np.uint8)
    uops = [Uop(dst=d, src=(d + 3) % 8) for d in range(6)]
    table = encode_uops(uops, cfg)
    dram[64:64 + len(table)] = np.frombuffer(table, np.uint8)
    acc_base = 1024 // cfg.acc_elem_bytes
    tab = 4096 // 4
    program = [
        Load(memory_type="UOP", sram_base=0, dram_base=64 // cfg.uop_bytes, y_size=1,
             x_size=len(uops), x_stride=len(uops)),
        Load(memory_type="ACC", sram_base=0, dram_base=acc_base, y_size=1, x_size=16,
             x_stride=16),
        Load(memory_type="TAB", sram_base=0, dram_base=tab + 1, y_size=4, x_size=64,
             x_stride=67),
        Load(memory_type="TAB", sram_base=37, dram_base=tab + 300, y_size=3, x_size=5,
             x_stride=9),
        Alu(alu_opcode="TAB", use_imm=True, imm=-77, uop_bgn=0, uop_end=3, iter_out=1,
            iter_in=2, dst_factor_in=3),
        Alu(alu_opcode="TAB", uop_bgn=0, uop_end=len(uops), iter_out=1, iter_in=1),
        Alu(alu_opcode="TAB", uop_bgn=2, uop_end=3, iter_out=2, iter_in=3,
            dst_factor_out=3, dst_factor_in=1, src_factor_out=1),
        Alu(alu_opcode="TAB", use_imm=True, imm=2**15 - 1, uop_bgn=0, uop_end=6, iter_out=1,
            iter_in=1),
    ]
    matches_functional(cfg, dram, gen, program, "packed")


def divide_acc_image(gen, rows: int, lanes: int) -> np.ndarray:
    """int32 acc rows for DIV: dividends and divisors of every kind mixed lane by lane
    (negative, zero, small, large, the int32 edges), so both saturations, zero quotients
    and every quotient bit occur."""
    pools = [gen.integers(-2**31, 2**31, (rows, lanes)), gen.integers(-50, 3000, (rows, lanes)),
             gen.integers(0, 1 << 20, (rows, lanes)), gen.integers(-3, 40, (rows, lanes)),
             np.resize(np.array([-2**31, -1, 0, 1, 127, 128, 2**31 - 1]), (rows, lanes))]
    which = gen.integers(0, len(pools), (rows, lanes))
    return np.choose(which, pools).astype(np.int64).astype(np.int32)


@pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])
@pytest.mark.parametrize("hold", [False, True], ids=["plain", "hold"])
def test_small_core_divide_matches_functional_simulator(hold, pipeline):
    """The ALU's DIV in Amaranth's simulator: by immediates (positive, zero, negative,
    the largest), by acc rows (several micro-ops, a chain through rows just divided),
    by a held row among its own destinations (with alu_hold), a reset with the DIV
    opcode, and an ADD right after a DIV that reads its rows, against the functional
    simulator; with the pipelined divider (`div_pipeline`) also the hazards its
    scoreboard resolves: one row divided again and again, a row read as the operand
    right after a micro-op divided it, rows in flight read by the next instruction."""
    cfg = HardwareConfig(batch=2, block_in=2, block_out=2, uop_buff_size=256,
                         inp_buff_size=256, wgt_buff_size=128 * 4, acc_buff_size=256 * 4,
                         alu_ops={"MIN", "MAX", "ADD", "SHR", "DIV"}, alu_hold=hold,
                         div_pipeline=pipeline)
    gen = np.random.default_rng(13)
    dram = gen.integers(0, 256, 1 << 13, dtype=np.uint8)
    uops = [Uop(dst=d, src=8 + d) for d in range(4)] + [Uop(dst=4, src=5), Uop(dst=5, src=4),
                                                        Uop(dst=6, src=7)]
    # A chain through rows in flight (7, 8, 9: each divides by the row divided last), and
    # a held row among the destinations.
    uops += [Uop(dst=1, src=12), Uop(dst=2, src=1), Uop(dst=3, src=2), Uop(dst=4, src=5)]
    table = encode_uops(uops, cfg)
    dram[64:64 + len(table)] = np.frombuffer(table, np.uint8)
    image = divide_acc_image(gen, 32, cfg.batch * cfg.block_out)
    dram[1024:1024 + image.nbytes] = image.view(np.uint8).reshape(-1)
    program = [
        Load(memory_type="UOP", sram_base=0, dram_base=64 // cfg.uop_bytes, y_size=1,
             x_size=len(uops), x_stride=len(uops)),
        Load(memory_type="ACC", sram_base=0, dram_base=1024 // cfg.acc_elem_bytes, y_size=1,
             x_size=16, x_stride=16),
        Alu(alu_opcode="DIV", use_imm=True, imm=3, uop_bgn=0, uop_end=2, iter_out=1,
            iter_in=2, dst_factor_in=2),
        Alu(alu_opcode="DIV", uop_bgn=0, uop_end=4, iter_out=1, iter_in=1),
        Alu(alu_opcode="ADD", uop_bgn=0, uop_end=4, iter_out=1, iter_in=1),
        Alu(alu_opcode="DIV", uop_bgn=4, uop_end=6, iter_out=2, iter_in=1),
        Load(memory_type="ACC", sram_base=6, dram_base=1024 // cfg.acc_elem_bytes + 16,
             y_size=1, x_size=8, x_stride=8),   # fresh rows 6..13 for the held operands
        Alu(alu_opcode="DIV", uop_bgn=6, uop_end=7, iter_out=2, iter_in=3, dst_factor_out=3,
            dst_factor_in=1, src_factor_out=1),
        Load(memory_type="ACC", sram_base=6, dram_base=1024 // cfg.acc_elem_bytes + 24,
             y_size=1, x_size=8, x_stride=8),
        Alu(alu_opcode="DIV", uop_bgn=6, uop_end=7, iter_out=1, iter_in=4, dst_factor_in=1),
        Alu(alu_opcode="DIV", use_imm=True, imm=-5, uop_bgn=0, uop_end=1, iter_out=1,
            iter_in=1),
        Load(memory_type="ACC", sram_base=0, dram_base=1024 // cfg.acc_elem_bytes + 3,
             y_size=1, x_size=8, x_stride=8),
        Alu(alu_opcode="DIV", use_imm=True, imm=2**15 - 1, uop_bgn=0, uop_end=7, iter_out=1,
            iter_in=1),
        Alu(alu_opcode="DIV", use_imm=True, imm=0, uop_bgn=2, uop_end=3, iter_out=1,
            iter_in=1),
        Alu(alu_opcode="DIV", reset_reg=True, uop_bgn=3, uop_end=5, iter_out=1, iter_in=1),
        # Hazards: fresh rows, then a row divided 3 times in a row (dst reuse), rows 2
        # apart (a dst read a micro-op after its division started), a chain whose operand
        # is the row the micro-op before divided (src = an in-flight dst), a held row
        # (rows 4..6 by 5, then by 6) whose second outer iteration reads the row its
        # first one divided last and divides its rows again, and an ADD of them all.
        Load(memory_type="ACC", sram_base=0, dram_base=1024 // cfg.acc_elem_bytes + 40,
             y_size=1, x_size=16, x_stride=16),
        Alu(alu_opcode="DIV", use_imm=True, imm=2, uop_bgn=0, uop_end=1, iter_out=1,
            iter_in=3),
        Alu(alu_opcode="DIV", use_imm=True, imm=1, uop_bgn=0, uop_end=2, iter_out=2,
            iter_in=2, dst_factor_out=1, dst_factor_in=2),
        Alu(alu_opcode="DIV", uop_bgn=7, uop_end=10, iter_out=1, iter_in=1),
        Alu(alu_opcode="DIV", uop_bgn=10, uop_end=11, iter_out=2, iter_in=3,
            dst_factor_in=1, src_factor_out=1),
        Alu(alu_opcode="ADD", uop_bgn=7, uop_end=10, iter_out=1, iter_in=1),
    ]
    matches_functional(cfg, dram, gen, program, "packed")
