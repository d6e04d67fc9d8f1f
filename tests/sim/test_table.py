"""The ALU's lookup table (TAB): a LOAD of TAB fills it, the TAB op reads it lane by lane.

Each test writes a small program by hand, runs it on a `DifferentialDevice` (the
functional simulator and the candidate backend, Verilator, which must agree byte for
byte) and checks the result against values computed here in numpy from the ISA's
definition (docs/isa.md, TAB), so the two simulators cannot agree on a wrong answer.
`TABLE` is the `EXTENDED` config (every extension past VTA), whose Verilator model the
other extension tests share; the random programs of `test_differential` cover TAB's
other shapes on it.
"""

import numpy as np
import pytest

import vdla
from differential import CANDIDATE, EXTENDED, pair_with, store_and_run
from vdla.config import TABLE_BITS, TABLE_ENTRIES, AluOp
from vdla.isa import Alu, EncodeError, Load, MemoryType, Uop, encode, encode_uops
from vdla.runtime import ProgramBuilder
from vdla.sim.validate import ProgramError

TABLE = EXTENDED
assert AluOp.TAB in TABLE.alu_ops


@pytest.fixture(scope="module")
def candidate():
    with vdla.runtime.open(TABLE, backend=CANDIDATE, dram_size=1 << 22) as d:
        yield d


@pytest.fixture
def dev(candidate):
    with pair_with(candidate) as d:
        yield d


def _signed_bits(values: np.ndarray, bits: int) -> np.ndarray:
    low = values.astype(np.int64) & ((1 << bits) - 1)
    return np.where(low >> (bits - 1), low - (1 << bits), low)


def _run_table(dev, table: np.ndarray, acc: np.ndarray, *, operand=None, imm: int = 0,
               table_loads=((0, TABLE_ENTRIES),)) -> np.ndarray:
    """LOAD TAB `table` (int32[256], in the given (first entry, count) pieces), LOAD ACC
    `acc` (rows, batch, block_out) into rows 0.. and `operand` (if any) after them, one
    TAB over those rows (by the immediate `imm`, or by the operand rows), and STORE the
    out rows; returns them as int8."""
    c = dev.config
    rows = len(acc)
    both = acc if operand is None else np.concatenate([acc, operand])
    uops = [Uop(0, rows if operand is not None else 0, 0)]
    uop_addr = dev.alloc(c.uop_bytes)
    dev.write(uop_addr, np.frombuffer(encode_uops(uops, c), np.uint8))
    tab_addr = dev.alloc(table.nbytes)
    dev.write(tab_addr, table.astype(np.int32).view(np.uint8))
    acc_addr = dev.alloc(both.nbytes)
    dev.write(acc_addr, both.astype(np.int32).view(np.uint8).reshape(-1))
    p = ProgramBuilder(c)
    for first, count in table_loads:
        p.load(MemoryType.TAB, sram_base=first, dram_base=tab_addr // 4 + first, y_size=1,
               x_size=count, x_stride=count)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=1, x_stride=1)
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(both), x_stride=len(both))
    p.append(Alu(alu_opcode=AluOp.TAB, uop_bgn=0, uop_end=1, iter_out=1, iter_in=rows,
                 dst_factor_in=1, src_factor_in=1, use_imm=operand is None, imm=imm))
    return store_and_run(dev, p, rows)[0].reshape(acc.shape)


def _acc(rng, rows: int, low: int, high: int) -> np.ndarray:
    return rng.integers(low, high, size=(rows, TABLE.batch, TABLE.block_out)).astype(np.int32)


def test_tab_looks_up_each_lane_by_its_low_bits_plus_the_immediate(dev):
    """Every entry is reached, the sum wraps at 256, and an entry keeps its low 18 bits,
    sign-extended (so its out byte is that value's low 8 bits)."""
    rng = np.random.default_rng(3)
    table = rng.integers(-2**31, 2**31 - 1, size=TABLE_ENTRIES).astype(np.int32)
    acc = _acc(rng, 40, -100_000, 100_000)
    out = _run_table(dev, table, acc, imm=-3)
    entries = _signed_bits(table, TABLE_BITS)
    expected = entries[(-3 - acc.astype(np.int64)) & 255]
    np.testing.assert_array_equal(out, expected.astype(np.int8))


