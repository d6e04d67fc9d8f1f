"""Pooling on the cycle-accurate backend: ResNet-18's stem max pool, a 3x3 average pool,
and the global average pools of ResNet-18 and ResNet-50.

Each pool is lowered with the default schedule chooser (`cost.choose_pool2d`), run on the
Verilator backend with the default config and DRAM model, and checked bit-exactly against
the integer reference. Printed per pool: the schedule, cycles, compute cycles per output
entry (one entry is batch x block_out channels of one position), the analytical model's
estimate and its error.

A max pool's compute per output entry is about 2 (reset and -128) + 2 per tap (an ALU
MAX with a vector operand) + 2 per widened input entry (GEMM reset and copy); an average
pool's is one GEMM micro-op per tap plus its requantization and clamp.

    python bench/pools.py [--no-check]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import vdla  # noqa: E402
from vdla.compiler import Graph, run_reference  # noqa: E402
from vdla.compiler.targets.vdla.pool import estimate_pool2d, lower_pool2d, run_pool2d  # noqa: E402

# (name, op, (C, H, W), attributes)
POOLS = [
    ("resnet18 maxpool", "max_pool2d", (64, 112, 112),
     dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ("avgpool 3x3/2", "qavg_pool2d", (64, 56, 56),
     dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), shift=(3,))),
    ("resnet18 avgpool", "qglobal_avg_pool2d", (512, 7, 7), dict(shift=(6,))),
    ("resnet50 avgpool", "qglobal_avg_pool2d", (2048, 7, 7), dict(shift=(6,))),
]


def pool_graph(op: str, shape, attrs) -> Graph:
    g = Graph("pool")
    x = g.add_input("x", (1, *shape), "int8")
    g.set_outputs([g.add_node(op, [x], name="pool", **attrs)])
    return g.validate()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-check", action="store_true",
                        help="skip the bit-exact comparison with the reference")
    args = parser.parse_args(argv)
    config = vdla.HardwareConfig()
    dev = vdla.runtime.open(config, backend="verilator")
    rng = np.random.default_rng(0)
    print(f"Pools on Verilator, config {config.name}, default DRAM model")
    print(f"{'pool':17s} {'op':18s} {'schedule':10s} {'cycles':>9s} {'cyc/entry':>9s} "
          f"{'model':>9s} {'error':>6s} {'exact':>5s}")
    failed = False
    start = time.perf_counter()
    for name, op, shape, attrs in POOLS:
        graph = pool_graph(op, shape, attrs)
        x = rng.integers(-128, 128, (1, *shape)).astype(np.int8)
        lowered = lower_pool2d("pool", graph, config)
        y, stats = run_pool2d(dev, lowered, x, return_stats=True)
        exact = "-"
        if not args.no_check:
            exact = "yes" if (y == run_reference(graph, {"x": x})[graph.outputs[0]]).all() \
                else "NO"
        failed |= exact == "NO"
        L, s = lowered.layer, lowered.schedule
        entries = L.batch_blocks * L.blocks * L.out_h * L.out_w
        est = estimate_pool2d(L, s, config)
        cycles = stats["cycles"]
        print(f"{name:17s} {op:18s} {f'h{s.tile_h} w{s.tile_w} c{s.tile_c}':10s} "
              f"{cycles:9,d} {stats['compute_busy'] / entries:9.1f} {est:9,d} "
              f"{est / cycles - 1:+6.0%} {exact:>5s}", flush=True)
    print(f"(simulation and checks took {time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
