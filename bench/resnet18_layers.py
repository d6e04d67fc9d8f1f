"""GEMM utilization of ResNet-18's conv layers C2-C11 on the cycle-accurate backend.

Each layer (the shapes of `vdla.compiler.frontend.workloads.RESNET18`, as the synthetic
one-node graph `workload_graph` builds: bias, one requantization shift, ReLU) is lowered with the default schedule chooser restricted to one virtual
thread, and to two, and run on the Verilator backend with the default config and the
default DRAM model (the config's `dram_bytes_per_cycle` each way, 8 unless the config
says otherwise; 32 cycles of read latency). Every output
is checked bit-exactly against the integer reference.

Printed per layer and thread count: the schedule, cycles, GEMM utilization (useful MACs /
(cycles x 256)), the share of cycles the load module was busy, and the analytical model's
estimate. Then, per 3x3 layer, the 90% target, and the *epilogue bound*: the utilization
the layer would have if loads, stores and instruction overheads cost nothing, i.e. GEMM
micro-ops / (GEMM micro-ops + reset and ALU cycles of the requantization epilogue). A
layer with 64 input channels has 36 GEMM micro-ops per output entry against 6 epilogue
cycles (reset 1, bias ADD 2 — an ALU op with a vector operand reads the acc buffer twice —,
SHR, MAX, MIN 1 each), so its bound is 85.7%.

    python bench/resnet18_layers.py [--layers C2 C5] [--no-check] [--config FILE|NAME]

``--config`` runs another config (a JSON file or a shipped config's name, e.g.
``vta-plus``); the estimate passes the epilogue its config has (with the ALU's REQ, one
REQ per entry and no reset).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import vdla  # noqa: E402
from vdla.compiler import run_reference  # noqa: E402
from vdla.compiler.targets.vdla import (Conv2dLayer, Conv2dSchedule, choose_conv2d,  # noqa: E402
                                        estimate_conv2d, lower_conv2d, run_conv2d)
from vdla.compiler.frontend.workloads import RESNET18, workload_graph  # noqa: E402
from vdla.compiler.targets.vdla.conv_layer import (alu_passes, conv2d_workload,  # noqa: E402
                                                   residual_passes)
from vdla.shipped import load_config  # noqa: E402

TARGET = 0.90
LAYERS = [f"C{i}" for i in range(2, 12)]


def short(s: Conv2dSchedule) -> str:
    threads = " oc2" if s.oc_nthread > 1 else " h2" if s.h_nthread > 1 else ""
    return f"h{s.tile_h} w{s.tile_w} ci{s.tile_ci} co{s.tile_co}{threads}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", default=LAYERS, choices=list(RESNET18))
    parser.add_argument("--no-check", action="store_true",
                        help="skip the bit-exact comparison with the reference")
    parser.add_argument("--config", metavar="FILE|NAME",
                        help="the hardware config (default: VTA's default config)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    dev = vdla.runtime.open(config, backend="verilator")
    print(f"ResNet-18 conv layers on Verilator, config {config.name}, default DRAM model "
          f"at {config.dram_bytes_per_cycle:g} bytes/cycle")
    print(f"{'layer':5s} {'thr':>3s} {'schedule':24s} {'cycles':>9s} {'util':>6s} "
          f"{'load%':>6s} {'model':>9s} {'exact':>5s}")
    results = {}
    failed = False
    start = time.perf_counter()
    for name in args.layers:
        workload = RESNET18[name]
        graph, feed = workload_graph(workload)
        node = graph.node("conv")
        want = None if args.no_check else run_reference(graph, feed)[graph.outputs[0]]
        layer = Conv2dLayer.from_node(node, graph, config)
        epilogue = conv2d_workload(node, graph, config)
        passes = dict(alu_passes=alu_passes(epilogue),
                      residual_passes=residual_passes(epilogue))
        row = {}
        for nthreads in (1, 2):
            schedule = choose_conv2d(layer, config, nthreads=nthreads)
            lowered = lower_conv2d(node, graph, config, schedule)
            y, stats = run_conv2d(dev, lowered, feed["x"], graph.tensors["w"].data,
                                  graph.tensors["b"].data, return_stats=True)
            exact = "-" if want is None else "yes" if (y == want).all() else "NO"
            failed |= exact == "NO"
            cycles = stats["cycles"]
            util = layer.macs / (cycles * config.macs_per_cycle)
            est = estimate_conv2d(layer, schedule, config, **passes)
            row[nthreads] = (cycles, util, est)
            print(f"{name:5s} {nthreads:3d} {short(schedule):24s} {cycles:9d} {util:6.1%} "
                  f"{stats['load_busy'] / cycles:6.1%} {est.cycles:9d} {exact:>5s}",
                  flush=True)
        results[name] = row
    wall = time.perf_counter() - start

    print(f"\n{'layer':5s} {'kxk':>3s} {'1 thread':>9s} {'2 threads':>9s} {'speedup':>8s} "
          f"{'bound':>6s}  target (>= {TARGET:.0%} on 3x3 layers, 2 threads)")
    for name, row in results.items():
        (c1, u1, _), (c2, u2, est) = row[1], row[2]
        k = RESNET18[name].k
        bound = est.gemm / (est.gemm + est.epilogue)
        verdict = ""
        if k == 3:
            verdict = "met" if u2 >= TARGET else (
                f"MISSED: the epilogue bounds it at {bound:.1%}" if bound < TARGET + 0.01
                else "MISSED")
        faster = "" if c2 < c1 else "  (2 threads not faster)"
        print(f"{name:5s} {k:>3d} {u1:9.1%} {u2:9.1%} {c1 / c2:7.2f}x {bound:6.1%}  "
              f"{verdict}{faster}")
    for nthreads in (1, 2):
        utils = [row[nthreads][1] for row in results.values()]
        geomean = math.exp(sum(math.log(u) for u in utils) / len(utils))
        total = sum(row[nthreads][0] for row in results.values())
        print(f"{nthreads} thread{'s' if nthreads > 1 else ' '}: geometric mean utilization "
              f"{geomean:.1%} over {', '.join(results)}; {total} cycles, "
              f"{total / (config.clock_mhz * 1e3):.2f} ms at {config.clock_mhz:g} MHz")
    print(f"(simulation and checks took {wall:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
