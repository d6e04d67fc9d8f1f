"""Program validation (`vdla.sim.validate`): what every backend checks before a run, so
that a bad program fails fast with the same error everywhere."""

from __future__ import annotations

import time

import numpy as np
import pytest

import vdla
from vdla.isa import Finish, Gemm, Load, MemoryType, Program, Store, Uop, encode_uops
from vdla.sim import BudgetError, DeadlockError, FunctionalSimulator, ProgramError, SimError
from vdla.sim.validate import (BUDGET_MARGIN, BUDGET_SLACK, DEFAULT_MAX_CYCLES,
                               ProgramValidator)

CFG = vdla.HardwareConfig()


@pytest.fixture
def sim():
    return FunctionalSimulator(CFG, np.zeros(1 << 20, np.uint8))


def uop_load(dram_base: int, count: int, **flags) -> Load:
    return Load(memory_type=MemoryType.UOP, dram_base=dram_base, y_size=1, x_size=count,
                x_stride=count, **flags)


def put_uops(dram: np.ndarray, byte_addr: int, uops, base: int = 0) -> int:
    """Write micro-ops at `byte_addr` of `dram` (a block that will sit at DRAM byte
    `base`); returns their element address for a LOAD."""
    raw = encode_uops(uops, CFG)
    dram[byte_addr:byte_addr + len(raw)] = np.frombuffer(raw, np.uint8)
    return (base + byte_addr) // CFG.uop_bytes


def U(dst: int = 0) -> Uop:
    return Uop(dst, 0)


#: The three kinds of bad program the issue names, each a decodable program that the
#: hardware would run without complaint (indices wrap, loops just go on).
BAD = {
    "out-of-range index": (
        lambda dram, base: [uop_load(put_uops(dram, 0x1000, [U(2000)], base), 1),
                      Gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=100, iter_in=1,
                           dst_factor_out=1), Finish()],
        ProgramError, "dst index reaches 2099, past the acc buffer depth 2048"),
    "deadlock": (
        lambda dram, base: [Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1,
                           pop_next=True, push_next=True),
                      Gemm(pop_prev=True, push_prev=True), Finish()],
        DeadlockError, "load waits at instruction 0"),
    "runaway loop": (
        lambda dram, base: [uop_load(put_uops(dram, 0x1000, [U()] * 8192, base), 8192),
                      Gemm(reset_reg=True, uop_bgn=0, uop_end=8192, iter_out=16383,
                           iter_in=16383), Finish()],
        BudgetError, "needs at least 2,198,754,828,288 cycles, past the cycle budget of "  # 16383² · 8192
                     "2,000,000,000"),
}


def run_program(dev, build):
    """Write the program `build(block, base)` returns (and the data it puts in `block`,
    which goes to DRAM byte `base`) into `dev`, run it."""
    dram = np.zeros(1 << 16, np.uint8)
    base = dev.alloc(len(dram))
    insns = build(dram, base)
    dev.write(base, dram)
    return dev.run(*dev.load_program(Program(insns, CFG)))


@pytest.mark.parametrize("name", BAD)
def test_bad_programs_end_fast_with_the_same_error_on_both_backends(name):
    """Before validation, two of these ran on Verilator for minutes (the cycle budget was
    2e9 and the hardware stayed busy); now each ends at once with the functional error."""
    build, kind, needle = BAD[name]
    errors = {}
    for backend in ("functional", "verilator"):
        options = {"log": lambda message: None} if backend == "verilator" else {}
        with vdla.runtime.open(CFG, backend=backend, dram_size=1 << 20, **options) as dev:
            start = time.perf_counter()
            with pytest.raises(SimError) as info:
                run_program(dev, build)
            assert time.perf_counter() - start < 10
            errors[backend] = info.value
    assert type(errors["functional"]) is type(errors["verilator"]) is kind
    assert str(errors["functional"]) == str(errors["verilator"])
    assert needle in str(errors["verilator"])


