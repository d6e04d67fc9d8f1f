"""Fuzzing the simulators with random decodable programs: the functional model and the
Verilated hardware must agree on every one.

Each example is a random program (instructions with every field drawn from the ISA's
own field widths, biased towards small values so that some programs are valid) over a
random DRAM image (so the micro-ops a program loads are random too). Two kinds:

- *random* flags: mostly programs that deadlock, leave tokens, set flags the module
  cannot have, or finish before their work;
- *serial*: dependency tokens chain every instruction to the next (a no-op GEMM relays
  between load and store), so most of these run, and the interesting failures are the
  indices, addresses and loop extents.

The oracle: both backends reject a program with the same error (type and message, since
both validate first), or both run it to the same DRAM image and instruction counts. Only
programs whose outcome cannot depend on timing are run on Verilator: every pair of
instructions of different modules that touch the same SRAM or DRAM bytes (one writing)
must be ordered by tokens, and every instruction must be ordered before FINISH (`_racy`);
other valid programs run on a scratch functional simulator only, where they must not
raise anything but a `SimError`. The two long-lived simulators run the same sequence of
programs, so their SRAMs stay in step.

A fixed seed and example budget keep CI time bounded; the counts go to the fuzz summary.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import vdla
from fuzzing import count, fuzz_settings
from vdla.isa import Alu, Finish, Gemm, Load, MemoryType, Module, Program, Store
from vdla.isa.layout import layouts_for
from vdla.sim import FunctionalSimulator, SimError
from vdla.sim.protocol import route_program

CFG = vdla.HardwareConfig()
DRAM_SIZE = 1 << 17
INSN_ADDR = 0x18000          # the program sits above the random image
IMAGE_BYTES = INSN_ADDR
MAX_CYCLES = 400_000         # both backends' budget: longer loop nests are refused
VERILATOR_ESTIMATE = 50_000  # programs estimated longer run on the functional model only
EXAMPLES = 500

LAYOUT = layouts_for(CFG)
FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")
#: The token queues each module has (a flag naming another is an error).
VALID_FLAGS = {Module.LOAD: ("pop_next", "push_next"), Module.COMPUTE: FLAGS,
               Module.STORE: ("pop_prev", "push_prev")}


def _value(width: int) -> st.SearchStrategy[int]:
    """A field value: mostly small (valid-looking), one in ten anything the field holds
    (an instruction has a dozen fields: more would make nearly every program invalid)."""
    top = (1 << width) - 1
    return st.integers(0, 19).flatmap(
        lambda k: st.integers(0, min(top, 4)) if k < 9 else
        st.integers(0, min(top, 40)) if k < 18 else st.integers(0, top))


def _fields(kind: str, names) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({n: _value(LAYOUT[kind].fields[n][1]) for n in names})


_MEM = ("sram_base", "dram_base", "y_size", "x_size", "x_stride")
_PADS = ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")
_LOOP = ("uop_bgn", "uop_end", "iter_out", "iter_in", "dst_factor_out", "dst_factor_in",
         "src_factor_out", "src_factor_in")


@st.composite
def _insn(draw):
    kind = draw(st.sampled_from(("load", "load", "store", "gemm", "alu")))
    if kind == "load":
        mem = draw(st.sampled_from((MemoryType.UOP, MemoryType.INP, MemoryType.WGT,
                                    MemoryType.ACC)))
        fields = draw(_fields("LOAD", _MEM + _PADS))
        if mem == MemoryType.UOP and draw(st.booleans()):
            fields.update(dict.fromkeys(_PADS, 0))   # padded uop loads are invalid
        return Load(memory_type=mem, **fields)
    if kind == "store":
        return Store(**draw(_fields("STORE", _MEM)))
    if kind == "gemm":
        return _uop_range(draw, Gemm(reset_reg=draw(st.booleans()), **draw(
            _fields("GEMM", _LOOP + ("wgt_factor_out", "wgt_factor_in")))))
    op = draw(st.sampled_from(sorted(CFG.alu_ops)))  # others do not decode on CFG
    imm = draw(st.integers(-(1 << 15), (1 << 15) - 1))
    return _uop_range(draw, Alu(alu_opcode=op, use_imm=draw(st.booleans()),
                                reset_reg=draw(st.booleans()), imm=imm,
                                **draw(_fields("ALU", _LOOP))))


def _uop_range(draw, insn):
    """Mostly a forward micro-op range of a few micro-ops (independent draws of both ends
    are backwards half the time)."""
    if draw(st.integers(0, 4)):
        end = min(insn.uop_bgn + draw(st.integers(0, 6)), CFG.uop_depth)
        insn = type(insn)(**{**insn.fields(), "uop_end": end})
    return insn


def _with_flags(insn, flags):
    return type(insn)(**{**insn.fields(), **dict.fromkeys(FLAGS, False), **flags})


@st.composite
def _random_program(draw):
    """Random flags: a valid module's flag 30% of the time, any flag now and then."""
    program = []
    for insn in draw(st.lists(_insn(), min_size=0, max_size=8)):
        flags = {f: draw(st.integers(0, 9)) < 3 for f in VALID_FLAGS[insn.module]}
        if draw(st.integers(0, 29)) == 0:
            flags[draw(st.sampled_from(FLAGS))] = True
        program.append(_with_flags(insn, flags))
    finish = {f: draw(st.booleans()) for f in ("pop_prev", "pop_next")}
    return program + [Finish(**finish)]


