"""Speed of the Verilator backend: simulated cycles per second on a long GEMM-bound
program (default config, default DRAM model), the model's build time cold and cached,
and the wall-clock ratio against the functional simulator on the same program.

The backend simulates the WIDE form of the GEMM core by default (`vdla.hw.compute.
GemmArithmetic`: one 32-bit multiplier per product); the PACKED form that `vdla verilog`
writes for boards (two products per DSP) gives the same results in the same cycles, and
its speed is printed too (`--no-packed` skips it).

Target: at least 1,000,000 simulated cycles per second on a two-core machine (anchors:
Gemmini on Verilator 34-120 k cycles/s; Amaranth's Python simulator ~10 k cycles/s).

    python bench/sim_speed.py [--size M N K] [--repeat R] [--no-cold] [--no-packed]

Each figure is the best of R runs (default 5), timeit's convention: on a shared virtual
machine noise only ever adds time, and this machine has phases where everything runs
about 25% slower.

The cold build uses a fresh temporary cache (Verilog generation, Verilator, g++); the
cached figure is `build_model` in a new process finding that build (the key's hashing
and the entry's check, not Python's start-up).
"""

import os

# numpy's BLAS threads spin after the functional simulator's matrix products and would
# steal the second core from the Verilator model: one thread is the fair comparison.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import vdla  # noqa: E402
from vdla.runtime.kernels import BlockedGemm, blocked_gemm_reference  # noqa: E402
from vdla.sim.verilator import build_model  # noqa: E402

TARGET = 1_000_000


def time_build(config, cold: bool):
    if not cold:
        return None, None
    folder = tempfile.mkdtemp(prefix="vdla-bench-cache-")
    try:
        start = time.perf_counter()
        first = build_model(config, cache=folder)
        cold_s = time.perf_counter() - start
        probe = ("import json, sys, time, vdla; from vdla.sim.verilator import build_model; "
                 "t = time.perf_counter(); b = build_model(vdla.HardwareConfig(), cache=sys.argv[1]); "
                 "print(json.dumps([b.built, time.perf_counter() - t]))")
        out = subprocess.run([sys.executable, "-c", probe, folder], capture_output=True,
                             text=True, check=True).stdout
        built_again, cached_s = json.loads(out)
        assert first.built and not built_again
        return cold_s, cached_s
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_gemm(backend, config, a, b, repeat, **options):
    """Best wall time of `repeat` runs of the GEMM program (DRAM ready), and its stats."""
    with vdla.runtime.open(config, backend=backend, dram_size=256 << 20, **options) as dev:
        with BlockedGemm(dev, a, b, shift=8, virtual_threads=2) as gemm:
            best, stats = float("inf"), None
            for _ in range(repeat):
                start = time.perf_counter()
                stats = gemm.run()
                best = min(best, time.perf_counter() - start)
            if not np.array_equal(gemm.result(), blocked_gemm_reference(a, b, 8)):
                raise SystemExit(f"{backend}: the GEMM's result differs from numpy")
            return best, stats, gemm.program


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, nargs=3, default=(1024, 512, 512),
                        metavar=("M", "N", "K"), help="GEMM size (default 1024 512 512)")
    parser.add_argument("--repeat", type=int, default=5, help="best of R runs (default 5)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold build")
    parser.add_argument("--no-packed", action="store_true",
                        help="skip the run of the packed (board) form of the GEMM core")
    args = parser.parse_args()
    config = vdla.HardwareConfig()
    m, n, k = args.size
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)

    print(f"Verilator backend, config {config.name}, blocked GEMM {m}x{n}x{k} "
          f"(2 virtual threads), default DRAM model, best of {args.repeat}")
    cold_s, cached_s = time_build(config, cold=not args.no_cold)
    build = build_model(config)   # the user's cache, for the runs
    v_s, stats, program = run_gemm("verilator", config, a, b, args.repeat)
    f_s, _, _ = run_gemm("functional", config, a, b, args.repeat)
    packed = None
    if not args.no_packed:
        packed = run_gemm("verilator", config, a, b, args.repeat, gemm_arithmetic="packed")
        if packed[1]["cycles"] != stats["cycles"]:
            raise SystemExit(f"the packed and wide GEMM cores took {packed[1]['cycles']} and "
                             f"{stats['cycles']} cycles: they must agree")

    cycles = stats["cycles"]
    rate = cycles / v_s
    macs = m * n * k
    utilization = macs / (cycles * config.macs_per_cycle)
    rows = [
        ("instructions", f"{len(program)}"),
        ("simulated cycles", f"{cycles:,}"),
        ("GEMM utilization", f"{utilization:.1%}"),
        ("Verilator run", f"{v_s:.3f} s"),
        ("cycles per second", f"{rate:,.0f}   ({rate / TARGET:.2f}x the 1M target)"),
        ("  packed GEMM core", "skipped" if packed is None else
         f"{cycles / packed[0]:,.0f}   (the board netlist; same cycles, "
         f"{packed[0] / v_s:.2f}x the wide core's time)"),
        ("functional run", f"{f_s * 1e3:.1f} ms"),
        ("Verilator / functional", f"{v_s / f_s:.0f}x the wall time"),
        ("build, cold", "skipped" if cold_s is None else f"{cold_s:.1f} s"),
        ("build, cached", "skipped" if cached_s is None else f"{cached_s:.2f} s"),
        ("model library", f"{build.library}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print("PASS" if rate >= TARGET else "BELOW TARGET", f"({rate:,.0f} cycles/s vs {TARGET:,})")


if __name__ == "__main__":
    main()
