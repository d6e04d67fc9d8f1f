"""The ALU extensions past VTA (REQ, `alu_hold`) on both backends, against numpy.

Each test writes a small program by hand, runs it on a `DifferentialDevice` (the
functional simulator and Verilator, which must agree byte for byte) and checks the
result against values computed here in numpy from the ISA's definition, so the two
simulators cannot agree on a wrong answer. The random programs of `test_differential`
cover the extensions' other shapes on the `EXTENDED` config.
"""

import numpy as np
import pytest

import vdla
from differential import CANDIDATE, EXTENDED, pair_with, store_and_run
from vdla.config import AluOp
from vdla.isa import Alu, MemoryType, Uop, encode_uops
from vdla.runtime import ProgramBuilder

DRAM_SIZE = 1 << 22


@pytest.fixture(scope="module")
def candidate():
    with vdla.runtime.open(EXTENDED, backend=CANDIDATE, dram_size=DRAM_SIZE) as d:
        yield d


@pytest.fixture
def dev(candidate):
    with pair_with(candidate) as d:
        yield d


def _run_alu(dev, acc: np.ndarray, uop: Uop, stored: int | None = None,
             **alu) -> tuple[np.ndarray, dict]:
    """LOAD ACC `acc` (rows, batch, block_out) int32 into rows 0.., one ALU instruction
    with the micro-op `uop` and fields `alu`, then STORE the out elements of rows
    0..`stored`-1 (every row by default; only rows the ALU wrote: the out buffer keeps
    what earlier programs left elsewhere). Returns (those rows as int8, statistics)."""
    c = dev.config
    rows = len(acc) if stored is None else stored
    uop_addr = dev.alloc(c.uop_bytes)
    dev.write(uop_addr, np.frombuffer(encode_uops([uop], c), np.uint8))
    acc_addr = dev.alloc(acc.nbytes)
    dev.write(acc_addr, acc.astype(np.int32).view(np.uint8).reshape(-1))
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=1, x_stride=1)
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(acc), x_stride=len(acc))
    p.append(Alu(uop_bgn=0, uop_end=1, **alu))
    if not rows:    # nothing stored
        return np.zeros((0,) + acc.shape[1:], np.int8), dev.run(*dev.load_program(p.finish()))
    out, stats = store_and_run(dev, p, rows)
    return out.reshape((rows,) + acc.shape[1:]), stats


def _acc(rng, rows: int, low: int = -5000, high: int = 5000) -> np.ndarray:
    c = EXTENDED
    return rng.integers(low, high, size=(rows, c.batch, c.block_out)).astype(np.int32)


@pytest.mark.parametrize("moving", [True, False], ids=["row_per_outer", "one_row"])
def test_held_operand_is_read_at_each_outer_iterations_first_micro_op(dev, moving):
    """A held ADD whose destinations cover its own operand row: every micro-op of an
    outer iteration adds the row as it was at that iteration's first micro-op (with
    ``src_factor_out == 0``, as it was at the instruction's first)."""
    rng = np.random.default_rng(1)
    acc = _acc(rng, 8, -40, 40)
    out, _ = _run_alu(dev, acc, Uop(0, 2, 0), alu_opcode=AluOp.ADD, iter_out=2, iter_in=4,
                      dst_factor_out=4, dst_factor_in=1, src_factor_out=4 if moving else 0,
                      src_factor_in=0)
    expected = acc.copy()
    expected[0:4] += acc[2]
    expected[4:8] += acc[6] if moving else acc[2]
    np.testing.assert_array_equal(out, expected.astype(np.int8))


def test_held_operand_issues_a_micro_op_per_cycle(dev):
    """The hold pays one free cycle per outer iteration, not one per micro-op: a held SHR
    over 2 x 64 rows keeps the compute module busy about 128 cycles; the same work as
    two micro-ops per inner step (which nothing holds) about 256."""
    rng = np.random.default_rng(2)
    acc = _acc(rng, 130)
    acc[128] = acc[129] = 3                    # the operand rows: shift by 3
    # Rows 0..63 by row 128, rows 64..127 by row 129.
    held, _ = _run_alu(dev, acc, Uop(0, 128, 0), stored=128, alu_opcode=AluOp.SHR,
                       iter_out=2, iter_in=64, dst_factor_out=64, dst_factor_in=1,
                       src_factor_out=1, src_factor_in=0)
    held_busy = dev.last_stats[1]["compute_busy"]
    np.testing.assert_array_equal(held, (acc[:128] >> 3).astype(np.int8))
    # The same program with an empty ALU loop: the LOADs' share of compute_busy.
    _run_alu(dev, acc, Uop(0, 128, 0), stored=0, alu_opcode=AluOp.SHR, iter_out=0)
    loads_busy = dev.last_stats[1]["compute_busy"]
    # Rows 0..127 by one operand row (row 128), two micro-ops per step: not held.
    c = dev.config
    uops = [Uop(0, 128, 0), Uop(1, 128, 0)]
    uop_addr = dev.alloc(2 * c.uop_bytes)
    dev.write(uop_addr, np.frombuffer(encode_uops(uops, c), np.uint8))
    acc_addr = dev.alloc(acc.nbytes)
    dev.write(acc_addr, acc.view(np.uint8).reshape(-1))
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=2, x_stride=2)
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(acc), x_stride=len(acc))
    p.alu(AluOp.SHR, uop_bgn=0, uop_end=2, iter_out=1, iter_in=64,
          dst_factor_in=2)
    dev.run(*dev.load_program(p.finish()))
    unheld_busy = dev.last_stats[1]["compute_busy"]
    if CANDIDATE != "verilator":
        pytest.skip("cycle counts need the Verilator backend")
    held, unheld = held_busy - loads_busy, unheld_busy - loads_busy
    assert 128 < held < 128 + 12 and 256 < unheld < 256 + 12, (held, unheld)


@pytest.mark.parametrize("use_imm", [True, False], ids=["imm", "vector"])
def test_req_shifts_then_clamps(dev, use_imm):
    """REQ = SHR by the operand's bits 5:0, then min(max(., lo), hi) with lo in bits 15:8
    and hi in bits 23:16 (127 with an immediate); lo > hi gives hi."""
    rng = np.random.default_rng(3)
    c = EXTENDED
    acc = _acc(rng, 16, -200_000, 200_000)
    shift, lo, hi = 7, -20, 90
    if use_imm:
        imm = (shift & 63) | ((lo & 255) << 8)
        imm -= (imm >> 15) << 16                      # as a signed 16-bit immediate
        out, _ = _run_alu(dev, acc, Uop(0, 0, 0), alu_opcode=AluOp.REQ, iter_out=16,
                          iter_in=1, dst_factor_out=1, use_imm=True, imm=imm)
        expected = np.clip(acc >> shift, lo, 127)
    else:
        # Row 15 holds the operand: per lane a shift of 0..9 and bounds, some lo > hi.
        lanes = np.arange(c.block_out)
        shifts, los, his = lanes % 10, -lanes * 3, 100 - lanes * 9
        word = (shifts & 63) | ((los & 255) << 8) | ((his & 255) << 16)
        acc[15] = word.astype(np.uint32).view(np.int32)
        out, _ = _run_alu(dev, acc, Uop(0, 15, 0), stored=15, alu_opcode=AluOp.REQ,
                          iter_out=15, iter_in=1, dst_factor_out=1, src_factor_out=0)
        expected = np.minimum(np.maximum(acc[:15] >> shifts, los), his)
    np.testing.assert_array_equal(out, expected.astype(np.int8))
