"""The vdla command line: config show, asm/disasm, demo, and its errors."""

import argparse
import json
import subprocess
import sys

import pytest

import vdla
from vdla import cli
from vdla.cli import main

PROGRAM = """\
# a tiny program
LOAD UOP y_size=1 x_size=1 x_stride=1
LOAD INP sram_base=0 dram_base=0x40 y_size=4 x_size=4 x_stride=4 y_pad_0=1 push_next
GEMM reset_reg uop_bgn=0 uop_end=1 iter_out=16 iter_in=1 dst_factor_out=1 pop_prev
ALU SHR use_imm imm=-2 uop_bgn=0 uop_end=1 iter_out=16 iter_in=1 dst_factor_out=1 ; left
FINISH
"""


def test_config_show_text_and_json(capsys, tmp_path):
    assert main(["config", "show"]) == 0
    text = capsys.readouterr().out
    assert "config 1x16x16_i8w8a32_15_15_18_17" in text and "acc_depth          2048" in text
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps({"LOG_BATCH": 1, "LOG_BLOCK": 4, "LOG_INP_WIDTH": 3}))
    assert main(["config", "show", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"]["batch"] == 2
    assert data["derived"]["name"] == "2x16x16_i8w8a32_15_15_18_17"
    assert data["insn_layouts"]["GEMM"]["uop_bgn"] == "20:8"


@pytest.mark.parametrize("params", [None, {"batch": 2, "block_in": 32, "acc_buff_size": 65536,
                                           "alu_ops": ["MIN", "MAX", "ADD", "SHR", "MUL"],
                                           "clock_mhz": 187.5}],
                         ids=["default", "custom"])
def test_config_show_json_is_accepted_by_config(capsys, tmp_path, params):
    """`vdla config show --json > f; vdla config show --config f --json` prints f again."""
    args = ["config", "show", "--json"]
    if params is not None:
        plain = tmp_path / "plain.json"
        plain.write_text(json.dumps(params))
        args += ["--config", str(plain)]
    assert main(args) == 0
    first = capsys.readouterr().out
    shown = tmp_path / "shown.json"
    shown.write_text(first)
    assert main(["config", "show", "--config", str(shown), "--json"]) == 0
    assert capsys.readouterr().out == first
    # A derived value edited by hand is refused, naming it and both values.
    doc = json.loads(first)
    doc["derived"]["wgt_depth"] += 1
    shown.write_text(json.dumps(doc))
    assert main(["config", "show", "--config", str(shown)]) == 1
    err = capsys.readouterr().err
    expected = vdla.HardwareConfig.from_dict(doc["parameters"]).wgt_depth
    assert err.startswith(f"vdla: error: hardware config '{shown}': derived.wgt_depth is "
                          f"{expected + 1} in the file, but the parameters give {expected}")


def test_config_errors(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"block_in": 12}')
    assert main(["config", "show", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "vdla: error:" in err and "block_in" in err and "12" in err
    assert main(["config", "show", "--config", str(tmp_path / "missing.json")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_asm_disasm_roundtrip(tmp_path, capsys):
    src, binary, text = tmp_path / "p.s", tmp_path / "p.bin", tmp_path / "p2.s"
    src.write_text(PROGRAM)
    assert main(["asm", str(src), "-o", str(binary)]) == 0
    assert binary.stat().st_size == 5 * 16
    assert main(["disasm", str(binary), "-o", str(text)]) == 0
    assert text.read_text().splitlines()[0] == ".config 1x16x16_i8w8a32_15_15_18_17"
    again = tmp_path / "p2.bin"
    assert main(["asm", str(text), "-o", str(again)]) == 0
    assert again.read_bytes() == binary.read_bytes()
    assert main(["disasm", str(binary)]) == 0
    assert "ALU SHR" in capsys.readouterr().out


def test_asm_errors_name_the_line(tmp_path, capsys):
    src = tmp_path / "bad.s"
    src.write_text("FINISH\nGEMM uop_end=70000\n")
    out = tmp_path / "out.bin"
    assert main(["asm", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:2:" in err and "uop_end=70000" in err
    assert not out.exists()  # nothing half-written
    (tmp_path / "odd.bin").write_bytes(b"\0" * 17)
    assert main(["disasm", str(tmp_path / "odd.bin")]) == 1
    assert "multiple of 16 bytes" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["functional", "verilator"])
def test_demo_checks_against_numpy(capsys, backend):
    assert main(["demo", "--m", "64", "--n", "48", "--k", "40", "--threads", "2",
                 "--backend", backend]) == 0
    out = capsys.readouterr().out
    assert "OK: all 3072 outputs match numpy bit-exactly" in out
    assert ("GEMM utilization" in out) == (backend == "verilator")
    assert main(["demo", "--m", "0"]) == 1
    assert "--m must be a positive integer" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "vdla", "config", "show", "--json"],
                            capture_output=True, text=True, check=True)
    assert json.loads(result.stdout)["derived"]["name"] == vdla.HardwareConfig().name


#: A user error for each command (a bad value the parser cannot judge): exit status 1.
USER_ERRORS = {
    "config": ["config", "show", "--config", "{tmp}/missing.json"],
    "asm": ["asm", "{tmp}/missing.s", "-o", "{tmp}/out.bin"],
    "disasm": ["disasm", "{tmp}/missing.bin"],
    "verilog": ["verilog", "-o", "{tmp}/rtl", "--board", "no-such-board"],
    "estimate": ["estimate", "--board", "no-such-board"],
    "sim": ["sim", "{tmp}/missing.bin"],
    "demo": ["demo", "--m", "0"],
    "export": ["export", "no_such_net", "-o", "{tmp}/out.onnx"],
    "targets": ["targets", "--config", "{tmp}/missing.json"],
    "run": ["run", "no_such_net", "--sim", "functional"],
    "tune": ["tune", "no_such_net", "--trials", "1", "--records", "{tmp}/t.db"],
}


@pytest.mark.parametrize("command", sorted(USER_ERRORS))
def test_exit_status_1_for_a_user_error_2_for_a_usage_error(command, capsys, tmp_path):
    """One convention across commands: a user error exits 1 with one ``vdla: error:``
    line; a usage error (argparse: a missing or unknown option) exits 2."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in USER_ERRORS[command]]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("vdla: error: ") and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []     # nothing written
    with pytest.raises(SystemExit) as exc:
        main([*args, "--no-such-option"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_commands_help_works(command, capsys):
    """``vdla COMMAND --help`` prints the command's usage and exits 0."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: vdla {command}")


def _option_actions() -> dict[str, dict[str, object]]:
    """flag -> command -> its argparse action, over every command's parser."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, dict[str, object]] = {}
    for command, p in sub.choices.items():
        for action in p._actions:
            for flag in action.option_strings:
                found.setdefault(flag, {})[command] = action
    return found


#: The options declared once (`vdla.cli.common`, `vdla.cli.target_args`), and the commands
#: whose option of that name means something else, declared apart: tune's --seed seeds
#: its search and its --batch is schedules per round, dataset's --seed seeds the platforms
#: and the shapes, sweep's seeds its sampler; tune's and dataset's --records are written,
#: not read (their own shared declaration); roofline's --precision names a GPU's units,
#: dataset's takes no float16.
SHARED = {"--calibration": set(), "--seed": {"tune", "dataset", "sweep", "demo"},
          "--batch": {"tune", "export"}, "--records": {"tune", "dataset"},
          "--precision": {"roofline", "dataset"}, "--chooser": set()}


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_option_says_the_same_in_every_command(flag):
    """Each option several commands take alike has one help text, one default and one
    type in all of them (it is declared once, in `vdla.cli.common` or
    `vdla.cli.target_args`)."""
    actions = _option_actions()[flag]
    alike = {c: a for c, a in actions.items() if c not in SHARED[flag]}
    assert len(alike) >= 2, f"{flag}: taken by {sorted(alike)} only"
    described = {(a.help, a.default, a.type, a.metavar, tuple(a.choices or ()))
                 for a in alike.values()}
    assert len(described) == 1, (f"{flag} is described {len(described)} ways in "
                                 f"{', '.join(sorted(alike))}: {described}")


def test_the_ray_address_is_described_once():
    """--ray says what ADDRESS may be in the same words in every command that takes it."""
    from vdla.cli.common import RAY_ADDRESS_HELP

    actions = _option_actions()["--ray"]
    assert {"run", "tune", "sweep"} <= set(actions)
    assert all(RAY_ADDRESS_HELP in a.help for a in actions.values())
