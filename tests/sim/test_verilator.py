"""The Verilator backend: binding, device, watchdog, errors, timeline and waveform.

The differential tests (test_differential.py, test_functional_vta.py) compare it with the
functional simulator over many programs; these check its own contract. Every model is a
real Verilator build of the generated Verilog (cached in $VDLA_CACHE across runs); the
build cache itself is tested in test_verilator_cache.py.
"""

import functools
import json

import numpy as np
import pytest

import vdla
from differential import SMALL_QUEUES
from vdla.isa.registers import COUNTERS, REGISTERS, STATE_BITS
from vdla.isa import AluOp, Finish, Gemm, Load, MemoryType, Program, Store
from vdla.runtime import COMPUTE, STORE, ProgramBuilder
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference
from vdla.sim import BudgetError, DeadlockError, ProgramError, WatchdogError
from vdla.sim.verilator import DramTiming, RunStatus

CFG = vdla.HardwareConfig()
DRAM = 1 << 24


@pytest.fixture(scope="module")
def dev():
    with vdla.runtime.open(CFG, backend="verilator", dram_size=DRAM) as d:
        yield d


def gemm_operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, size=(m, k), dtype=np.int8),
            rng.integers(-128, 128, size=(n, k), dtype=np.int8))


def run_insns(dev, insns, **options):
    return dev.run(*dev.load_program(Program(insns, dev.config)), **options)


def inp_load(**kw):
    return Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1, **kw)


# --- the binding ------------------------------------------------------------------------------

def test_control_registers_over_axi_lite(dev):
    model = dev.simulator.model
    assert model.ctrl_read(REGISTERS["ID"][0]) == 0x56444C41
    model.ctrl_write(REGISTERS["INSN_ADDR"][0], 0x1230)
    assert model.ctrl_read(REGISTERS["INSN_ADDR"][0]) == 0x1230
    assert model.ctrl_read(REGISTERS["STATE"][0]) == model.state == 0   # idle


def test_peek_poke_step(dev):
    model = dev.simulator.model
    assert model.ports["m_axi__rdata"] == (CFG.dram_bus_width, True)
    assert model.ports["state"] == (32, False)
    before = model.cycle
    model.step(10)
    assert model.cycle == before + 10
    assert model.peek("irq") in (0, 1)
    model.poke("s_axi_ctrl__araddr", REGISTERS["ID"][0])   # inputs can be poked
    model.eval()
    with pytest.raises(ValueError, match="output"):
        model.poke("irq", 1)
    with pytest.raises(ValueError, match="does not fit"):
        model.poke("s_axi_ctrl__araddr", 1 << 12)
    with pytest.raises(KeyError, match="no port 'nope'"):
        model.peek("nope")
    with pytest.raises(ValueError, match="non-negative"):
        model.step(-1)


# --- running programs -----------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_gemm_is_bit_exact_and_counted(dev, threads):
    a, b = gemm_operands(64, 48, 96, seed=threads)
    out, stats, program = blocked_gemm(dev, a, b, shift=7, virtual_threads=threads)
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 7))
    assert set(COUNTERS) <= set(stats)
    assert stats["cycles"] > 0 and stats["wall_seconds"] > 0
    macs = (64 // CFG.batch) * (48 // CFG.block_out) * (96 // CFG.block_in)
    assert stats["gemm_active"] == macs   # one GEMM micro-op per block product
    assert stats["fetched_insns"] == len(program)
    assert stats["load_insns"] + stats["compute_insns"] + stats["store_insns"] == len(program)
    for name in ("load_busy", "compute_busy", "store_busy", "fetch_busy"):
        assert 0 < stats[name] <= stats["cycles"], name


def test_two_virtual_threads_hide_latency(dev):
    """The point of the decoupled design: loads overlap compute, so two threads win."""
    a, b = gemm_operands(128, 128, 256, seed=3)
    cycles = {}
    for threads in (1, 2):
        _, stats, _ = blocked_gemm(dev, a, b, shift=8, virtual_threads=threads)
        cycles[threads] = stats["cycles"]
    assert cycles[2] < cycles[1], cycles


def test_dram_timing_changes_cycles_not_results():
    a, b = gemm_operands(32, 32, 64, seed=5)
    seen = {}
    for name, timing in (("fast", DramTiming(read_latency=1, bytes_per_cycle=64)),
                         ("default", DramTiming()),
                         ("slow", DramTiming(read_latency=200, bytes_per_cycle=1))):
        with vdla.runtime.open(CFG, backend="verilator", dram_size=DRAM, dram=timing) as d:
            out, stats, _ = blocked_gemm(d, a, b, shift=6, virtual_threads=1)
        np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 6))
        seen[name] = stats["cycles"]
    assert seen["fast"] < seen["default"] < seen["slow"], seen


