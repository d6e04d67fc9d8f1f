"""The board runtime (`vdla.deploy.board_device.BoardDevice`) on the Verilator model of the same
Verilog: its register protocol made on the RTL's AXI4-Lite port (`board_shim`), its
results and counters against the Verilator backend's, its errors."""

import dataclasses
import json

import numpy as np
import pytest

import vdla
from board_shim import VerilatorInterrupt, VerilatorMemory, VerilatorMmio
from program_gen import random_program
from vdla.boards import BOARDS
from vdla.compiler import pipeline
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.isa import Finish, Gemm, Load, MemoryType, Program
from vdla.isa.registers import COUNTERS, CTRL_START, REGISTERS, STATUS_DONE
from vdla.runtime import STAT_KEYS
from vdla.deploy.board.hardware import (BoardError, BoardTimeout, RegisterLog, bitstream_config,
                                        bitstream_mismatch, decode_state)
from vdla.deploy.board_device import BoardDevice
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference
from vdla.sim import DeadlockError, ProgramError
from vdla.sim.verilator import VerilatorSimulator

CFG = vdla.HardwareConfig()
DRAM = 64 << 20
#: The DMA region's physical address in the shim: not 0, so that the runtime's bus
#: addresses (region + offset) are tested as a board's are.
BASE = 1 << 20


@pytest.fixture(scope="module")
def sim():
    simulator = VerilatorSimulator(CFG, DRAM, log=lambda message: None)
    yield simulator
    simulator.close()


def board(sim, **options) -> BoardDevice:
    return BoardDevice(CFG, mmio=RegisterLog(VerilatorMmio(sim.model)),
                       memory=VerilatorMemory(sim.model, base=BASE), **options)


def runs(accesses) -> list[list]:
    """The register accesses of each run: from the INSN_ADDR write on."""
    found = []
    for access in accesses:
        if access[:2] == ("w", "INSN_ADDR"):
            found.append([])
        if found:
            found[-1].append(access)
    return found


def check_protocol(run) -> None:
    """One run's accesses as docs/boards.md gives them: INSN_ADDR, INSN_COUNT, CTRL =
    START; CTRL read until DONE; every counter's low and high word in the map's order."""
    assert [x[:2] for x in run[:3]] == [("w", "INSN_ADDR"), ("w", "INSN_COUNT"),
                                        ("w", "CTRL")]
    assert run[0][2] > BASE and run[2][2] == CTRL_START
    polls = [x for x in run[3:] if x[1] == "CTRL"]
    assert all(x[0] == "r" for x in polls) and polls[-1][2] & STATUS_DONE
    assert not any(p[2] & STATUS_DONE for p in polls[:-1])
    reads = run[3 + len(polls):]
    assert [x[:2] for x in reads] == [("r", f"{name.upper()}_{half}") for name in COUNTERS
                                      for half in ("LO", "HI")]


def test_the_protocol_of_a_run(sim):
    """ID and VERSION once at open, then each run as `check_protocol` says."""
    dev = board(sim)
    log = dev.mmio.accesses
    assert [a[:2] for a in log] == [("r", "ID"), ("r", "VERSION")]
    a, b = (np.arange(256, dtype=np.int64).reshape(16, 16).astype(np.int8) for _ in range(2))
    blocked_gemm(dev, a, b)
    (run,) = runs(log)
    check_protocol(run)


def test_a_gemm_on_the_board_matches_the_verilator_backend(sim):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, size=(48, 64), dtype=np.int8)
    b = rng.integers(-128, 128, size=(32, 64), dtype=np.int8)
    dev = board(sim)
    out, stats, _ = blocked_gemm(dev, a, b, shift=6)
    assert np.array_equal(out, blocked_gemm_reference(a, b, 6))
    assert tuple(stats)[:len(STAT_KEYS)] == STAT_KEYS
    with vdla.runtime.open(CFG, backend="verilator", dram_size=DRAM) as ref:
        want, want_stats, _ = blocked_gemm(ref, a, b, shift=6)
    assert np.array_equal(out, want)
    assert {k: v for k, v in stats.items() if k != "wall_seconds"} == \
        {k: v for k, v in want_stats.items() if k != "wall_seconds"}
    # The host flushed what it wrote and invalidated before reading the results back.
    kinds = {kind for kind, _, _ in dev.memory.syncs}
    assert kinds == {"flush", "invalidate"}


