"""``vdla config show``: a config's parameters, derived values and instruction layouts;
``vdla config list``: the configs shipped with vdla and their recorded figures."""

from __future__ import annotations

import json
from typing import Any, Mapping

from vdla.cli.common import CONFIG_HELP, table
from vdla.isa import layouts_for
from vdla.shipped import ShippedConfig, resolve_config, shipped_configs

__all__ = ["add_parser", "run", "run_list"]


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
                    "config name, features past VTA, the board it is meant for, whether "
                    "it fits that board and its measured figures, as its file records them "
                    "(nothing is synthesised or run).")
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
    """``vdla config list``: a table of the shipped configs (or ``--json``), each one's
    description below it. Reads the files only: ``fits`` and the figures are what was
    recorded there (`vdla estimate` and `vdla run` measure them afresh)."""
    entries = shipped_configs()
    if args.json:
        print(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return 0
    header = ("name", "config", "features", "board", "fits", "figures")
    rows = [(e.name, e.config.name, ", ".join(e.config.features) or "-", e.board or "-",
             _fits_cell(e), _runs_cell(e.figures.get("runs", []))) for e in entries]
    print("\n".join(table(header, rows)))
    for entry in entries:
        print(f"\n{entry.name}: {entry.description}")
        source = entry.figures.get("resources", {}).get("source")
        if source:
            print(f"  resources: {source}")
    print("\n--config NAME takes these names on every command; `vdla config show --config "
          "NAME` prints one in full.")
    return 0


def _fits_cell(entry: ShippedConfig) -> str:
    """``yes: LUT 22,502/53,200, ..., BRAM 126.5/140``, ``no: ...``, or ``?`` when not
    recorded."""
    verdict = {True: "yes", False: "no", None: "?"}[entry.fits]
    used = [f"{name.upper()} {use['used']:,g}/{use['of']:,g}"
            for name, use in entry.figures.get("resources", {}).items() if name != "source"]
    return f"{verdict}: {', '.join(used)}" if used else verdict


def _runs_cell(runs: list[Mapping[str, Any]]) -> str:
    """Each run as ``resnet18 8,364,316 cycles (verilator, bit-exact, c1cb93c, 8,930,290
    on CONFIG)``, ``;``-separated, or ``-``."""
    cells = []
    for run in runs:
        notes = [run[key] for key in ("backend",) if run.get(key)]
        if "bit_exact" in run:
            notes.append("bit-exact" if run["bit_exact"] else "NOT bit-exact")
        if run.get("commit"):
            notes.append(str(run["commit"]))
        baseline = run.get("baseline")
        if isinstance(baseline, Mapping) and "cycles" in baseline:
            notes.append(f"{baseline['cycles']:,} on {baseline.get('config', 'the baseline')}")
        cells.append(f"{run['model']} {run['cycles']:,} cycles"
                     + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(cells) or "-"