def test_the_default_dram_has_the_configs_bandwidth():
    # The compiler plans with the config's dram_bytes_per_cycle: Verilator's DRAM model
    # defaults to it (the same Verilog: the model build is shared).
    a, b = gemm_operands(32, 32, 64, seed=5)
    seen = {}
    for bpc in (8.0, 1.0):
        config = CFG.replace(dram_bytes_per_cycle=bpc)
        with vdla.runtime.open(config, backend="verilator", dram_size=DRAM) as d:
            assert d.simulator.validator.bytes_per_cycle == bpc
            out, stats, _ = blocked_gemm(d, a, b, shift=6, virtual_threads=1)
        np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 6))
        seen[bpc] = stats["cycles"]
    assert seen[1.0] > seen[8.0], seen


@pytest.mark.parametrize("field, value, allowed", [
    ("read_latency", 0, "from 1"), ("max_reads", 1.5, "integer"),
    ("bytes_per_cycle", 0, "from 0.125"), ("write_latency", True, "integer")])
def test_dram_timing_rejects_bad_values(field, value, allowed):
    with pytest.raises(ValueError, match=f"DramTiming.{field} must be.*{allowed}"):
        DramTiming(**{field: value})


def test_sram_contents_survive_between_runs(dev):
    """As on the board (and in the functional simulator): a second program can use what
    the first loaded."""
    c = CFG
    data = np.arange(c.acc_elem_bytes * 2, dtype=np.uint8).view(np.int32)
    src = dev.alloc(data.nbytes)
    dev.write(src, data)
    out = dev.alloc(2 * c.out_elem_bytes)
    uops = dev.alloc(c.uop_bytes)
    dev.write(uops, np.frombuffer(vdla.isa.encode_uops([vdla.isa.Uop(0, 0)], c), np.uint8))
    first = ProgramBuilder(c)
    first.load(MemoryType.UOP, dram_base=uops // c.uop_bytes, y_size=1, x_size=1, x_stride=1)
    first.load(MemoryType.ACC, dram_base=src // c.acc_elem_bytes, y_size=1, x_size=2, x_stride=2)
    dev.run(*dev.load_program(first.finish()))
    second = ProgramBuilder(c)
    second.alu(AluOp.ADD, use_imm=True, imm=1, uop_bgn=0, uop_end=1, iter_out=2, iter_in=1,
               dst_factor_out=1)
    second.dep_push(COMPUTE, STORE)
    second.dep_pop(COMPUTE, STORE)
    second.store(dram_base=out // c.out_elem_bytes, y_size=1, x_size=2, x_stride=2)
    second.dep_push(STORE, COMPUTE)
    second.dep_pop(STORE, COMPUTE)
    dev.run(*dev.load_program(second.finish()))
    got = dev.read(out, 2 * c.out_elem_bytes).view(np.int8)
    np.testing.assert_array_equal(got, (data + 1).astype(np.int8))


# --- the watchdog and the errors -------------------------------------------------------------

def functional_error(insns):
    with vdla.runtime.open(CFG, backend="functional", dram_size=1 << 20) as f:
        with pytest.raises((DeadlockError, ProgramError)) as info:
            run_insns(f, insns)
    return info.value


DEADLOCKS = {
    "missing token": [inp_load(), Gemm(pop_prev=True), Finish()],
    "cycle": [inp_load(pop_next=True, push_next=True), Gemm(pop_prev=True, push_prev=True),
              Finish()],
    "three modules": [inp_load(pop_next=True), Gemm(pop_next=True, push_prev=True),
                      Store(pop_prev=True, push_prev=True), Finish()],
}


@pytest.mark.parametrize("name", DEADLOCKS)
def test_deadlock_is_found_before_the_run(dev, name):
    """Validation finds a deadlock before Verilator runs: the functional error, verbatim."""
    insns = DEADLOCKS[name]
    expected = functional_error(insns)
    with pytest.raises(DeadlockError) as info:
        run_insns(dev, insns)
    assert type(info.value) is DeadlockError and str(info.value) == str(expected)
    assert info.value.waits == expected.waits


@pytest.mark.parametrize("name", DEADLOCKS)
def test_deadlock_raises_the_watchdog_with_the_functional_waits(dev, name):
    """Without validation (as for a program whose hardware misbehaves), the watchdog still
    turns the hang into the same report."""
    insns = DEADLOCKS[name]
    expected = functional_error(insns)
    with pytest.raises(WatchdogError) as info:
        run_insns(dev, insns, validate=False)
    error = info.value
    assert isinstance(error, DeadlockError) and error.stalled
    assert error.waits == expected.waits
    assert "watchdog" in str(error) and "deadlock" in str(error)
    assert error.cycles < 20_000   # found by the stall detector, not the budget
    # The device is usable afterwards: the accelerator was reset.
    assert run_insns(dev, [Finish()])["compute_insns"] == 1


def test_full_command_queue_deadlock_names_fetch():
    cfg = SMALL_QUEUES   # command queues of 8: twelve loads fill one
    insns = [inp_load(pop_next=True)] + [inp_load() for _ in range(12)] + [
        Gemm(push_prev=True), Finish()]
    with vdla.runtime.open(cfg, backend="functional", dram_size=1 << 20) as f:
        with pytest.raises(DeadlockError) as expected:
            f.run(*f.load_program(Program(insns, cfg)))
    with vdla.runtime.open(cfg, backend="verilator", dram_size=1 << 20) as d:
        with pytest.raises(DeadlockError) as found:
            d.run(*d.load_program(Program(insns, cfg)))
        assert str(found.value) == str(expected.value)
        with pytest.raises(WatchdogError) as info:
            d.run(*d.load_program(Program(insns, cfg)), validate=False)
    assert info.value.waits == expected.value.waits
    assert any(w.unit == "fetch" and w.reason == "space" for w in info.value.waits)


def test_cycle_budget(dev, monkeypatch):
    """A run that passes validation but is still moving when its budget runs out is
    stopped by the watchdog, saying what was executing, the budget and how to raise it.
    A budget below the program's own work is refused before the run."""
    a, b = gemm_operands(128, 128, 256, seed=9)
    with monkeypatch.context() as patch:
        patch.setattr(dev, "max_cycles", 2000)
        with pytest.raises(BudgetError, match=r"needs at least 20,480 cycles, past the "
                                              r"cycle budget of 2,000.*max_cycles="):
            blocked_gemm(dev, a, b, shift=8, virtual_threads=2)
        # 20,480 GEMM micro-ops is a lower bound; the run takes longer than that.
        patch.setattr(dev, "max_cycles", 20_481)
        with pytest.raises(WatchdogError) as info:
            blocked_gemm(dev, a, b, shift=8, virtual_threads=2)
    error = info.value
    assert not error.stalled and error.cycles >= 20_481
    assert "did not finish within" in str(error)
    assert "budget 20,481 cycles (the budget given); raise it with max_cycles=" in str(error)
    assert error.busy or error.waits
    out, _, _ = blocked_gemm(dev, a, b, shift=8, virtual_threads=2)   # usable again
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 8))


def test_max_cycles_must_be_positive(dev):
    with pytest.raises(ValueError, match="max_cycles must be a positive integer"):
        dev.run(*dev.load_program(Program([Finish()], CFG)), max_cycles=0)


@pytest.mark.parametrize("insns, needle", [
    ([inp_load(), Gemm()], "without a FINISH"),
    # Functionally the load runs first and leaves a token; on the hardware FINISH wins the
    # race with the load's DRAM read. Both are the same mistake: nothing orders the load.
    ([inp_load(push_next=True), Finish()], "tokens left|FINISH ran while"),
    ([Load(memory_type=MemoryType.INP, pop_prev=True), Finish()], "no previous module"),
], ids=["no finish", "tokens left", "bad flag"])
def test_invalid_programs_raise_what_the_functional_simulator_raises(dev, insns, needle):
    expected = functional_error(insns)
    with pytest.raises(ProgramError, match=needle) as info:
        run_insns(dev, insns)
    assert type(info.value) is type(expected)
    assert run_insns(dev, [Finish()])["compute_insns"] == 1


def test_dram_access_outside_dram_is_an_error(dev):
    elems = DRAM // CFG.inp_elem_bytes
    insns = [Load(memory_type=MemoryType.INP, dram_base=elems - 1, y_size=1, x_size=4,
                  x_stride=4), Finish()]
    with pytest.raises(ProgramError, match="past the end of DRAM"):
        run_insns(dev, insns)
    assert run_insns(dev, [Finish()])["compute_insns"] == 1


def test_instruction_address_is_checked(dev):
    with pytest.raises(ProgramError, match="not a multiple of 16"):
        dev.run(8, 1)
    with pytest.raises(ProgramError, match="not inside DRAM"):
        dev.run(DRAM - 16, 2)


# --- timeline and waveform --------------------------------------------------------------------

def test_timeline_shows_overlap_and_exports_a_trace(dev, tmp_path, monkeypatch):
    a, b = gemm_operands(64, 64, 256, seed=11)
    monkeypatch.setattr(dev, "run", functools.partial(dev.run, timeline=True))
    _, stats, program = blocked_gemm(dev, a, b, shift=8, virtual_threads=2)
    timeline = dev.timeline
    assert timeline.end_cycle >= stats["cycles"]
    # Each busy interval of a module is one of its instructions, in program order.
    loads = [i for i, insn in enumerate(program) if insn.module.value == "load"]
    intervals = timeline.intervals("load")
    assert len(intervals) == len(loads)
    assert intervals[0][2].startswith(f"{loads[0]}: LOAD")
    # Busy cycles agree with the hardware's counters to within the start/stop edges.
    for unit in ("load", "compute", "store"):
        assert abs(timeline.busy_cycles(unit) - stats[f"{unit}_busy"]) <= 2, unit
    assert timeline.overlap_cycles("load", "compute") > 0   # latency hiding, visibly
    timeline.save(tmp_path / "run.json")
    events = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "M"}