@pytest.mark.parametrize("model", ["small_cnn", "resnet18", "mobilenet_v1"])
def test_a_model_through_the_board_is_bit_exact_in_the_same_cycles(sim, model):
    """The zoo's models through the board runtime on the shim: outputs bit-exact, cycles
    those of ``vdla run --sim verilator``, every run by the protocol (about 15 s for
    ResNet-18, both ways)."""
    target = VdlaTarget(CFG, backend="verilator")
    dev = board(sim)
    on_board = pipeline.run_model(model, target, device=dev)
    assert on_board.bit_exact, on_board.mismatch
    reference = pipeline.run_model(model, target)
    assert on_board.result.cycles == reference.result.cycles
    done = runs(dev.mmio.accesses)
    assert done
    for run in done:
        check_protocol(run)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("threads", [1, 2])
def test_random_programs_through_the_board_match_the_verilator_backend(sim, seed, threads):
    """`program_gen`'s random programs (every load shape, GEMM and ALU form, one and two
    virtual threads) built and run through the board runtime at bus addresses, against
    the same program built at a simulator's: the stores' bytes and every counter alike,
    each run by the protocol."""
    dev = board(sim)
    ran = {}
    with vdla.runtime.open(CFG, backend="verilator", dram_size=DRAM) as verilator:
        for name, device in (("board", dev), ("verilator", verilator)):
            generated = random_program(device, np.random.default_rng([seed, threads, 41]),
                                       virtual_threads=threads)
            addr, count = device.load_program(generated.program)
            stats = device.run(addr, count)
            ran[name] = ([device.read(a, n) for a, n in generated.outputs],
                         {k: v for k, v in stats.items() if k != "wall_seconds"})
    (board_out, board_stats), (want_out, want_stats) = ran["board"], ran["verilator"]
    assert len(board_out) == len(want_out) > 0
    assert all(np.array_equal(a, b) for a, b in zip(board_out, want_out))
    assert board_stats == want_stats
    (run,) = runs(dev.mmio.accesses)
    check_protocol(run)


def test_completion_by_interrupt(sim):
    """With the done interrupt (the model's irq port as the line), a run reads CTRL once,
    after the interrupt, and gives the polled run's outputs and counters; a model runs
    bit-exact in the same cycles."""
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, size=(32, 64), dtype=np.int8)
    b = rng.integers(-128, 128, size=(48, 64), dtype=np.int8)
    polled = board(sim)
    want, want_stats, _ = blocked_gemm(polled, a, b, shift=5)
    line = VerilatorInterrupt(sim.model)
    dev = board(sim, interrupt=line)
    out, stats, _ = blocked_gemm(dev, a, b, shift=5)
    assert np.array_equal(out, want) and line.armed == 1
    assert {k: v for k, v in stats.items() if k != "wall_seconds"} == \
        {k: v for k, v in want_stats.items() if k != "wall_seconds"}
    (run,) = runs(dev.mmio.accesses)
    check_protocol(run)
    assert [x[:2] for x in run[3:5]] == [("r", "CTRL"), ("r", "CYCLES_LO")]
    target = VdlaTarget(CFG, backend="verilator")
    on_board = pipeline.run_model("small_cnn", target,
                                  device=board(sim, interrupt=VerilatorInterrupt(sim.model)))
    assert on_board.bit_exact
    assert on_board.result.cycles == pipeline.run_model("small_cnn", target).result.cycles


def test_a_hang_with_the_interrupt_ends_in_the_timeout(sim):
    dev = board(sim, timeout=0.3, interrupt=VerilatorInterrupt(sim.model))
    at = dev.alloc(CFG.inp_elem_bytes) // CFG.inp_elem_bytes
    insns = [Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1, dram_base=at),
             Gemm(pop_prev=True), Finish()]
    addr, count = dev.load_program(Program(insns, CFG))
    with pytest.raises(BoardTimeout, match="wait_token_load_compute"):
        dev.run(addr, count, validate=False)
    sim.model.reset()


