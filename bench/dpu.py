"""vdla's ``zcu104-plus`` against the Vitis AI DPU (DPUCZDX8G B4096) on the ZCU104.

    python bench/dpu.py [--config zcu104-plus] [--models resnet50 resnet18 ...] [--jobs 2]
                        [--plot PATH]

Each model runs once on the cycle-accurate Verilator model of the config, at the
ZCU104's clock with its DRAM model (the board's bytes per cycle and read latency),
checked bit for bit against the integer reference. Beside it, the DPU's published
single-thread latency on the same board and the cycles it implies at the DPU's clock
(`DPU`, with their sources), the share of each one's MAC bound, and both latencies at the
config's stated clock and at 300 MHz.

Columns: ``cycles`` (Verilator), ``DPU cycles`` (the DPU's latency times 300 MHz),
``bound`` (useful MACs over MACs a cycle times cycles; both cores do 2,048 int8 MACs a
cycle), ``ms`` at the config's clock and at 300 MHz. The last column is the timing
model's cycles for the same program at 300 MHz through one HP port (17.75 bytes a
cycle instead of 32, and a 48-cycle read latency): what the cycles would become if the
design ran at the DPU's clock without the DPU's second data port. ``run s`` is the wall
time of the run on Verilator (op-parallel on ``--jobs`` local processes, with the
reference run that feeds them; compiling is not counted). ``--plot`` draws
the cycles side by side, each model's MAC bound marked.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from vdla.boards import get as get_board  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.dse.resources import ResourceModel  # noqa: E402
from vdla.shipped import resolve_config  # noqa: E402
from vdla.sim.verilator import DramTiming  # noqa: E402


@dataclasses.dataclass(frozen=True)
class DpuFigure:
    """One published DPU latency: the model, milliseconds, and the model zoo's name."""

    model: str
    latency_ms: float
    zoo_name: str


#: The DPU's clock and MACs a cycle on the ZCU104: 2 x B4096 at 300 MHz (Vitis AI 1.3's
#: ZCU104 platform); a B4096 core does 4,096 int8 operations, 2,048 MACs, a cycle
#: (PG338: pixel parallelism 8 x input channels 16 x output channels 16). Its data reach
#: DDR4 through two 128-bit HP ports: 32 bytes a cycle at 300 MHz.
DPU_MHZ = 300
DPU_MACS_PER_CYCLE = 2048
DPU_SOURCE = ("Xilinx Vitis AI 1.3 model zoo, ZCU104 performance table (single-thread "
              "latency, 2 x B4096 at 300 MHz); PG338 (DPUCZDX8G product guide) for the "
              "B4096's parallelism")
#: The published single-thread latencies (the DPU's own int8 models; same architectures
#: and input sizes as vdla's zoo).
DPU = {f.model: f for f in (
    DpuFigure("resnet50", 13.29, "cf_resnet50_imagenet_224_224_7.7G"),
    DpuFigure("resnet18", 5.27, "cf_resnet18_imagenet_224_224_3.65G"),
    DpuFigure("mobilenet_v1", 3.34, "tf_mobilenetv1_1.0_imagenet_224_224_1.14G"),
    DpuFigure("mobilenet_v2", 3.92, "cf_mobilenetv2_imagenet_224_224_0.59G"),
)}

#: At 300 MHz one 128-bit HP port (333 MHz at most) gives 16 x 333 / 300 bytes a cycle,
#: and the 160 ns read latency is 48 cycles.
ONE_PORT_300 = DramTiming(read_latency=48, bytes_per_cycle=17.75)


def dpu_cycles(model: str) -> int:
    """Cycles the DPU's published latency takes at its clock."""
    return round(DPU[model].latency_ms * 1e-3 * DPU_MHZ * 1e6)


def run(model: str, config, board, jobs: int) -> dict:
    """`model` on Verilator on `board` (bit-exact or SystemExit), and the timing model's
    cycles of the same schedules at 300 MHz through one HP port."""
    target = get_target("vdla", config=config, dram=board.dram_timing(config))
    outcome = pipeline.run_model(model, target, jobs=jobs)
    seconds = outcome.run_seconds
    if not outcome.bit_exact:
        raise SystemExit(f"{model}: not bit-exact against the reference: {outcome.mismatch}")
    ops = [s for s in outcome.result.ops if s.target == "vdla"]
    cycles = sum(s.cycles or 0 for s in ops)
    macs = sum(s.macs or 0 for s in ops)
    schedules = {op.name: op.kernel.lowered.schedule for op in outcome.compiled.ops
                 if op.target == "vdla" and op.kernel.lowered is not None}
    at_300 = dataclasses.replace(config, clock_mhz=DPU_MHZ,
                                 dram_bytes_per_cycle=ONE_PORT_300.bytes_per_cycle)
    slow = get_target("vdla", config=at_300, backend="functional", dram=ONE_PORT_300)
    one_port = sum(e.cycles or 0 for e in slow.estimate(outcome.quantized, schedules=schedules)
                   if e.target == "vdla")
    host = [s.name for s in outcome.result.ops if s.target == "host"]
    return dict(model=model, cycles=cycles, macs=macs, one_port=one_port, host=host,
                seconds=seconds)


