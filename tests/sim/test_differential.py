"""Differential tests: the functional simulator against a candidate backend.

Random valid programs (`program_gen`) on one and two virtual threads, the blocked GEMM
kernel and a deadlocking program run on a `DifferentialDevice`, which compares DRAM and
instruction counts after every run. `CANDIDATE` (set in `differential.py`, one line)
names the candidate backend: a second functional device stands in until it is switched
to "verilator". One candidate per config serves all tests of the module (a Verilator
model is built once per config); each test pairs it with a fresh functional reference,
which works because the generated programs read only SRAM they wrote and the pair frees
its DRAM when closed. Further tests check the generator (it covers what it claims, its
tokens order every hazard) and the checker itself.
"""

import collections
import dataclasses
import itertools

import numpy as np
import pytest

import vdla
from differential import (B2X8X32, CANDIDATE, DW, EXTENDED, SMALL_QUEUES, DifferentialDevice,
                          open_differential, pair_with)
from program_gen import DEADLOCK_WAITS, deadlock_program, random_program
from vdla.isa import DEP_FLAGS, Alu, Finish, Gemm, Load, MemoryType, Store
from vdla.runtime import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.kernels import GemmSchedule, blocked_gemm, blocked_gemm_reference
from vdla.sim import DeadlockError, SimError
from vdla.sim.functional import holds_operand

CONFIGS = {
    "default": vdla.HardwareConfig(),
    "b2x8x32": B2X8X32,
    "smallq": SMALL_QUEUES,
    "extended": EXTENDED,
}
#: Each extension past VTA alone, besides `EXTENDED` (all): slow, as `EXTENDED` runs the
#: same generator and hardware for all at once (a Verilator model to build each). The
#: depthwise window's is `DW`, with two inp rows a window column (EXTENDED' has one).
_VTA_OPS = EXTENDED.alu_ops - {vdla.AluOp.REQ, vdla.AluOp.TAB, vdla.AluOp.DIV}
SINGLE_EXTENSIONS = {
    "req": EXTENDED.replace(alu_ops=_VTA_OPS | {vdla.AluOp.REQ}, alu_hold=False, dw_taps=0),
    "tab": EXTENDED.replace(alu_ops=_VTA_OPS | {vdla.AluOp.TAB}, alu_hold=False, dw_taps=0),
    "div": EXTENDED.replace(alu_ops=_VTA_OPS | {vdla.AluOp.DIV}, alu_hold=False, dw_taps=0),
    "hold": EXTENDED.replace(alu_ops=_VTA_OPS, dw_taps=0),
    # The pipelined divider with the other extensions on: alu_hold's held DIVs among them.
    "divp": EXTENDED.replace(div_pipeline=True),
    "dw": DW,
}
ALL_CONFIGS = {**CONFIGS, **SINGLE_EXTENSIONS}
CONFIG_PARAMS = [pytest.param(name, marks=pytest.mark.slow) if name in SINGLE_EXTENSIONS
                 else name for name in ALL_CONFIGS]
DRAM_SIZE = 1 << 24
SEEDS = range(30)
COVERAGE_SEEDS = range(20)


@pytest.fixture(scope="module", params=CONFIG_PARAMS)
def candidate(request):
    """The candidate device of one config, shared by the module's tests."""
    with vdla.runtime.open(ALL_CONFIGS[request.param], backend=CANDIDATE,
                           dram_size=DRAM_SIZE) as d:
        yield d


@pytest.fixture
def dev(candidate):
    with pair_with(candidate) as d:
        yield d


def generate(dev, seed: int, threads: int):
    """The random program of (seed, threads): 3 to 8 tiles."""
    return random_program(dev, np.random.default_rng([seed, threads]), n_tiles=3 + seed % 6,
                          virtual_threads=threads)