def test_runaway_names_the_instruction_and_how_to_raise_the_budget(sim):
    dram = sim.dram
    program = BAD["runaway loop"][0](dram, 0)
    with pytest.raises(BudgetError) as info:
        sim.run(program)
    error = info.value
    assert error.insn_index == 1 and error.budget == DEFAULT_MAX_CYCLES
    assert "instruction 1 (GEMM" in str(error) and "max_cycles=" in str(error)
    assert "--max-cycles" in str(error)


def test_plan_estimate_and_default_budget(sim):
    dram = sim.dram
    addr = put_uops(dram, 0x1000, [U(i) for i in range(4)])
    program = [uop_load(addr, 4), Gemm(reset_reg=True, uop_bgn=0, uop_end=4, iter_out=10,
                                        iter_in=10), Finish()]
    plan = ProgramValidator(CFG).validate(program, dram)
    assert plan.order == (0, 1, 2) and plan.module_insns == {"compute": 3}
    assert plan.minimum == 400                 # 400 micro-ops, one per cycle at best
    assert plan.estimate > plan.minimum
    assert plan.default_budget
    assert plan.budget == BUDGET_MARGIN * plan.estimate + BUDGET_SLACK
    assert "default budget" in plan.budget_note()
    given = ProgramValidator(CFG).validate(program, dram, max_cycles=400)
    assert given.budget == 400 and not given.default_budget
    with pytest.raises(BudgetError, match="needs at least 400 cycles, past the cycle budget "
                                          "of 399"):
        ProgramValidator(CFG).validate(program, dram, max_cycles=399)
    with pytest.raises(ValueError, match="max_cycles must be a positive integer, not 0"):
        ProgramValidator(CFG).validate(program, dram, max_cycles=0)


def test_stores_over_the_program_or_its_uops_are_refused(sim):
    """Fetch and the uop loads read DRAM while the program runs: overwriting them would
    make the outcome depend on timing, so validation refuses it."""
    stream_addr = 0x2000
    program = [Store(dram_base=stream_addr // CFG.out_elem_bytes, y_size=1, x_size=1,
                     x_stride=1, push_prev=True), Finish(pop_next=True)]
    with pytest.raises(ProgramError, match="over the program's instructions"):
        sim.run(program, insn_addr=stream_addr)
    sim.run(program)   # where the instructions are is not known: nothing to protect
    addr = put_uops(sim.dram, 0x1000, [U()])
    program = [Store(dram_base=0x1000 // CFG.out_elem_bytes, y_size=1, x_size=1, x_stride=1,
                     push_prev=True), uop_load(addr, 1, pop_next=True), Finish()]
    with pytest.raises(ProgramError, match="over the micro-ops instruction 1 loads"):
        sim.run(program)


def test_uops_persist_across_programs_and_only_valid_programs_commit(sim):
    """The validator checks a GEMM against the micro-ops an earlier program left in the
    uop buffer, as the hardware holds them; a program that fails leaves them alone."""
    dram = sim.dram
    far = put_uops(dram, 0x1000, [U(2047)])
    near = put_uops(dram, 0x1100, [U(0)])
    gemm = Gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=2, iter_in=1,
                dst_factor_out=1)
    sim.run([uop_load(near, 1), Finish()])
    sim.run([gemm, Finish()])                          # dst 0 and 1: fine
    with pytest.raises(ProgramError, match="dst index reaches 2048"):
        sim.run([uop_load(far, 1), gemm, Finish()])    # refused: nothing committed
    sim.run([gemm, Finish()])                          # still the near micro-op
    sim.run([uop_load(far, 1), Finish()])
    with pytest.raises(ProgramError, match="dst index reaches 2048"):
        sim.run([gemm, Finish()])


def test_empty_load_with_no_rows(sim):
    """y_size 0 and no padding rows writes nothing (fuzzing found the functional model
    crashing on it)."""
    before = sim.inp.copy()
    sim.run([Load(memory_type=MemoryType.INP, y_size=0, x_size=1, x_stride=0,
                  push_next=True), Finish(pop_prev=True)])
    assert np.array_equal(sim.inp, before)