def test_a_hang_ends_in_the_timeout_with_the_state_decoded(sim):
    """A compute instruction waits for a token no load pushes: unchecked (validate
    False), the run never finishes, and the timeout names what each unit waits on."""
    dev = board(sim, timeout=0.3)
    at = dev.alloc(CFG.inp_elem_bytes) // CFG.inp_elem_bytes
    insns = [Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1, dram_base=at),
             Gemm(pop_prev=True), Finish()]
    addr, count = dev.load_program(Program(insns, CFG))
    with pytest.raises(BoardTimeout) as info:
        dev.run(addr, count, validate=False)
    message = str(info.value)
    assert "did not finish in 0.3 s" in message and "wait_token_load_compute" in message
    assert info.value.state and info.value.counters["cycles"] > 0
    assert decode_state(info.value.state) in message
    sim.model.reset()
    # Validated, the same program is refused before it starts.
    with pytest.raises(DeadlockError, match="token"):
        dev.run(addr, count)
    # Below the region: refused by the same checks, naming the region.
    low = [Load(memory_type=MemoryType.INP, y_size=1, x_size=1, x_stride=1), Finish()]
    with pytest.raises(ProgramError, match="below the DRAM the device holds"):
        dev.run(*dev.load_program(Program(low, CFG)))


def test_a_window_that_is_not_the_accelerator_is_refused(sim):
    class Elsewhere(VerilatorMmio):       # a window of some other peripheral
        def read(self, offset):
            return 0xDEADBEEF if offset == REGISTERS["ID"][0] else super().read(offset)

    with pytest.raises(BoardError, match="reads ID 0xdeadbeef, not a vdla"):
        BoardDevice(CFG, mmio=Elsewhere(sim.model), memory=VerilatorMemory(sim.model, BASE))

    class OldMap(VerilatorMmio):
        def read(self, offset):
            return 1 if offset == REGISTERS["VERSION"][0] else super().read(offset)

    with pytest.raises(BoardError, match="register map is version 1"):
        BoardDevice(CFG, mmio=OldMap(sim.model), memory=VerilatorMemory(sim.model, BASE))


def test_addresses_are_the_regions_and_checked(sim):
    dev = board(sim)
    addr = dev.alloc(100)
    assert addr > BASE and addr % vdla.runtime.dram_alignment(CFG) == 0
    dev.write(addr, np.arange(100, dtype=np.uint8))
    assert np.array_equal(dev.read(addr, 100), np.arange(100, dtype=np.uint8))
    assert np.array_equal(sim.model.dram[addr:addr + 100], np.arange(100, dtype=np.uint8))
    with pytest.raises(ValueError, match="not inside one allocated DRAM block"):
        dev.read(BASE - 64, 16)
    with pytest.raises(ProgramError, match="not inside DRAM"):
        dev.run(BASE + DRAM, 1)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        board(sim, timeout=0)


def test_a_mismatched_bitstream_is_refused(sim, tmp_path):
    """A model compiled for another block size, or for a feature the bitstream lacks,
    is refused before anything runs: at open against the bitstream's manifest, and at
    load (`program_mismatch`) on a board opened for another config."""
    wide = dataclasses.replace(CFG, block_in=32, block_out=32)
    held = dataclasses.replace(CFG, alu_hold=True)
    text = bitstream_mismatch(CFG, wide)
    assert "block_in (bitstream 16, model 32)" in text and "block_out" in text
    text = bitstream_mismatch(CFG, held)
    assert "the model needs extension(s) hold (alu_hold), which the bitstream lacks" in text
    assert bitstream_mismatch(CFG, CFG) == ""
    # The manifest vdla verilog --board writes, against the config a model asks for.
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"config": CFG.to_dict()}))
    assert bitstream_config(manifest) == CFG
    with pytest.raises(BoardError, match="needs extension"):
        BOARDS["pynq-z1"].open_hardware(held, manifest=manifest)
    # A board with no processor for the runtime: refused before any device is touched.
    assert BOARDS["pynq-z1"].runs_runtime and not BOARDS["de10-nano"].runs_runtime
    with pytest.raises(BoardError, match=r"board de10-nano \(cyclone-v\): the board "
                                         r"runtime runs on a Zynq's Linux"):
        BOARDS["de10-nano"].open_hardware()
    # On a board of CFG, a program encoded for the wider core does not load.
    dev = board(sim)
    with pytest.raises(ValueError, match="program is encoded for config .*block_in"):
        dev.load_program(Program([Finish()], wide))