@pytest.mark.parametrize("threads", [1, 2], ids=["1thread", "2threads"])
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_random_program(dev, seed, threads):
    generated = generate(dev, seed, threads)
    try:
        dev.run(*dev.load_program(generated.program))
    except (AssertionError, SimError) as exc:
        raise AssertionError(f"{generated.description}\n{exc}\nprogram:\n"
                             f"{generated.program.to_asm()}") from exc


@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_gemm(dev, threads):
    """The hand-written kernel with odd sizes, in several tiles on 1 and 2 threads."""
    c = dev.config
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, size=(48, 40), dtype=np.int8)
    b = rng.integers(-128, 128, size=(80, 40), dtype=np.int8)
    mb, nb = -(-48 // c.batch), -(-80 // c.block_out)
    schedule = GemmSchedule(tile_m=max(1, mb // 3), tile_n=max(1, nb // 2), virtual_threads=threads)
    out, _, _ = blocked_gemm(dev, a, b, shift=6, schedule=schedule)
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 6))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_deadlock_reports_the_same_waits(name):
    """Both backends report the deadlock with the same waits: the functional simulator
    raises DeadlockError, the candidate any SimError with `waits` (a watchdog's too).
    A pair of its own: a deadlocked candidate must not serve other tests."""
    with open_differential(CONFIGS[name], CANDIDATE, DRAM_SIZE) as dev:
        with pytest.raises(DeadlockError) as info:
            dev.run(*dev.load_program(deadlock_program(dev.config)))
        reference, candidate = dev.last_errors
        assert reference is info.value
        assert [(w.unit, w.insn_index, w.queue, w.reason) for w in reference.waits] == DEADLOCK_WAITS
        assert isinstance(candidate, SimError), candidate
        assert getattr(candidate, "waits", None) == reference.waits, str(candidate)


# --- the generator covers what it claims --------------------------------------------------------

def _extensions_used(program, config) -> set:
    """What a program exercises, read from its instructions."""
    bus = config.dram_bus_width // 8
    elem = {MemoryType.UOP: config.uop_bytes, MemoryType.INP: config.inp_elem_bytes,
            MemoryType.WGT: config.wgt_elem_bytes, MemoryType.ACC: config.acc_elem_bytes,
            MemoryType.OUT: config.out_elem_bytes, MemoryType.TAB: 4}
    seen = set()
    for insn in program:
        if isinstance(insn, (Load, Store)) and insn.x_size:
            mem = insn.memory_type.name
            seen.add(("dma", mem))
            seen.update(("pad", mem, pad) for pad in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")
                        if getattr(insn, pad))
            if insn.y_size > 1 and insn.x_stride > insn.x_size:
                seen.add(("strided", mem))
            if insn.dram_base * elem[insn.memory_type] % bus:
                seen.add(("inside a bus word", mem))
        elif isinstance(insn, Gemm) and insn.iter_out:
            kind = "gemm dw" if insn.dw else "gemm"
            seen.add((kind, "reset" if insn.reset_reg else "accumulate"))
            if insn.uop_end - insn.uop_bgn > 1 and insn.iter_out > 1 and insn.iter_in > 1:
                seen.add((f"{kind} nest", "reset" if insn.reset_reg else "accumulate"))
        elif isinstance(insn, Alu):
            seen.add(("alu", insn.alu_opcode.name, "imm" if insn.use_imm else "vector"))
            if holds_operand(insn, config) and insn.iter_out > 1 and insn.iter_in > 1:
                seen.add(("alu held", "row per outer iteration" if insn.src_factor_out
                          else "one row"))
            if insn.use_imm and insn.imm < 0:
                seen.add(("alu negative imm", insn.alu_opcode.name))
    if any(isinstance(i, Load) and i.memory_type == MemoryType.TAB and i.x_size
           and i.sram_base == 0 for i in program):
        seen.add(("table", "from entry 0"))
    return seen


def _expected_extensions(config) -> set:
    bus = config.dram_bus_width // 8
    table = vdla.AluOp.TAB in config.alu_ops
    mems = ("UOP", "INP", "WGT", "ACC", "OUT") + (("TAB",) if table else ())
    small = {"UOP": config.uop_bytes, "INP": config.inp_elem_bytes, "WGT": config.wgt_elem_bytes,
             "ACC": config.acc_elem_bytes, "OUT": config.out_elem_bytes, "TAB": 4}
    return ({("dma", m) for m in mems} | {("strided", m) for m in mems}
            | {("pad", m, pad) for m in ("INP", "WGT", "ACC")
               for pad in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")}
            | {("inside a bus word", m) for m in mems if small[m] < bus}
            | {("gemm", kind) for kind in ("reset", "accumulate")}
            | {("gemm nest", kind) for kind in ("reset", "accumulate")}
            | {("alu", op.name, kind) for op in config.alu_ops for kind in ("imm", "vector")}
            | {("alu negative imm", op.name) for op in config.alu_ops}
            | ({("alu held", "row per outer iteration"), ("alu held", "one row")}
               if config.alu_hold else set())
            | ({(kind, k) for kind in ("gemm dw", "gemm dw nest") for k in ("reset", "accumulate")}
               if config.dw_taps else set())
            | ({("table", "from entry 0")} if table else set()))


def _tiles_ahead(program) -> int:
    """How many tiles the load module can load before its first WAR wait (a pop of
    compute->load): the load->compute tokens it pushes until then."""
    ahead = 0
    for insn in program:
        if insn.module == LOAD:
            if insn.pop_next:
                break
            ahead += insn.push_next
    return ahead


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generator_coverage(name):
    """Over the first seeds of each thread count the random programs use every padding,
    strides, DRAM bases inside bus words, both GEMM kinds with nested loops of several
    micro-ops (and both with the depthwise window, where the config has it), every ALU
    op with both operands and negative immediates (TAB too, where the config has it,
    after strided LOADs of TAB, the table filled from entry 0); their stores
    change the outputs; two-thread programs use both halves of the buffers and let loads
    run a tile ahead of compute."""
    config = CONFIGS[name]
    seen = set()
    for threads in (1, 2):
        for seed in COVERAGE_SEEDS:
            with vdla.runtime.open(config, dram_size=DRAM_SIZE) as dev:
                generated = generate(dev, seed, threads)
                before = [dev.read(addr, n) for addr, n in generated.outputs]
                dev.run(*dev.load_program(generated.program))
                after = [dev.read(addr, n) for addr, n in generated.outputs]
            assert generated.outputs and all((x != y).any() for x, y in zip(before, after))
            assert _tiles_ahead(generated.program) == threads
            halves = {insn.sram_base >= config.inp_depth // 2 for insn in generated.program
                      if isinstance(insn, Load) and insn.memory_type == MemoryType.INP}
            assert halves == {False, True} or threads == 1
            seen |= _extensions_used(generated.program, config)
    assert _expected_extensions(config) - seen == set()


_NEIGHBOURS = {LOAD: {"prev": None, "next": COMPUTE}, COMPUTE: {"prev": LOAD, "next": STORE},
               STORE: {"prev": COMPUTE, "next": None}}


def _run_by_priority(config, dram, program, priority):
    """Run `program` one instruction at a time, always on the first module in `priority`
    whose next instruction's tokens are there (command and token queues unbounded: every
    order the hardware may take is among these schedules' freedoms)."""
    sim = vdla.sim.FunctionalSimulator(config, dram)
    pending = {module: [insn for insn in program if insn.module == module] for module in priority}
    tokens = collections.Counter()

    def queue(module, flag):
        other = _NEIGHBOURS[module][flag.split("_")[1]]
        ends = (module, other) if flag.startswith("push") else (other, module)
        return f"{ends[0].value}->{ends[1].value}"

    while any(pending.values()):
        module = next(m for m in priority if pending[m] and all(
            tokens[queue(m, flag)] for flag in ("pop_prev", "pop_next") if getattr(pending[m][0], flag)))
        insn = pending[module].pop(0)
        for flag in DEP_FLAGS:
            if getattr(insn, flag):
                tokens[queue(module, flag)] += 1 if flag.startswith("push") else -1
        bare = dataclasses.replace(insn, **dict.fromkeys(DEP_FLAGS, False))
        if isinstance(bare, Store):  # FINISH must wait for it
            sim.run([dataclasses.replace(bare, push_prev=True), Finish(pop_next=True)])
        elif not isinstance(bare, Finish):
            sim.run([bare, Finish()])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generator_tokens_order_every_hazard(name):
    """The functional simulator runs modules in one fixed order, so it cannot show a
    missing token; here every strict module priority (load first lets loads run as far
    ahead as the tokens allow, store last lets compute overwrite out before the store,
    ...) must give the same outputs."""
    config = CONFIGS[name]
    for threads in (1, 2):
        for seed in range(8):
            with vdla.runtime.open(config, dram_size=DRAM_SIZE) as dev:
                generated = generate(dev, seed, threads)
                start = dev.dram.copy()
                dev.run(*dev.load_program(generated.program))
                for priority in itertools.permutations((LOAD, COMPUTE, STORE)):
                    dram = start.copy()
                    _run_by_priority(config, dram, generated.program, priority)
                    for addr, n in generated.outputs:
                        np.testing.assert_array_equal(
                            dram[addr:addr + n], dev.dram[addr:addr + n],
                            err_msg=f"{threads} thread(s), seed {seed}, priority {priority}")


# --- the checker itself ----------------------------------------------------------------------------

def test_differential_device_reports_dram_differences():
    with open_differential(CONFIGS["default"]) as dev:
        addr = dev.alloc(100)
        dev.write(addr, np.arange(100, dtype=np.uint8))
        dev.candidate.write(addr + 10, np.array([7, 7, 7], np.uint8))
        message = (rf"allocation {addr:#x}: 3 of 100 bytes differ, the first at offset 10 "
                   r".*reference has \[10, 11, 12\], the candidate \[7, 7, 7\]")
        with pytest.raises(AssertionError, match=message):
            dev.read(addr, 100)
        with pytest.raises(AssertionError, match="DRAM differs after the run in 1 of 2 allocations"):
            dev.run(*dev.load_program(ProgramBuilder(dev.config).finish()))


def test_differential_device_reports_one_sided_errors():
    with open_differential(CONFIGS["default"]) as dev:
        addr, count = dev.load_program(deadlock_program(dev.config))
        # The candidate gets a program of the same length that completes.
        p = ProgramBuilder(dev.config)
        p.nop(LOAD)
        p.dep_push(LOAD, COMPUTE)
        p.dep_pop(LOAD, COMPUTE)
        p.nop(COMPUTE)
        p.nop(COMPUTE)
        dev.candidate.write(addr, p.finish().to_bytes())
        with pytest.raises(AssertionError, match=r"the reference \(functional\) raised "
                           r"DeadlockError: .*the candidate \(functional\) ran the program"):
            dev.run(addr, count)
        assert isinstance(dev.last_errors[0], DeadlockError) and dev.last_errors[1] is None


def test_differential_device_checks_allocations_and_configs():
    with open_differential(CONFIGS["default"]) as dev:
        dev.candidate.alloc(16)  # the candidate's allocator is ahead
        with pytest.raises(AssertionError, match="returned 0x100 on the reference and 0x200"):
            dev.alloc(16)
        assert dev.allocations == {}
    with pytest.raises(ValueError, match="the reference has config"):
        DifferentialDevice(vdla.runtime.open(CONFIGS["default"], dram_size=1 << 16),
                           vdla.runtime.open(CONFIGS["smallq"], dram_size=1 << 16))
