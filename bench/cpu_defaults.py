"""The CPU target's default schedules on different machines, side by side: what the
default choosers make of each machine's model (`MachineModel.costs`: FMA lanes a cycle
at each vector width, L1d and L2 a core; the instruction set its flags allow).

The first machine is the one this runs on (its CPU model and instruction set named,
measured once and cached: `machine.machine_model`); each ``--machines`` file adds
another: a machine model as the cache writes it (``{"model": {...}}``, with an optional
``"note"`` saying where it comes from) or a bare `MachineModel.to_dict`.
bench/machines/ holds this project's host as measured and two written from published
specs (an AMD Zen 4 with AVX-512, an Intel Sapphire Rapids). Per model and precision it
prints the layers whose defaults differ between the machines (every layer with
``--all``) and how many differ; ``--plain`` gives the convolutions the plain layout's
choice (`choose_conv(..., blocked=False)`, where the chooser's cost model decides the
tiles) instead of the blocked layout's rules. Nothing is built or timed.

    python bench/cpu_defaults.py [--models resnet18 resnet50 mobilenet_v1 bert_tiny]
        [--precision int8 float32] [--threads 2] [--machines bench/machines/*.json]
        [--plain] [--all] [--out DIR]

Writes OUT/cpu_defaults.json with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vdla.compiler.pipeline import graph_for, load_model
from vdla.compiler.targets.cpu.machine import MachineModel, machine_model
from vdla.compiler.targets.cpu.schedule import choose_conv
from vdla.compiler.targets.cpu.target import CpuTarget, default_threads

ROOT = Path(__file__).resolve().parents[1]


def load_machine(path: Path) -> tuple[MachineModel, str]:
    """The machine model in `path` and its note ("" without one); ValueError naming the
    file for anything else."""
    try:
        data = json.loads(Path(path).read_text())
        model = MachineModel.from_dict(data.get("model", data))
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a machine model ({exc})") from None
    return model, str(data.get("note", ""))


def machine_target(model: MachineModel, threads: int, here: bool) -> CpuTarget:
    """A CPU target for `model`'s machine: this one's own (`here`), or another CPU's
    platform on the instruction set its flags allow."""
    if here:
        return CpuTarget(threads=threads)
    return CpuTarget(threads=threads, isa=model.vector_isa(), cpu=model.model_name,
                     machine=model)


def short(schedule) -> str:
    """A schedule in a few characters: layout, vector lanes, register tile, cache tiles."""
    d = schedule.to_dict()
    if "mr" in d and "tile_co" in d:
        kind = "W" if d.get("wino") else "B" if d.get("layout") == "nchwc" else "P"
        return (f"{kind} vl{d['vl']} {d['mr']}x{d['nv']} co{d['tile_co']} h{d['tile_h']}"
                f" ci{d['tile_ci']} {d['order']} u{d['unroll']} {d['parallel']}")
    if "ov" in d:
        return f"dense vl{d['vl']} ov{d['ov']} u{d['unroll']} {d['parallel']}"
    return f"mm vl{d['vl']} {d['mr']}x{d['nv']} u{d['unroll']} {d['parallel']} w{d['wide']}"


def defaults(target: CpuTarget, graph, plain: bool) -> dict[str, tuple[str, object]]:
    """Task key -> (its description, its default schedule on `target`)."""
    found = {}
    for task in target.tasks(graph):
        schedule = (choose_conv(task.shape, task._isa, task.threads, blocked=False,
                                costs=task.costs)
                    if plain and task.conv else task.default_schedule())
        found[task.key] = (task.describe(), schedule)
    return found


def compare(machines, models, precisions, threads, plain, every) -> list[dict]:
    """Print and return, per model and precision, the machines' defaults side by side."""
    results = []
    targets = [machine_target(m, threads, i == 0) for i, (m, _) in enumerate(machines)]
    names = [f"{m.model_name} ({t.isa.name}{', here' if i == 0 else ''})"
             for i, ((m, _), t) in enumerate(zip(machines, targets))]
    for model_name in models:
        model = load_model(model_name)
        for precision in precisions:
            graph = graph_for(model, targets[0], precision=precision)
            per = [defaults(t, graph, plain) for t in targets]
            rows, differ = [], 0
            for key, (what, _) in per[0].items():
                cells = [short(p[key][1]) if key in p else "-" for p in per]
                same = len(set(cells)) == 1
                differ += not same
                rows.append({"layer": what, "schedules": cells, "differ": not same})
            print(f"\n{model_name} {precision}: {differ} of {len(rows)} layers' defaults "
                  f"differ")
            for row in rows:
                if row["differ"] or every:
                    print(f"  {row['layer']}")
                    for name, cell in zip(names, row["schedules"]):
                        print(f"    {name:48.48s} {cell}")
            results.append({"model": model_name, "precision": precision, "layers": len(rows),
                            "differ": differ, "rows": rows})
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["resnet18", "resnet50", "mobilenet_v1", "bert_tiny"])
    parser.add_argument("--precision", nargs="+", default=["int8", "float32"],
                        choices=("int8", "float32"))
    parser.add_argument("--threads", type=int, default=None,
                        help="the team the defaults plan for (default: this process's cores)")
    parser.add_argument("--machines", nargs="*", type=Path,
                        default=sorted((ROOT / "bench" / "machines").glob("*.json")),
                        help="machine-model JSON files (default: bench/machines/*.json)")
    parser.add_argument("--plain", action="store_true",
                        help="the convolutions' plain-layout choice (the cost model's tiles)")
    parser.add_argument("--all", action="store_true", help="print every layer")
    parser.add_argument("--out", type=Path, help="write OUT/cpu_defaults.json")
    args = parser.parse_args(argv)
    threads = args.threads or default_threads()
    if threads < 1:
        parser.error("--threads must be positive")
    try:
        machines = [(machine_model(), "this machine, measured")]
        machines += [load_machine(path) for path in args.machines]
    except ValueError as exc:
        parser.error(str(exc))
    print(f"default schedules at {threads} threads"
          + (" (plain-layout convolutions)" if args.plain else ""))
    for (model, note), here in zip(machines, [True] + [False] * len(args.machines)):
        costs = model.costs()
        lanes = ", ".join(f"{bits}-bit {value:g}" for bits, value in costs.fma_lanes)
        print(f"  {model.model_name}: {model.vector_isa()}{' (this machine)' if here else ''}; "
              f"float32 lane-FMAs a cycle {lanes}; L1d {costs.l1d >> 10} KiB, "
              f"L2 {costs.l2 >> 10} KiB a core; AMX {'yes' if costs.amx else 'no'}"
              + (f"\n    {note}" if note and not here else ""))
    try:
        results = compare(machines, args.models, args.precision, threads, args.plain,
                          args.all)
    except ValueError as exc:         # a model load_model does not know
        parser.error(str(exc))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu_defaults.json").write_text(json.dumps(
            {"threads": threads, "plain": args.plain,
             "machines": [m.to_dict() for m, _ in machines], "results": results},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
