"""Assembly text: assemble/disassemble round trips, syntax, directives and errors."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vdla import HardwareConfig
from vdla.isa import (Alu, AluOp, AsmError, Finish, Gemm, Load, MemoryType, Program, Store,
                      assemble, disassemble, encode_stream, format_insn, parse_insn)
from vdla_testing import instructions

DEFAULT = HardwareConfig()
MUL_OPS = ["MIN", "MAX", "ADD", "SHR", "MUL"]
CONFIGS = {
    "default": DEFAULT,
    "big": HardwareConfig(batch=2, block_in=32, block_out=32, alu_ops=MUL_OPS),
    "wide": HardwareConfig(uop_buff_size=65536, inp_buff_size=16384, acc_buff_size=65536),
}

#: The module docstring's example, with the instructions it stands for.
EXAMPLE = """\
.config 1x16x16_i8w8a32_15_15_18_17
LOAD INP sram_base=0 dram_base=0x40 y_size=4 x_size=4 x_stride=4 push_next
GEMM reset_reg uop_bgn=0 uop_end=1 iter_out=16 iter_in=1 dst_factor_out=1 pop_prev
ALU SHR use_imm imm=-2 uop_bgn=1 uop_end=2 iter_out=16 iter_in=1 dst_factor_out=1
FINISH
"""
EXAMPLE_INSNS = [
    Load(memory_type=MemoryType.INP, dram_base=64, y_size=4, x_size=4, x_stride=4,
         push_next=True),
    Gemm(reset_reg=True, uop_end=1, iter_out=16, iter_in=1, dst_factor_out=1, pop_prev=True),
    Alu(alu_opcode=AluOp.SHR, use_imm=True, imm=-2, uop_bgn=1, uop_end=2, iter_out=16,
        iter_in=1, dst_factor_out=1),
    Finish(),
]


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_disassemble_assemble_round_trip(cfg, data):
    program = data.draw(st.lists(instructions(cfg), max_size=10))
    text = disassemble(program, cfg)
    assert text.startswith(f".config {cfg.name}\n")
    assert assemble(text, cfg) == program
    assert encode_stream(assemble(text, cfg), cfg) == encode_stream(program, cfg)
    # Without the .config line, too.
    assert assemble(disassemble(program), cfg) == program


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_program_round_trips(cfg, data):
    program = Program(data.draw(st.lists(instructions(cfg), max_size=10)), cfg)
    assert Program.from_asm(program.to_asm(), cfg) == program
    assert Program.from_bytes(program.to_bytes(), cfg) == program
    assert len(program.to_bytes()) == program.nbytes == 16 * len(program)
    assert list(program) == list(program.insns)


@settings(max_examples=200, deadline=None)
@given(insn=instructions(DEFAULT))
def test_format_parse_round_trip(insn):
    line = format_insn(insn)
    assert "\n" not in line and line.split()[0] == insn.opcode.name
    assert parse_insn(line) == insn


# --- syntax -------------------------------------------------------------------------------


def test_example_assembles():
    assert assemble(EXAMPLE, DEFAULT) == EXAMPLE_INSNS
    # The example's words, written out by hand from docs/isa.md's layout table.
    assert encode_stream(assemble(EXAMPLE, DEFAULT), DEFAULT)[16:48] == (
        (0x0000000000000001_000200800020008A).to_bytes(16, "little")
        + (0xFFFEB00000000001_0002008000400104).to_bytes(16, "little"))


def test_format_insn():
    assert format_insn(EXAMPLE_INSNS[0]) == (
        "LOAD INP dram_base=64 y_size=4 x_size=4 x_stride=4 push_next")
    assert format_insn(EXAMPLE_INSNS[2]) == (
        "ALU SHR uop_bgn=1 uop_end=2 iter_out=16 iter_in=1 dst_factor_out=1 imm=-2 use_imm")
    assert format_insn(Store(x_size=2)) == "STORE x_size=2"
    assert format_insn(Load(memory_type="UOP")) == "LOAD UOP"
    assert format_insn(Finish()) == "FINISH"
    assert disassemble([Finish()]) == "FINISH\n"
    assert disassemble([Finish()], DEFAULT) == f".config {DEFAULT.name}\nFINISH\n"


def test_comments_blank_lines_hex_and_case():
    text = """
    # a comment line
    ; another comment style

    load inp sram_base=0x10 dram_base=0X20 y_size=1 x_size=0x2 x_stride=2   # trailing
    Gemm uop_end=0x1 ; trailing, other style
    alu max use_imm imm=-0x10
    alu mul imm=1_000
    STORE dram_base=7
    \tFINISH\tpop_prev
    """
    cfg = HardwareConfig(alu_ops=MUL_OPS)
    assert assemble(text, cfg) == [
        Load(memory_type="INP", sram_base=16, dram_base=32, y_size=1, x_size=2, x_stride=2),
        Gemm(uop_end=1),
        Alu(alu_opcode="MAX", use_imm=True, imm=-16),
        Alu(alu_opcode="MUL", imm=1000),
        Store(dram_base=7),
        Finish(pop_prev=True),
    ]
    assert assemble("", cfg) == []
    assert assemble("# nothing\n\n   \n", cfg) == []


def test_config_directive():
    assert assemble(f".config {DEFAULT.name}\nFINISH", DEFAULT) == [Finish()]
    assert assemble(f"  .config\t{DEFAULT.name}   # the default\nFINISH", DEFAULT) == [Finish()]
    big = CONFIGS["big"]
    with pytest.raises(AsmError, match=rf"^<asm>:1: written for config '{DEFAULT.name}', "
                                       rf"assembling for '{re.escape(big.name)}'"):
        assemble(f".config {DEFAULT.name}\nFINISH", big)
    with pytest.raises(AsmError, match=r"^prog\.s:2: \.config needs the name of a config"):
        assemble("FINISH\n.config\n", DEFAULT, source="prog.s")
    with pytest.raises(AsmError, match=r"^<asm>:1: unknown directive '\.org'; known: \.config"):
        assemble(".org 0x100", DEFAULT)


def test_program_from_asm_checks_config():
    program = Program.from_asm(EXAMPLE, DEFAULT)
    assert list(program) == EXAMPLE_INSNS
    assert program.to_asm().splitlines()[:2] == [
        f".config {DEFAULT.name}", "LOAD INP dram_base=64 y_size=4 x_size=4 x_stride=4 push_next"]
    assert Program.from_asm(program.to_asm(), DEFAULT) == program
    with pytest.raises(AsmError, match=r"^x\.s:1: written for config"):
        Program.from_asm(EXAMPLE, CONFIGS["wide"], source="x.s")


# --- errors ---------------------------------------------------------------------------------

ERRORS = [
    ("NOP", r"unknown mnemonic 'NOP'; known: LOAD, STORE, GEMM, FINISH, ALU"),
    ("LOADX INP", r"unknown mnemonic 'LOADX'"),
    ("LOAD", r"LOAD needs a memory type \(UOP, WGT, INP, ACC, TAB\)"),
    ("LOAD sram_base=1", r"LOAD needs a memory type"),
    ("LOAD OUT x_size=1", r"LOAD needs a memory type"),
    ("ALU", r"ALU needs an operation \(MIN, MAX, ADD, SHR, MUL, REQ, TAB, DIV\)"),
    ("ALU XOR imm=1", r"ALU needs an operation"),
    ("GEMM bogus=1", r"GEMM has no field 'bogus'"),
    ("GEMM imm=1", r"GEMM has no field 'imm'"),
    ("LOAD INP memory_type=2", r"LOAD has no field 'memory_type'"),
    ("STORE OUT", r"STORE has no field 'OUT'"),
    ("GEMM reset_reg=1", r"reset_reg is a flag: write 'reset_reg' alone"),
    ("FINISH pop_prev=0", r"pop_prev is a flag"),
    ("GEMM uop_bgn", r"GEMM field 'uop_bgn' needs a value \(uop_bgn=N\)"),
    ("GEMM uop_bgn=abc", r"GEMM field uop_bgn='abc' is not an integer"),
    ("GEMM uop_bgn=1.5", r"GEMM field uop_bgn='1\.5' is not an integer"),
    ("GEMM uop_bgn=", r"GEMM field uop_bgn='' is not an integer"),
    ("GEMM uop_bgn=1 uop_bgn=2", r"GEMM field 'uop_bgn' is given twice"),
    ("GEMM reset_reg reset_reg", r"GEMM field 'reset_reg' is given twice"),
    ("GEMM uop_bgn=8192", r"GEMM field uop_bgn=8192 does not fit its 13-bit field "
                          r"\(allowed 0\.\.8191\)"),
    ("LOAD WGT dram_base=0x100000000", r"LOAD field dram_base=4294967296 .*allowed 0\.\.4294967295"),
    ("ALU ADD imm=32768", r"ALU field imm=32768 .*allowed -32768\.\.32767"),
    ("LOAD INP x_size=-1", r"Load\.x_size must be non-negative, not -1"),
    ("STORE x_pad_1=1", r"Store\.x_pad_1 must be 0"),
    ("ALU MUL use_imm imm=2", r"ALU field alu_opcode=MUL is not implemented"),
]


@pytest.mark.parametrize("line, pattern", ERRORS, ids=[line for line, _ in ERRORS])
def test_errors_name_the_line(line, pattern):
    text = f"# header\n\nFINISH\n{line}   # the bad one\nFINISH\n"
    with pytest.raises(AsmError, match=rf"^<asm>:4: {pattern}"):
        assemble(text, DEFAULT)
    with pytest.raises(AsmError, match=rf"^kernel\.s:1: {pattern}"):
        assemble(line, DEFAULT, source="kernel.s")


def test_asm_error_is_value_error():
    assert issubclass(AsmError, ValueError)
    with pytest.raises(AsmError, match="empty line"):
        parse_insn("   ")
