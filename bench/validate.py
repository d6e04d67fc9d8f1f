"""How the validator's cycle estimate bounds real runs: the default cycle budget's margin.

Every program is validated before it runs (`vdla.sim.validate`); a Verilator run's default
budget is ``BUDGET_MARGIN`` x the validator's estimate + ``BUDGET_SLACK``. The estimate
sums every instruction's worst case as if nothing overlapped, so it should sit above the
measured cycles with room to spare, under every DRAM timing; a run that goes past the
budget is then a hang, not a slow program.

Runs ResNet-18's conv layers (their default schedules, one and two virtual threads) and
blocked GEMMs on Verilator under the default DRAM model and a slow one (1 byte per cycle,
200 cycles of latency, as a board's DDR behind a narrow port might be), and prints per
program: measured cycles, the lower bound, the estimate, measured / estimate and the
budget. The figure to watch is the largest measured / estimate: the budget trips only past
``BUDGET_MARGIN`` x that.

    python bench/validate.py [--layers C2 C8] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import vdla  # noqa: E402
from vdla.compiler.frontend.workloads import RESNET18, workload_graph  # noqa: E402
from vdla.compiler.targets.vdla import (Conv2dLayer, choose_conv2d, lower_conv2d,  # noqa: E402
                                        run_conv2d)
from vdla.runtime.kernels import blocked_gemm  # noqa: E402
from vdla.sim.validate import BUDGET_MARGIN, BUDGET_SLACK  # noqa: E402
from vdla.sim.verilator import DramTiming  # noqa: E402

TIMINGS = {"default": DramTiming(), "slow": DramTiming(read_latency=200, write_latency=100,
                                                       bytes_per_cycle=1.0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", default=[f"C{i}" for i in range(1, 12)],
                        choices=list(RESNET18))
    parser.add_argument("--quick", action="store_true",
                        help="C2, C8 and one GEMM only (a check that the script runs)")
    args = parser.parse_args(argv)
    layers = ["C2", "C8"] if args.quick else args.layers
    config = vdla.HardwareConfig()
    print(f"Validator estimate vs Verilator cycles, config {config.name}; default budget = "
          f"{BUDGET_MARGIN} x estimate + {BUDGET_SLACK:,}")
    print(f"{'dram':8s} {'program':16s} {'cycles':>10s} {'minimum':>10s} {'estimate':>11s} "
          f"{'cyc/est':>8s} {'budget':>12s}")
    worst = {}
    start = time.perf_counter()
    for timing_name, timing in TIMINGS.items():
        dev = vdla.runtime.open(config, backend="verilator", dram=timing,
                                log=lambda message: None)
        programs = []
        for name in layers:
            graph, feed = workload_graph(RESNET18[name])
            node = graph.node("conv")
            layer = Conv2dLayer.from_node(node, graph, config)
            for threads in (1, 2):
                programs.append((f"{name} {threads}thr", lambda node=node, graph=graph,
                                 feed=feed, layer=layer, threads=threads: run_conv2d(
                    dev, lower_conv2d(node, graph, config,
                                      choose_conv2d(layer, config, nthreads=threads)),
                    feed["x"], graph.tensors["w"].data, graph.tensors["b"].data,
                    return_stats=True)[1]))
        rng = np.random.default_rng(0)
        for m, n, k in ([(64, 64, 64)] if args.quick else [(64, 64, 64), (256, 256, 256)]):
            a = rng.integers(-128, 128, (m, k)).astype(np.int8)
            b = rng.integers(-128, 128, (n, k)).astype(np.int8)
            for threads in (1, 2):
                programs.append((f"gemm {m} {threads}thr", lambda a=a, b=b, threads=threads:
                                 blocked_gemm(dev, a, b, shift=8, virtual_threads=threads)[1]))
        for label, run in programs:
            stats = run()
            plan = dev.simulator.plan
            cycles = stats["cycles"]
            ratio = cycles / plan.estimate
            worst[timing_name] = max(worst.get(timing_name, 0.0), ratio)
            print(f"{timing_name:8s} {label:16s} {cycles:10,d} {plan.minimum:10,d} "
                  f"{plan.estimate:11,d} {ratio:8.2f} {plan.budget:12,d}", flush=True)
        dev.close()
    print()
    for name, ratio in worst.items():
        print(f"{name} DRAM: largest cycles / estimate {ratio:.2f}; the default budget "
              f"trips at {BUDGET_MARGIN}x the estimate, {BUDGET_MARGIN / ratio:.1f}x the "
              "slowest program's own cycles")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
