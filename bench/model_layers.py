"""Whole models layer by layer on the default (VTA-compatible) config, or another
(`--config`): Verilator's cycles beside the timing model's, the model's error per layer,
and the cycles a baseline commit took, with each model's total against its goal.

    python bench/model_layers.py [--models resnet18 resnet50 mobilenet_v1]
                                 [--config FILE] [--board NAME] [--baseline PATH]
                                 [--save-baseline PATH]

Each model runs once on the cycle-accurate Verilator model (checked bit-exactly against
the integer reference); the timing model (`VdlaTarget.estimate`, what the default chooser
and the design-space sweep use) predicts every op of the same compiled graph. Columns:

* ``cycles``: Verilator; ``model``: the timing model; ``err``: model / Verilator - 1;
* ``util``: useful MACs / (cycles x MACs per cycle) of a GEMM op;
* ``floor``: the cycles the compute module cannot avoid with this lowering: the GEMM
  micro-ops plus the epilogue's ALU passes (one cycle each, two with a vector operand:
  the acc buffer has one read port), the timing model's ``gemm + epilogue``;
* ``before``: the baseline's cycles for the op (``--baseline``, a file this script's
  ``--save-baseline`` wrote at an earlier commit).

Each model's summary ends with a *lower bound on VTA's ISA*: its GEMM micro-ops (every
output entry times its input blocks and taps, as lowered) plus 5 compute cycles per
output entry (a reset, the bias, one shift, MAX and MIN: the fewest an int8 result
takes, with a per-tensor shift) plus the residuals' widening, with loads, stores, pools
and instruction overheads free. A goal below it cannot be met by compiling for this ISA.

``--save-baseline`` writes the run's per-op cycles (with the commit) for a later run.
``--board`` runs the config at the board's clock with the board's DRAM model (its bytes
a cycle and read latency), as ``vdla run --board`` does, and the timing model plans with
the same; without it the Verilator backend's default DRAM model (the config's bytes a
cycle, a 32-cycle read latency) is used, as the figures of these pages have been.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from vdla import HardwareConfig  # noqa: E402
from vdla._fileio import atomic_write  # noqa: E402
from vdla.boards import get as get_board  # noqa: E402
from vdla.shipped import load_config  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.compiler.targets.vdla.conv_layer import (Conv2dLayer, alu_passes,  # noqa: E402
                                                   conv2d_workload, residual_passes)
from vdla.compiler.targets.vdla.timing import estimate_conv2d  # noqa: E402
from vdla.compiler.targets.vdla.target import GEMM_OPS  # noqa: E402

#: Compute cycles per output entry no int8 result on VTA's ISA goes below: a reset, the
#: bias (a GEMM micro-op), a per-tensor shift, MAX and MIN.
MIN_EPILOGUE = 5
#: Each model's goal in cycles on the default config (the project's issue tracker).
GOALS = {"resnet18": 8_300_000, "resnet50": 19_000_000, "mobilenet_v1": 4_000_000}
#: ...and on pynq-z1's shipped config with extensions past VTA (no goal for other configs
#: with extensions, such as ``vta-plus``).
EXTENSION_GOALS = {"resnet18": 7_600_000, "mobilenet_v1": 2_800_000}
EXTENSION_GOAL_CONFIG = "pynq-z1-plus"
ROOT = Path(__file__).resolve().parent.parent


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def isa_bound(node, graph, target) -> int:
    """GEMM micro-ops + `MIN_EPILOGUE` per output entry + residual widening of a GEMM op
    (0 for other ops)."""
    if node.op not in GEMM_OPS:
        return 0
    layer = Conv2dLayer.from_node(node, graph, target.config)
    entries = layer.batch_blocks * layer.out_blocks * layer.out_h * layer.out_w
    return layer.gemm_uops + MIN_EPILOGUE * entries + layer.residual_uops


def floor_cycles(node, graph, target, schedule) -> int | None:
    """GEMM micro-ops plus epilogue passes of a GEMM op (None for other ops)."""
    if node.op not in GEMM_OPS:
        return None
    layer = Conv2dLayer.from_node(node, graph, target.config)
    workload = conv2d_workload(node, graph, target.config)
    e = estimate_conv2d(layer, schedule, target.config,
                        alu_passes=alu_passes(workload), residual_passes=residual_passes(workload))
    return e.gemm + e.epilogue


def run(model: str, baseline: dict, config: HardwareConfig | None = None,
        board=None) -> dict:
    """`model` on Verilator and the timing model; on `board` (a `vdla.boards.Board`)
    with its clock and DRAM model, else with the config's own."""
    options = {}
    if board is not None:
        config = board.apply(config)
        options["dram"] = board.dram_timing(config)
    target = get_target("vdla", config=config, **options)
    start = time.perf_counter()
    outcome = pipeline.run_model(model, target)
    if not outcome.bit_exact:
        raise SystemExit(f"{model}: not bit-exact against the reference: {outcome.mismatch}")
    graph = outcome.quantized
    schedules = {op.name: op.kernel.lowered.schedule for op in outcome.compiled.ops
                 if op.target == "vdla" and op.kernel.lowered is not None}
    estimates = {e.name: e for e in target.estimate(graph, schedules=schedules)}
    before = baseline.get(model, {})
    rows = []
    for stats in outcome.result.ops:
        if stats.target != "vdla" or not stats.cycles:
            continue
        est = estimates[stats.name].cycles
        node = graph.node(stats.name)
        rows.append(dict(name=stats.name, op=stats.op, cycles=stats.cycles, model=est,
                         util=(stats.macs / (stats.cycles * target.config.macs_per_cycle)
                               if stats.macs else None),
                         floor=floor_cycles(node, graph, target, schedules[stats.name]),
                         bound=isa_bound(node, graph, target),
                         before=before.get(stats.name)))
    return dict(model=model, rows=rows, seconds=time.perf_counter() - start,
                macs=sum(s.macs or 0 for s in outcome.result.ops if s.target == "vdla"))


