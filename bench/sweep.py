"""Design-space sweep of ResNet-18 on pynq-z1's xc7z020, then its front confirmed.

    python bench/sweep.py [--spec bench/sweep_resnet18_pynq.toml] [--confirm 5] [--jobs 2]

Runs ``vdla sweep`` (the same code path as the command) on the spec's grid (972 points:
the GEMM core's shape, every buffer, the ALU's multiplier) with the timing and resource
models, then confirms `--confirm` points spread along the Pareto front with Verilator
(whole-model cycles, outputs bit-exact) and yosys (the ``vdla estimate`` flow), and
prints these figures:

* at least 500 valid design points in at most 30 minutes on this 2-core machine;
* on each confirmed point, the timing model within 5% of Verilator's cycles, and the
  resource model within 15% of yosys for LUT and BRAM and exact for DSP.

The store (``OUT/sweep.db``) keeps every point and confirmation: a second run answers
from it (``--fresh`` starts over). Writes the reports to ``OUT`` (default
``bench-sweep``): front.md, sweep.png/svg, report.html, sweep.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from vdla.cli import main as vdla_main

SWEEP_LIMIT_S = 30 * 60
VALID_GOAL = 500
CYCLES_TOLERANCE = 0.05
RESOURCE_TOLERANCE = 0.15


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    parser.add_argument("--spec", default=str(here / "sweep_resnet18_pynq.toml"))
    parser.add_argument("--out", default="bench-sweep")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--confirm", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="delete OUT's store first")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.fresh and out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    status = vdla_main(["sweep", args.spec, "--out", str(out), "--jobs", str(args.jobs),
                        "--confirm", str(args.confirm), "--best", str(out / "best.json")])
    wall = time.perf_counter() - start
    if status:
        return status
    doc = json.loads((out / "sweep.json").read_text())
    points, meta = doc["points"], doc["meta"]
    valid = [p for p in points if p["valid"]]
    front = {k for k in doc["front"]}
    confirmed = [p for p in points if p.get("confirmed") and p["key"] in front]
    print()
    print(f"sweep: {len(points)} points, {len(valid)} valid ({'meets' if len(valid) >= VALID_GOAL else 'MISSES'} "
          f"the {VALID_GOAL}), models phase {meta['seconds']:.0f} s "
          f"({'within' if meta['seconds'] <= SWEEP_LIMIT_S else 'OVER'} 30 min; "
          f"{meta['reused']} answered from the store); whole run with confirmation {wall:.0f} s")
    if not confirmed:
        print("no confirmed points")
        return 0
    print(f"{'config':<34}{'Verilator cycles':>17}{'model':>9}{'yosys LUT':>11}{'model':>9}"
          f"{'BRAM':>8}{'model':>9}{'DSP':>6}{'diff':>6}  bit-exact")
    ok = True
    for p in sorted(confirmed, key=lambda p: p["objectives"]["latency_ms"]):
        c, e = p["confirmed"], p["confirmed"]["error"]
        r = c["resources"]
        good = (abs(e["cycles"]) <= CYCLES_TOLERANCE and abs(e["lut"]) <= RESOURCE_TOLERANCE
                and abs(e["bram"]) <= RESOURCE_TOLERANCE and e["dsp"] == 0 and c["bit_exact"])
        ok &= good
        print(f"{p['config_name']:<34}{c['cycles']:>17,}{100 * e['cycles']:>+8.1f}%"
              f"{r['lut']:>11,.0f}{100 * e['lut']:>+8.1f}%{r['bram']:>8g}{100 * e['bram']:>+8.1f}%"
              f"{r['dsp']:>6g}{e['dsp']:>+6g}  {'yes' if c['bit_exact'] else 'NO'}"
              + ("" if good else "  <- outside the tolerance"))
    print(f"{len(confirmed)} confirmed front points: "
          + ("every one within 5% (cycles), 15% (LUT, BRAM), exact (DSP)" if ok else
             "NOT all within the tolerances"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