def test_tab_with_a_vector_operand_adds_it_lane_by_lane(dev):
    rng = np.random.default_rng(4)
    table = rng.integers(-128, 128, size=TABLE_ENTRIES).astype(np.int32)
    acc = _acc(rng, 12, -300, 300)
    operand = _acc(rng, 12, -300, 300)
    out = _run_table(dev, table, acc, operand=operand)
    np.testing.assert_array_equal(out, table[(operand.astype(np.int64) - acc) & 255]
                                  .astype(np.int8))


def test_a_table_loaded_in_pieces_is_the_concatenation(dev):
    """Two LOADs of TAB fill halves; a third overwrites a middle stretch."""
    rng = np.random.default_rng(5)
    table = rng.integers(-128, 128, size=TABLE_ENTRIES).astype(np.int32)
    acc = np.arange(256, dtype=np.int32).reshape(-1, TABLE.batch, TABLE.block_out)
    out = _run_table(dev, table, acc, table_loads=((0, 128), (128, 128), (100, 20)))
    # by the immediate 0, acc value v reads entry -v mod 256
    np.testing.assert_array_equal(out.reshape(-1), table[(-np.arange(256)) & 255]
                                  .astype(np.int8))


def test_the_int32_result_stays_in_the_accumulator(dev):
    """An exponential's entry (up to 2**16) is a full accumulator value, not only its
    out byte: a second pass (SHR by 8) shows the high bits."""
    c = dev.config
    table = (np.arange(TABLE_ENTRIES, dtype=np.int32) * 257)
    acc = np.arange(16 * c.batch * c.block_out, dtype=np.int32).reshape(
        -1, c.batch, c.block_out) % 256
    tab_addr, acc_addr = dev.alloc(table.nbytes), dev.alloc(acc.nbytes)
    uop_addr = dev.alloc(c.uop_bytes)
    dev.write(tab_addr, table.view(np.uint8))
    dev.write(acc_addr, acc.view(np.uint8).reshape(-1))
    dev.write(uop_addr, np.frombuffer(encode_uops([Uop(0, 0, 0)], c), np.uint8))
    p = ProgramBuilder(c)
    p.load(MemoryType.TAB, sram_base=0, dram_base=tab_addr // 4, y_size=1, x_size=256,
           x_stride=256)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=1, x_stride=1)
    p.load(MemoryType.ACC, sram_base=0, dram_base=acc_addr // c.acc_elem_bytes, y_size=1,
           x_size=len(acc), x_stride=len(acc))
    loop = dict(uop_bgn=0, uop_end=1, iter_out=1, iter_in=len(acc), dst_factor_in=1,
                use_imm=True)
    p.append(Alu(alu_opcode=AluOp.TAB, imm=0, **loop))
    p.append(Alu(alu_opcode=AluOp.SHR, imm=8, **loop))
    out = store_and_run(dev, p, len(acc))[0].reshape(acc.shape)
    np.testing.assert_array_equal(out, ((table[-acc & 255]) >> 8).astype(np.int8))


def test_a_config_without_the_table_refuses_its_load_and_op():
    plain = vdla.HardwareConfig()
    load = Load(memory_type=MemoryType.TAB, sram_base=0, dram_base=0, y_size=1, x_size=4,
                x_stride=4)
    with pytest.raises(EncodeError, match="memory_type=TAB is not implemented by config "
                                          r"1x16x16\S* \(allowed ADD, MAX, MIN, SHR|"
                                          "memory_type=TAB is not implemented"):
        encode(load, plain)
    with pytest.raises(EncodeError, match="alu_opcode=TAB is not implemented"):
        encode(Alu(alu_opcode=AluOp.TAB, uop_end=1, iter_out=1, iter_in=1), plain)


def test_a_table_load_past_the_table_or_padded_is_refused(dev):
    c = dev.config
    for fields, message in (({"sram_base": 200, "x_size": 64}, "past its depth 256"),
                            ({"sram_base": 0, "x_size": 8, "x_pad_0": 1}, "cannot pad")):
        p = ProgramBuilder(c)
        p.load(MemoryType.TAB, dram_base=0, y_size=1, x_stride=fields["x_size"], **fields)
        with pytest.raises(ProgramError, match=message):
            dev.run(*dev.load_program(p.finish()))
