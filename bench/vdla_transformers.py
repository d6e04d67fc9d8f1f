"""The zoo's transformers on the accelerator: where their cycles go, how close the matrix
products come to the GEMM core's bound, and what the host still does.

    python bench/vdla_transformers.py [--models bert_tiny gpt_mini vit_tiny bert_base]
                                      [--config NAME|FILE] [--backend functional|verilator]
                                      [--calibration N] [--json PATH]

Each model is quantized for the config, compiled, run once on the backend (the
functional simulator by default: the timing model gives the cycles; ``verilator``: the
cycle-accurate model's own, slower) and checked bit-exactly against the integer
reference. Per model it prints:

* the accelerator's matrix products (``qdense``, ``qconv2d``, and ``qmatmul``: the
  heads' products of an attention split head by head, `VdlaTarget.legalize`): their
  cycles, their MAC bound (the MACs they run / the core's MACs a cycle; an identity
  product that transposes v counts its own) and the share of it reached;
* the accelerator's other ops (views take none);
* the host's ops by kind, with the wall time they took in this run on this machine (its
  CPU named; they run vdla's reference kernels, numpy, as any session on the accelerator
  target runs its host ops), and the host's moves of activations to and from the
  accelerator;
* the end-to-end time at the config's clock: the accelerator's cycles / clock plus the
  host's time, and the accelerator's share of it. This is the comparison FlexViT's
  figures make (2.74x on the accelerated layers, 1.40x end to end): whatever stays on the
  host bounds the whole.

Host times are one run's wall times on the machine at hand; cycles do not depend on it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vdla._fileio import atomic_write  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.frontend.zoo_transformers import TRANSFORMERS  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.compiler.targets.cpu import isa as cpu_isa  # noqa: E402
from vdla.shipped import load_config  # noqa: E402

#: The transformers of the zoo this bench runs by default (bert_base: add it by name; a
#: functional run of it takes about a minute here).
DEFAULT_MODELS = ("bert_tiny", "gpt_mini", "vit_tiny")
GEMM = ("qdense", "qconv2d", "qmatmul")


def measure(name: str, config, backend: str, calibration: int) -> dict:
    """One model's run on `config`'s accelerator: the figures the module docstring lists."""
    target = get_target("vdla", config=config, backend=backend)
    start = time.perf_counter()
    model = pipeline.load_model(name, calibration=calibration, note=None)
    outcome = pipeline.run_model(model, target)
    if not outcome.bit_exact:
        raise SystemExit(f"{name}: not bit-exact against the reference: {outcome.mismatch}")
    graph = outcome.quantized
    cycles = {op.name: op.kernel.estimated_cycles for op in outcome.compiled.ops
              if op.target == "vdla" and op.kernel is not None}
    measured = backend == "verilator"
    gemm = other = macs = products = 0
    host = collections.defaultdict(lambda: [0, 0.0])
    for s in outcome.result.ops:
        if s.target == "vdla":
            c = (s.cycles if measured else cycles.get(s.name)) or 0
            if s.op in GEMM:
                gemm += c
                macs += s.macs or 0
                products += c * (s.op == "qmatmul")
            else:
                other += c
        else:
            host[s.op][0] += 1
            host[s.op][1] += s.wall_seconds
    moves = outcome.result.host_time()
    bound = macs / config.macs_per_cycle
    accel_s = (gemm + other) / (config.clock_mhz * 1e6)
    host_s = sum(seconds for _, seconds in host.values()) + moves["transfer_seconds"]
    return {"model": name, "nodes": len(list(graph.nodes())),
            "cycles_from": "verilator" if measured else "timing model", "gemm_cycles": gemm,
            "attention_cycles": products, "other_cycles": other,
            "mac_bound": round(bound), "gemm_share_of_bound": bound / gemm if gemm else None,
            "accelerator_ms": accel_s * 1e3, "host_ops": {op: {"count": n, "ms": s * 1e3}
                                                          for op, (n, s) in host.items()},
            "moves": moves["transfers"], "moved_bytes": moves["transfer_bytes"],
            "moves_ms": moves["transfer_seconds"] * 1e3, "host_ms": host_s * 1e3,
            "end_to_end_ms": (accel_s + host_s) * 1e3,
            "accelerator_share": accel_s / (accel_s + host_s),
            "seconds": time.perf_counter() - start}


def report(r: dict) -> None:
    share = r["gemm_share_of_bound"]

    def line(label: str, figure: str, note: str = "") -> None:
        print(f"  {label:<24}{figure:>14}  {note}".rstrip())

    print(f"{r['model']}: cycles from the {r['cycles_from']}, bit-exact")
    line("matrix products", f"{r['gemm_cycles']:,}",
         f"cycles; MAC bound {r['mac_bound']:,} ({share:.0%} of it reached)" if share
         else "cycles")
    line("  of them attention's", f"{r['attention_cycles']:,}",
         "cycles (its heads' products, where it runs head by head)")
    line("other accelerator ops", f"{r['other_cycles']:,}", "cycles")
    line("accelerator", f"{r['accelerator_ms']:.2f}", "ms at the config's clock")
    for op, h in sorted(r["host_ops"].items(), key=lambda kv: -kv[1]["ms"]):
        line(f"host {op}", f"{h['ms']:.2f}", f"ms ({h['count']} ops)")
    line("host moves", f"{r['moves_ms']:.2f}",
         f"ms ({r['moves']} moves, {r['moved_bytes']:,} bytes)")
    line("end to end", f"{r['end_to_end_ms']:.2f}",
         f"ms (the accelerator {r['accelerator_share']:.0%} of it) [{r['seconds']:.0f} s]")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL",
                   help=f"zoo transformers ({', '.join(TRANSFORMERS)}; default "
                        f"{' '.join(DEFAULT_MODELS)})")
    p.add_argument("--config", default="pynq-z1-plus", metavar="NAME|FILE",
                   help="a shipped config's name or a config file (default pynq-z1-plus)")
    p.add_argument("--backend", default="functional", choices=("functional", "verilator"),
                   help="functional: the timing model's cycles; verilator: measured cycles")
    p.add_argument("--calibration", type=int, default=2,
                   help="calibration samples (default 2)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in TRANSFORMERS]
    if unknown:
        p.error(f"--models: {', '.join(unknown)} is not a zoo transformer; choose from "
                f"{', '.join(TRANSFORMERS)}")
    if args.calibration < 1:
        p.error(f"--calibration must be at least 1, not {args.calibration}")
    try:
        config = load_config(args.config)
    except (ValueError, OSError) as exc:
        p.error(f"--config {args.config}: {exc}")
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "isa": cpu_isa.detect().name}
    print(f"config {args.config} ({config.name}) at {config.clock_mhz} MHz; host times on "
          f"{machine['cpu']} "
          f"({machine['cores']} cores, {machine['isa']})")
    results = []
    for name in args.models:
        results.append(measure(name, config, args.backend, args.calibration))
        report(results[-1])
    if args.json:
        figures = {"config": config.name, "machine": machine, "backend": args.backend,
                   "models": results}
        atomic_write(args.json, (json.dumps(figures, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