_RELAY = Gemm()  # a compute no-op that passes a token between load and store
_QUEUE_FLAGS = {  # (from module, to module) -> (the sender's push flag, the receiver's pop flag)
    (Module.LOAD, Module.COMPUTE): ("push_next", "pop_prev"),
    (Module.COMPUTE, Module.LOAD): ("push_prev", "pop_next"),
    (Module.COMPUTE, Module.STORE): ("push_next", "pop_prev"),
    (Module.STORE, Module.COMPUTE): ("push_prev", "pop_next"),
}


#: A STORE of the first out-buffer elements to DRAM, so that what GEMMs and ALUs
#: computed shows in the image the backends are compared on.
_DUMP = Store(sram_base=0, dram_base=0x1700, y_size=4, x_size=16, x_stride=16)  # above the loads


@st.composite
def _serial_program(draw):
    """Every instruction ordered after the previous one by a token (relayed through a
    compute no-op between load and store), ending in FINISH after the last, often with a
    dump of the out buffer before it; a flag is dropped now and then, so near-valid
    programs come too."""
    chain = []
    body = draw(st.lists(_insn(), min_size=1, max_size=8))
    if draw(st.booleans()):
        body.append(_DUMP)
    for insn in body + [Finish()]:
        if chain and {chain[-1].module, insn.module} == {Module.LOAD, Module.STORE}:
            chain.append(_RELAY)
        chain.append(insn)
    flags = [dict() for _ in chain]
    for i in range(1, len(chain)):
        a, b = chain[i - 1].module, chain[i].module
        if a != b:
            push, pop = _QUEUE_FLAGS[(a, b)]
            flags[i - 1][push] = True
            flags[i][pop] = True
    if draw(st.integers(0, 9)) == 0:
        i = draw(st.integers(0, len(chain) - 1))
        if flags[i]:
            del flags[i][draw(st.sampled_from(sorted(flags[i])))]
    return [_with_flags(insn, f) for insn, f in zip(chain, flags)]


# --- which programs' outcome cannot depend on timing ------------------------------------------

def _ordered(insns) -> np.ndarray:
    """before[a, b]: instruction a completes before b starts, by program order within a
    module and by tokens (the k-th pop of a queue waits for its k-th push)."""
    n = len(insns)
    routes = route_program(insns)
    before = np.zeros((n, n), dtype=bool)
    last = {}
    pushes = {}
    for i, (module, pops, push_queues) in enumerate(routes):
        if module in last:
            before[last[module], i] = True
        last[module] = i
        for q in push_queues:
            pushes.setdefault(q, []).append(i)
    popped = {}
    for i, (_, pops, _) in enumerate(routes):
        for q in pops:
            k = popped.get(q, 0)
            popped[q] = k + 1
            if k < len(pushes.get(q, ())):
                before[pushes[q][k], i] = True
    for k in range(n):   # transitive closure
        before |= before[:, [k]] & before[[k], :]
    return before


def _accesses(insn) -> list[tuple[str, int, int, bool]]:
    """(space, begin, end, writes) of what an instruction touches across modules: SRAMs
    the other modules share (inp and wgt with load, out with store), DRAM bytes. Whole
    buffers where the micro-ops decide."""
    c = CFG
    if isinstance(insn, Load):
        if not insn.x_size:
            return []
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        elem = {MemoryType.UOP: c.uop_bytes, MemoryType.INP: c.inp_elem_bytes,
                MemoryType.WGT: c.wgt_elem_bytes, MemoryType.ACC: c.acc_elem_bytes}
        out = [(insn.memory_type.name, insn.sram_base, insn.sram_base + rows * width, True)]
        if insn.y_size:
            e = elem[insn.memory_type]
            last = insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size
            out.append(("DRAM", insn.dram_base * e, last * e, False))
        return out
    if isinstance(insn, Store):
        if not (insn.x_size and insn.y_size):
            return []
        last = insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size
        return [("OUT", insn.sram_base, insn.sram_base + insn.y_size * insn.x_size, False),
                ("DRAM", insn.dram_base * c.out_elem_bytes, last * c.out_elem_bytes, True)]
    if isinstance(insn, (Gemm, Alu)) and insn.iter_out and insn.iter_in and \
            insn.uop_end > insn.uop_bgn:
        out = [("OUT", 0, c.out_depth, True)]
        if isinstance(insn, Gemm) and not insn.reset_reg:
            out += [("INP", 0, c.inp_depth, False), ("WGT", 0, c.wgt_depth, False)]
        return out
    return []


