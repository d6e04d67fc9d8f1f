"""Output files of the commands: checked before any work (a missing parent folder or a
path that is a folder is an error that names the option, the path and the folder),
and written whatever happens to stdout (a pipe closed early)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from vdla.cli import build_parser, main
from vdla.cli.common import CliError, check_output_file, output_file

#: Each command with an option that names one file to write, and that option. A command
#: line that parses but for that option (the files it reads need not exist).
OUTPUT_OPTIONS = [
    (["run", "small_cnn"], "--json"),
    (["compare", "small_cnn"], "--json"),
    (["compare", "small_cnn"], "--chart"),
    (["roofline", "small_cnn"], "--json"),
    (["roofline", "small_cnn"], "--plot"),
    (["estimate", "--board", "pynq-z1"], "--json"),
    (["sim", "prog.asm"], "--dump"),
    (["sim", "prog.asm"], "--trace"),
    (["sim", "prog.asm"], "--wave"),
    (["tune", "small_cnn", "--trials", "1", "--records", "r.db"], "--json"),
    (["tune", "small_cnn", "--trials", "1"], "--records"),
    (["asm", "prog.asm"], "-o"),
    (["disasm", "prog.bin"], "-o"),
    (["export", "small_cnn"], "-o"),
]
#: Options that name a folder the command may create.
FOLDER_OPTIONS = {("compile", "output"), ("verilog", "output"), ("sweep", "out"),
                  ("deploy", "output")}
OUTPUT_DESTS = {"json", "chart", "plot", "dump", "trace", "wave", "output", "records", "best",
                "store"}


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_output_file_option_is_checked():
    """Every option that writes a file takes `output_file` (its parent must exist), so a
    new command cannot forget it. Read-only uses (run's --records) are left out."""
    unchecked = []
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if action.dest not in OUTPUT_DESTS or (name, action.dest) in FOLDER_OPTIONS:
                continue
            if isinstance(action, argparse._StoreTrueAction):   # --json: print JSON
                continue
            if action.dest == "records" and name != "tune":    # read, not written
                continue
            if action.type is not output_file:
                unchecked.append(f"{name} {action.option_strings[-1]}")
    assert unchecked == []


@pytest.mark.parametrize("argv, option", OUTPUT_OPTIONS,
                         ids=[f"{a[0]}{o}" for a, o in OUTPUT_OPTIONS])
def test_a_missing_parent_folder_is_an_error_not_created(tmp_path, capsys, argv, option):
    """A bad value, not a usage error: exit status 1 and one line naming the option, the
    path and the missing folder (argparse's status 2 came with the whole usage text)."""
    target = tmp_path / "nonexistent" / "dir" / "out.json"
    assert main([*argv, option, str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vdla: error: ") and len(err.splitlines()) == 1
    assert option in err and repr(str(target)) in err
    assert f"{str(tmp_path / 'nonexistent')!r} does not exist" in err
    assert "usage:" not in err
    assert not (tmp_path / "nonexistent").exists()


def test_a_usage_error_beside_a_bad_output_path_is_still_a_usage_error(tmp_path, capsys):
    target = str(tmp_path / "nonexistent" / "out.json")
    with pytest.raises(SystemExit) as exit_:
        main(["run", "small_cnn", "--json", target, "--no-such-option"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "small_cnn", "--records", target])       # --trials is required
    assert exit_.value.code == 2
    assert "the following arguments are required: --trials" in capsys.readouterr().err


def test_another_commands_flag_of_the_same_name_is_not_a_path(capsys):
    """``config list --json`` is a flag, ``run --json`` a path: only the options of the
    command given are checked."""
    assert main(["config", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_a_parent_that_is_a_file_is_named():
    with pytest.raises(CliError, match="is not a folder"):
        check_output_file(__file__ + "/x.json")


def test_a_file_in_the_working_folder_is_fine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_output_file("x.json")
    assert output_file("x.json") == "x.json"


def test_export_onto_a_folder_says_it_is_a_folder(tmp_path, capsys):
    """It printed ``[Errno 21] Is a directory`` with a temporary file's name."""
    assert main(["export", "small_cnn", "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vdla: error: -o/--output: {str(tmp_path)!r} is a folder")
    assert "writes one file" in err and ".tmp" not in err and "Errno" not in err
    assert len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def _run_with_stdout_closed(argv: list[str], unbuffered: bool) -> tuple[int, str]:
    """Run ``python -m vdla ARGV`` with its stdout a pipe whose reader has closed it
    before the command prints (as `| head -1` does once it has its line): (exit status,
    stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "vdla", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()         # the reader is gone: every write to stdout fails (EPIPE)
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_a_closed_stdout_still_writes_the_files_and_exits_quietly(tmp_path, unbuffered):
    """`vdla compare ... | head -1` exited 0 and wrote neither the chart nor the JSON."""
    chart, report = tmp_path / "c.png", tmp_path / "c.json"
    status, err = _run_with_stdout_closed(
        ["compare", "small_cnn", "--targets", "host", "--chart", str(chart),
         "--json", str(report)], unbuffered)
    assert status == 141                 # 128 + SIGPIPE, as the shell reports `yes | head`
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(report.read_text())["targets"]["host"]["bit_exact"] is True


def test_vdla_run_writes_its_json_before_its_report(tmp_path):
    report = tmp_path / "r.json"
    status, err = _run_with_stdout_closed(
        ["run", "small_cnn", "--target", "host", "--json", str(report)], unbuffered=True)
    assert status == 141 and "Traceback" not in err
    assert json.loads(report.read_text())["bit_exact"] is True
