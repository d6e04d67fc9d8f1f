"""Programs that cannot complete: deadlocks, invalid indices and addresses, bad flags."""

from dataclasses import replace

import numpy as np
import pytest

import vdla
from vdla.isa import Alu, Finish, Gemm, Load, MemoryType, Module, Store
from vdla.sim import DeadlockError, FunctionalSimulator, ProgramError

CFG = vdla.HardwareConfig()


@pytest.fixture
def sim():
    return FunctionalSimulator(CFG, np.zeros(1 << 20, np.uint8))


def inp_load(**kw):
    return Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1, **kw)


def test_missing_token_is_a_deadlock_not_a_hang(sim):
    """Compute pops a token from load that load never pushes."""
    program = [inp_load(), Gemm(pop_prev=True), Finish()]
    with pytest.raises(DeadlockError) as info:
        sim.run(program)
    message = str(info.value)
    assert "compute waits at instruction 1" in message
    assert "load->compute" in message
    [wait] = info.value.waits
    assert (wait.unit, wait.insn_index, wait.queue, wait.reason) == ("compute", 1, "load->compute", "token")


def test_deadlock_names_every_blocked_module(sim):
    """Load waits on compute and compute waits on load: both are reported."""
    program = [inp_load(pop_next=True, push_next=True), Gemm(pop_prev=True, push_prev=True), Finish()]
    with pytest.raises(DeadlockError) as info:
        sim.run(program)
    waits = {(w.unit, w.insn_index, w.queue) for w in info.value.waits}
    assert waits == {("load", 0, "compute->load"), ("compute", 1, "load->compute")}


def test_full_command_queue_deadlocks_like_the_hardware():
    """Fetch stalls on a full load queue, so the compute instruction that would free the
    waiting load is never fetched."""
    cfg = vdla.HardwareConfig(cmd_queue_depth=2)
    sim = FunctionalSimulator(cfg, np.zeros(1 << 20, np.uint8))
    program = [inp_load(pop_next=True), inp_load(), inp_load(), Gemm(push_prev=True), Finish()]
    with pytest.raises(DeadlockError) as info:
        sim.run(program)
    waits = {(w.unit, w.insn_index, w.queue, w.reason) for w in info.value.waits}
    assert ("fetch", 2, "load command", "space") in waits
    assert ("load", 0, "compute->load", "token") in waits
    # With deeper queues the same program runs to the end.
    deep = FunctionalSimulator(vdla.HardwareConfig(cmd_queue_depth=8), np.zeros(1 << 20, np.uint8))
    program[0] = inp_load()
    program[3] = Gemm()
    deep.run(program)


def test_full_token_queues_block_the_pushers():
    """Compute and store each wait for space in the queue the other one should pop."""
    cfg = vdla.HardwareConfig(token_queue_depth=2)
    sim = FunctionalSimulator(cfg, np.zeros(1 << 20, np.uint8))
    program = ([Gemm(push_next=True)] * 5 + [Gemm(pop_next=True)]
               + [Store(pop_prev=True, push_prev=True)] * 3 + [Finish()])
    with pytest.raises(DeadlockError) as info:
        sim.run(program)
    assert {(w.unit, w.insn_index, w.queue, w.reason) for w in info.value.waits} == {
        ("compute", 4, "compute->store", "space"), ("store", 8, "store->compute", "space")}


def test_program_without_finish(sim):
    with pytest.raises(ProgramError, match="without a FINISH"):
        sim.run([inp_load()])


def test_finish_before_unordered_work(sim):
    with pytest.raises(ProgramError, match=r"FINISH \(instruction 1\) ran while instruction 0"):
        sim.run([Store(), Finish()])


def test_leftover_tokens(sim):
    with pytest.raises(ProgramError, match="1 on load->compute"):
        sim.run([inp_load(push_next=True), Finish(pop_prev=False)])


@pytest.mark.parametrize("insn, flag", [
    (inp_load(pop_prev=True), "pop_prev"), (inp_load(push_prev=True), "push_prev"),
    (Store(pop_next=True), "pop_next"), (Store(push_next=True), "push_next"),
])
def test_flag_without_a_neighbour(sim, insn, flag):
    with pytest.raises(ProgramError, match=f"instruction 0 .* has no .* module, but sets {flag}"):
        sim.run([insn, Finish()])


