"""Both backends' `Device.run` statistics have the same keys (`STAT_KEYS`): the README's
Python API example, written for the functional backend, ended in ``KeyError:
'alu_uops'`` on Verilator. The program's counters a backend does not count itself are
read off its instructions (`vdla.sim.counters.work_counters`), checked here against the
functional simulator's own counts."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from program_gen import random_program
from vdla.isa import MemoryType, decode_stream
from vdla.isa.registers import COUNTERS
from vdla.runtime import COMPUTE, STORE, STAT_KEYS, ProgramBuilder
from vdla.runtime.kernels import GemmSchedule, blocked_gemm
from vdla.sim.counters import WORK_COUNTERS, work_counters

CFG = vdla.HardwareConfig()
#: Counters only a clocked backend measures (None on the functional one).
CLOCKED = [key for key in COUNTERS if key not in WORK_COUNTERS]


def readme_example(backend: str):
    """The README's "Python API" program (an ALU shift of 16 accumulators): (output, stats)."""
    with vdla.runtime.open(CFG, backend=backend) as dev:
        acc = dev.alloc(16 * CFG.acc_elem_bytes)
        dev.write(acc, np.arange(16 * 16, dtype=np.int32))
        out = dev.alloc(16 * CFG.out_elem_bytes)
        uop = dev.alloc(4)
        dev.write(uop, vdla.isa.encode_uops([vdla.isa.Uop(dst=0, src=0)], CFG))
        p = ProgramBuilder(CFG)
        p.load(MemoryType.UOP, dram_base=uop // CFG.uop_bytes, y_size=1, x_size=1, x_stride=1)
        p.load(MemoryType.ACC, dram_base=acc // CFG.acc_elem_bytes, y_size=1, x_size=16,
               x_stride=16)
        p.alu(vdla.AluOp.SHR, use_imm=True, imm=1, uop_end=1, iter_out=16, iter_in=1,
              dst_factor_out=1)
        p.dep_push(COMPUTE, STORE); p.dep_pop(COMPUTE, STORE)
        p.store(dram_base=out // CFG.out_elem_bytes, y_size=1, x_size=16, x_stride=16)
        p.dep_push(STORE, COMPUTE); p.dep_pop(STORE, COMPUTE)
        stats = dev.run(*dev.load_program(p.finish()))
        return dev.read(out, 16 * 16).view(np.int8), stats


def test_the_readme_example_has_the_same_stats_keys_on_both_backends():
    functional_out, functional = readme_example("functional")
    verilator_out, verilator = readme_example("verilator")
    np.testing.assert_array_equal(functional_out, verilator_out)
    assert list(functional) == list(verilator) == list(STAT_KEYS)
    assert functional["alu_uops"] == verilator["alu_uops"] == 16
    for key in WORK_COUNTERS:
        if not key.startswith("dram_bytes"):    # Verilator's: whole bus words
            assert functional[key] == verilator[key], key
    assert all(functional[key] is None for key in CLOCKED)
    assert verilator["cycles"] > 0 and verilator["alu_active"] >= 16
    assert functional["wall_seconds"] > 0 and verilator["wall_seconds"] > 0


def test_the_same_keys_for_a_blocked_gemm_on_both_backends():
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (32, 32), dtype=np.int8)
    b = rng.integers(-128, 128, (48, 32), dtype=np.int8)
    stats = {}
    for backend in ("functional", "verilator"):
        with vdla.runtime.open(CFG, backend=backend) as dev:
            _, stats[backend], _ = blocked_gemm(dev, a, b, shift=8,
                                                schedule=GemmSchedule(tile_m=1, tile_n=2))
    assert list(stats["functional"]) == list(stats["verilator"]) == list(STAT_KEYS)
    assert stats["functional"]["gemm_macs"] == stats["verilator"]["gemm_macs"] > 0


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("threads", [1, 2])
def test_work_counters_read_off_the_program_equal_the_functional_counts(seed, threads):
    with vdla.runtime.open(CFG, backend="functional") as dev:
        generated = random_program(dev, np.random.default_rng([seed, threads, 11]),
                                   virtual_threads=threads)
        insn_addr, count = dev.load_program(generated.program)
        insns = decode_stream(dev.read(insn_addr, count * 16).tobytes(), CFG)
        counted = dev.simulator.run_from_dram(insn_addr, count)
    static = work_counters(insns, CFG)
    assert {k: v for k, v in static.items() if v} == counted
