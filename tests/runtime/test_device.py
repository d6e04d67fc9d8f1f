"""The device API (functional backend), the DRAM allocator and the program builder."""

import numpy as np
import pytest

import vdla
from vdla.isa import Finish, Gemm, Load, MemoryType, Store
from vdla.runtime import COMPUTE, LOAD, STORE, DramAllocator, OutOfMemory, ProgramBuilder
from vdla.runtime.device import dram_alignment


@pytest.fixture
def dev():
    with vdla.runtime.open(vdla.HardwareConfig(), dram_size=1 << 20) as d:
        yield d


def test_open_defaults_and_unknown_backend():
    dev = vdla.runtime.open()
    assert dev.config == vdla.HardwareConfig() and dev.backend == "functional"
    with pytest.raises(ValueError, match="unknown backend 'verilog'; available: functional"):
        vdla.runtime.open(backend="verilog")
    with pytest.raises(ValueError, match="dram_size must be an integer of at least 65536"):
        vdla.runtime.open(dram_size=100)
    with pytest.raises(TypeError, match="config must be a vdla.HardwareConfig"):
        vdla.runtime.open({"batch": 1})


def test_alloc_alignment_and_roundtrip(dev):
    align = dram_alignment(dev.config)
    assert align == 256  # a whole weight tile for the default config
    addrs = [dev.alloc(n) for n in (1, 300, 17, 4096)]
    assert all(a % align == 0 and a > 0 for a in addrs)
    data = np.arange(-150, 150, dtype=np.int32)
    dev.write(addrs[1], data[:75])
    np.testing.assert_array_equal(dev.read(addrs[1], 300).view(np.int32), data[:75])
    dev.write(addrs[3], b"\x01\x02\x03")
    assert dev.read(addrs[3], 3).tolist() == [1, 2, 3]
    big_endian = np.array([1, 2], dtype=">i4")
    dev.write(addrs[3], big_endian)
    assert dev.read(addrs[3], 8).view("<i4").tolist() == [1, 2]


def test_reads_and_writes_outside_allocations_fail(dev):
    a = dev.alloc(64)
    with pytest.raises(ValueError, match="not inside one allocated DRAM block"):
        dev.write(a + 200, b"x" * 100)
    with pytest.raises(ValueError, match="not inside one allocated DRAM block"):
        dev.read(0, 16)
    with pytest.raises(ValueError, match="read size must be a non-negative integer"):
        dev.read(a, -1)
    with pytest.raises(TypeError, match="write\\(\\) takes a numpy array or a bytes-like"):
        dev.write(a, [1, 2, 3])
    dev.free(a)
    with pytest.raises(ValueError, match="was not returned by alloc"):
        dev.free(a)


def test_allocator_reuses_and_coalesces():
    alloc = DramAllocator(1 << 16, alignment=256)
    a, b, c = alloc.alloc(1000), alloc.alloc(1000), alloc.alloc(1000)
    assert (a, b, c) == (256, 1280, 2304)
    alloc.free(b)
    alloc.free(a)
    assert alloc.alloc(2048) == 256  # a and b merged into one block
    alloc.free(256)
    alloc.free(c)
    assert alloc.bytes_in_use == 0
    assert alloc.alloc((1 << 16) - 256) == 256  # everything merged back
    with pytest.raises(OutOfMemory, match="largest free block is 0 bytes"):
        alloc.alloc(1)
    with pytest.raises(ValueError, match="alloc size must be a positive integer"):
        alloc.alloc(0)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        DramAllocator(1 << 16, alignment=48)


def test_run_program_from_dram(dev):
    """A program written into DRAM runs; the stats count what it did."""
    p = ProgramBuilder(dev.config)
    p.gemm(uop_bgn=0, uop_end=1, iter_out=4, iter_in=2, dst_factor_out=2, dst_factor_in=1)
    program = p.finish()
    addr, count = dev.load_program(program)
    stats = dev.run(addr, count)
    assert stats["gemm_uops"] == 8 and stats["gemm_macs"] == 8 * 256
    assert stats["instructions"] == 2 and stats["fetch_bytes"] == 32
    other = vdla.HardwareConfig(batch=2)
    with pytest.raises(ValueError, match="encoded for config 2x16x16"):
        dev.load_program(ProgramBuilder(other).finish())


def test_builder_places_flags_and_nops():
    cfg = vdla.HardwareConfig()
    p = ProgramBuilder(cfg)
    p.dep_push(LOAD, COMPUTE)  # no load yet: a load no-op carries the push
    p.dep_pop(LOAD, COMPUTE)
    p.load(MemoryType.INP, y_size=1, x_size=1, x_stride=1)
    p.dep_push(LOAD, COMPUTE)
    p.dep_pop(LOAD, COMPUTE)  # two pending pops: a compute no-op carries the first
    p.gemm()
    p.dep_push(COMPUTE, STORE)
    p.dep_pop(COMPUTE, STORE)
    p.store()
    p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    program = p.finish()
    assert list(program) == [
        Load(memory_type=MemoryType.INP, push_next=True),
        Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1, push_next=True),
        Load(memory_type=MemoryType.UOP, pop_prev=True),
        Gemm(pop_prev=True, push_next=True),
        Store(pop_prev=True, push_prev=True),
        Finish(pop_next=True),
    ]
    vdla.sim.FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8)).run(program)


def test_builder_errors():
    cfg = vdla.HardwareConfig()
    p = ProgramBuilder(cfg)
    with pytest.raises(ValueError, match="neighbouring modules"):
        p.dep_push(LOAD, STORE)
    with pytest.raises(ValueError, match="uop_end=99999 does not fit"):
        p.gemm(uop_end=99999)
    p.load(MemoryType.INP)
    p.dep_push(LOAD, COMPUTE)
    with pytest.raises(ValueError, match=r"unbalanced dependency tokens .*load->compute: \+1"):
        p.finish()
    q = ProgramBuilder(cfg)
    q.dep_pop(COMPUTE, STORE)
    with pytest.raises(ValueError, match="no store instruction after it"):
        q.finish()
    r = ProgramBuilder(cfg)
    r.finish()
    with pytest.raises(RuntimeError, match="finished"):
        r.gemm()
