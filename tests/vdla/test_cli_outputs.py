"""Output files of the commands: checked before any work (a missing parent folder or a
path that is a folder is an error that names the option, the path and the folder),
and written whatever happens to stdout (a pipe closed early)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from vdla.cli import build_parser, main
from vdla.cli.common import output_file

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
#: Options that name a folder the command may create, and the sweep command (its module
#: is kept apart; its options are listed for it to adopt `output_file`).
FOLDER_OPTIONS = {("compile", "output"), ("verilog", "output")}
OUTPUT_DESTS = {"json", "chart", "plot", "dump", "trace", "wave", "output", "records", "best"}


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_output_file_option_is_checked():
    """Every option that writes a file takes `output_file` (its parent must exist), so a
    new command cannot forget it. Read-only uses (run's --records) are left out."""
    unchecked = []
    for name, parser in _subparsers().items():
        if name == "sweep":
            continue
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
    target = tmp_path / "nonexistent" / "dir" / "out.json"
    with pytest.raises(SystemExit) as exit_:
        main([*argv, option, str(target)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert option in err and repr(str(target)) in err
    assert f"{str(tmp_path / 'nonexistent')!r} does not exist" in err
    assert not (tmp_path / "nonexistent").exists()


def test_a_parent_that_is_a_file_is_named():
    with pytest.raises(argparse.ArgumentTypeError, match="is not a folder"):
        output_file(__file__ + "/x.json")


def test_a_file_in_the_working_folder_is_fine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output_file("x.json") == "x.json"


def test_export_onto_a_folder_says_it_is_a_folder(tmp_path, capsys):
    """It printed ``[Errno 21] Is a directory`` with a temporary file's name."""
    with pytest.raises(SystemExit) as exit_:
        main(["export", "small_cnn", "-o", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument -o/--output: {str(tmp_path)!r} is a folder" in err
    assert "writes one file" in err and ".tmp" not in err and "Errno" not in err
    assert list(tmp_path.iterdir()) == []
