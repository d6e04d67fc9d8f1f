"""The ALU's DIV: ``min(max(acc[dst], 0) // operand, 127)``, and 127 where the operand is
not positive.

Each test writes a small program by hand, runs it on a `DifferentialDevice` (the
functional simulator and the candidate backend, Verilator, which must agree byte for
byte) and checks the result against numpy from the ISA's definition (docs/isa.md, DIV),
so the two simulators cannot agree on a wrong answer. `DIVIDE` is the `EXTENDED` config
(every extension past VTA, alu_hold among them), whose Verilator model the other
extension tests share; the random programs of `test_differential` cover DIV's other
shapes on it."""

import numpy as np
import pytest

import vdla
from differential import CANDIDATE, EXTENDED, pair_with, store_and_run
from vdla.config import DIV_MAX, AluOp
from vdla.isa import Alu, EncodeError, MemoryType, Uop, encode, encode_uops
from vdla.runtime import ProgramBuilder

DIVIDE = EXTENDED
assert AluOp.DIV in DIVIDE.alu_ops and DIVIDE.alu_hold


@pytest.fixture(scope="module")
def candidate():
    with vdla.runtime.open(DIVIDE, backend=CANDIDATE, dram_size=1 << 22) as d:
        yield d


@pytest.fixture
def dev(candidate):
    with pair_with(candidate) as d:
        yield d


def _divide(dev, acc: np.ndarray, *, operand=None, imm: int = 1, held: bool = False):
    """LOAD ACC `acc` (rows, batch, block_out) and `operand` rows after them (or one
    operand row with `held`); DIV every row by the immediate or its operand row; the
    out rows as int8."""
    c = dev.config
    rows = len(acc)
    both = acc if operand is None else np.concatenate([acc, operand])
    uop_addr, acc_addr = dev.alloc(c.uop_bytes), dev.alloc(both.nbytes)
    dev.write(uop_addr, np.frombuffer(encode_uops([Uop(0, rows if operand is not None
                                                       else 0, 0)], c), np.uint8))
    dev.write(acc_addr, both.astype(np.int32).view(np.uint8).reshape(-1))
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=1, x_stride=1)
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(both), x_stride=len(both))
    p.append(Alu(alu_opcode=AluOp.DIV, uop_bgn=0, uop_end=1, iter_out=1, iter_in=rows,
                 dst_factor_in=1, src_factor_in=0 if held else 1,
                 use_imm=operand is None, imm=imm))
    return store_and_run(dev, p, rows)[0].reshape(acc.shape)


def _expected(a, b):
    a = np.maximum(np.asarray(a, np.int64), 0)
    b = np.asarray(b, np.int64)
    return np.where(b > 0, np.minimum(a // np.maximum(b, 1), DIV_MAX), DIV_MAX)


def _rows(rng, n, low, high):
    return rng.integers(low, high, size=(n, DIVIDE.batch, DIVIDE.block_out)).astype(np.int32)


@pytest.mark.parametrize("imm", [1, 3, 127, 2**15 - 1, 0, -5])
def test_divide_by_an_immediate(dev, imm):
    rng = np.random.default_rng(imm & 0xFFFF)
    acc = _rows(rng, 12, -2**31, 2**31 - 1)
    acc[0] = rng.integers(0, 1000, acc.shape[1:])
    out = _divide(dev, acc, imm=imm)
    np.testing.assert_array_equal(out, _expected(acc, imm).astype(np.int8))


def test_divide_by_rows_and_a_held_row(dev):
    """A softmax's shape: exponentials times 2**k plus half the sum, over the sum."""
    rng = np.random.default_rng(9)
    sums = _rows(rng, 1, 1, 1 << 30)
    e = (rng.integers(0, 1 << 16, (16, DIVIDE.batch, DIVIDE.block_out)) << 7) + (sums >> 1)
    out = _divide(dev, e.astype(np.int32), operand=sums, held=True)
    np.testing.assert_array_equal(out, _expected(e, sums).astype(np.int8))
    rows = _rows(rng, 10, -100, 100_000)
    divisors = _rows(rng, 10, -3, 2000)
    out = _divide(dev, rows, operand=divisors)
    np.testing.assert_array_equal(out, _expected(rows, divisors).astype(np.int8))


def test_divide_chains_through_rows_just_divided(dev):
    """Each micro-op reads what the one before wrote: one row divided by 3 four times
    (its dst read right behind the division before it), then each next row divided by
    the row just divided (the src read right behind it)."""
    c = dev.config
    rng = np.random.default_rng(5)
    acc = np.concatenate([_rows(rng, 1, 0, 1 << 16), _rows(rng, 3, -20, 3000)])
    uops = [Uop(0, 0, 0), Uop(1, 0, 0), Uop(2, 1, 0), Uop(3, 2, 0)]
    uop_addr, acc_addr = dev.alloc(len(uops) * c.uop_bytes), dev.alloc(acc.nbytes)
    dev.write(uop_addr, np.frombuffer(encode_uops(uops, c), np.uint8))
    dev.write(acc_addr, acc.view(np.uint8).reshape(-1))
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=len(uops), x_stride=len(uops))
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(acc), x_stride=len(acc))
    p.append(Alu(alu_opcode=AluOp.DIV, uop_bgn=0, uop_end=1, iter_out=1, iter_in=4,
                 use_imm=True, imm=3))
    p.append(Alu(alu_opcode=AluOp.DIV, uop_bgn=1, uop_end=4, iter_out=1, iter_in=1))
    out = store_and_run(dev, p, len(acc))[0].reshape(acc.shape)
    want = acc.astype(np.int64)
    for _ in range(4):
        want[0] = _expected(want[0], 3)
    for dst in (1, 2, 3):
        want[dst] = _expected(want[dst], want[dst - 1])
    np.testing.assert_array_equal(out, want.astype(np.int8))


def test_a_config_without_div_refuses_it():
    with pytest.raises(EncodeError, match="alu_opcode=DIV is not implemented"):
        encode(Alu(alu_opcode=AluOp.DIV, uop_end=1, iter_out=1, iter_in=1),
               vdla.HardwareConfig())
