"""`Device.load_program` refuses a program the device would not run as written: encoded
for another config (naming the extensions the device lacks and the instructions that use
them), or holding an ALU op the device's ALU does not have. Nothing is written then. On
a device of the program's own config it loads and runs (the ISA page's REQ example)."""

import re

import numpy as np
import pytest

import vdla
from vdla.config import AluOp, HardwareConfig
from vdla.isa import Alu, Gemm, MemoryType, Program, Uop, encode_uops
from vdla.runtime import COMPUTE, STORE, ProgramBuilder
from vdla.runtime.device import program_mismatch

DEFAULT = HardwareConfig()
PLUS = DEFAULT.replace(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ"}, alu_hold=True)
HOLD = DEFAULT.replace(alu_hold=True)
DW3 = DEFAULT.replace(dw_taps=3)


def _req_program(config: HardwareConfig, count: int = 1) -> Program:
    """A GEMM reset, then `count` REQ instructions (shift 2, lo -3 = 0xFD: the
    16-bit immediate 0xFD02, negative)."""
    p = ProgramBuilder(config)
    p.gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1)
    for _ in range(count):
        p.append(Alu(alu_opcode=AluOp.REQ, use_imm=True, imm=0xFD02 - (1 << 16),
                     uop_bgn=0, uop_end=1, iter_out=1, iter_in=1))
    return p.finish()


@pytest.fixture
def default_dev():
    with vdla.runtime.open(DEFAULT, dram_size=1 << 20) as d:
        yield d


def test_a_program_for_a_config_with_extensions_names_those_the_device_lacks(default_dev):
    program = _req_program(PLUS, count=5)
    in_use = default_dev.allocator.bytes_in_use
    with pytest.raises(ValueError) as exc:
        default_dev.load_program(program)
    message = str(exc.value)
    assert message.startswith(f"program is encoded for config {PLUS.name}, the device has "
                              f"{DEFAULT.name}; the program needs extension(s) req (the ALU's "
                              f"REQ), hold (alu_hold), which config {DEFAULT.name} lacks")
    # The REQ instructions by index: the GEMM is instruction 0.
    assert "(it uses REQ at instruction(s) 1, 2, 3 and 2 more)" in message
    assert default_dev.allocator.bytes_in_use == in_use      # nothing written


def test_an_extension_without_an_instruction_is_named_too(default_dev):
    """alu_hold changes no encoding, only what a program means: still refused."""
    p = ProgramBuilder(HOLD)
    p.alu(AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=1, iter_in=4, dst_factor_in=1)
    with pytest.raises(ValueError, match=re.escape(
            "the program needs extension(s) hold (alu_hold), which config "
            f"{DEFAULT.name} lacks")) as exc:
        default_dev.load_program(p.finish())
    assert "instruction" not in str(exc.value)


def test_a_device_with_more_extensions_names_them():
    with vdla.runtime.open(PLUS, dram_size=1 << 20) as dev:
        with pytest.raises(ValueError, match=re.escape(
                f"config {PLUS.name} has extension(s) req, hold, which the program's config "
                "lacks")):
            dev.load_program(ProgramBuilder(DEFAULT).finish())


def _dw_program(config: HardwareConfig) -> Program:
    """A reset, then two GEMMs with the depthwise window's dw bit (instructions 1, 2)."""
    p = ProgramBuilder(config)
    p.gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1)
    for _ in range(2):
        p.append(Gemm(uop_bgn=0, uop_end=2, iter_out=1, iter_in=1, dw=True))
    return p.finish()


def test_a_program_with_the_depthwise_window_is_refused_without_it(default_dev):
    in_use = default_dev.allocator.bytes_in_use
    with pytest.raises(ValueError) as exc:
        default_dev.load_program(_dw_program(DW3))
    message = str(exc.value)
    assert message.startswith(
        f"program is encoded for config {DW3.name}, the device has {DEFAULT.name}; the "
        f"program needs extension(s) dw3 (the depthwise window, dw_taps=3), which config "
        f"{DEFAULT.name} lacks (it uses dw GEMMs at instruction(s) 1, 2)"), message
    assert "differ in" not in message            # dw_taps is named as the extension
    assert default_dev.allocator.bytes_in_use == in_use      # nothing written


def test_a_window_of_other_taps_is_refused():
    """dw GEMMs mean another window on a device with another dw_taps."""
    dw4 = DEFAULT.replace(dw_taps=4)
    assert program_mismatch(_dw_program(DW3), dw4) == (
        f"program is encoded for config {DW3.name}, the device has {dw4.name}; the program "
        f"needs extension(s) dw3 (the depthwise window, dw_taps=3), which config {dw4.name} "
        f"lacks (it uses dw GEMMs at instruction(s) 1, 2); config {dw4.name} has "
        f"extension(s) dw4, which the program's config lacks")
    # A program of the window's config without dw GEMMs is still refused elsewhere: its
    # encoding has the dw bit.
    assert "dw3" in program_mismatch(ProgramBuilder(DW3).finish(), DEFAULT)


