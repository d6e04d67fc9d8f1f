"""``vdla config show``: a config's parameters, derived values and instruction layouts;
``vdla config list``: the configs shipped with vdla and their recorded figures."""

from __future__ import annotations

import json
import textwrap
from typing import Any, Mapping

from vdla.cli.common import CONFIG_HELP, table
from vdla.isa import layouts_for
from vdla.shipped import ShippedConfig, resolve_config, shipped_configs

__all__ = ["WIDTH", "add_parser", "run", "run_list"]

#: Columns of ``vdla config list``'s default output: what any terminal shows unbroken.
#: The figures and descriptions are longer than a line (``--wide`` keeps them unbroken).
WIDTH = 80
#: The listing's last line.
FOOTER = ("--config NAME takes these names on every command; `vdla config show --config "
          "NAME` prints one in full.")


def add_parser(sub) -> None:
    config = sub.add_parser("config", help="hardware configurations")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_sub.add_parser("show", help="print the parameters and derived values")
    show.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    show.add_argument("--json", action="store_true",
                      help="machine-readable output (which --config reads back)")
    show.set_defaults(func=run)
    listing = config_sub.add_parser(
        "list", help="the configs shipped with vdla (names --config takes)",
        description="The configs shipped with vdla: each one's name (what --config takes), "
                    "config name, extensions past VTA, the board it is meant for, whether "
                    "it fits that board and its measured figures with the commit they were "
                    "measured at, as its file records them (nothing is synthesised or "
                    f"run). Printed as one block per config, {WIDTH} columns wide.")
    listing.add_argument("--wide", action="store_true",
                         help="one table row per config, each as long as its figures "
                              "make it (for a wide terminal or grep)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=run_list)


def run(args) -> int:
    """``vdla config show``: the config ``--config`` names (a file or a shipped name), as
    text (with the shipped config's description, when it is one) or ``--json`` (the
    document ``--config`` reads back)."""
    resolved = resolve_config(args.config)
    config = resolved.config
    derived = config.derived()
    layouts = {kind: layout.bit_ranges() for kind, layout in layouts_for(config).items()}
    if args.json:
        print(json.dumps({"parameters": config.to_dict(), "derived": derived,
                          "insn_layouts": layouts}, indent=2))
        return 0
    print(f"config {config.name}")
    if resolved.shipped is not None:
        entry = resolved.shipped
        board = f" for {entry.board}" if entry.board else ""
        print(f"shipped as {entry.name}{board}: {entry.description}")
    print("parameters:")
    for key, value in config.to_dict().items():
        print(f"  {key:<18} {', '.join(value) if isinstance(value, list) else value}")
    print("derived:")
    for key, value in derived.items():
        if key != "name":
            print(f"  {key:<18} {value}")
    print("instruction layouts (field: bits):")
    for kind, fields in layouts.items():
        print(f"  {kind:<7}" + ", ".join(f"{name} {bits}" for name, bits in fields.items()))
    return 0


def run_list(args) -> int:
    """``vdla config list``: the shipped configs, a block each wrapped to `WIDTH` columns
    (``--wide``: a table row each, its description below it; ``--json``: the documents).
    Reads the files only: ``fits`` and the figures are what was recorded there, at the
    commit each run names (`vdla estimate` and `vdla run` measure them afresh)."""
    entries = shipped_configs()
    if args.json:
        print(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return 0
    if not args.wide:
        print("\n\n".join("\n".join(_block(entry)) for entry in entries))
        print("\n" + textwrap.fill(FOOTER + " `--wide` prints a row per config.", WIDTH))
        return 0
    header = ("name", "config", "extensions", "board", "fits", "figures")
    rows = [(e.name, e.config.name, ", ".join(e.config.extensions) or "-", e.board or "-",
             _fits_cell(e), _runs_cell(e.figures.get("runs", []))) for e in entries]
    print("\n".join(table(header, rows)))
    for entry in entries:
        print(f"\n{entry.name}: {entry.description}")
        source = entry.figures.get("resources", {}).get("source")
        if source:
            print(f"  resources: {source}")
    print(f"\n{FOOTER}")
    return 0


def _block(entry: ShippedConfig) -> list[str]:
    """The lines of one shipped config in the default listing: its name and description,
    then one labelled field a line, each wrapped to `WIDTH` columns under its label (the
    config name alone is never broken: it is what a reader copies)."""
    lines = [f"{entry.name}: {entry.config.name}"]
    lines += textwrap.wrap(entry.description, WIDTH, initial_indent="  ",
                           subsequent_indent="  ", break_on_hyphens=False)
    fields = [("extensions", ", ".join(entry.config.extensions) or "-"),
              ("board", entry.board or "-"), ("fits", _fits_cell(entry))]
    source = entry.figures.get("resources", {}).get("source")
    if source:
        fields.append(("resources", source))
    runs = entry.figures.get("runs", [])
    fields += [("runs" if i == 0 else "", _runs_cell([run])) for i, run in enumerate(runs)]
    if not runs:
        fields.append(("runs", "-"))
    label = max(len(name) for name, _ in fields) + 2
    for name, text in fields:
        lines += textwrap.wrap(text, WIDTH, initial_indent=f"  {name:<{label}}",
                               subsequent_indent=" " * (label + 2), break_long_words=False,
                               break_on_hyphens=False)
    return lines


def _fits_cell(entry: ShippedConfig) -> str:
    """``yes: LUT 22,502/53,200, ..., BRAM 126.5/140``, ``no: ...``, or ``?`` when not
    recorded."""
    verdict = {True: "yes", False: "no", None: "?"}[entry.fits]
    used = [f"{name.upper()} {use['used']:,g}/{use['of']:,g}"
            for name, use in entry.figures.get("resources", {}).items() if name != "source"]
    return f"{verdict}: {', '.join(used)}" if used else verdict


def _runs_cell(runs: list[Mapping[str, Any]]) -> str:
    """Each run as ``resnet18 8,362,452 cycles (verilator, bit-exact, commit 73946b6,
    8,927,958 on CONFIG)``, ``;``-separated, or ``-``. The commit is the one the cycles
    were measured at: a later commit may run the model in other cycles."""
    cells = []
    for run in runs:
        notes = [run[key] for key in ("backend",) if run.get(key)]
        if "bit_exact" in run:
            notes.append("bit-exact" if run["bit_exact"] else "NOT bit-exact")
        if run.get("commit"):
            notes.append(f"commit {run['commit']}")
        baseline = run.get("baseline")
        if isinstance(baseline, Mapping) and "cycles" in baseline:
            notes.append(f"{baseline['cycles']:,} on {baseline.get('config', 'the baseline')}")
        cells.append(f"{run['model']} {run['cycles']:,} cycles"
                     + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(cells) or "-"