SMALL = vdla.HardwareConfig(block_in=8, block_out=8, uop_buff_size=4096, inp_buff_size=4096,
                            wgt_buff_size=16384, acc_buff_size=16384)


def test_vcd_waveform(tmp_path):
    wave = tmp_path / "run.vcd"
    a, b = gemm_operands(16, 16, 16)
    with vdla.runtime.open(SMALL, backend="verilator", dram_size=1 << 20, waveform=wave) as d:
        out, stats, _ = blocked_gemm(d, a, b, shift=4, virtual_threads=1)
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 4))
    text = wave.read_text()
    assert "$enddefinitions" in text and "m_axi__arvalid" in text
    # Two dumps per cycle (clock low and high), times 10 units a cycle.
    last = max(int(line[1:]) for line in text.splitlines() if line.startswith("#"))
    assert last >= 10 * stats["cycles"]


def test_waveform_name_must_give_the_format():
    with pytest.raises(ValueError, match=r"must end in \.vcd or \.fst"):
        vdla.runtime.open(SMALL, backend="verilator", dram_size=1 << 20, waveform="x.txt")


def test_state_bits_are_documented():
    bits = [bit for bit, _ in STATE_BITS.values()]
    assert len(set(bits)) == len(bits) and max(bits) < 32
    assert RunStatus.DONE == 0
