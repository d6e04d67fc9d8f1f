"""``vdla targets``: the targets models compile for, and what each runs."""

from __future__ import annotations

import json
import textwrap

from vdla.cli.common import CONFIG_HELP, load_config
from vdla.compiler import targets

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    cmd = sub.add_parser("targets", help="list the targets (back halves) and what each runs",
                         description="List the targets a model compiles for (`vdla run "
                                     "--target NAME`): what each is, the requantization "
                                     "modes it runs, how its schedules are tuned, and the "
                                     "ops it runs; any other op falls back to the host.")
    cmd.add_argument("--config", metavar="FILE", help=CONFIG_HELP + " (for the vdla target)")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=run)


def _describe(name: str, config) -> dict:
    target = targets.get(name, config=config) if name == "vdla" else targets.get(name)
    return {"name": name, "description": target.description, "options": target.options(),
            "requant_modes": list(target.requant_modes),
            "measure_backends": list(target.measure_backends),
            "ops": [{"op": op, "runs": what} for op, what in target.capabilities()]}


def run(args) -> int:
    config = load_config(args.config)
    found = [_describe(name, config) for name in targets.names()]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for t in found:
        settings = ", ".join(f"{k} {v}" for k, v in t["options"].items() if v is not None)
        print(f"{t['name']}: {t['description']}" + (f" ({settings})" if settings else ""))
        print(f"  requantization: {', '.join(t['requant_modes'])}; tuning: "
              + (", ".join(t["measure_backends"]) or "none"))
        width = max((len(o["op"]) for o in t["ops"]), default=0)
        for o in t["ops"]:
            lines = textwrap.wrap(o["runs"], 88 - width - 4) or [""]
            print(f"  {o['op']:<{width}}  {lines[0]}")
            for more in lines[1:]:
                print(f"  {'':<{width}}  {more}")
        print()
    print("Ops a target does not run fall back to the host target (the numpy reference "
          "kernels). `vdla run MODEL --target NAME` picks one.")
    return 0
