"""``vdla config show``: a config's parameters, derived values and instruction layouts."""

from __future__ import annotations

import json

from vdla.cli.common import CONFIG_HELP, load_config
from vdla.isa import layouts_for

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    config = sub.add_parser("config", help="hardware configurations")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_sub.add_parser("show", help="print the parameters and derived values")
    show.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    show.add_argument("--json", action="store_true",
                      help="machine-readable output (which --config reads back)")
    show.set_defaults(func=run)


def run(args) -> int:
    config = load_config(args.config)
    derived = config.derived()
    layouts = {kind: layout.bit_ranges() for kind, layout in layouts_for(config).items()}
    if args.json:
        print(json.dumps({"parameters": config.to_dict(), "derived": derived,
                          "insn_layouts": layouts}, indent=2))
        return 0
    print(f"config {config.name}")
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