def report(result: dict, config: HardwareConfig) -> list[str]:
    rows, model = result["rows"], result["model"]
    macs_per_cycle = config.macs_per_cycle
    vta = not config.program_extensions   # the DSP limit changes no cycle
    default = " (VTA's default)" if config == HardwareConfig() else ""
    lines = [f"{model}: Verilator, config {config.name}{default}, bit-exact",
             f"  {'op':<22} {'kind':<19} {'before':>10} {'cycles':>10} {'model':>10} "
             f"{'err':>7} {'util':>6} {'floor':>10}"]
    for r in rows:
        util = f"{100 * r['util']:.1f}%" if r["util"] else "-"
        before = f"{r['before']:,}" if r["before"] else "-"
        floor = f"{r['floor']:,}" if r["floor"] else "-"
        err = 100 * (r["model"] / r["cycles"] - 1)
        lines.append(f"  {r['name']:<22} {r['op']:<19} {before:>10} {r['cycles']:>10,} "
                     f"{r['model']:>10,} {err:>+6.1f}% {util:>6} {floor:>10}")
    total = sum(r["cycles"] for r in rows)
    est = sum(r["model"] for r in rows)
    floor = sum(r["floor"] or r["cycles"] for r in rows)
    bound = result["macs"] / macs_per_cycle
    worst = max(rows, key=lambda r: abs(r["model"] / r["cycles"] - 1))
    off = [r["name"] for r in rows if abs(r["model"] / r["cycles"] - 1) > 0.03]
    before = sum(r["before"] or 0 for r in rows)
    goal = (GOALS.get(model) if vta else EXTENSION_GOALS.get(model)
            if config == load_config(EXTENSION_GOAL_CONFIG) else None)
    lines += [
        f"  total: {total:,} cycles" + (f" (before: {before:,}, {before / total:.2f}x)"
                                        if before else "")
        + f"; MAC bound {bound:,.0f} ({100 * bound / total:.1f}% of it)"
        + (f"; goal {goal:,}: {'met' if total <= goal else 'MISSED'}" if goal else ""),
        f"  timing model: {est:,} in all ({100 * (est / total - 1):+.1f}%); worst layer "
        f"{worst['name']} {100 * (worst['model'] / worst['cycles'] - 1):+.1f}%; "
        f"{len(off)} of {len(rows)} ops beyond 3%" + (f" ({', '.join(off)})" if off else ""),
        f"  floor of this lowering (GEMM micro-ops + epilogue passes, pools as run): "
        f"{floor:,} cycles",
        *([f"  lower bound on VTA's ISA (GEMM micro-ops + {MIN_EPILOGUE} cycles per output "
           f"entry + residual widening; loads, stores, pools free): "
           f"{sum(r['bound'] for r in rows):,} cycles"
           + (f" ({'above' if sum(r['bound'] for r in rows) > goal else 'below'} the goal)"
              if goal else "")] if vta else []),
        f"  ({result['seconds']:.0f} s)"]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(GOALS), metavar="MODEL")
    parser.add_argument("--baseline", type=Path,
                        default=ROOT / "bench" / "baselines" / "models_f678c43.json",
                        help="per-op cycles of an earlier commit (default: %(default)s)")
    parser.add_argument("--save-baseline", type=Path, metavar="PATH",
                        help="write this run's per-op cycles here")
    parser.add_argument("--config", metavar="FILE|NAME",
                        help="the hardware config: a JSON file or a shipped config's name "
                             "(default: VTA's default config)")
    parser.add_argument("--board", metavar="NAME",
                        help="run at this board's clock with its DRAM model (default: the "
                             "Verilator backend's DRAM model)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    board = get_board(args.board) if args.board else None
    config = board.apply(config) if board else config
    baseline = {}
    if args.baseline and args.baseline.exists():
        baseline = json.loads(args.baseline.read_text())["cycles"]
    saved = {}
    for i, model in enumerate(args.models):
        result = run(model, baseline, config, board)
        print(("\n" if i else "") + "\n".join(report(result, config)), flush=True)
        saved[model] = {r["name"]: r["cycles"] for r in result["rows"]}
    if args.save_baseline:
        atomic_write(args.save_baseline, json.dumps(
            {"commit": _commit(), "command": "python bench/model_layers.py --save-baseline",
             "cycles": saved}, indent=1).encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
