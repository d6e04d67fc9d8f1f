"""The ``vdla`` command line: one module per command.

Each command module (`COMMANDS`, in the order ``vdla --help`` lists them) has
``add_parser(subparsers)``, which adds its parser and sets ``func`` to its ``run(args) ->
exit status``. Adding a command is one module and one entry here.

Exit status: 0 success; 1 a user error (bad input, a failed check: `CliError` and the
other errors `main` prints as ``vdla: error: ...``); 2 a usage error (argparse); 130
interrupted (Ctrl-C); 141 stdout closed early (128 + SIGPIPE, as a shell reports a Unix
tool that a closed pipe ends: ``vdla compare ... | head -1``), quietly, no traceback. An
interrupted command ends with one line, ``vdla: interrupted: ...``, saying what stopped
and what was kept (a command says so with `vdla.cli.common.on_interrupt`), and no
traceback. Commands write their files atomically, so an interrupt never leaves half a
file, and before they print their report, so a closed stdout does not cost the files.

Importing this package is light (no numpy): the commands are imported by `main`, inside
its Ctrl-C handling.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

import vdla
from vdla.cli.common import CliError, check_output_files

__all__ = ["COMMANDS", "CliError", "build_parser", "main"]

#: The commands, by module name in `vdla.cli`.
COMMANDS = ("config", "asm", "disasm", "verilog", "boards", "estimate", "sim", "demo",
            "export", "targets", "run", "compare", "roofline", "compile", "tune", "dataset",
            "sweep", "serve", "deploy")
#: Exit status of an interrupted command (128 + SIGINT, as shells report it).
INTERRUPTED = 130
#: Exit status when stdout's reader went away (128 + SIGPIPE, as shells report it).
STDOUT_CLOSED = 128 + signal.SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vdla", description=vdla.__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"vdla.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names (default: the process's arguments) and return its exit
    status (see the module docstring; argparse exits with 2 itself)."""
    with warnings.catch_warnings():       # restores the caller's display on return
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = None
    try:
        # Importing the commands is most of start-up: Ctrl-C there ends cleanly too.
        parser = build_parser()
        args = parser.parse_args(argv)
        # The output paths once the command line is known to be well formed: a usage
        # error (exit 2) wins, and a path that cannot be written is a bad value (exit 1).
        check_output_files(parser, args)
        status = args.func(args)
        # Buffered output meets a closed pipe here, not at the interpreter's exit (where
        # it would be printed as an ignored exception).
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        _report_interrupt(args, sys.argv[1:] if argv is None else argv)
        return INTERRUPTED
    except BrokenPipeError:     # stdout piped into head & co., which has exited
        _drop_stdout()
        return STDOUT_CLOSED
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        print(f"vdla: error: {exc}", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so that nothing more (the
    flush at exit) meets the closed pipe: Python ignores SIGPIPE, which would end a C
    tool there, and raises BrokenPipeError instead (the idiom of Python's documentation,
    "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # no file descriptor (a test's captured stdout)
        pass


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, ``vdla: warning: ...`` (no source line)."""
    print(f"vdla: warning: {message}", file=sys.stderr if file is None else file)


def _is_user_error(exc: Exception) -> bool:
    """Whether `main` prints `exc` as ``vdla: error: ...`` with exit status 1."""
    errors: tuple[type[Exception], ...] = (CliError, ValueError, OSError)
    # A SimError can only come from a loaded simulator package; importing it here would
    # load numpy, and could fail the same way as the import that raised `exc`.
    sim_errors = sys.modules.get("vdla.sim.errors")
    if sim_errors is not None:
        errors += (sim_errors.SimError,)
    # A failed build (Verilator's, the CPU target's C) names its log: the user's to read.
    for module in ("vdla.sim.verilator.build", "vdla.compiler.targets.cpu.build"):
        if module in sys.modules:
            errors += (sys.modules[module].BuildError,)
    return isinstance(exc, errors)


def _report_interrupt(args, argv: list[str]) -> None:
    """The one line of an interrupted command: its note, or which command stopped."""
    note = getattr(args, "interrupt_note", None)
    if callable(note):
        try:
            note = note()
        except Exception:  # noqa: BLE001 - a faulty note must not bring the traceback back
            note = None
    if not note:
        # The command and its operand (`vdla run resnet18`): the words before any option.
        words = ["vdla"]
        for word in argv[:2]:
            if word.startswith("-"):
                break
            words.append(word)
        note = (f"{' '.join(words)} stopped; no partial output written" if args is not None
                else "vdla stopped while starting")
    if sys.stderr.isatty():
        print("\r\x1b[K", end="", file=sys.stderr)   # end a progress line and the ^C echo
    print(f"vdla: interrupted: {note}", file=sys.stderr, flush=True)
