"""What the command modules share: the user-facing error, what an interrupt keeps,
config and file loading, progress on a terminal, atomic JSON output and table formatting,
the options of the commands that load a model (each declared here once, with one help
text and one default: ``--calibration``, ``--seed``, ``--batch``, ``--records``), the
tuning records they open and the timing of a whole-graph run.

The options that need the compiler to describe them (``--precision``, ``--chooser``,
``--target``'s default) are `vdla.cli.target_args`'s.

Importing this module is light (no numpy): `vdla.cli.main` imports it before its own
Ctrl-C handling starts."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from vdla import shipped
from vdla._fileio import atomic_write
from vdla.config import HardwareConfig

if TYPE_CHECKING:
    from vdla.boards import Board
    from vdla.compiler.tuner import Records

__all__ = ["CONFIG_HELP", "DEFAULT_CALIBRATION", "RAY_ADDRESS_HELP", "WHOLE_GRAPH_RUNS", "CliError",
           "add_batch_option", "add_calibration_option", "add_float_nonlinear_option",
           "add_input_option", "add_ray_option",
           "add_records_option", "add_records_output_option", "add_seed_option",
           "board_config", "check_model_options", "check_output_file", "check_output_files",
           "int_arg", "load_config", "log", "on_interrupt", "open_records", "output_file",
           "progress_line", "read_file", "table", "whole_graph", "write_json"]

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


# --- The options of the commands that load a model --------------------------------------
# Each is declared once, here, so that every command that takes it says the same thing
# and has the same default (tests/vdla/test_cli.py checks the help of each is one text).

#: ``--calibration``'s default: the calibration samples a model is quantized on.
DEFAULT_CALIBRATION = 4
#: What ``--ray ADDRESS`` may be, in every command that runs work on Ray.
RAY_ADDRESS_HELP = ("auto (a running cluster), local (an instance on this machine with "
                    "--jobs CPUs) or host:port (needs pip install 'vdla[ray]')")


def add_calibration_option(parser: argparse.ArgumentParser) -> None:
    """``--calibration N``: how many calibration samples the model is quantized on
    (`vdla.compiler.pipeline.load_model`'s ``calibration``), for every command that
    quantizes a model (run, compile, compare, roofline, tune, deploy).

    parser : the command's parser
    """
    parser.add_argument("--calibration", type=int, default=DEFAULT_CALIBRATION, metavar="N",
                        help="calibration samples the model is quantized on (default "
                             f"{DEFAULT_CALIBRATION})")


def add_seed_option(parser: argparse.ArgumentParser) -> None:
    """``--seed N``: what seeds the model's inputs (`load_model`'s ``seed``), for the
    commands that run or compile a model on its inputs. A command whose seed seeds
    something else (tune's search, sweep's sampler) declares its own.

    parser : the command's parser
    """
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seeds the model's inputs (digits_cnn: the test image's index) "
                             "(default 0)")


def add_batch_option(parser: argparse.ArgumentParser) -> None:
    """``--batch N``: the model's batch size (`load_model`'s ``batch``). Not tune's
    ``--batch``, which is the schedules measured per round.

    parser : the command's parser
    """
    parser.add_argument("--batch", type=int, metavar="N",
                        help="batch size: a zoo model is built with it, an ONNX model's "
                             "dynamic batch dimension set to it (default 1; an ONNX model "
                             "that fixes another batch is an error)")


def add_input_option(parser: argparse.ArgumentParser) -> None:
    """``--input FILE.npz``: the arrays a run feeds the model, one per input by name
    (`load_model`'s ``inputs``), instead of the generated ones.

    parser : the command's parser
    """
    parser.add_argument("--input", metavar="FILE.npz",
                        help="run on these inputs: an .npz file with one array per model "
                             "input, by name (default: generated: seeded normal values, "
                             "token ids inside the embedding table, masks of ones)")


def add_float_nonlinear_option(parser: argparse.ArgumentParser) -> None:
    """``--float-nonlinear``: keep softmax, LayerNorm, GELU and attention in float on the
    host when quantizing (`graph_for`'s ``integer_nonlinear`` False), to compare with
    their integer definitions.

    parser : the command's parser
    """
    parser.add_argument("--float-nonlinear", action="store_true",
                        help="quantize with softmax, LayerNorm, GELU and attention kept in "
                             "float on the host, to compare with their integer definitions")


def add_records_option(parser: argparse.ArgumentParser) -> None:
    """``--records DB``, read: the tuning records a model is compiled with (`open_records`
    opens them), for the commands that compile a model (run, compile, compare, deploy).

    parser : the command's parser
    """
    parser.add_argument("--records", metavar="DB",
                        help="compile each tunable op with its best schedule for the target "
                             "in this tuning records file (vdla tune writes one; records are "
                             "kept per target); --chooser picks the others'")


def add_records_output_option(parser: argparse.ArgumentParser) -> None:
    """``--records DB``, written: the records file a command that measures schedules
    appends every measurement to (tune, dataset); required.

    parser : the command's parser
    """
    parser.add_argument("--records", required=True, type=output_file, metavar="DB",
                        help="SQLite records file every measurement is appended to "
                             "(created if missing)")


def add_ray_option(parser: argparse.ArgumentParser, what: str, note: str = "") -> None:
    """``--ray ADDRESS``: run the command's work on Ray instead of local processes, the
    address said the same way in every command (`RAY_ADDRESS_HELP`).

    parser : the command's parser
    what : what goes to Ray, as the start of the help ("simulate the ops on Ray instead")
    note : what else the command says of it, after the address (or nothing)
    """
    parser.add_argument("--ray", metavar="ADDRESS",
                        help=f"{what}: {RAY_ADDRESS_HELP}" + (f"; {note}" if note else ""))


def check_model_options(args: argparse.Namespace) -> None:
    """CliError for a bad ``--calibration``, ``--seed`` or ``--batch`` of a command that
    loads a model; an option the command does not take is not checked.

    args : the command's parsed arguments
    """
    calibration = getattr(args, "calibration", None)
    if calibration is not None and calibration < 1:
        raise CliError(f"--calibration must be a positive integer, not {calibration}")
    seed = getattr(args, "seed", None)
    if seed is not None and seed < 0:
        raise CliError(f"--seed must be a non-negative integer, not {seed}")
    batch = getattr(args, "batch", None)
    if batch is not None and batch < 1:
        raise CliError(f"--batch must be a positive integer, not {batch}")


def open_records(path: str | None) -> Records | None:
    """The tuning records ``--records`` names, opened for reading (the caller closes
    them), or None without the option. CliError for a file that does not exist: opening
    would create an empty one, and the run would silently use no tuned schedule.

    path : the option's value, or None
    """
    if path is None:
        return None
    if not Path(path).is_file():
        raise CliError(f"records file {path!r} does not exist (vdla tune --records {path} "
                       "writes one)")
    # heavy: the tuner loads numpy; only a command given --records needs it.
    from vdla.compiler.tuner import Records

    return Records(path)


#: Runs of the whole graph in one call that `whole_graph` times (their median is reported).
WHOLE_GRAPH_RUNS = 20


def whole_graph(outcome) -> tuple[float, dict[str, float], dict[str, float]] | None:
    """For a target that compiles the graph into one program (the CPU target): the
    median wall time of the whole graph in one call, of each op inside it and of each
    layout conversion the program runs between ops (`GraphRun.layout_seconds`), over
    `WHOLE_GRAPH_RUNS` runs after a warm-up run whose outputs must be the op-by-op run's;
    None for other targets. Shared by ``vdla run`` and ``vdla compare``.

    outcome : the `vdla.compiler.pipeline.Outcome` of an op-by-op run
    """
    # heavy: numpy; this module loads without it (vdla.cli's rule).
    import numpy as np

    with outcome.compiled.session() as session:
        first = session.run_graph(outcome.model.feed)
        if first is None:
            return None
        for name, value in first.outputs.items():
            if not np.array_equal(value, outcome.result.outputs[name]):
                raise CliError(f"the whole-graph run's output {name!r} differs from the "
                               "op-by-op run's")
        totals, per_op = [], {name: [] for name in first.op_seconds}
        per_layout = {name: [] for name in first.layout_seconds}
        for _ in range(WHOLE_GRAPH_RUNS):
            start = time.perf_counter()
            run = session.run_graph(outcome.model.feed)
            totals.append(time.perf_counter() - start)
            for name, seconds in run.op_seconds.items():
                per_op[name].append(seconds)
            for name, seconds in run.layout_seconds.items():
                per_layout[name].append(seconds)
    return (float(np.median(totals)), {k: float(np.median(v)) for k, v in per_op.items()},
            {k: float(np.median(v)) for k, v in per_layout.items()})