def resource_lines(config, board, resources: dict | None) -> list[str]:
    """vdla's recorded resources (`resources`: a shipped config's figures, by yosys where
    its source says so, or None) beside the board's calibrated resource model, with the
    model's error against them."""
    family = board.family
    predicted = ResourceModel.for_board(board).predict(config).to_dict()
    capacity = board.part.capacity
    lines = ["", f"{'resource':<10} {'recorded':>10} {'model':>10} {'error':>7} {'of':>9}"]
    for key, value in predicted.items():
        unit = {"lut": family.lut_unit, "bram": family.bram_unit}.get(key, "")
        used = resources.get(key, {}).get("used") if resources else None
        error = f"{100 * (value / used - 1):+6.1f}%" if used else "      -"
        shown = f"{used:>10,g}" if used is not None else f"{'-':>10}"
        lines.append(f"{key:<10} {shown} {value:>10,.0f} {error} {getattr(capacity, key):>9,g}"
                     + (f"  ({unit})" if unit else ""))
    if resources:
        lines.append(f"recorded: {resources.get('source', '')}")
    return lines


def report(rows: list[dict], config, board, resources: dict | None) -> list[str]:
    mhz = config.clock_mhz
    lines = [f"vdla {config.name} on the {board.name} ({board.part.name}) at {mhz:g} MHz, "
             f"DRAM {config.dram_bytes_per_cycle:g} bytes a cycle; Verilator, bit-exact",
             f"DPU: {DPU_SOURCE}", "",
             f"{'model':<13} {'DPU ms':>7} {'DPU cycles':>11} {'DPU bound':>9} "
             f"{'vdla cycles':>12} {'vdla bound':>10} {'cycles vs DPU':>13} "
             f"{f'ms @{mhz:g}':>9} {'ms @300':>8} {'1 port @300':>12} {'run s':>6}"]
    for r in rows:
        dpu = dpu_cycles(r["model"])
        bound = r["macs"] / config.macs_per_cycle
        lines.append(
            f"{r['model']:<13} {DPU[r['model']].latency_ms:>7.2f} {dpu:>11,} "
            f"{100 * r['macs'] / DPU_MACS_PER_CYCLE / dpu:>8.1f}% {r['cycles']:>12,} "
            f"{100 * bound / r['cycles']:>9.1f}% {r['cycles'] / dpu:>12.2f}x "
            f"{r['cycles'] / (mhz * 1e3):>9.2f} {r['cycles'] / (DPU_MHZ * 1e3):>8.2f} "
            f"{r['one_port']:>12,} {r['seconds']:>6.1f}")
    lines += ["", f"MACs a cycle: vdla {config.macs_per_cycle:,}, DPU {DPU_MACS_PER_CYCLE:,}; "
              f"vdla's DSPs: {config.gemm_multipliers:,} (two int8 products each)"]
    lines += resource_lines(config, board, resources)
    host = sorted({h for r in rows for h in r["host"]})
    lines.append(f"on the host: {', '.join(host) if host else 'nothing'} (input quantize, "
                 "logits dequantize); every other op on vdla")
    return lines


def plot(rows: list[dict], config, path) -> None:
    """Bars of vdla's and the DPU's cycles per model, with the MAC bound marked."""
    import matplotlib  # plotting is optional: imported only when asked for
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    x = range(len(rows))
    width = 0.38
    ours = [r["cycles"] / 1e6 for r in rows]
    theirs = [dpu_cycles(r["model"]) / 1e6 for r in rows]
    ax.bar([i - width / 2 for i in x], ours, width, label=f"vdla {config.name}", color="#1f77b4")
    ax.bar([i + width / 2 for i in x], theirs, width,
           label=f"DPU B4096, published latency x {DPU_MHZ} MHz", color="#d62728")
    for i, r in enumerate(rows):
        bound = r["macs"] / config.macs_per_cycle / 1e6
        ax.hlines(bound, i - width, i + width, colors="black", linestyles="dashed",
                  label="MAC bound (2,048 MACs a cycle)" if i == 0 else None)
        ax.annotate(f"{ours[i] / theirs[i]:.2f}x", (i - width / 2, ours[i]), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(x), [r["model"] for r in rows])
    ax.set_ylabel("cycles (millions)")
    ax.set_title("ZCU104, batch 1, 2,048 int8 MACs a cycle each: cycles per inference")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="zcu104-plus", metavar="FILE|NAME",
                        help="the hardware config (default: %(default)s)")
    parser.add_argument("--board", default="zcu104", metavar="NAME")
    parser.add_argument("--models", nargs="+", default=list(DPU), choices=list(DPU),
                        metavar="MODEL")
    parser.add_argument("--jobs", type=int, default=2,
                        help="local processes the ops are simulated on (default: 2)")
    parser.add_argument("--plot", metavar="PATH", help="also draw the cycles as a PNG here")
    args = parser.parse_args(argv)
    resolved = resolve_config(args.config)
    board = get_board(args.board)
    config = board.apply(resolved.config)
    rows = []
    for model in args.models:
        rows.append(run(model, config, board, args.jobs))
        print(f"  {model}: {rows[-1]['cycles']:,} cycles, bit-exact "
              f"({rows[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
    resources = resolved.shipped.figures.get("resources") if resolved.shipped else None
    print("\n".join(report(rows, config, board, resources)))
    if args.plot:
        plot(rows, config, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
