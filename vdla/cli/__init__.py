"""The ``vdla`` command line: one module per command.

Each command module (`COMMANDS`, in the order ``vdla --help`` lists them) has
``add_parser(subparsers)``, which adds its parser and sets ``func`` to its ``run(args) ->
exit status``. Adding a command is one module and one entry here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import vdla
from vdla.cli.common import CliError
from vdla.sim.errors import SimError

__all__ = ["COMMANDS", "CliError", "build_parser", "main"]

#: The commands, by module name in `vdla.cli`.
COMMANDS = ("config", "asm", "disasm", "verilog", "boards", "estimate", "sim", "demo",
            "export", "targets", "run", "tune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vdla", description=vdla.__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"vdla.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except (CliError, ValueError, SimError, OSError) as exc:
        print(f"vdla: error: {exc}", file=sys.stderr)
        return 1