@pytest.mark.parametrize("insn, needle", [
    (Load(memory_type=MemoryType.INP, sram_base=2047, y_size=1, x_size=2, x_stride=2),
     "writes INP SRAM elements 2047..2048, past its depth 2048"),
    (Load(memory_type=MemoryType.ACC, sram_base=0, y_size=2, x_size=2, x_stride=2, y_pad_0=1,
          x_pad_1=1, dram_base=0, ), None),
    (Load(memory_type=MemoryType.WGT, dram_base=(1 << 20) // 256, y_size=1, x_size=1, x_stride=1),
     "past the end of DRAM"),
    (Load(memory_type=MemoryType.UOP, y_size=1, x_size=1, x_stride=1, x_pad_0=1), "cannot pad"),
    (Store(sram_base=2040, y_size=2, x_size=8, x_stride=8), "past its depth 2048"),
    (Store(dram_base=(1 << 20) // 16 - 1, y_size=1, x_size=2, x_stride=2), "past the end of DRAM"),
    (Store(y_size=2, x_size=4, x_stride=2), "would overlap"),
    (Gemm(uop_bgn=0, uop_end=1, iter_out=2048, iter_in=2, dst_factor_out=1, dst_factor_in=1),
     "dst index reaches 2048, past the acc buffer depth 2048"),
    (Gemm(uop_bgn=0, uop_end=1, iter_out=2, iter_in=1, wgt_factor_out=1023, wgt_factor_in=0),
     None),
    (Gemm(uop_bgn=0, uop_end=1, iter_out=3, iter_in=1, wgt_factor_out=1000),
     "wgt index reaches 2000, past the wgt buffer depth 1024"),
    (Gemm(uop_bgn=5, uop_end=4, iter_out=1, iter_in=1), "micro-op range 5..4"),
    (Alu(uop_bgn=0, uop_end=1, iter_out=3, iter_in=1, src_factor_out=1024),
     "src index reaches 2048, past the acc buffer depth 2048"),
])
def test_out_of_range_names_the_instruction(sim, insn, needle):
    # Order the instruction before FINISH with tokens, whichever module runs it.
    if insn.module == Module.LOAD:
        program = [Gemm(), replace(insn, push_next=True), Finish(pop_prev=True)]
    elif insn.module == Module.STORE:
        program = [Gemm(push_next=True), replace(insn, pop_prev=True, push_prev=True),
                   Finish(pop_next=True)]
    else:
        program = [Gemm(), insn, Finish()]
    if needle is None:  # the boundary case that just fits
        sim.run(program)
        return
    with pytest.raises(ProgramError, match="instruction 1 ") as info:
        sim.run(program)
    assert needle in str(info.value)
    assert info.value.insn_index == 1


def test_run_from_dram_checks_the_address(sim):
    with pytest.raises(ProgramError, match="not a multiple of 16"):
        sim.run_from_dram(8, 1)
    with pytest.raises(ProgramError, match="not inside DRAM"):
        sim.run_from_dram(1 << 20, 1)
    sim.dram[:16] = 0xFF  # opcode 7
    with pytest.raises(ProgramError, match="unknown opcode 7"):
        sim.run_from_dram(0, 1)


def test_sram_state_persists_across_runs(sim):
    """As on the hardware, a second program sees what the first left in the SRAMs."""
    sim.acc[3] = 77
    sim.run([Gemm(), Finish()])
    assert (sim.acc[3] == 77).all()


def test_empty_store_writes_nothing(sim):
    """y_size 0 with x_size > 0 moves no data (the hardware's store found this case)."""
    before = sim.dram.copy()
    sim.out[:4] = 7
    stats = sim.run([Store(sram_base=0, dram_base=16, y_size=0, x_size=3, x_stride=3,
                           push_prev=True),
                     Finish(pop_next=True)])
    assert np.array_equal(sim.dram, before)
    assert stats.get("store_bytes_out", 0) == 0 and stats["store_insns"] == 1
