"""The ALU's DIV: ``min(max(acc[dst], 0) // operand, 127)``, and 127 where the operand is
not positive. Hand-written programs checked against numpy from the ISA's definition
(docs/isa.md, DIV) on `BACKEND`."""

import numpy as np
import pytest

import vdla
from differential import store_and_run
from vdla.config import DIV_MAX, AluOp
from vdla.isa import Alu, EncodeError, MemoryType, Uop, encode, encode_uops
from vdla.runtime import ProgramBuilder

DIVIDE = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "DIV"}, alu_hold=True)
BACKEND = "functional"


@pytest.fixture(scope="module")
def dev():
    with vdla.runtime.open(DIVIDE, backend=BACKEND, dram_size=1 << 20) as d:
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


def test_a_config_without_div_refuses_it():
    with pytest.raises(EncodeError, match="alu_opcode=DIV is not implemented"):
        encode(Alu(alu_opcode=AluOp.DIV, uop_end=1, iter_out=1, iter_in=1),
               vdla.HardwareConfig())
