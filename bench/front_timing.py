"""The timing model against Verilator on every layer of ResNet-18, MobileNet-v1 and
ResNet-50, for every extension combination on the fronts of `bench/sweep_extensions.py`.

    python3 bench/front_timing.py FRONTS.json [--out front-timing.json] [--resume]
                                  [--models resnet18 mobilenet_v1 resnet50] [--jobs 2]
    python3 bench/front_timing.py --config NAME|FILE ...     # chosen configs instead

The sweep picks its fronts by the timing model, so the model has to hold wherever a front
goes. A *extension combination* is what a config's name adds to its sizes (``req-hold``,
``hold-dw3-bus128``, ...): the ISA extensions and the DRAM bus. The GEMM core's DSP limit is
left out: it builds some multiplier pairs from LUTs in the same pipeline, so it changes
no cycle (MobileNet-v1 on pynq-z1-plus took 2,082,662 cycles on Verilator with and
without it at commit 191557f). For each combination on either model's front (with or
without extensions) its fastest point (the most LUTs) runs every model layer by layer on
the cycle-accurate Verilator backend with the pynq-z1's DRAM (bit-exact against the
integer reference, `bench/model_layers.py`'s run), and each layer's cycles are set
beside the timing model's.

Prints, per config and model, the cycles, the model's total error, its worst layer and
the layers beyond 3%; then one line per combination. ``--jobs`` runs configs in that
many processes (each its own Verilator model). The results go to ``--out`` after every
config (atomically), so ``--resume`` goes on where a run stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_layers import _commit, run  # noqa: E402

from vdla import HardwareConfig  # noqa: E402
from vdla._fileio import atomic_write  # noqa: E402
from vdla.boards import get as get_board  # noqa: E402
from vdla.shipped import load_config  # noqa: E402

MODELS = ["resnet18", "mobilenet_v1", "resnet50"]
#: The error beyond which a layer counts as missed (the issue's goal).
LIMIT = 0.03


def combination(config: HardwareConfig) -> str:
    """What `config`'s name adds to its sizes but the DSP limit ("-" for VTA's ISA on the
    default bus)."""
    return "-".join(config.replace(gemm_dsp_limit=0).name.split("-")[1:]) or "-"


def front_configs(path: Path) -> list[HardwareConfig]:
    """One config per extension combination on the fronts in `path` (`sweep_extensions.py`'s
    fronts.json): the fastest, the one with the most LUTs."""
    doc = json.loads(path.read_text())
    board = get_board(doc.get("board", "pynq-z1"))
    chosen: dict[str, tuple[int, HardwareConfig]] = {}
    for fronts in doc["fronts"].values():
        for points in fronts.values():
            for p in points:
                config = board.apply(HardwareConfig.from_dict(p["config"]))
                key, lut = combination(config), p["objectives"]["lut"]
                if key not in chosen or lut > chosen[key][0]:
                    chosen[key] = (lut, config)
    return [config for _, config in sorted(chosen.values(), key=lambda x: x[0])]


def measure(config: HardwareConfig, models: list[str]) -> dict:
    """Every layer of `models` on `config`: Verilator's cycles and the timing model's."""
    sys.stdout = sys.stderr     # a worker's own progress stays off the table
    out = {}
    for model in models:
        result = run(model, {}, config)
        out[model] = {"seconds": round(result["seconds"], 1),
                      "layers": {r["name"]: [r["cycles"], r["model"]] for r in result["rows"]}}
    return out


def summary(model: str, layers: dict) -> tuple[str, list[str]]:
    """One line for `model`'s layers (name -> [Verilator, timing model]), and the layers
    beyond `LIMIT`."""
    cycles = sum(v for v, _ in layers.values())
    est = sum(e for _, e in layers.values())
    errors = {op: e / v - 1 for op, (v, e) in layers.items()}
    worst = max(errors, key=lambda op: abs(errors[op]))
    off = [op for op, err in errors.items() if abs(err) > LIMIT]
    return (f"  {model:<13} {cycles:>12,} {est:>12,} {100 * (est / cycles - 1):>+6.1f}%  "
            f"worst {worst} {100 * errors[worst]:+.1f}%; {len(off)} of {len(layers)} "
            f"beyond {100 * LIMIT:g}%" + (f" ({', '.join(off)})" if off else "")), off


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fronts", nargs="?", type=Path,
                        help="sweep_extensions.py's OUT/fronts.json")
    parser.add_argument("--config", nargs="+", metavar="NAME|FILE",
                        help="run these configs (shipped names or JSON files) instead")
    parser.add_argument("--models", nargs="+", default=MODELS, metavar="MODEL")
    parser.add_argument("--out", type=Path, default=Path("front-timing.json"))
    parser.add_argument("--resume", action="store_true",
                        help="keep the configs --out already holds and run the rest")
    parser.add_argument("--jobs", type=int, default=1, help="configs run at once")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be 1 or more, not {args.jobs}")
    if bool(args.fronts) == bool(args.config):
        parser.error("give either FRONTS.json or --config")
    if args.fronts and not args.fronts.is_file():
        parser.error(f"no fronts file at {args.fronts} (bench/sweep_extensions.py writes it)")
    configs = ([load_config(c) for c in args.config] if args.config
               else front_configs(args.fronts))
    doc = {"commit": _commit(), "models": args.models, "configs": {}}
    if args.resume and args.out.is_file():
        doc["configs"] = json.loads(args.out.read_text())["configs"]
    start = time.perf_counter()
    print(f"{len(configs)} configs x {len(args.models)} models on Verilator "
          f"(commit {doc['commit']})", flush=True)
    print(f"  {'model':<13} {'Verilator':>12} {'timing model':>12} {'err':>7}", flush=True)
    missed = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        # Submitted in order, reported in order; each result is saved as it arrives.
        running = {c.name: pool.submit(measure, c, args.models) for c in configs
                   if c.name not in doc["configs"]}
        for i, config in enumerate(configs, 1):
            name = config.name
            if name in running:
                doc["configs"][name] = {"combination": combination(config),
                                        "config": config.to_dict(),
                                        "models": running[name].result()}
                atomic_write(args.out, json.dumps(doc, indent=1).encode() + b"\n")
            print(f"[{i}/{len(configs)}] {name} ({combination(config)}; "
                  f"{config.dram_bytes_per_cycle:g} bytes a cycle)", flush=True)
            report(doc["configs"][name]["models"], missed.setdefault(name, []))
    print(f"\nper combination ({time.perf_counter() - start:.0f} s):")
    for name, off in missed.items():
        print(f"  {doc['configs'][name]['combination']:<28} {name.split('_')[0]:<8} "
              + (f"{len(off)} layers beyond {100 * LIMIT:g}%: {', '.join(off)}" if off
                 else f"every layer within {100 * LIMIT:g}%"))
    return 0


def report(models: dict, missed: list) -> None:
    """Print one config's models (`summary`) and add their layers beyond `LIMIT` to
    `missed`."""
    for model, result in models.items():
        line, off = summary(model, result["layers"])
        print(line, flush=True)
        missed.extend(f"{model} {op}" for op in off)


if __name__ == "__main__":
    sys.exit(main())