def _racy(insns) -> bool:
    before = _ordered(insns)
    finish = next(i for i, insn in enumerate(insns) if isinstance(insn, Finish))
    if not all(before[i, finish] for i in range(len(insns)) if i != finish):
        return True
    modules = [insn.module for insn in insns]
    touched = [_accesses(insn) for insn in insns]
    for a in range(len(insns)):
        for b in range(a + 1, len(insns)):
            if modules[a] == modules[b] or before[a, b] or before[b, a]:
                continue
            for space, a0, a1, aw in touched[a]:
                for other, b0, b1, bw in touched[b]:
                    if space == other and (aw or bw) and a0 < b1 and b0 < a1:
                        return True
    return False


def _image(seed: int) -> np.ndarray:
    """Random DRAM bytes where half the 32-bit words are micro-ops with small indices
    (dst, src, wgt < 16), so that the micro-ops a program loads often stay in range and
    write where the dump reads."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, IMAGE_BYTES // 4, dtype=np.uint64)
    small = rng.integers(0, 16, (len(words), 3)).astype(np.uint64)
    uops = small[:, 0] | small[:, 1] << CFG.uop_dst_bits | small[:, 2] << (
        CFG.uop_dst_bits + CFG.uop_src_bits)
    words = np.where(rng.random(len(words)) < 0.5, uops, words)
    return words.astype("<u4").view(np.uint8)


# --- the fuzz test ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def simulators():
    from vdla.sim.verilator import VerilatorSimulator  # heavy: builds or loads the model
    functional = FunctionalSimulator(CFG, np.zeros(DRAM_SIZE, np.uint8))
    verilator = VerilatorSimulator(CFG, DRAM_SIZE, log=lambda message: None)
    yield functional, verilator
    verilator.close()


def _outcome(sim, insns, n):
    try:
        stats = sim.run_from_dram(INSN_ADDR, n, max_cycles=MAX_CYCLES)
    except SimError as exc:
        return exc
    return stats


@fuzz_settings(examples=EXAMPLES, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(program=st.one_of(_random_program(), _serial_program(), _serial_program()),
       seed=st.integers(0, 2**32 - 1))
def test_random_programs_agree_on_both_simulators(simulators, program, seed):
    functional, verilator = simulators
    image = _image(seed)
    stream = np.frombuffer(Program(program, CFG).to_bytes(), np.uint8)
    for dram in (functional.dram, verilator.dram):
        dram[:] = 0
        dram[:IMAGE_BYTES] = image
        dram[INSN_ADDR:INSN_ADDR + len(stream)] = stream
    # What validation says, without touching either simulator's state.
    try:
        plan = copy.deepcopy(functional.validator).validate(
            program, functional.dram, insn_addr=INSN_ADDR, max_cycles=MAX_CYCLES)
    except SimError as exc:
        plan, expected = None, exc
    count("programs (functional)")
    if plan is None:
        got = _outcome(functional, program, len(program))
        assert type(got) is type(expected) and str(got) == str(expected)
        start = time.perf_counter()
        on_hw = _outcome(verilator, program, len(program))
        assert time.perf_counter() - start < 10
        count("programs (verilator)")
        assert type(on_hw) is type(expected), (program, on_hw, expected)
        assert str(on_hw) == str(expected)
        return
    if _racy(program) or plan.estimate > VERILATOR_ESTIMATE:
        # Timing-dependent (or long): the functional model alone, on a scratch copy.
        scratch = FunctionalSimulator(CFG, functional.dram.copy())
        scratch.run_from_dram(INSN_ADDR, len(program), max_cycles=MAX_CYCLES)
        return
    want = functional.run_from_dram(INSN_ADDR, len(program), max_cycles=MAX_CYCLES)
    got = verilator.run_from_dram(INSN_ADDR, len(program), max_cycles=MAX_CYCLES)
    count("programs (verilator)")
    for key in ("load_insns", "compute_insns", "store_insns"):
        assert got[key] == want.get(key, 0), (key, program)
    differ = np.flatnonzero(functional.dram != verilator.dram)
    assert not len(differ), (f"{len(differ)} DRAM bytes differ, first at {differ[0]:#x}",
                             program)

