"""The pynq-z1 design space with the extensions past VTA as dimensions: ResNet-18 and
MobileNet-v1, each a ``vdla sweep`` over the GEMM core's shape, the accumulator buffer,
the DRAM bus's width, the ALU's REQ, alu_hold, the GEMM core's DSP limit and its
depthwise window (every extension of `vdla.extensions`), then the Pareto fronts of latency
against LUTs with and without the extensions in one plot.

    python bench/sweep_extensions.py [--out bench-sweep-extensions] [--jobs 2]
                                     [--models resnet18 mobilenet_v1]
    python bench/sweep_extensions.py --replot FRONTS.json [--out DIR]   # the plot alone

Every point is priced by the timing model and the resource model (calibrated per family
on yosys; `vdla.dse.resources`), and only points that fit the xc7z020 count. A point is
*without extensions* when it is VTA's ISA and hardware (no REQ, no hold, every multiplier
a DSP, no depthwise window). Prints, per model, both fronts (the best point of each at
the most LUTs it may use) and writes ``OUT/<model>/`` (the sweep's own reports, its printed table in
``sweep.txt``), ``OUT/fronts.png`` and ``OUT/fronts.json`` (both fronts of each model,
every point with its config, for ``bench/front_timing.py``). ``--replot`` draws
``OUT/fronts.png`` again from an earlier run's ``fronts.json``, sweeping nothing.
Confirmation runs of front points: ``bench/front_timing.py`` runs the timing model
against Verilator on every extension combination of the fronts; ``vdla sweep --confirm``
adds yosys; the shipped configs (``vdla config list``) carry the ones that were run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vdla import HardwareConfig  # noqa: E402
from vdla._fileio import atomic_write  # noqa: E402
from vdla.cli import main as vdla_main  # noqa: E402
from vdla.extensions import EXTENSIONS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_layers import _commit  # noqa: E402

BASE_OPS = ["MIN", "MAX", "ADD", "SHR"]
#: The pynq-z1's part's LUTs (the plot's right edge).
XC7Z020_LUTS = 53_200
#: The grid: every (block_in, block_out) from 8 to 32, two sizes of the acc buffer (the
#: wgt buffer at 128 KiB: 256 KiB was within 0.5% of its cycles on every front point of
#: an earlier run with both, at commit 702fe43, and the same block RAM), the DRAM bus at
#: the HP port's width and at twice it (bridged to the port at 150 MHz: 12 bytes a cycle
#: instead of 8; either front may take it, it is VTA's parameter), and
#: every extension past VTA, off and at its example value (`vdla.extensions`: REQ, hold,
#: a three-tap depthwise window where block_out is a multiple of block_in, the DSP limit
#: of the xc7z020's 220 DSP48s).
PARAMETERS = {
    "block_in": [8, 16, 32],
    "block_out": [8, 16, 32],
    "wgt_buff_size": ["128K"],
    "acc_buff_size": ["64K", "128K"],
    "dram_bus_width": [64, 128],
    **{ext.field: ([BASE_OPS, BASE_OPS + [ext.alu_op]] if ext.kind == "alu_op"
                   else [False if ext.kind == "flag" else 0, ext.example])
       for ext in EXTENSIONS},
}


def spec_text(model: str) -> str:
    """The sweep's TOML spec for `model`."""
    lines = ['board = "pynq-z1"', 'search = "grid"', 'objectives = ["latency_ms", "lut"]', "",
             "[[models]]", f'name = "{model}"', "", "[parameters]"]
    # JSON's lists, strings and booleans are TOML's.
    lines += [f"{name} = {json.dumps(values)}" for name, values in PARAMETERS.items()]
    lines += ["", "[constraints]", "fits = true"]
    return "\n".join(lines) + "\n"


def has_extensions(config: dict) -> bool:
    """Whether a point's config has an extension past VTA."""
    return bool(HardwareConfig.from_dict(config).extensions)


def front(points: list[dict]) -> list[dict]:
    """The latency/LUT Pareto front of `points` (valid, fitting), by LUTs."""
    best, out = None, []
    for p in sorted(points, key=lambda p: (p["objectives"]["lut"],
                                           p["objectives"]["latency_ms"])):
        if best is None or p["objectives"]["latency_ms"] < best:
            best = p["objectives"]["latency_ms"]
            out.append(p)
    return out


