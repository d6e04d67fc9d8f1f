"""The project scripts `vdla verilog --board` writes are Tcl that parses: with no Vivado
or Quartus here, each script is split into its commands by a real Tcl interpreter
(Python's own, `tkinter.Tcl`), and every command must be complete (braces, brackets and
quotes balanced) with nothing left open at the end. Nothing is executed."""

import pytest

from vdla.boards import BOARDS
from vdla.boards.project import VENDOR_FILES, _template, _values, board_id, render
from vdla.hw.verilog import manifest

tkinter = pytest.importorskip("tkinter", reason="Python built without Tcl")


def commands(tcl, text: str) -> list[str]:
    """`text` cut into complete Tcl commands; AssertionError for one left open."""
    found, pending = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        pending += line + "\n"
        tcl.setvar("vdla_chunk", pending)
        if tcl.eval("info complete $vdla_chunk") == "1":
            if pending.strip() and not pending.lstrip().startswith("#"):
                found.append(pending)
            pending = ""
    assert not pending.strip(), f"a command opened and never closed, ending at line {number}"
    return found


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_the_project_scripts_parse_as_tcl(board):
    """The scripts as `generate` renders them (without the Verilog, which is slow to
    make and not Tcl)."""
    tcl = tkinter.Tcl()
    spec = BOARDS[board]
    config = spec.apply(None)
    values = _values(spec, config, manifest(config))
    scripts = {name.format(board_id=board_id(spec)): render(_template(template), values)
               for name, template in VENDOR_FILES[spec.family.vendor].items()
               if name.endswith(".tcl")}
    if not scripts:
        pytest.skip(f"{board}: its flow writes no Tcl")
    for name, text in scripts.items():
        found = commands(tcl, text)
        assert len(found) > 5, name
        # Each command's words parse as a Tcl list (no stray quote or brace inside).
        for command in found:
            tcl.setvar("vdla_cmd", command)
            assert tcl.eval("info complete $vdla_cmd") == "1"
        if spec.family.vendor == "xilinx":
            # The bitstream, and the hardware handoff pynq loads an overlay by.
            assert any("write_bitstream" in c for c in found)
            assert any(f"vdla_{board_id(spec)}.hwh" in c for c in found), name


def test_an_unbalanced_script_is_caught():
    tcl = tkinter.Tcl()
    with pytest.raises(AssertionError, match="opened and never closed"):
        commands(tcl, "set a 1\nif {$a} {\n  puts yes\n")
    assert len(commands(tcl, "set a 1\nif {$a} {\n  puts yes\n}\n# done\n")) == 2
