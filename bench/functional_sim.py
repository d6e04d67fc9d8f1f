"""Simulated int8 MACs per second of the functional simulator on blocked GEMMs.

Times `Device.run` only (the program and operands are in DRAM already), best of
several repeats, and checks each result against numpy. Target: at least 1e9 MAC/s
for the 256x256x64 GEMM on a two-core CI machine.

    python bench/functional_sim.py [--repeat N]
"""

import argparse
import time

import numpy as np

import vdla
from vdla.runtime.kernels import BlockedGemm, GemmSchedule, blocked_gemm_reference

CASES = [  # (M, N, K, virtual threads, schedule or None for the default)
    (256, 256, 64, 1, None),
    (256, 256, 64, 2, None),
    (256, 256, 64, 2, GemmSchedule(tile_m=32, tile_n=16, virtual_threads=2)),
    (1024, 1024, 256, 2, None),
]
TARGET = 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    config = vdla.HardwareConfig()
    rng = np.random.default_rng(0)
    print(f"functional simulator, config {config.name}, best of {args.repeat}")
    print(f"{'GEMM':>16} {'threads':>7} {'tiles':>7} {'insns':>6} {'MACs':>11} "
          f"{'run ms':>8} {'MAC/s':>9}  vs target")
    with vdla.runtime.open(config, dram_size=64 << 20) as dev:
        for m, n, k, threads, schedule in CASES:
            a = rng.integers(-128, 128, (m, k), dtype=np.int8)
            b = rng.integers(-128, 128, (n, k), dtype=np.int8)
            with BlockedGemm(dev, a, b, shift=8, schedule=schedule,
                             virtual_threads=threads) as gemm:
                best = float("inf")
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    stats = gemm.run()
                    best = min(best, time.perf_counter() - start)
                if not np.array_equal(gemm.result(), blocked_gemm_reference(a, b, 8)):
                    raise SystemExit(f"{m}x{n}x{k}: result differs from numpy")
                s = gemm.schedule
                tiles = -(-gemm.blocks[0] // s.tile_m) * -(-gemm.blocks[2] // s.tile_n)
                rate = stats["gemm_macs"] / best
                print(f"{f'{m}x{n}x{k}':>16} {threads:>7} {tiles:>7} {len(gemm.program):>6} "
                      f"{stats['gemm_macs']:>11} {best * 1e3:>8.2f} {rate:>9.3g}  "
                      f"{rate / TARGET:.2f}x")


if __name__ == "__main__":
    main()