def sweep(model: str, out: Path, jobs: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "spec.toml"
    atomic_write(spec, spec_text(model).encode())
    # The sweep's own report (its front with every parameter) goes to OUT/<model>/.
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        status = vdla_main(["sweep", str(spec), "--out", str(out), "--jobs", str(jobs)])
    atomic_write(out / "sweep.txt", report.getvalue().encode())
    if status:
        raise SystemExit(f"vdla sweep failed for {model} (exit {status})")
    doc = json.loads((out / "sweep.json").read_text())
    fitting = [p for p in doc["points"] if p["valid"] and p.get("fits")]
    plain = [p for p in fitting if not has_extensions(p["config"])]
    return {"model": model, "points": len(doc["points"]), "fitting": len(fitting),
            "with": front(fitting), "without": front(plain)}


def report(result: dict) -> list[str]:
    lines = [f"{result['model']}: {result['points']} points, {result['fitting']} fit the "
             "xc7z020; Pareto fronts of latency (ms at 100 MHz, timing model) against LUTs "
             "(resource model)"]
    for kind in ("without", "with"):
        lines.append(f"  {kind} extensions:")
        for p in result[kind]:
            o = p["objectives"]
            lines.append(f"    {p['config_name']:<48} {o['lut']:>7,} LUT  "
                         f"{o['latency_ms']:8.2f} ms")
    best = {k: min(result[k], key=lambda p: p["objectives"]["latency_ms"])
            for k in ("without", "with")}
    a, b = (best[k]["objectives"]["latency_ms"] for k in ("without", "with"))
    lines.append(f"  fastest without: {best['without']['config_name']} {a:.2f} ms; with: "
                 f"{best['with']['config_name']} {b:.2f} ms ({a / b:.2f}x)")
    return lines


def plot(results: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, result in zip(axes[0], results):
        # The fronts run on to the part's LUTs (the best a design within them reaches);
        # the front without extensions on top, open, where the two coincide.
        for kind, style in (("with", dict(color="tab:blue", marker="s", zorder=2)),
                            ("without", dict(color="black", marker="o", linestyle="--",
                                             markerfacecolor="none", zorder=3))):
            pts = result[kind]
            xs = [p["objectives"]["lut"] for p in pts] + [XC7Z020_LUTS]
            ys = [p["objectives"]["latency_ms"] for p in pts]
            best = pts[-1]
            short = best["config_name"].split("_")[0] + "".join(
                f"-{x}" for x in best["config_name"].split("-")[1:])
            ax.step(xs, ys + ys[-1:], where="post", markevery=range(len(pts)),
                    label=f"{kind} extensions past VTA\n(fastest: {short}, "
                          f"{best['objectives']['latency_ms']:.1f} ms)", **style)
        ax.axvline(XC7Z020_LUTS, color="tab:red", linestyle=":", label="xc7z020 LUTs")
        ax.set_xlabel("LUTs (resource model)")
        ax.set_ylabel("latency, ms at 100 MHz (timing model)")
        ax.set_title(f"{result['model']} on pynq-z1: Pareto fronts")
        ax.grid(alpha=0.3)
        # The fronts fall from the upper left: the legend goes above their right ends.
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, png.getvalue())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-sweep-extensions", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v1"])
    parser.add_argument("--replot", type=Path, metavar="FRONTS.json",
                        help="only draw OUT/fronts.png from an earlier run's fronts.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.replot:
        if not args.replot.is_file():
            parser.error(f"no fronts file at {args.replot} (a run of this script writes it)")
        doc = json.loads(args.replot.read_text())
        plot([{"model": model, **fronts} for model, fronts in doc["fronts"].items()],
             args.out / "fronts.png")
        print(f"wrote {args.out / 'fronts.png'} from {args.replot} (commit "
              f"{doc.get('commit', 'unknown')})")
        return 0
    results = [sweep(model, args.out / model, args.jobs) for model in args.models]
    for i, result in enumerate(results):
        print(("\n" if i else "") + "\n".join(report(result)))
    plot(results, args.out / "fronts.png")
    fronts = {r["model"]: {kind: [{key: p[key] for key in ("config_name", "config", "objectives")}
                                  for p in r[kind]] for kind in ("with", "without")}
              for r in results}
    commit = _commit()
    atomic_write(args.out / "fronts.json", json.dumps(
        {"board": "pynq-z1", "command": "python3 bench/sweep_extensions.py", "commit": commit,
         "fronts": fronts},
        indent=1).encode() + b"\n")
    print(f"wrote {args.out / 'fronts.png'} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
