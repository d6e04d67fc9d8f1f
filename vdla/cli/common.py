"""What the command modules share: the user-facing error, what an interrupt keeps,
config and file loading, progress on a terminal, atomic JSON output and table formatting.

Importing this module is light (no numpy): `vdla.cli.main` imports it before its own
Ctrl-C handling starts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from vdla import shipped
from vdla._fileio import atomic_write
from vdla.config import HardwareConfig

if TYPE_CHECKING:
    from vdla.boards import Board

__all__ = ["CONFIG_HELP", "CliError", "board_config", "check_output_file",
           "check_output_files", "int_arg", "load_config", "log", "on_interrupt",
           "output_file", "progress_line", "read_file", "table", "write_json"]

#: The help of every command's ``--config`` (the vdla target's says the same in its own
#: words); `vdla.shipped.resolve_config` is what the value means. It ends with the
#: default, which ``vdla estimate`` replaces with the board's.
CONFIG_HELP = ("hardware config: a JSON file (vdla's keys or VTA's vta_config.json) or the "
               "name of a config shipped with vdla (`vdla config list`); default: VTA's "
               "default")


class CliError(Exception):
    """A user-facing failure: printed as ``vdla: error: ...`` with exit status 1."""


def on_interrupt(args, note: str | Callable[[], str]) -> None:
    """Say what Ctrl-C stops and keeps from this point of a command on: `vdla.cli.main`
    ends an interrupted command with the one line ``vdla: interrupted: NOTE`` and exit
    status 130. Without a note it says which command stopped.

    args : the command's parsed arguments (the note travels on them to `main`)
    note : the text, or a function that returns it when the interrupt comes (for counts
        that grow while the command runs, such as measurements kept)
    """
    args.interrupt_note = note


def load_config(spec: str | None) -> HardwareConfig:
    """The config ``--config SPEC`` names: a JSON file, else a shipped config's name
    (`vdla.shipped.resolve_config`); VTA's default for None."""
    return shipped.load_config(spec)


def board_config(board_name: str, config_path: str | None) -> tuple[Board, HardwareConfig]:
    """(board, config) for a command with ``--board`` and ``--config``: the config
    ``--config`` names (a file or a shipped name, as `load_config`) applied to the board
    (its clock; its bus width checked), else the board's default."""
    # The boards load the runtime and numpy (heavy): not at start-up (see the docstring).
    from vdla.boards import get as get_board

    board = get_board(board_name)
    config = shipped.load_config(config_path) if config_path else None
    return board, board.apply(config)


def log(message: str) -> None:
    """A progress or status line on stderr (stdout carries the results)."""
    print(f"vdla: {message}", file=sys.stderr, flush=True)


def read_file(path: str, *, binary: bool):
    try:
        return Path(path).read_bytes() if binary else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror}") from None


def int_arg(text: str) -> int:
    """An integer option in decimal or 0x hex (argparse turns ValueError into a usage
    error)."""
    return int(text, 0)


def output_file(text: str) -> str:
    """The argparse ``type=`` of every option that names one file to write (``--json``,
    ``--chart``, ``-o FILE``, ...). It returns the path as given and marks the option for
    `check_output_files`, which `vdla.cli.main` runs once the whole command line has
    parsed: a path that cannot be written is a bad value (exit status 1, one ``vdla:
    error:`` line), not a usage error, which argparse would report with the whole usage
    text and status 2, and before a misspelt option, which is one."""
    return text


def check_output_file(text: str) -> None:
    """CliError unless the file `text` can be created where it names, checked before the
    command does any work.

    A missing parent folder is an error, not created: a mistyped folder would otherwise
    become a new folder (``--json /nonexistent/dir/x.json`` made one at the root). A path
    that is a folder is an error too (the file would have to replace it). Only options
    that name an output *folder* (``-o DIR`` of compile and verilog) create it."""
    path = Path(text)
    if path.is_dir():
        raise CliError(f"{text!r} is a folder; this option writes one file: give the file's "
                       f"path (such as {str(path / 'NAME')!r})")
    parent = path.parent
    if not parent.is_dir():
        missing = parent
        while not missing.parent.is_dir():      # name the first folder that is not there
            missing = missing.parent
        what = "is not a folder" if missing.exists() else "does not exist"
        raise CliError(f"cannot write {text!r}: {str(missing)!r} {what} (vdla creates no "
                       "folder for an output file; make it first, or give a path in an "
                       "existing folder)")


def check_output_files(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check (`check_output_file`) every path given to an option of the parsed command
    whose type is `output_file`; the CliError names the option as argparse would
    (``-o/--output: ...``)."""
    for action in _chosen_actions(parser, args):
        value = getattr(args, action.dest, None)
        if action.type is not output_file or value is None:
            continue
        for text in value if isinstance(value, list) else [value]:
            try:
                check_output_file(text)
            except CliError as exc:
                option = "/".join(action.option_strings) or action.metavar or action.dest
                raise CliError(f"{option}: {exc}") from None


def _chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The actions of `parser` and of each subcommand's parser that `args` chose (the
    same option of another subcommand may be a flag, such as ``config list --json``)."""
    while parser is not None:
        yield from parser._actions
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                   None)
        parser = None if sub is None else sub.choices.get(getattr(args, sub.dest, None))


def write_json(path: str | Path, data) -> None:
    """`data` as indented JSON in `path`, atomically."""
    atomic_write(Path(path), (json.dumps(data, indent=2) + "\n").encode())


def progress_line(verb: str):
    """A progress callback ``(done, total, name)`` that keeps one updating line on a
    terminal's stderr, and nothing when stderr is not a terminal (logs and tests stay
    clean). Returns (callback or None, function that ends the line)."""
    if not sys.stderr.isatty():
        return None, lambda: None

    def show(done: int, total: int, name: str):
        print(f"\r\x1b[K{verb} [{done + 1}/{total}] {name}", end="", file=sys.stderr,
              flush=True)

    return show, lambda: print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
          right: set[int] = frozenset()) -> list[str]:
    """Lines of a plain table: columns padded to their widest cell, those in `right`
    aligned right."""
    widths = [max(len(str(r[i])) for r in list(rows) + [header]) for i in range(len(header))]
    return ["  ".join(f"{str(v):>{w}}" if i in right else f"{str(v):<{w}}"
                      for i, (v, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *rows]]
