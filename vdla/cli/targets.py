"""``vdla targets``: the targets models compile for, and what each runs."""

from __future__ import annotations

import itertools
import json
import textwrap

from vdla.cli.common import log
from vdla.cli.target_args import add_target_options, make_target, unavailable
from vdla.compiler import targets

__all__ = ["add_parser", "run"]

#: The widest the op column of the listing gets (characters).
OP_COLUMN = 28


def add_parser(sub) -> None:
    cmd = sub.add_parser("targets", help="list the targets (back halves) and what each runs",
                         description="List the targets a model compiles for (`vdla run "
                                     "--target NAME`): what each is, the requantization "
                                     "modes it runs, how its schedules are tuned, and the "
                                     "ops it runs; any other op falls back to the host. "
                                     "A target that runs on this machine (cpu) describes "
                                     "it too, from figures measured once and cached.")
    add_target_options(cmd, "targets")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.add_argument("--no-cache", action="store_true",
                     help="measure this machine again even when a cached model exists")
    cmd.set_defaults(func=run)


def _describe(name: str, args) -> tuple[dict, list[str]]:
    """Target `name` as JSON values, and its machine's lines (`Target.machine_lines`)."""
    if unavailable(name) is None:
        target = make_target(name, args, "targets", strict=False)
    else:           # still listed, as far as it can say without its extra
        target = targets.get(name)
    machine = target.machine(use_cache=not args.no_cache, log=log)
    return ({"name": name, "description": target.description, "options": target.options(),
             "requant_modes": list(target.requant_modes),
             "measure_backends": list(target.measure_backends),
             "machine": machine,
             "ops": [{"op": op, "runs": what} for op, what in target.capabilities()]},
            [] if machine is None else target.machine_lines(machine))


def run(args) -> int:
    described = [_describe(name, args) for name in targets.names()]
    if args.json:
        print(json.dumps([t for t, _ in described], indent=2))
        return 0
    for t, machine in described:
        settings = ", ".join(f"{k} {v}" for k, v in t["options"].items() if v is not None)
        print(f"{t['name']}: {t['description']}" + (f" ({settings})" if settings else ""))
        print(f"  requantization: {', '.join(t['requant_modes'])}; tuning: "
              + (", ".join(t["measure_backends"]) or "none"))
        # The machine's first line names it; the others are indented under it.
        for i, line in enumerate(machine):
            print(f"  machine: {line}" if i == 0 else f"    {line}")
        # The op column no wider than OP_COLUMN: a long list of ops wraps in it.
        width = min(max((len(o["op"]) for o in t["ops"]), default=0), OP_COLUMN)
        for o in t["ops"]:
            names = textwrap.wrap(o["op"], width) or [""]
            lines = textwrap.wrap(o["runs"], 88 - width - 4) or [""]
            for name, line in itertools.zip_longest(names, lines, fillvalue=""):
                print(f"  {name:<{width}}  {line}".rstrip())
        print()
    print("Ops a target does not run fall back to the host target (the numpy reference "
          "kernels). `vdla run MODEL --target NAME` picks one.")
    return 0