def test_a_hand_built_dw_gemm_on_a_config_without_the_window_is_named(default_dev):
    program = Program(_dw_program(DW3).insns, DEFAULT)
    with pytest.raises(ValueError, match=re.escape(
            "program has GEMMs with the depthwise window's dw bit, which config "
            f"{DEFAULT.name} lacks (it needs dw_taps > 0): dw GEMMs at instruction(s) 1, 2")):
        default_dev.load_program(program)
    with vdla.runtime.open(DW3, dram_size=1 << 20) as dev:     # its own config runs it
        assert program_mismatch(_dw_program(DW3), DW3) == ""
        assert dev.run(*dev.load_program(_dw_program(DW3)))["gemm_uops"] == 5


def test_other_differences_are_named(default_dev):
    other = DEFAULT.replace(batch=2, clock_mhz=200.0)
    with pytest.raises(ValueError, match=re.escape(
            "they differ in batch (program 2, device 1), clock_mhz (program 200.0, "
            "device 100.0)")):
        default_dev.load_program(ProgramBuilder(other).finish())
    # The clock alone: the names are equal, so the difference is what says why.
    assert program_mismatch(ProgramBuilder(DEFAULT.replace(clock_mhz=50.0)).finish(),
                            DEFAULT).endswith("they differ in clock_mhz (program 50.0, "
                                              "device 100.0)")


def test_an_op_the_programs_own_config_lacks_is_named_with_its_index(default_dev):
    """A Program built by hand is not checked until it is encoded: the device names the
    instruction before the encoder would."""
    program = Program(_req_program(PLUS).insns, DEFAULT)
    with pytest.raises(ValueError, match=re.escape(
            f"program has ALU instructions config {DEFAULT.name} lacks: REQ at "
            "instruction(s) 1 (its ALU has MIN, MAX, ADD, SHR)")):
        default_dev.load_program(program)


def test_the_isa_pages_req_example_runs_as_written():
    """docs/isa.md: shift 2 with lo -3 is the immediate 0xFD02 (-766), hi is 127; REQ
    writes the clamped value to OUT and clears ACC."""
    c = PLUS
    acc = np.zeros((1, c.batch, c.block_out), np.int32)
    acc[0, 0, :4] = [-100, 0, 40, 1000]         # >> 2: -25, 0, 10, 250
    with vdla.runtime.open(c, dram_size=1 << 20) as dev:
        uop_addr, acc_addr = dev.alloc(c.uop_bytes), dev.alloc(acc.nbytes)
        out_addr = dev.alloc(c.out_elem_bytes)
        dev.write(uop_addr, np.frombuffer(encode_uops([Uop(0, 0, 0)], c), np.uint8))
        dev.write(acc_addr, acc)
        p = ProgramBuilder(c)
        p.load(MemoryType.UOP, dram_base=uop_addr // c.uop_bytes, y_size=1, x_size=1,
               x_stride=1)
        p.load(MemoryType.ACC, dram_base=acc_addr // c.acc_elem_bytes, y_size=1, x_size=1,
               x_stride=1)
        p.alu(AluOp.REQ, use_imm=True, imm=-766, uop_bgn=0, uop_end=1, iter_out=1,
              iter_in=1)
        p.dep_push(COMPUTE, STORE)
        p.dep_pop(COMPUTE, STORE)
        p.store(dram_base=out_addr // c.out_elem_bytes, y_size=1, x_size=1, x_stride=1)
        p.dep_push(STORE, COMPUTE)
        p.dep_pop(STORE, COMPUTE)
        dev.run(*dev.load_program(p.finish()))
        out = dev.read(out_addr, c.out_elem_bytes).view(np.int8)
        assert out[:4].tolist() == [-3, 0, 10, 127] and not out[4:].any()
        assert not dev.simulator.acc[0].any()           # cleared


def test_the_same_config_loads_and_runs():
    with vdla.runtime.open(PLUS, dram_size=1 << 20) as dev:
        program = _req_program(PLUS)
        assert program_mismatch(program, PLUS) == ""
        addr, count = dev.load_program(program)
        assert count == len(program) == 3
        assert np.array_equal(dev.read(addr, program.nbytes),
                              np.frombuffer(program.to_bytes(), np.uint8))
        assert dev.run(addr, count)["alu_uops"] == 1
